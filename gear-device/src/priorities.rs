//! [`DevicePriorities`]: one `f64` priority per table slot in device memory
//! (negative: the slot holds nothing), proportional draws and top-k by
//! kernel.
//!
//! Updates are batched and written by a scatter kernel after resolving
//! duplicate slots on the host: the last update of a slot wins, as a
//! sequential loop would leave it ([`crate::plan::last_write_wins`]).
//! Sampling recomputes f64 prefix sums of `p^alpha` from scratch when
//! priorities changed (no incremental drift, the failure of f32 sum trees)
//! and draws with a counter-based generator keyed by a seed and the draw
//! index, so a seed fixes the draws (see `kernels/sample.cu`). A zero
//! priority has no mass whatever `alpha` (`0^0` would be 1), as the host
//! strategies give it none.

use crate::kernels::KernelFn;
use crate::launch::{grid_1d, launch};
use crate::plan;
use gear_core::{Access, Device, DeviceApi, DeviceBuffer, KernelArg};

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

pub(crate) fn f64s(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_f64s(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

fn refuse<A: DeviceApi>(msg: impl Into<String>) -> A::Error {
    A::Error::from(gear_core::Error::Device(msg.into()))
}

/// Grow-only device scratch buffer. Before a smaller buffer is replaced
/// (freed), work queued on `stream` that may use it is waited for.
pub(crate) fn ensure<A: DeviceApi>(
    mem: &mut Option<A::Buffer>,
    device: &A::Device,
    stream: &A::Stream,
    bytes: u64,
) -> Result<u64, A::Error> {
    if mem.as_ref().is_none_or(|m| m.len() < bytes) {
        if mem.is_some() {
            device.stream_synchronize(stream)?;
        }
        *mem = Some(device.alloc(bytes.max(8))?);
    }
    Ok(mem.as_ref().expect("just ensured").device_addr())
}

fn read_back<A: DeviceApi>(device: &A::Device, mem: &Option<A::Buffer>, bytes: u64) -> Result<Vec<u8>, A::Error> {
    let mut v = vec![0u8; bytes as usize];
    device.read(mem.as_ref().expect("ensured"), 0, &mut v)?;
    Ok(v)
}

fn check_exponents<A: DeviceApi>(alpha: f64, beta: f64) -> Result<(), A::Error> {
    if alpha.is_finite() && alpha >= 0.0 && beta.is_finite() && beta >= 0.0 {
        Ok(())
    } else {
        Err(refuse::<A>(format!("alpha {alpha} and beta {beta} must be finite and >= 0")))
    }
}

/// One `f64` priority per table slot, in device memory.
pub struct DevicePriorities<A: DeviceApi> {
    device: A::Device,
    stream: A::Stream,
    capacity: u64,
    prio: A::Buffer,
    prefix: A::Buffer,
    chunk_sum: A::Buffer,
    chunk_min: A::Buffer,
    chunk_off: A::Buffer,
    stats: A::Buffer,
    /// The `alpha` that `prefix`/`stats` were computed with; `None` when
    /// priorities changed since.
    prefix_alpha: Option<f64>,
    upd_idx: Option<A::Buffer>,
    upd_val: Option<A::Buffer>,
    out_slot: Option<A::Buffer>,
    out_prob: Option<A::Buffer>,
    out_weight: Option<A::Buffer>,
    /// Scratch of the top-k sorting network: m slot indices.
    topk_idx: Option<A::Buffer>,
}

impl<A: DeviceApi> std::fmt::Debug for DevicePriorities<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePriorities").field("capacity", &self.capacity).finish()
    }
}

impl<A: DeviceApi> DevicePriorities<A> {
    /// Priorities for `capacity` slots, all empty, on the device's stream.
    pub fn new(device: &A::Device, capacity: u64) -> Result<Self, A::Error> {
        Self::on_stream(device, capacity, device.stream().clone())
    }

