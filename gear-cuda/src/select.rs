//! Selection on the GPU: priorities mirrored in device memory, proportional
//! sampling and top-k by kernel, and two [`gear_core::Selector`]s on top.
//!
//! [`DevicePriorities`] holds one `f64` per table slot in device memory
//! (negative: the slot holds nothing). Updates are batched and written by a
//! scatter kernel after resolving duplicate slots on the host: the last
//! update of a slot wins, as a sequential loop would leave it
//! ([`crate::plan::last_write_wins`]). Sampling recomputes f64 prefix sums of
//! `p^alpha` from scratch when priorities changed (no incremental drift, the
//! failure of f32 sum trees) and draws with a counter-based generator keyed
//! by a seed and the draw index, so a seed fixes the draws (see
//! `kernels/sample.cu`).

use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels::KernelFn;
use crate::memory::DeviceMemory;
use crate::plan;
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use gear_core::{check_priority, RandomSource, Sampled, SelectionRule, Selector, SlotKey};
use std::sync::Arc;

/// Proportional draws from [`DevicePriorities::sample`], copied to the host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceDraws {
    /// Slot of each draw.
    pub slots: Vec<u32>,
    /// `P(slot) = p^alpha / sum(p^alpha)` of each draw.
    pub probabilities: Vec<f64>,
    /// `(N * P)^-beta` normalised by its largest value, `(w_min / w)^beta`.
    pub weights: Vec<f64>,
}

