//! Two [`Selector`]s whose priorities live in device memory:
//! [`DevicePrioritized`] (proportional) and [`DeviceTopK`].
//!
//! As a table's strategy each names its [`SelectionRule`], so a device
//! sampler draws its batches on the device from its own mirror of the
//! table's slots; the strategy's own draws serve host samplers. Those draw
//! through [`Selector::sample_shared`]: the table admits and counts the
//! batch under its process-shared lock and releases it before the draw,
//! so the device round trip (flush of buffered updates, prefix sums, draw,
//! copy back) never holds writers or samplers of other processes.

use crate::priorities::DevicePriorities;
use gear_core::{check_priority, DeviceApi, RandomSource, Sampled, SelectionRule, Selector, SlotKey};
use std::sync::Mutex;

/// Host bookkeeping shared by the device selectors: which key holds each slot.
#[derive(Debug)]
struct Keys {
    generation: Vec<Option<u32>>,
    len: usize,
}

impl Keys {
    fn new() -> Self {
        Keys { generation: Vec::new(), len: 0 }
    }

    fn prepare(&mut self, capacity: u64) {
        self.generation = vec![None; capacity as usize];
        self.len = 0;
    }

    fn check_slot(&self, key: SlotKey) -> gear_core::Result<usize> {
        let i = key.slot as usize;
        if i >= self.generation.len() {
            return Err(gear_core::Error::Selection(format!(
                "key {key}: slot beyond the prepared capacity {} (call prepare first)",
                self.generation.len()
            )));
        }
        Ok(i)
    }

    fn insert(&mut self, key: SlotKey) -> gear_core::Result<()> {
        let i = self.check_slot(key)?;
        if let Some(g) = self.generation[i] {
            return Err(gear_core::Error::Selection(format!(
                "key {key}: slot {} already holds generation {g}",
                key.slot
            )));
        }
        self.generation[i] = Some(key.generation);
        self.len += 1;
        Ok(())
    }

    fn require(&self, key: SlotKey) -> gear_core::Result<()> {
        let i = self.check_slot(key)?;
        if self.generation[i] != Some(key.generation) {
            return Err(gear_core::Error::Selection(format!("key {key} is not held")));
        }
        Ok(())
    }

    fn remove(&mut self, key: SlotKey) -> gear_core::Result<()> {
        self.require(key)?;
        self.generation[key.slot as usize] = None;
        self.len -= 1;
        Ok(())
    }

    fn key(&self, slot: u32) -> gear_core::Result<SlotKey> {
        self.generation
            .get(slot as usize)
            .copied()
            .flatten()
            .map(|generation| SlotKey { slot, generation })
            .ok_or_else(|| gear_core::Error::Selection(format!("device returned slot {slot}, which holds nothing")))
    }

    fn held(&self) -> impl Iterator<Item = SlotKey> + '_ {
        self.generation
            .iter()
            .enumerate()
            .filter_map(|(s, g)| g.map(|generation| SlotKey { slot: s as u32, generation }))
    }
}

/// A device failure as a strategy's error.
fn device_error<E: std::error::Error>(e: E) -> gear_core::Error {
    gear_core::Error::Device(e.to_string())
}

/// The device half of a strategy: priorities in device memory and the
/// updates not yet written there, behind one lock so that draws through a
/// shared reference can flush and draw.
struct DeviceState<A: DeviceApi> {
    prios: Option<DevicePriorities<A>>,
    pending: Vec<(u32, f64)>,
}

impl<A: DeviceApi> DeviceState<A> {
    fn flushed(&mut self) -> gear_core::Result<&mut DevicePriorities<A>> {
        let prios = self.prios.as_mut().ok_or(gear_core::Error::Unsupported("sample before prepare"))?;
        if !self.pending.is_empty() {
            prios.set(&self.pending).map_err(device_error)?;
            self.pending.clear();
        }
        Ok(prios)
    }
}

/// Prioritized (proportional) replay with priorities in device memory:
/// `P(i) = p_i^alpha / sum p^alpha` over items with `p_i > 0` (a zero
/// priority has no mass, whatever alpha), importance weights
/// `(N P(i))^-beta / max_j (N P(j))^-beta`; new items without a priority
/// get the largest priority seen so far (1.0 at first). Priority updates
/// are buffered on the host and written in one launch before the next draw.
///
/// Each draw takes one `u64` from the random source as the seed of its
/// draws. When every mass is zero, draws are uniform over the held items,
/// probability `1/N`, weight 1 (as the host strategy).
pub struct DevicePrioritized<A: DeviceApi> {
    device: A::Device,
    state: Mutex<DeviceState<A>>,
    keys: Keys,
    alpha: f64,
    beta: f64,
    stratified: bool,
    max_priority: f64,
}