    /// Priorities for `capacity` slots, all empty, with their work queued
    /// on `stream` (which must belong to the device).
    pub fn on_stream(device: &A::Device, capacity: u64, stream: A::Stream) -> Result<Self, A::Error> {
        if capacity == 0 || capacity > u64::from(u32::MAX) {
            return Err(refuse::<A>(format!("priority capacity {capacity} not in 1..=2^32-1")));
        }
        if !device.owns_stream(&stream) {
            return Err(refuse::<A>("stream belongs to another device"));
        }
        let (_, nchunks) = plan::prio_chunks(capacity);
        let prio = device.alloc(capacity * 8)?;
        // Empty slots hold -1.0 (weight 0).
        device.write(&stream, &prio, 0, &f64s(&vec![-1.0; capacity as usize]))?;
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
        Ok(me)
    }

    /// Slots covered.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The stream this work is queued on.
    pub fn stream(&self) -> &A::Stream {
        &self.stream
    }

    /// Writes a batch of `(slot, priority)` updates; a negative priority
    /// empties the slot. Duplicate slots: the last update wins.
    pub fn set(&mut self, updates: &[(u32, f64)]) -> Result<(), A::Error> {
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
        let idx_addr = ensure::<A>(&mut self.upd_idx, &self.device, &self.stream, m * 4)?;
        let val_addr = ensure::<A>(&mut self.upd_val, &self.device, &self.stream, m * 8)?;
        self.device.write(&self.stream, self.upd_idx.as_ref().expect("ensured"), 0, &idx)?;
        self.device.write(&self.stream, self.upd_val.as_ref().expect("ensured"), 0, &f64s(&val))?;
        let args = [
            KernelArg::Ptr(idx_addr, Access::Read),
            KernelArg::Ptr(val_addr, Access::Read),
            KernelArg::U64(m),
            KernelArg::Ptr(self.prio.device_addr(), Access::Write),
        ];
        // SAFETY: gear_scatter_f64(u32*, f64*, u64, f64*); the index and
        // value buffers hold `m` entries written on this stream just before;
        // every index is < capacity (checked above) and distinct
        // (last_write_wins), so writes stay in `prio` and never race.
        unsafe { launch::<A>(&self.device, &self.stream, KernelFn::ScatterF64, grid_1d(m), &args, &[]) }?;
        self.prefix_alpha = None;
        Ok(())
    }

    /// All priorities, copied to the host (waits for queued work).
    pub fn to_host(&self) -> Result<Vec<f64>, A::Error> {
        self.device.stream_synchronize(&self.stream)?;
        let mut v = vec![0u8; self.prio.len() as usize];
        self.device.read(&self.prio, 0, &mut v)?;
        Ok(from_f64s(&v))
    }

    /// The total of the weights `p^alpha` and the smallest positive one
    /// (-1 when none), recomputing the prefix sums if priorities or alpha
    /// changed. Blocks until they are on the host.
    pub fn mass(&mut self, alpha: f64) -> Result<(f64, f64), A::Error> {
        self.queue_prefix(alpha)?;
        self.device.stream_synchronize(&self.stream)?;
        let mut v = [0u8; 16];
        self.device.read(&self.stats, 0, &mut v)?;
        let s = from_f64s(&v);
        Ok((s[0], s[1]))
    }

