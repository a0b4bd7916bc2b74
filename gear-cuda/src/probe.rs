//! Probes for the CUDA driver and NVRTC, run once per process.
//!
//! cudarc loads `libcuda` and `libnvrtc` lazily and panics when a library
//! or a symbol is missing. Every path into cudarc in this crate goes through
//! [`driver`] or [`nvrtc`] first; they check for the library without
//! panicking, call a few entry points inside `catch_unwind` (a driver too
//! old for the CUDA 13 bindings lacks symbols), and turn every failure into
//! [`Error::BackendUnavailable`] with the reason.
//!
//! NVRTC is found by the dynamic loader's usual search (`LD_LIBRARY_PATH`,
//! the system cache) under the names cudarc tries (`libnvrtc.so`,
//! `libnvrtc.so.13`, ...). Setting `GEAR_NVRTC_DIR` to a directory holding
//! `libnvrtc.so.*` (such as the one `gear-cuda/ci/install-nvrtc.sh` prints)
//! preloads the library and its builtins from there first; this works even
//! though the loader only reads `LD_LIBRARY_PATH` at process start.

use crate::error::{Error, Result};
use crate::ffi;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Environment variable naming a directory to preload NVRTC from.
pub const NVRTC_DIR_ENV: &str = "GEAR_NVRTC_DIR";

/// What the driver probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub version: i32,
    /// CUDA devices visible to this process (at least one).
    pub devices: usize,
}

/// What the NVRTC probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcInfo {
    /// NVRTC's (major, minor) version.
    pub version: (i32, i32),
    /// Real architectures NVRTC can compile for, e.g. 75, 80, 86, 90, 100.
    pub archs: Vec<i32>,
    /// Where the library was preloaded from, when `GEAR_NVRTC_DIR` was set.
    pub preloaded_from: Option<PathBuf>,
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown panic".to_owned())
}

fn probe_driver() -> std::result::Result<DriverInfo, String> {
    // SAFETY: is_culib_present only tries to dlopen candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda) was not found; no NVIDIA driver is installed".into());
    }
    let run = || -> std::result::Result<DriverInfo, String> {
        use cudarc::driver::sys;
        // SAFETY: the library is present; these calls take only out-pointers.
        unsafe {
            let init = sys::cuInit(0);
            if init != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuInit failed: {init:?} (no usable device, or the driver is not loaded)"));
            }
            let mut version = 0;
            let r = sys::cuDriverGetVersion(&mut version);
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuDriverGetVersion failed: {r:?}"));
            }
            let mut count = 0;
            let r = sys::cuDeviceGetCount(&mut count);
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuDeviceGetCount failed: {r:?}"));
            }
            if count <= 0 {
                return Err(format!("the CUDA driver (version {version}) sees no device"));
            }
            Ok(DriverInfo { version, devices: count as usize })
        }
    };
    catch_unwind(AssertUnwindSafe(run))
        .map_err(|p| format!("the CUDA driver library is unusable: {}", panic_message(p)))?
}

/// Probes the CUDA driver once per process: library present, `cuInit`
/// succeeds, at least one device. Never panics.
pub fn driver() -> Result<&'static DriverInfo> {
    static DRIVER: OnceLock<std::result::Result<DriverInfo, String>> = OnceLock::new();
    DRIVER.get_or_init(probe_driver).as_ref().map_err(|e| Error::BackendUnavailable(e.clone()))
}

/// Whether a CUDA device can be used (the driver probe succeeded).
pub fn has_device() -> bool {
    driver().is_ok()
}

/// Preloads NVRTC from `dir`: the builtins library first (NVRTC opens it by
/// soname), then `libnvrtc.so*`. Skips the `.alt` variants.
fn preload_nvrtc(dir: &Path) -> std::result::Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{NVRTC_DIR_ENV}={}: {e}", dir.display()))?;
    let mut builtins = Vec::new();
    let mut main = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.contains(".alt.") || !name.contains(".so") {
            continue;
        }
        if name.starts_with("libnvrtc-builtins") {
            builtins.push(entry.path());
        } else if name.starts_with("libnvrtc.so") {
            main.push(entry.path());
        }
    }
    if main.is_empty() {
        return Err(format!("{NVRTC_DIR_ENV}={}: no libnvrtc.so* in that directory", dir.display()));
    }
    // Longest name first: the versioned file, not a symlink to it (either works).
    main.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for p in &builtins {
        ffi::dlopen_global(p)?;
    }
    ffi::dlopen_global(&main[0])
}

fn probe_nvrtc(dir: Option<&Path>) -> std::result::Result<NvrtcInfo, String> {
    let preloaded_from = match dir {
        Some(dir) => {
            preload_nvrtc(dir)?;
            Some(dir.to_path_buf())
        }
        None => None,
    };
    // SAFETY: is_culib_present only tries to dlopen candidate names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(format!(
            "NVRTC (libnvrtc.so.13) was not found; install it (gear-cuda/ci/install-nvrtc.sh) and set \
             {NVRTC_DIR_ENV} or LD_LIBRARY_PATH to its directory"
        ));
    }
    let run = || -> std::result::Result<NvrtcInfo, String> {
        use cudarc::nvrtc::sys;
        // SAFETY: the library is present; the calls take out-pointers sized
        // as the API requires (the arch buffer is sized by the count call).
        unsafe {
            let (mut major, mut minor) = (0, 0);
            sys::nvrtcVersion(&mut major, &mut minor).result().map_err(|e| format!("nvrtcVersion: {e}"))?;
            let mut n = 0;
            sys::nvrtcGetNumSupportedArchs(&mut n).result().map_err(|e| format!("nvrtcGetNumSupportedArchs: {e}"))?;
            let mut archs = vec![0i32; n.max(0) as usize];
            sys::nvrtcGetSupportedArchs(archs.as_mut_ptr())
                .result()
                .map_err(|e| format!("nvrtcGetSupportedArchs: {e}"))?;
            Ok(NvrtcInfo { version: (major, minor), archs, preloaded_from: None })
        }
    };
    let mut info = catch_unwind(AssertUnwindSafe(run))
        .map_err(|p| format!("the NVRTC library is unusable: {}", panic_message(p)))??;
    info.preloaded_from = preloaded_from;
    Ok(info)
}

static NVRTC: OnceLock<std::result::Result<NvrtcInfo, String>> = OnceLock::new();

/// Probes NVRTC once per process (preloading from `GEAR_NVRTC_DIR` when
/// set). Never panics.
pub fn nvrtc() -> Result<&'static NvrtcInfo> {
    let dir = std::env::var_os(NVRTC_DIR_ENV).filter(|d| !d.is_empty()).map(PathBuf::from);
    nvrtc_from(dir.as_deref())
}

/// Like [`nvrtc`], but preloading from `dir` instead of reading
/// `GEAR_NVRTC_DIR`. Only the first probe of the process loads anything;
/// later calls return its result whatever `dir` they pass.
pub fn nvrtc_from(dir: Option<&Path>) -> Result<&'static NvrtcInfo> {
    NVRTC.get_or_init(|| probe_nvrtc(dir)).as_ref().map_err(|e| Error::BackendUnavailable(e.clone()))
}
