//! Running a kernel on a CPU device's worker: the C++ build of the `.cu`
//! sources (`cpu/kernels.cpp`, linked by `build.rs`), called by name with
//! the launch's arguments as 64-bit words. Before the gather runs, every
//! address its row and column tables hold is checked against the device's
//! live allocations and the buffers the launch declared, so a table that
//! names freed or undeclared memory is reported instead of read.

use super::DeviceState;
use crate::kernels::KernelFn;
use gear_core::Access;
use std::sync::Arc;

/// A queued kernel.
pub(crate) struct KernelCall {
    pub(crate) kernel: KernelFn,
    pub(crate) grid: [u32; 3],
    pub(crate) block: [u32; 3],
    pub(crate) words: Vec<u64>,
    /// Allocation starts the launch declared, with the access it declared.
    pub(crate) declared: Vec<(u64, Access)>,
}

#[cfg(not(gear_no_cpu_kernels))]
mod ffi {
    extern "C" {
        /// `cpu/kernels.cpp`: runs kernel `name` over `grid` x `block`.
        pub(super) fn gear_cpu_launch(
            name: *const std::ffi::c_char,
            grid: *const u32,
            block: *const u32,
            args: *const u64,
            nargs: u64,
        ) -> std::ffi::c_int;
    }
}

/// Whether this build has the kernels (a C++ compiler was found).
pub(crate) const KERNELS_BUILT: bool = cfg!(not(gear_no_cpu_kernels));

pub(crate) fn run_kernel(dev: &Arc<DeviceState>, call: &KernelCall, what: &str) {
    if call.kernel == KernelFn::Gather {
        if let Err(m) = check_gather(dev, call) {
            return dev.report_from_worker(format!("{what}: {m}; the kernel was not run"));
        }
    }
    for (i, (&w, p)) in call.words.iter().zip(call.kernel.params()).enumerate() {
        let pointer = matches!(p, crate::kernels::Param::In | crate::kernels::Param::Out);
        if pointer && w != 0 {
            if let Err(m) = dev.check_live(w, 1) {
                return dev.report_from_worker(format!("{what}: argument {i}: {m}; the kernel was not run"));
            }
        }
    }
    call_kernel(dev, call, what);
}

#[cfg(not(gear_no_cpu_kernels))]
fn call_kernel(dev: &Arc<DeviceState>, call: &KernelCall, what: &str) {
    let name = std::ffi::CString::new(call.kernel.name()).expect("kernel names have no NUL");
    // SAFETY: the name is NUL-terminated; grid and block are three words
    // each; `words` holds the kernel's arguments in order (their count is
    // checked by the callee against the kernel's, and their types against
    // KernelFn::params when queued); every pointer argument lies in a live
    // allocation (checked above and at enqueue), and the gather's indirect
    // addresses were checked by `check_gather`. What remains is the
    // caller's `Device::launch` contract (sizes fit the scalars).
    let rc = unsafe {
        ffi::gear_cpu_launch(
            name.as_ptr(),
            call.grid.as_ptr(),
            call.block.as_ptr(),
            call.words.as_ptr(),
            call.words.len() as u64,
        )
    };
    if rc != 0 {
        dev.report_from_worker(format!("{what}: the CPU kernels refused the launch (code {rc})"));
    }
}

#[cfg(gear_no_cpu_kernels)]
fn call_kernel(dev: &Arc<DeviceState>, _call: &KernelCall, what: &str) {
    dev.report_from_worker(format!("{what}: built without the CPU kernels"));
}

/// Reads `n` words at device address `addr` after checking they lie in a
/// live allocation.
fn words(dev: &DeviceState, addr: u64, n: u64) -> Result<Vec<u64>, String> {
    dev.check_live(addr, n * 8)?;
    // SAFETY: `addr..addr+8n` lies in a live allocation of this device
    // (checked), which the stream's order makes stable now (the tracker
    // checked at enqueue that no unordered work writes it).
    Ok((0..n).map(|i| unsafe { std::ptr::read_unaligned((addr + 8 * i) as *const u64) }).collect())
}

/// Checks every range `gear_gather` will read and write, from its tables.
fn check_gather(dev: &DeviceState, call: &KernelCall) -> Result<(), String> {
    let a = &call.words;
    let (row_src, row_len, cols, rows, ncols) = (a[0], a[1], a[2], a[3], a[4]);
    let window = gear_core::WindowSpec {
        offset: a[5] as i64,
        len: a[6],
        pad: if a[7] as u32 != 0 { gear_core::Pad::Head } else { gear_core::Pad::Tail },
    };
    let src = words(dev, row_src, rows)?;
    let len = words(dev, row_len, rows)?;
    let cols = words(dev, cols, 3 * ncols)?;
    let declared = |start: u64, need: Access| {
        call.declared.iter().any(|&(s, acc)| s == start && (acc == need || acc == Access::Write))
    };
    for c in 0..ncols as usize {
        let (dst, s) = (cols[3 * c + 2], cols[3 * c + 1]);
        let bytes = rows * window.len * s;
        if bytes > 0 {
            let (start, _) = dev.live_range(dst, bytes).map_err(|m| format!("column {c}'s batch buffer: {m}"))?;
            if !declared(start, Access::Write) {
                return Err(format!("column {c}'s batch buffer at {dst:#x} was not declared written by the launch"));
            }
        }
    }
    for r in 0..rows as usize {
        let w = window.resolve(len[r]);
        if w.steps == 0 {
            continue;
        }
        for c in 0..ncols as usize {
            let (off, s) = (cols[3 * c], cols[3 * c + 1]);
            let from = src[r] + off + w.src_step * s;
            let (start, _) = dev.live_range(from, w.steps * s).map_err(|m| format!("row {r} column {c}: {m}"))?;
            if !declared(start, Access::Read) {
                return Err(format!("row {r} column {c} reads {from:#x}, in a buffer the launch did not declare"));
            }
        }
    }
    Ok(())
}