    /// Queues the prefix sums of `p^alpha` (and the total and smallest
    /// positive weight in device memory) if priorities or alpha changed.
    fn queue_prefix(&mut self, alpha: f64) -> Result<(), A::Error> {
        if self.prefix_alpha == Some(alpha) {
            return Ok(());
        }
        let n = self.capacity;
        let (chunk_len, nchunks) = plan::prio_chunks(n);
        let prio = self.prio.device_addr();
        let (cs, cm, co) = (self.chunk_sum.device_addr(), self.chunk_min.device_addr(), self.chunk_off.device_addr());
        let (prefix, stats) = (self.prefix.device_addr(), self.stats.device_addr());
        use Access::{Read, Write};
        let chunks = [
            KernelArg::Ptr(prio, Read),
            KernelArg::U64(n),
            KernelArg::F64(alpha),
            KernelArg::U64(chunk_len),
            KernelArg::U64(nchunks),
            KernelArg::Ptr(cs, Write),
            KernelArg::Ptr(cm, Write),
        ];
        let scan = [
            KernelArg::Ptr(cs, Read),
            KernelArg::Ptr(cm, Read),
            KernelArg::U64(nchunks),
            KernelArg::Ptr(co, Write),
            KernelArg::Ptr(stats, Write),
        ];
        let prefix_args = [
            KernelArg::Ptr(prio, Read),
            KernelArg::U64(n),
            KernelArg::F64(alpha),
            KernelArg::U64(chunk_len),
            KernelArg::U64(nchunks),
            KernelArg::Ptr(co, Read),
            KernelArg::Ptr(prefix, Write),
        ];
        let one = ([1, 1, 1], [1, 1, 1]);
        let (d, s) = (&self.device, &self.stream);
        // SAFETY: each list matches its kernel (checked by `launch`);
        // `prio` and `prefix` have n entries, the chunk buffers `nchunks`
        // (allocated for prio_chunks(capacity)), `stats` two; the chunks
        // cover [0, n).
        unsafe {
            launch::<A>(d, s, KernelFn::PrioChunks, grid_1d(nchunks), &chunks, &[])?;
            launch::<A>(d, s, KernelFn::PrioScan, one, &scan, &[])?;
            launch::<A>(d, s, KernelFn::PrioPrefix, grid_1d(nchunks), &prefix_args, &[])?;
        }
        self.prefix_alpha = Some(alpha);
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
    /// The three buffers are device allocations of this device holding at
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
    ) -> Result<(), A::Error> {
        check_exponents::<A>(alpha, beta)?;
        self.queue_prefix(alpha)?;
        if draws == 0 {
            return Ok(());
        }
        use Access::{Read, Write};
        let args = [
            KernelArg::Ptr(self.prio.device_addr(), Read),
            KernelArg::Ptr(self.prefix.device_addr(), Read),
            KernelArg::U64(self.capacity),
            KernelArg::F64(alpha),
            KernelArg::F64(beta),
            KernelArg::Ptr(self.stats.device_addr(), Read),
            KernelArg::U64(seed),
            KernelArg::U64(draws),
            KernelArg::U32(u32::from(stratified)),
            KernelArg::Ptr(out_slot, Write),
            KernelArg::Ptr(out_prob, Write),
            KernelArg::Ptr(out_weight, Write),
        ];
        // SAFETY: gear_sample_draws's arguments (checked by `launch`);
        // prio/prefix have `capacity` entries (prefix queued above for this
        // alpha), stats two; the kernel checks the total itself; the outputs
        // hold `draws` entries (the caller's obligation).
        unsafe { launch::<A>(&self.device, &self.stream, KernelFn::SampleDraws, grid_1d(draws), &args, &[]) }
    }

    /// `n` proportional draws with `P(i) = p_i^alpha / sum p^alpha`,
    /// importance weights with exponent `beta`, fixed by `seed`; with
    /// `stratified`, draw `d` comes from the `d`-th of `n` equal segments.
    /// Errors with `Empty` when the weights sum to zero. Blocks until the
    /// draws are on the host.
    pub fn sample(
        &mut self,
        n: usize,
        alpha: f64,
        beta: f64,
        seed: u64,
        stratified: bool,
    ) -> Result<DeviceDraws, A::Error> {
        check_exponents::<A>(alpha, beta)?;
        let (total, _) = self.mass(alpha)?;
        if total.is_nan() || total <= 0.0 {
            return Err(gear_core::Error::Empty("every priority weight is zero".into()).into());
        }
        if !total.is_finite() {
            return Err(refuse::<A>(format!("priority weights sum to {total} (overflow)")));
        }
        if n == 0 {
            return Ok(DeviceDraws::default());
        }
        let draws = n as u64;
        let slot_addr = ensure::<A>(&mut self.out_slot, &self.device, &self.stream, draws * 4)?;
        let prob_addr = ensure::<A>(&mut self.out_prob, &self.device, &self.stream, draws * 8)?;
        let weight_addr = ensure::<A>(&mut self.out_weight, &self.device, &self.stream, draws * 8)?;
        // SAFETY: the outputs were just sized for `draws` entries and live
        // in `self`, which waits for the stream before freeing them.
        unsafe { self.queue_draws(draws, alpha, beta, seed, stratified, slot_addr, prob_addr, weight_addr) }?;
        self.device.stream_synchronize(&self.stream)?;
        let slots = read_back::<A>(&self.device, &self.out_slot, draws * 4)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
            .collect();
        Ok(DeviceDraws {
            slots,
            probabilities: from_f64s(&read_back::<A>(&self.device, &self.out_prob, draws * 8)?),
            weights: from_f64s(&read_back::<A>(&self.device, &self.out_weight, draws * 8)?),
        })
    }