fn f64s(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_f64s(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

fn cfg_1d(items: u64) -> LaunchConfig {
    LaunchConfig { grid_dim: (plan::grid_1d(items), 1, 1), block_dim: (plan::BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// Grow-only device scratch buffer. Before a smaller buffer is replaced
/// (freed), work queued on `stream` that may use it is waited for.
fn ensure(mem: &mut Option<DeviceMemory>, device: &CudaDevice, stream: &CudaStream, bytes: u64) -> Result<u64> {
    if mem.as_ref().is_none_or(|m| m.len() < bytes) {
        if mem.is_some() {
            stream.synchronize()?;
        }
        *mem = Some(device.alloc(bytes.max(8))?);
    }
    Ok(mem.as_ref().expect("just ensured").device_addr())
}

/// One `f64` priority per table slot, in device memory.
pub struct DevicePriorities {
    device: CudaDevice,
    stream: Arc<CudaStream>,
    capacity: u64,
    prio: DeviceMemory,
    prefix: DeviceMemory,
    chunk_sum: DeviceMemory,
    chunk_min: DeviceMemory,
    chunk_off: DeviceMemory,
    stats: DeviceMemory,
    /// The `alpha` that `prefix`/`stats` were computed with; `None` when
    /// priorities changed since.
    prefix_alpha: Option<f64>,
    upd_idx: Option<DeviceMemory>,
    upd_val: Option<DeviceMemory>,
    out_slot: Option<DeviceMemory>,
    out_prob: Option<DeviceMemory>,
    out_weight: Option<DeviceMemory>,
    /// Scratch of the top-k sorting network: m slot indices.
    topk_idx: Option<DeviceMemory>,
}

impl std::fmt::Debug for DevicePriorities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePriorities").field("capacity", &self.capacity).finish()
    }
}

impl DevicePriorities {
    /// Priorities for `capacity` slots, all empty, on the device's stream.
    pub fn new(device: &CudaDevice, capacity: u64) -> Result<Self> {
        Self::on_stream(device, capacity, device.stream().clone())
    }

    /// Priorities for `capacity` slots, all empty, with their work queued
    /// on `stream` (which must belong to the device's context).
    pub fn on_stream(device: &CudaDevice, capacity: u64, stream: Arc<CudaStream>) -> Result<Self> {
        if capacity == 0 || capacity > u64::from(u32::MAX) {
            return Err(Error::InvalidArgument(format!("priority capacity {capacity} not in 1..=2^32-1")));
        }
        if **stream.context() != **device.context() {
            return Err(Error::InvalidArgument("stream belongs to another device context".into()));
        }
        let (_, nchunks) = plan::prio_chunks(capacity);
        let prio = device.alloc(capacity * 8)?;
        // Empty slots hold -1.0 (weight 0).
        prio.write_async(0, &f64s(&vec![-1.0; capacity as usize]), &stream)?;
        let me = DevicePriorities {
            prefix: device.alloc(capacity * 8)?,
            chunk_sum: device.alloc(nchunks * 8)?,
            chunk_min: device.alloc(nchunks * 8)?,
            chunk_off: device.alloc(nchunks * 8)?,
            stats: device.alloc(16)?,
            prio,
            device: device.clone(),
            stream,
            capacity,
            prefix_alpha: None,
            upd_idx: None,
            upd_val: None,
            out_slot: None,
            out_prob: None,
            out_weight: None,
            topk_idx: None,
        };
        me.stream.synchronize()?;
        Ok(me)
    }

    /// Slots covered.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Writes a batch of `(slot, priority)` updates; a negative priority
    /// empties the slot. Duplicate slots: the last update wins.
    pub fn set(&mut self, updates: &[(u32, f64)]) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        for &(slot, p) in updates {
            if u64::from(slot) >= self.capacity {
                return Err(gear_core::Error::SlotOutOfRange { slot: u64::from(slot), capacity: self.capacity }.into());
            }
            if p.is_nan() || p.is_infinite() {
                return Err(gear_core::Error::InvalidPriority(p).into());
            }
        }
        let unique = plan::last_write_wins(updates);
        let m = unique.len() as u64;
        let idx: Vec<u8> = unique.iter().flat_map(|&(s, _)| s.to_le_bytes()).collect();
        let val: Vec<f64> = unique.iter().map(|&(_, p)| p).collect();
        let idx_addr = ensure(&mut self.upd_idx, &self.device, &self.stream, m * 4)?;
        let val_addr = ensure(&mut self.upd_val, &self.device, &self.stream, m * 8)?;
        self.upd_idx.as_ref().expect("ensured").write_async(0, &idx, &self.stream)?;
        self.upd_val.as_ref().expect("ensured").write_async(0, &f64s(&val), &self.stream)?;
        let func = self.device.function(KernelFn::ScatterF64)?;
        let dst = self.prio.device_addr();
        let mut b = self.stream.launch_builder(&func);
        b.arg(&idx_addr).arg(&val_addr).arg(&m).arg(&dst);
        // SAFETY: arguments match gear_scatter_f64(u32*, f64*, u64, f64*);
        // the index and value buffers hold `m` entries uploaded on this
        // stream; every index is < capacity (checked above) and distinct
        // (last_write_wins), so writes stay in `prio` and never race.
        unsafe { b.launch(cfg_1d(m)) }?;
        self.prefix_alpha = None;
        Ok(())
    }

    /// All priorities, copied to the host (waits for queued work).
    pub fn to_host(&self) -> Result<Vec<f64>> {
        self.stream.synchronize()?;
        Ok(from_f64s(&self.prio.to_vec()?))
    }

    /// The stream this work is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Recomputes prefix sums of `p^alpha` if priorities or alpha changed;
    /// returns (total, smallest positive weight or -1).
    fn prefix(&mut self, alpha: f64) -> Result<(f64, f64)> {
        self.queue_prefix(alpha)?;
        self.stream.synchronize()?;
        let s = from_f64s(&self.stats.to_vec()?);
        Ok((s[0], s[1]))
    }

    /// Queues the prefix sums of `p^alpha` (and the total and smallest
    /// positive weight in device memory) if priorities or alpha changed.
    fn queue_prefix(&mut self, alpha: f64) -> Result<()> {
        if self.prefix_alpha != Some(alpha) {
            let n = self.capacity;
            let (chunk_len, nchunks) = plan::prio_chunks(n);
            let prio = self.prio.device_addr();
            let (cs, cm, co) =
                (self.chunk_sum.device_addr(), self.chunk_min.device_addr(), self.chunk_off.device_addr());
            let (prefix, stats) = (self.prefix.device_addr(), self.stats.device_addr());
            let f = self.device.function(KernelFn::PrioChunks)?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&prio).arg(&n).arg(&alpha).arg(&chunk_len).arg(&nchunks).arg(&cs).arg(&cm);
            // SAFETY: matches gear_prio_chunks(f64*, u64, f64, u64, u64, f64*,
            // f64*); `prio` has n entries and chunk_sum/chunk_min `nchunks`
            // (allocated for prio_chunks(capacity)); chunks cover [0, n).
            unsafe { b.launch(cfg_1d(nchunks)) }?;
            let f = self.device.function(KernelFn::PrioScan)?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&cs).arg(&cm).arg(&nchunks).arg(&co).arg(&stats);
            let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches gear_prio_scan(f64*, f64*, u64, f64*, f64*);
            // buffers sized as above, stats has 2 entries.
            unsafe { b.launch(one) }?;
            let f = self.device.function(KernelFn::PrioPrefix)?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&prio).arg(&n).arg(&alpha).arg(&chunk_len).arg(&nchunks).arg(&co).arg(&prefix);
            // SAFETY: matches gear_prio_prefix(f64*, u64, f64, u64, u64, f64*,
            // f64*); `prefix` has n entries.
            unsafe { b.launch(cfg_1d(nchunks)) }?;
            self.prefix_alpha = Some(alpha);
        }
        Ok(())
    }

    /// Queues `draws` proportional draws into device buffers, with no wait
    /// and no copy to the host: slots to `out_slot` (`u32` each),
    /// probabilities and weights to `out_prob` and `out_weight` (`f64`
    /// each), as [`DevicePriorities::sample`] computes them. When the
    /// weights do not sum to a positive finite total the kernel writes slot
    /// `u32::MAX` (probability and weight 0) for every draw: the caller
    /// finds those rows keyless and draws them otherwise.
    ///
    /// # Safety
    /// The three buffers are device allocations of this context holding at
    /// least `draws` entries, alive until the stream has passed the launch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn queue_draws(
        &mut self,
        draws: u64,
        alpha: f64,
        beta: f64,
        seed: u64,
        stratified: bool,
        out_slot: u64,
        out_prob: u64,
        out_weight: u64,
    ) -> Result<()> {
        if !(alpha.is_finite() && alpha >= 0.0 && beta.is_finite() && beta >= 0.0) {
            return Err(Error::InvalidArgument(format!("alpha {alpha} and beta {beta} must be finite and >= 0")));
        }
        self.queue_prefix(alpha)?;
        if draws == 0 {
            return Ok(());
        }
        let (prio, prefix, stats) = (self.prio.device_addr(), self.prefix.device_addr(), self.stats.device_addr());
        let cap = self.capacity;
        let strat = u32::from(stratified);
        let f = self.device.function(KernelFn::SampleDraws)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&prio)
            .arg(&prefix)
            .arg(&cap)
            .arg(&alpha)
            .arg(&beta)
            .arg(&stats)
            .arg(&seed)
            .arg(&draws)
            .arg(&strat)
            .arg(&out_slot)
            .arg(&out_prob)
            .arg(&out_weight);
        // SAFETY: matches gear_sample_draws(f64*, f64*, u64, f64, f64, f64*,
        // u64, u64, u32, u32*, f64*, f64*); prio/prefix have `cap` entries
        // (prefix queued above for this alpha), stats two; the kernel checks
        // the total itself; the outputs hold `draws` entries (the caller's
        // obligation).
        unsafe { b.launch(cfg_1d(draws)) }?;
        Ok(())
    }

    /// `n` proportional draws with `P(i) = p_i^alpha / sum p^alpha`,
    /// importance weights with exponent `beta`, fixed by `seed`; with
    /// `stratified`, draw `d` comes from the `d`-th of `n` equal segments.
    /// Errors with `Empty` when the weights sum to zero.
    pub fn sample(&mut self, n: usize, alpha: f64, beta: f64, seed: u64, stratified: bool) -> Result<DeviceDraws> {
        if !(alpha.is_finite() && alpha >= 0.0 && beta.is_finite() && beta >= 0.0) {
            return Err(Error::InvalidArgument(format!("alpha {alpha} and beta {beta} must be finite and >= 0")));
        }
        let (total, _) = self.prefix(alpha)?;
        if total.is_nan() || total <= 0.0 {
            return Err(gear_core::Error::Empty("every priority weight is zero".into()).into());
        }
        if !total.is_finite() {
            return Err(Error::InvalidArgument(format!("priority weights sum to {total} (overflow)")));
        }
        if n == 0 {
            return Ok(DeviceDraws::default());
        }
        let draws = n as u64;
        let slot_addr = ensure(&mut self.out_slot, &self.device, &self.stream, draws * 4)?;
        let prob_addr = ensure(&mut self.out_prob, &self.device, &self.stream, draws * 8)?;
        let weight_addr = ensure(&mut self.out_weight, &self.device, &self.stream, draws * 8)?;
        let (prio, prefix, stats) = (self.prio.device_addr(), self.prefix.device_addr(), self.stats.device_addr());
        let cap = self.capacity;
        let strat = u32::from(stratified);
        let f = self.device.function(KernelFn::SampleDraws)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&prio)
            .arg(&prefix)
            .arg(&cap)
            .arg(&alpha)
            .arg(&beta)
            .arg(&stats)
            .arg(&seed)
            .arg(&draws)
            .arg(&strat)
            .arg(&slot_addr)
            .arg(&prob_addr)
            .arg(&weight_addr);
        // SAFETY: matches gear_sample_draws(f64*, f64*, u64, f64, f64, f64*,
        // u64, u64, u32, u32*, f64*, f64*); prio/prefix have `cap` entries
        // (prefix computed above for this alpha), stats[0] > 0 was checked,
        // outputs hold `draws` entries.
        unsafe { b.launch(cfg_1d(draws)) }?;
        self.stream.synchronize()?;
        let read = |m: &Option<DeviceMemory>, bytes: u64| -> Result<Vec<u8>> {
            let mut v = vec![0u8; bytes as usize];
            m.as_ref().expect("ensured").read(0, &mut v)?;
            Ok(v)
        };
        let slots = read(&self.out_slot, draws * 4)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
            .collect();
        Ok(DeviceDraws {
            slots,
            probabilities: from_f64s(&read(&self.out_prob, draws * 8)?),
            weights: from_f64s(&read(&self.out_weight, draws * 8)?),
        })
    }

    /// The `k` highest priorities as `(slot, priority)`, best first; ties go
    /// to the lower slot. Fewer when fewer slots are occupied.
    pub fn top_k(&mut self, k: usize) -> Result<Vec<(u32, f64)>> {
        if k == 0 {
            return Ok(Vec::new());
        }
        let k = (k as u64).min(self.capacity);
        let slot_addr = ensure(&mut self.out_slot, &self.device, &self.stream, k * 4)?;
        let prob_addr = ensure(&mut self.out_prob, &self.device, &self.stream, k * 8)?;
        // SAFETY: both outputs were just sized for `k` entries and live in
        // `self`, which waits for the stream before freeing them.
        unsafe { self.queue_top_k(k, slot_addr, prob_addr) }?;
        self.stream.synchronize()?;
        let mut slots = vec![0u8; k as usize * 4];
        let mut prios = vec![0u8; k as usize * 8];
        self.out_slot.as_ref().expect("ensured").read(0, &mut slots)?;
        self.out_prob.as_ref().expect("ensured").read(0, &mut prios)?;
        // Occupied slots sort first; the first empty entry ends the list.
        let got = from_f64s(&prios).iter().take_while(|&&p| p >= 0.0).count();
        slots.truncate(got * 4);
        prios.truncate(got * 8);
        Ok(slots.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).zip(from_f64s(&prios)).collect())
    }

    /// Queues the top-`k` selection (`k <= capacity`) with no wait: the
    /// best `k` slots to `out_slot` (`u32`) and their priorities to
    /// `out_prio` (`f64`), best first; empty entries are `(u32::MAX, -1)`.
    ///
    /// # Safety
    /// Both buffers are device allocations of this context holding at
    /// least `k` entries, alive until the stream has passed the launches.
    pub(crate) unsafe fn queue_top_k(&mut self, k: u64, slot_addr: u64, prob_addr: u64) -> Result<()> {
        let n = self.capacity;
        if k == 0 || k > n {
            return Err(Error::InvalidArgument(format!("top-{k} of {n} slots")));
        }
        let (m, steps) = plan::topk_network(n);
        let idx_addr = ensure(&mut self.topk_idx, &self.device, &self.stream, m * 4)?;
        let prio = self.prio.device_addr();
        let f = self.device.function(KernelFn::TopkInit)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&n).arg(&m).arg(&idx_addr);
        // SAFETY: matches gear_topk_init(u64, u64, u32*); idx holds m entries.
        unsafe { b.launch(cfg_1d(m)) }?;
        let f = self.device.function(KernelFn::TopkStep)?;
        for (size, stride) in steps {
            let mut b = self.stream.launch_builder(&f);
            b.arg(&prio).arg(&n).arg(&m).arg(&size).arg(&stride).arg(&idx_addr);
            // SAFETY: matches gear_topk_step(f64*, u64, u64, u64, u64, u32*);
            // prio holds n entries, idx m; pairs (i, i + stride) lie in [0, m).
            unsafe { b.launch(cfg_1d(m / 2)) }?;
        }
        let f = self.device.function(KernelFn::TopkEmit)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&prio).arg(&n).arg(&idx_addr).arg(&k).arg(&slot_addr).arg(&prob_addr);
        // SAFETY: matches gear_topk_emit(f64*, u64, u32*, u64, u32*, f64*);
        // k <= n <= m, outputs hold k entries (the caller's obligation).
        unsafe { b.launch(cfg_1d(k)) }?;
        Ok(())
    }
}

