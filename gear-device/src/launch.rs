//! Launching the crate's kernels on any device: arguments checked against
//! the kernel's parameter list first ([`KernelFn::params`]), and the grid
//! shapes the kernels are written for.

use crate::kernels::{KernelFn, Param};
use crate::plan;
use gear_core::{Device, DeviceApi, Indirect, KernelArg, Launch};

/// Whether `args` fit `kernel`'s parameters in number and kind.
pub fn check_args(kernel: KernelFn, args: &[KernelArg]) -> Result<(), String> {
    let params = kernel.params();
    if args.len() != params.len() {
        return Err(format!("{} takes {} arguments, {} given", kernel.name(), params.len(), args.len()));
    }
    for (i, (a, p)) in args.iter().zip(params).enumerate() {
        let fits = matches!(
            (a, p),
            (KernelArg::U32(_), Param::U32)
                | (KernelArg::U64(_), Param::U64)
                | (KernelArg::I64(_), Param::I64)
                | (KernelArg::F64(_), Param::F64)
                | (KernelArg::Ptr(_, gear_core::Access::Read), Param::In)
                | (KernelArg::Ptr(_, gear_core::Access::Write), Param::Out)
        );
        if !fits {
            return Err(format!("{} argument {i}: {a:?} given for a {p:?} parameter", kernel.name()));
        }
    }
    Ok(())
}

/// A 1-D launch over `items` threads' worth of work (grid-stride loops).
pub fn grid_1d(items: u64) -> ([u32; 3], [u32; 3]) {
    ([plan::grid_1d(items), 1, 1], [plan::BLOCK, 1, 1])
}

/// Queues `kernel` on `stream` after checking its arguments.
///
/// # Safety
/// [`Device::launch`]'s contract.
pub unsafe fn launch<A: DeviceApi>(
    device: &A::Device,
    stream: &A::Stream,
    kernel: KernelFn,
    (grid, block): ([u32; 3], [u32; 3]),
    args: &[KernelArg],
    indirect: &[Indirect],
) -> Result<(), A::Error> {
    check_args(kernel, args).map_err(|m| A::Error::from(gear_core::Error::Device(m)))?;
    let module = device.module()?;
    let l = Launch { kernel: kernel.name(), grid, block, args, indirect };
    // SAFETY: forwarded to the caller; the argument list was checked
    // against the kernel's parameters.
    unsafe { device.launch(stream, &module, &l) }
}