    /// The `k` highest priorities as `(slot, priority)`, best first; ties go
    /// to the lower slot. Fewer when fewer slots are occupied. Blocks until
    /// they are on the host.
    pub fn top_k(&mut self, k: usize) -> Result<Vec<(u32, f64)>, A::Error> {
        if k == 0 {
            return Ok(Vec::new());
        }
        let k = (k as u64).min(self.capacity);
        let slot_addr = ensure::<A>(&mut self.out_slot, &self.device, &self.stream, k * 4)?;
        let prob_addr = ensure::<A>(&mut self.out_prob, &self.device, &self.stream, k * 8)?;
        // SAFETY: both outputs were just sized for `k` entries and live in
        // `self`, which waits for the stream before freeing them.
        unsafe { self.queue_top_k(k, slot_addr, prob_addr) }?;
        self.device.stream_synchronize(&self.stream)?;
        let mut slots = read_back::<A>(&self.device, &self.out_slot, k * 4)?;
        let mut prios = read_back::<A>(&self.device, &self.out_prob, k * 8)?;
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
    /// Both buffers are device allocations of this device holding at least
    /// `k` entries, alive until the stream has passed the launches.
    pub(crate) unsafe fn queue_top_k(&mut self, k: u64, out_slot: u64, out_prio: u64) -> Result<(), A::Error> {
        let n = self.capacity;
        if k == 0 || k > n {
            return Err(refuse::<A>(format!("top-{k} of {n} slots")));
        }
        let (m, steps) = plan::topk_network(n);
        let idx = ensure::<A>(&mut self.topk_idx, &self.device, &self.stream, m * 4)?;
        let prio = self.prio.device_addr();
        let (d, s) = (&self.device, &self.stream);
        use Access::{Read, Write};
        // SAFETY: every argument list below matches its kernel (checked by
        // `launch`); prio holds n entries, idx m; pairs (i, i + stride) lie
        // in [0, m); k <= n <= m and the outputs hold k entries (the
        // caller's obligation).
        unsafe {
            let init = [KernelArg::U64(n), KernelArg::U64(m), KernelArg::Ptr(idx, Write)];
            launch::<A>(d, s, KernelFn::TopkInit, grid_1d(m), &init, &[])?;
            for (size, stride) in steps {
                let step = [
                    KernelArg::Ptr(prio, Read),
                    KernelArg::U64(n),
                    KernelArg::U64(m),
                    KernelArg::U64(size),
                    KernelArg::U64(stride),
                    KernelArg::Ptr(idx, Write),
                ];
                launch::<A>(d, s, KernelFn::TopkStep, grid_1d(m / 2), &step, &[])?;
            }
            let emit = [
                KernelArg::Ptr(prio, Read),
                KernelArg::U64(n),
                KernelArg::Ptr(idx, Read),
                KernelArg::U64(k),
                KernelArg::Ptr(out_slot, Write),
                KernelArg::Ptr(out_prio, Write),
            ];
            launch::<A>(d, s, KernelFn::TopkEmit, grid_1d(k), &emit, &[])?;
        }
        Ok(())
    }
}

impl<A: DeviceApi> Drop for DevicePriorities<A> {
    fn drop(&mut self) {
        // Queued kernels use the buffers about to be freed.
        let _ = self.device.stream_synchronize(&self.stream);
    }
}