impl<A: DeviceApi> std::fmt::Debug for DevicePrioritized<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePrioritized")
            .field("alpha", &self.alpha)
            .field("beta", &self.beta)
            .field("len", &self.keys.len)
            .finish()
    }
}

impl<A: DeviceApi> DevicePrioritized<A> {
    /// A strategy with exponents `alpha` (priority) and `beta` (importance
    /// correction) on `device`. Device memory is allocated in `prepare`.
    pub fn new(device: &A::Device, alpha: f64, beta: f64) -> Result<Self, A::Error> {
        if !(alpha.is_finite() && alpha >= 0.0 && beta.is_finite() && beta >= 0.0) {
            return Err(
                gear_core::Error::Device(format!("alpha {alpha} and beta {beta} must be finite and >= 0")).into()
            );
        }
        Ok(DevicePrioritized {
            device: device.clone(),
            state: Mutex::new(DeviceState { prios: None, pending: Vec::new() }),
            keys: Keys::new(),
            alpha,
            beta,
            stratified: false,
            max_priority: 1.0,
        })
    }

    /// Draw `d` of `n` from the `d`-th of `n` equal segments of the total
    /// (stratified sampling, as in PER implementations).
    pub fn stratified(mut self, on: bool) -> Self {
        self.stratified = on;
        self
    }

    /// Sets beta (annealed during training).
    pub fn set_beta(&mut self, beta: f64) -> Result<(), A::Error> {
        if !(beta.is_finite() && beta >= 0.0) {
            return Err(gear_core::Error::Device(format!("beta {beta} must be finite and >= 0")).into());
        }
        self.beta = beta;
        Ok(())
    }

    /// Runs `f` on the device priorities (after `prepare`) with every
    /// buffered update written, e.g. for top-k queries.
    pub fn with_priorities<T>(
        &self,
        f: impl FnOnce(&mut DevicePriorities<A>) -> Result<T, A::Error>,
    ) -> gear_core::Result<T> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(st.flushed()?).map_err(device_error)
    }

    fn push(&mut self, slot: u32, p: f64) {
        self.state.get_mut().unwrap_or_else(|p| p.into_inner()).pending.push((slot, p));
    }

    fn draw(&self, n: usize, seed: u64, out: &mut Vec<Sampled>) -> gear_core::Result<()> {
        if self.keys.len == 0 {
            return Err(gear_core::Error::Empty("no trajectories to sample".into()));
        }
        let (alpha, beta, stratified) = (self.alpha, self.beta, self.stratified);
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let prios = st.flushed()?;
        let (total, _) = prios.mass(alpha).map_err(device_error)?;
        if total > 0.0 && total.is_finite() {
            let d = prios.sample(n, alpha, beta, seed, stratified).map_err(device_error)?;
            out.reserve(n);
            for i in 0..d.slots.len() {
                out.push(Sampled {
                    key: self.keys.key(d.slots[i])?,
                    probability: d.probabilities[i],
                    weight: d.weights[i],
                });
            }
            return Ok(());
        }
        if !total.is_finite() {
            return Err(gear_core::Error::Device(format!("priority weights sum to {total} (overflow)")));
        }
        // Every mass zero: uniform over the held items, same seed rule.
        drop(st);
        let held: Vec<SlotKey> = self.keys.held().collect();
        let mut state = seed;
        let p = 1.0 / held.len() as f64;
        for _ in 0..n {
            let x = gear_core::rng::splitmix64(&mut state);
            let i = ((u128::from(x) * held.len() as u128) >> 64) as usize;
            out.push(Sampled { key: held[i], probability: p, weight: 1.0 });
        }
        Ok(())
    }

    fn top(&self, n: usize, out: &mut Vec<Sampled>) -> gear_core::Result<()> {
        if self.keys.len == 0 {
            return Err(gear_core::Error::Empty("no trajectories to select".into()));
        }
        if n == 0 {
            return Ok(());
        }
        let want = n.min(self.keys.len);
        let top = self.with_priorities(|p| p.top_k(want))?;
        if top.is_empty() {
            return Err(gear_core::Error::Selection("device top-k returned nothing for a non-empty set".into()));
        }
        for i in 0..n {
            let (slot, _) = top[i % top.len()];
            out.push(Sampled { key: self.keys.key(slot)?, probability: 1.0, weight: 1.0 });
        }
        Ok(())
    }
}

impl<A: DeviceApi> Selector for DevicePrioritized<A> {
    fn name(&self) -> &str {
        "device-prioritized"
    }

