//! Tests that need a CUDA device: gear-device's device suite
//! (`gear-device/tests/suite/mod.rs`, the same tests CI runs on the CPU
//! device) on device 0, and what only CUDA has. Without a device (or
//! without NVRTC, when no kernel image is embedded) each test prints
//! "skipped: no CUDA device" and passes, unless GEAR_REQUIRE_GPU=1, where a
//! skip fails. See gear-cuda/README.md for running them on a GPU machine.

mod common;
#[path = "../../gear-device/tests/suite/mod.rs"]
mod suite;

use gear_core::{MemoryKind, MemoryRegion};

device_suite!(gear_cuda::CudaApi, common::device_or_skip());

#[test]
fn zeroed_allocations_and_read_only_registration() {
    let Some(dev) = common::device_or_skip() else { return };
    let z = dev.alloc_zeroed(4097).unwrap();
    assert!(z.to_vec().unwrap().iter().all(|&b| b == 0));
    let spec = suite::spec();
    let bytes = gear_core::RegionLayout::for_spec(&spec).unwrap().total_bytes as usize;
    let reg = dev.register(common::SharedMapping::new(bytes)).unwrap();
    println!("registered read-only: {}", reg.is_read_only());
    assert_eq!(reg.kind(), MemoryKind::Shared);
}

#[test]
fn every_kernel_loads_on_this_device() {
    let Some(dev) = common::device_or_skip() else { return };
    dev.warm_up().unwrap();
    println!("{dev:?}");
}

#[test]
fn bench_runs_and_both_gathers_agree() {
    let Some(_) = common::device_or_skip() else { return };
    let params = gear_cuda::bench::CudaBenchParams {
        step_bytes: vec![4096, 12, 3],
        max_len: 32,
        capacity: 64,
        batch: 32,
        window: 16,
        iters: 3,
        warmup: 1,
        ..Default::default()
    };
    let report = gear_cuda::bench::run_bench(&params).unwrap();
    println!("{report}");
    assert!(report.outputs_match);
    assert!(report.zero_copy.gb_per_s > 0.0 && report.device_cache.gb_per_s > 0.0);
}
