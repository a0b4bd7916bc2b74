//! Helpers shared by gear-device's integration tests (and, by path, by
//! gear-cuda's): run-time skips with a printed reason (turned into failures
//! by GEAR_REQUIRE_* variables), CPU references of the kernels' contracts,
//! and a CPU device to run them on.
#![allow(dead_code)]

pub mod shim;

use gear_core::{BatchLayout, GatherRow, Layout};

/// Whether `var` is set to `1`.
pub fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// Prints the skip, or panics when `var=1` asks for the test to run.
pub fn skip(var: &str, what: &str, reason: &str) {
    if required(var) {
        panic!("{var}=1 but {what}: {reason}");
    }
    println!("skipped: {what} ({reason})");
}

/// A CPU device with `options`, or `None` after printing "skipped: no C++
/// compiler" (a failure under GEAR_REQUIRE_CXX=1): the crate was built
/// without its kernels.
pub fn cpu_device_with(options: gear_device::CpuDeviceOptions) -> Option<gear_device::CpuDevice> {
    match gear_device::CpuDevice::with_options(options) {
        Ok(d) => Some(d),
        Err(e) => {
            skip("GEAR_REQUIRE_CXX", "no C++ compiler for the CPU device's kernels", &e.to_string());
            None
        }
    }
}

/// A CPU device whose misuse panics (the default), or a printed skip.
pub fn cpu_device() -> Option<gear_device::CpuDevice> {
    cpu_device_with(gear_device::CpuDeviceOptions::default())
}

/// The collector contract (gear-core/src/collect.rs) restated on the CPU:
/// per requested column a zeroed `[rows, window.len, step]` buffer with the
/// window's steps copied where `WindowSpec::resolve` places them, and the
/// valid lengths. `data` is the table's data area.
pub fn gather_reference(
    layout: &Layout,
    data: &[u8],
    batch: &BatchLayout,
    rows: &[GatherRow],
) -> (Vec<Vec<u8>>, Vec<u64>) {
    let lengths: Vec<u64> = rows.iter().map(|r| r.resolve(&batch.window()).steps).collect();
    let cols = batch
        .columns()
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let s = batch.step_bytes()[i] as usize;
            let row_bytes = batch.row_bytes(i) as usize;
            let mut out = vec![0u8; row_bytes * rows.len()];
            for (r, row) in rows.iter().enumerate() {
                let w = row.resolve(&batch.window());
                let src = layout.range(u64::from(row.slot), c, w.src_step, w.steps);
                let dst = r * row_bytes + w.dst_step as usize * s;
                out[dst..dst + (src.end - src.start) as usize]
                    .copy_from_slice(&data[src.start as usize..src.end as usize]);
            }
            out
        })
        .collect();
    (cols, lengths)
}

/// The (d+1)-th splitmix64 output from `seed`, as the sampling kernel draws.
pub fn splitmix_at(seed: u64, d: u64) -> u64 {
    let mut s = seed;
    let mut x = 0;
    for _ in 0..=d {
        x = gear_core::rng::splitmix64(&mut s);
    }
    x
}

/// Pearson's chi-square statistic of `counts` against probabilities `p`
/// (bins with expected count 0 must have count 0, else infinity).
pub fn chi_square(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            if e == 0.0 {
                if c == 0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (c as f64 - e).powi(2) / e
            }
        })
        .sum()
}

/// A generous upper bound for a chi-square variable with `dof` degrees of
/// freedom: mean + 6 standard deviations (false alarm rate far below 1e-6).
pub fn chi_square_bound(dof: usize) -> f64 {
    let k = dof as f64;
    k + 6.0 * (2.0 * k).sqrt()
}

/// A test stand-in for a shared-memory table region: an anonymous
/// `MAP_SHARED` mapping (what `/dev/shm` gives actor processes), page
/// aligned and zeroed.
pub struct SharedMapping {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value and valid until drop; access
// is synchronised by its users (the MemoryRegion contract).
unsafe impl Send for SharedMapping {}
// SAFETY: see Send.
unsafe impl Sync for SharedMapping {}

impl SharedMapping {
    pub fn new(len: usize) -> Self {
        // SAFETY: an anonymous mapping with no address hint; the result is
        // checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap failed");
        SharedMapping { ptr: std::ptr::NonNull::new(p.cast()).unwrap(), len }
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: `ptr` points to `len` readable, writable, page-aligned bytes
// until drop.
unsafe impl gear_core::MemoryRegion for SharedMapping {
    fn kind(&self) -> gear_core::MemoryKind {
        gear_core::MemoryKind::Shared
    }
    fn len(&self) -> u64 {
        self.len as u64
    }
    fn alignment(&self) -> u64 {
        4096
    }
    fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
        Some(self.ptr)
    }
    fn name(&self) -> Option<&str> {
        Some("test-shared-mapping")
    }
}

/// Fills a table's whole data area with bytes from `seed` and returns a copy.
pub fn fill_table<R: gear_core::MemoryRegion>(table: &gear_core::TableRegion<R>, seed: u64) -> Vec<u8> {
    use gear_core::RandomSource;
    let mut rng = gear_core::Xoshiro256::seed_from_u64(seed);
    let n = table.layout().total_bytes() as usize;
    let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
    // SAFETY: the data area has `n` bytes; no other party writes in tests.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), table.data_ptr().as_ptr(), n) };
    bytes
}

/// Commits every slot of a table as a full-length trajectory; returns keys.
pub fn commit_all<R: gear_core::MemoryRegion>(table: &gear_core::TableRegion<R>) -> Vec<gear_core::SlotKey> {
    (0..table.spec().capacity() as u32)
        .map(|slot| {
            let rec = table.slot(slot).unwrap();
            let key = rec.begin_write(slot, 1, u64::from(slot), 1.0).unwrap();
            rec.publish_len(key, table.spec().max_len()).unwrap();
            rec.commit(key).unwrap();
            key
        })
        .collect()
}