    fn selection_rule(&self) -> Option<SelectionRule> {
        let (alpha, beta, stratified) = (self.alpha, self.beta, self.stratified);
        Some(SelectionRule::Proportional { alpha, beta, stratified })
    }

    fn prepare(&mut self, capacity: u64) -> gear_core::Result<()> {
        let prios = DevicePriorities::<A>::new(&self.device, capacity).map_err(device_error)?;
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        st.prios = Some(prios);
        st.pending.clear();
        self.keys.prepare(capacity);
        Ok(())
    }

    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> gear_core::Result<f64> {
        let p = match priority {
            Some(p) => check_priority(p)?,
            None => self.max_priority,
        };
        self.keys.insert(key)?;
        self.max_priority = self.max_priority.max(p);
        self.push(key.slot, p);
        Ok(p)
    }

    fn update(&mut self, key: SlotKey, priority: f64) -> gear_core::Result<()> {
        let p = check_priority(priority)?;
        self.keys.require(key)?;
        self.max_priority = self.max_priority.max(p);
        self.push(key.slot, p);
        Ok(())
    }

    fn remove(&mut self, key: SlotKey) -> gear_core::Result<()> {
        self.keys.remove(key)?;
        self.push(key.slot, -1.0);
        Ok(())
    }

    fn len(&self) -> usize {
        self.keys.len
    }

    fn sample(&mut self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> gear_core::Result<()> {
        let seed = rng.next_u64();
        self.draw(n, seed, out)
    }

    fn sample_shared(
        &self,
        n: usize,
        rng: &mut dyn RandomSource,
        out: &mut Vec<Sampled>,
    ) -> Option<gear_core::Result<()>> {
        if n == 0 {
            // The table's question at open: yes, draws go through here.
            return Some(Ok(()));
        }
        let seed = rng.next_u64();
        Some(self.draw(n, seed, out))
    }
}

/// Top-k (max-priority first) selection with priorities in device memory:
/// each draw of `n` returns the `min(n, len)` highest-priority items, best
/// first (ties to the lower slot), repeated from the first if `n > len`;
/// probability and weight 1. Zero priorities rank too (last).
pub struct DeviceTopK<A: DeviceApi> {
    inner: DevicePrioritized<A>,
}

impl<A: DeviceApi> std::fmt::Debug for DeviceTopK<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTopK").field("len", &self.inner.keys.len).finish()
    }
}

impl<A: DeviceApi> DeviceTopK<A> {
    /// A top-k strategy on `device`.
    pub fn new(device: &A::Device) -> Result<Self, A::Error> {
        Ok(DeviceTopK { inner: DevicePrioritized::<A>::new(device, 1.0, 0.0)? })
    }
}

impl<A: DeviceApi> Selector for DeviceTopK<A> {
    fn name(&self) -> &str {
        "device-topk"
    }
    fn selection_rule(&self) -> Option<SelectionRule> {
        Some(SelectionRule::TopK)
    }
    fn prepare(&mut self, capacity: u64) -> gear_core::Result<()> {
        self.inner.prepare(capacity)
    }
    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> gear_core::Result<f64> {
        self.inner.insert(key, priority)
    }
    fn update(&mut self, key: SlotKey, priority: f64) -> gear_core::Result<()> {
        self.inner.update(key, priority)
    }
    fn remove(&mut self, key: SlotKey) -> gear_core::Result<()> {
        self.inner.remove(key)
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn sample(&mut self, n: usize, _rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> gear_core::Result<()> {
        self.inner.top(n, out)
    }
    fn sample_shared(
        &self,
        n: usize,
        _rng: &mut dyn RandomSource,
        out: &mut Vec<Sampled>,
    ) -> Option<gear_core::Result<()>> {
        // Top-k keeps no cursor: every draw of a batch is a pure function
        // of the priorities, so it needs no exclusive lock.
        Some(if n == 0 { Ok(()) } else { self.inner.top(n, out) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_track_generations_and_refuse_unknown() {
        let mut k = Keys::new();
        k.prepare(4);
        let a = SlotKey { slot: 1, generation: 3 };
        k.insert(a).unwrap();
        assert!(k.insert(SlotKey { slot: 1, generation: 4 }).is_err());
        assert!(k.require(SlotKey { slot: 1, generation: 2 }).is_err());
        assert!(k.require(SlotKey { slot: 9, generation: 0 }).is_err());
        assert_eq!(k.key(1).unwrap(), a);
        k.remove(a).unwrap();
        assert!(k.remove(a).is_err());
        assert!(k.key(1).is_err());
        assert_eq!(k.len, 0);
    }
}
