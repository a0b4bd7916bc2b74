//! Helpers of gear-cuda's integration tests: gear-device's (skips, CPU
//! references of the kernels' contracts, test regions), included by path so
//! both crates share one copy, and the CUDA ones (NVRTC and device probes).
#![allow(dead_code)]

#[path = "../../../gear-device/tests/common/mod.rs"]
mod generic;

pub use generic::*;
use std::path::PathBuf;

/// The NVRTC directory to use: `GEAR_NVRTC_DIR`, else the one
/// `gear-cuda/ci/install-nvrtc.sh` installs into by default, if present.
pub fn nvrtc_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("GEAR_NVRTC_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.ci/nvrtc/nvidia/cu13/lib");
    default.join("libnvrtc.so.13").exists().then_some(default)
}

/// NVRTC, or `None` after printing "skipped: NVRTC not found" (a failure
/// under GEAR_REQUIRE_NVRTC=1).
pub fn nvrtc_or_skip() -> Option<&'static gear_cuda::probe::NvrtcInfo> {
    match gear_cuda::probe::nvrtc_from(nvrtc_dir().as_deref()) {
        Ok(info) => Some(info),
        Err(e) => {
            skip("GEAR_REQUIRE_NVRTC", "NVRTC not found", &e.to_string());
            None
        }
    }
}

/// Device 0 with every kernel loaded, or `None` after printing
/// "skipped: no CUDA device" (a failure under GEAR_REQUIRE_GPU=1). NVRTC is
/// needed only when the crate was built without it (no embedded kernel
/// images); when present it is loaded from [`nvrtc_dir`].
pub fn device_or_skip() -> Option<gear_cuda::CudaDevice> {
    if let Err(e) = gear_cuda::probe::driver() {
        skip("GEAR_REQUIRE_GPU", "no CUDA device", &e.to_string());
        return None;
    }
    // The first NVRTC probe of the process decides where it is loaded from;
    // a missing NVRTC matters only if the kernels need it (warm_up says).
    let _ = gear_cuda::probe::nvrtc_from(nvrtc_dir().as_deref());
    match gear_cuda::CudaDevice::new(0).and_then(|d| d.warm_up().map(|()| d)) {
        Ok(d) => Some(d),
        Err(e) => {
            skip("GEAR_REQUIRE_GPU", "no CUDA device", &e.to_string());
            None
        }
    }
}