impl Drop for DevicePriorities {
    fn drop(&mut self) {
        // Queued kernels use the buffers about to be freed.
        let _ = self.stream.synchronize();
    }
}

/// Host bookkeeping shared by the GPU selectors: which key holds each slot.
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
}

/// Prioritized (proportional) replay with priorities on the GPU:
/// `P(i) = p_i^alpha / sum p^alpha`, importance weights
/// `(N P(i))^-beta / max_j (N P(j))^-beta`; new items without a priority get
/// the largest priority seen so far (1.0 at first). Priority updates are
/// buffered on the host and written in one launch before the next draw.
///
/// Each `sample` call takes one `u64` from the random source as the seed of
/// that call's draws. When every weight is zero (all priorities 0 with
/// `alpha > 0`), draws are uniform over the held items, probability `1/N`,
/// weight 1.
pub struct CudaPrioritized {
    device: CudaDevice,
    prios: Option<DevicePriorities>,
    keys: Keys,
    pending: Vec<(u32, f64)>,
    alpha: f64,
    beta: f64,
    stratified: bool,
    max_priority: f64,
}

impl std::fmt::Debug for CudaPrioritized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPrioritized")
            .field("alpha", &self.alpha)
            .field("beta", &self.beta)
            .field("len", &self.keys.len)
            .finish()
    }
}

