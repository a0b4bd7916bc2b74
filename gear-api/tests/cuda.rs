//! The CUDA sampler through the public API. Without a CUDA driver,
//! `cuda_sampler` must fail with a clear "backend unavailable" error (never
//! a panic). With a device, the device sampler's suite
//! (`tests/sampler_suite/mod.rs`, the same tests `tests/device.rs` runs on
//! the CPU device in every CI run) runs on device 0: batches gathered on
//! the GPU must equal, byte for byte, what the CPU collector gathers for
//! the same keys and what the CPU `Sampler` returned for them. Device tests
//! print "skipped: no CUDA device" and pass without one, unless
//! GEAR_REQUIRE_GPU=1. `cargo xtask gpu-test` packs them.
#![cfg(feature = "cuda")]

mod sampler_suite;

use gear_api::{CudaSampler, CudaSamplerOptions, Error, ReplayTable, SampleConfig};
use gear_core::WindowSpec;
use sampler_suite::{spec, write_traj};
use std::path::PathBuf;

fn required() -> bool {
    std::env::var("GEAR_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

fn skip(reason: &str) {
    if required() {
        panic!("GEAR_REQUIRE_GPU=1 but no CUDA device: {reason}");
    }
    println!("skipped: no CUDA device ({reason})");
}

/// The NVRTC directory: `GEAR_NVRTC_DIR`, else where
/// `gear-cuda/ci/install-nvrtc.sh` installs it, if present.
fn nvrtc_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("GEAR_NVRTC_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.ci/nvrtc/nvidia/cu13/lib");
    default.join("libnvrtc.so.13").exists().then_some(default)
}

/// Device 0 with its kernels loaded, or `None` after printing the skip.
fn device_or_skip() -> Option<gear_cuda::CudaDevice> {
    if let Err(e) = gear_cuda::probe::driver() {
        skip(&e.to_string());
        return None;
    }
    // The first NVRTC probe of the process decides where it is loaded from;
    // NVRTC is needed only without build-time kernel images.
    let _ = gear_cuda::probe::nvrtc_from(nvrtc_dir().as_deref());
    match gear_cuda::CudaDevice::new(0).and_then(|d| d.warm_up().map(|()| d)) {
        Ok(d) => Some(d),
        Err(e) => {
            skip(&e.to_string());
            None
        }
    }
}

sampler_suite!(gear_cuda::CudaApi, device_or_skip());

#[test]
fn without_a_driver_cuda_sampler_is_a_clear_error() {
    if gear_cuda::probe::has_device() {
        println!("skipped: a CUDA device is present, nothing to check here");
        return;
    }
    let table = ReplayTable::builder(spec(8, 4)).build().unwrap();
    write_traj(&table, 1, 5);
    for options in [CudaSamplerOptions::default(), CudaSamplerOptions::new(3)] {
        let err = table.cuda_sampler(SampleConfig::new(2, WindowSpec::last(4)), options).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("backend: cuda backend unavailable: "), "{msg}");
        assert!(msg.contains("driver") || msg.contains("device"), "the reason is given: {msg}");
        let Error::Backend(inner) = &err else { panic!("expected a backend error, got {err:?}") };
        let cuda = inner.downcast_ref::<gear_cuda::Error>().expect("the gear-cuda error is kept");
        assert!(matches!(cuda, gear_cuda::Error::BackendUnavailable(_)), "{cuda:?}");
    }
    // The table is unharmed: the CPU path still samples.
    let mut sampler = table.sampler(SampleConfig::new(2, WindowSpec::last(4))).unwrap();
    assert_eq!(sampler.sample().unwrap().lengths(), &[4, 4]);
}

#[test]
fn cuda_sampler_is_send() {
    fn send<T: Send>() {}
    send::<CudaSampler>();
    send::<CudaSamplerOptions>();
}

/// `cuda_sampler` opens the device by ordinal and is the device sampler on
/// CUDA: the same batches as `device_sampler` with a handle of its own.
#[test]
fn cuda_sampler_opens_the_device_by_ordinal() {
    let Some(_) = device_or_skip() else { return };
    let table = ReplayTable::builder(spec(12, 8)).build().unwrap();
    for id in 0..8u8 {
        write_traj(&table, id, 12);
    }
    let mut s = table.cuda_sampler(SampleConfig::new(4, WindowSpec::last(3)), CudaSamplerOptions::new(0)).unwrap();
    assert_eq!(s.sample().unwrap().rows(), 4);
    let err =
        table.cuda_sampler(SampleConfig::new(4, WindowSpec::last(3)), CudaSamplerOptions::new(1_000)).unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err}");
}