impl CudaPrioritized {
    /// A strategy with exponents `alpha` (priority) and `beta` (importance
    /// correction) on `device`. Device memory is allocated in `prepare`.
    pub fn new(device: &CudaDevice, alpha: f64, beta: f64) -> Result<Self> {
        if !(alpha.is_finite() && alpha >= 0.0 && beta.is_finite() && beta >= 0.0) {
            return Err(Error::InvalidArgument(format!("alpha {alpha} and beta {beta} must be finite and >= 0")));
        }
        Ok(CudaPrioritized {
            device: device.clone(),
            prios: None,
            keys: Keys::new(),
            pending: Vec::new(),
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
    pub fn set_beta(&mut self, beta: f64) -> Result<()> {
        if !(beta.is_finite() && beta >= 0.0) {
            return Err(Error::InvalidArgument(format!("beta {beta} must be finite and >= 0")));
        }
        self.beta = beta;
        Ok(())
    }

    /// The device priorities (after `prepare`), e.g. for top-k queries.
    pub fn priorities(&mut self) -> Result<&mut DevicePriorities> {
        self.flush()?;
        self.prios.as_mut().ok_or_else(|| Error::InvalidArgument("prepare was not called".into()))
    }

    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let prios = self.prios.as_mut().ok_or_else(|| Error::InvalidArgument("prepare was not called".into()))?;
        prios.set(&self.pending)?;
        self.pending.clear();
        Ok(())
    }
}

impl Selector for CudaPrioritized {
    fn name(&self) -> &str {
        "cuda-prioritized"
    }

    fn selection_rule(&self) -> Option<SelectionRule> {
        let (alpha, beta, stratified) = (self.alpha, self.beta, self.stratified);
        Some(SelectionRule::Proportional { alpha, beta, stratified })
    }

    fn prepare(&mut self, capacity: u64) -> gear_core::Result<()> {
        self.prios = Some(DevicePriorities::new(&self.device, capacity)?);
        self.keys.prepare(capacity);
        self.pending.clear();
        Ok(())
    }

    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> gear_core::Result<f64> {
        let p = match priority {
            Some(p) => check_priority(p)?,
            None => self.max_priority,
        };
        self.keys.insert(key)?;
        self.max_priority = self.max_priority.max(p);
        self.pending.push((key.slot, p));
        Ok(p)
    }

    fn update(&mut self, key: SlotKey, priority: f64) -> gear_core::Result<()> {
        let p = check_priority(priority)?;
        self.keys.require(key)?;
        self.max_priority = self.max_priority.max(p);
        self.pending.push((key.slot, p));
        Ok(())
    }

    fn remove(&mut self, key: SlotKey) -> gear_core::Result<()> {
        self.keys.remove(key)?;
        self.pending.push((key.slot, -1.0));
        Ok(())
    }

    fn len(&self) -> usize {
        self.keys.len
    }

    fn sample(&mut self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> gear_core::Result<()> {
        if self.keys.len == 0 {
            return Err(gear_core::Error::Empty("no trajectories to sample".into()));
        }
        let seed = rng.next_u64();
        self.flush()?;
        let (alpha, beta, stratified) = (self.alpha, self.beta, self.stratified);
        let prios = self.prios.as_mut().ok_or(gear_core::Error::Unsupported("sample before prepare"))?;
        match prios.sample(n, alpha, beta, seed, stratified) {
            Ok(d) => {
                out.reserve(n);
                for i in 0..d.slots.len() {
                    out.push(Sampled {
                        key: self.keys.key(d.slots[i])?,
                        probability: d.probabilities[i],
                        weight: d.weights[i],
                    });
                }
                Ok(())
            }
            Err(Error::Core(gear_core::Error::Empty(_))) => {
                // All weights zero: uniform over held items, same seed rule.
                let held: Vec<SlotKey> = self
                    .keys
                    .generation
                    .iter()
                    .enumerate()
                    .filter_map(|(s, g)| g.map(|generation| SlotKey { slot: s as u32, generation }))
                    .collect();
                let mut state = seed;
                let p = 1.0 / held.len() as f64;
                for _ in 0..n {
                    let x = gear_core::rng::splitmix64(&mut state);
                    let i = ((u128::from(x) * held.len() as u128) >> 64) as usize;
                    out.push(Sampled { key: held[i], probability: p, weight: 1.0 });
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Top-k (max-priority first) selection with priorities on the GPU: each
/// `sample(n)` returns the `min(n, len)` highest-priority items, best first
/// (ties to the lower slot), repeated from the first if `n > len`;
/// probability and weight 1.
pub struct CudaTopK {
    inner: CudaPrioritized,
}

impl std::fmt::Debug for CudaTopK {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaTopK").field("len", &self.inner.keys.len).finish()
    }
}

impl CudaTopK {
    /// A top-k strategy on `device`.
    pub fn new(device: &CudaDevice) -> Result<Self> {
        Ok(CudaTopK { inner: CudaPrioritized::new(device, 1.0, 0.0)? })
    }
}

impl Selector for CudaTopK {
    fn name(&self) -> &str {
        "cuda-topk"
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
        if self.inner.keys.len == 0 {
            return Err(gear_core::Error::Empty("no trajectories to select".into()));
        }
        if n == 0 {
            return Ok(());
        }
        let want = n.min(self.inner.keys.len);
        let top = self.inner.priorities()?.top_k(want)?;
        if top.is_empty() {
            return Err(gear_core::Error::Selection("device top-k returned nothing for a non-empty set".into()));
        }
        for i in 0..n {
            let (slot, _) = top[i % top.len()];
            out.push(Sampled { key: self.inner.keys.key(slot)?, probability: 1.0, weight: 1.0 });
        }
        Ok(())
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
