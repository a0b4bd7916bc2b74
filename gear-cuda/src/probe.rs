//! Probes for the CUDA driver and NVRTC, run once per process.
//!
//! cudarc loads `libcuda` and `libnvrtc` lazily and panics when a library
//! or a symbol is missing. Every path into cudarc in this crate goes through
//! [`driver`] or [`nvrtc`] first; they check for the library without
//! panicking, call a few entry points inside `catch_unwind` (a driver too
//! old for the CUDA 13 bindings lacks symbols), and turn every failure into
//! [`Error::BackendUnavailable`] with the reason.
//!
//! NVRTC is needed only when the kernels were not compiled at build time
//! (see `build.rs`) or their images do not suit the device. It is loaded by
//! gear-cuda's own small binding (`src/nvrtc_lib.rs`), never through cudarc's NVRTC loader: when
//! `GEAR_NVRTC_DIR` names a directory, the library there is opened by path
//! (its builtins first), so no other `libnvrtc.so` on the search path can
//! take its place; without it, `libnvrtc.so.13` is looked up by the
//! loader's usual search (`LD_LIBRARY_PATH`, the system cache).

use crate::error::{Error, Result};
use crate::nvrtc_lib::NvrtcLib;
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
    /// The directory NVRTC was loaded from by path, when `GEAR_NVRTC_DIR`
    /// (or [`nvrtc_from`]) named one.
    pub preloaded_from: Option<PathBuf>,
    /// The library file opened (a soname when found by the loader's search).
    pub library: PathBuf,
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

fn probe_nvrtc(dir: Option<&Path>) -> std::result::Result<(NvrtcLib, NvrtcInfo), String> {
    let lib = match dir {
        Some(dir) => NvrtcLib::open_dir(dir).map_err(|e| format!("{NVRTC_DIR_ENV}={}: {e}", dir.display()))?,
        None => NvrtcLib::open_default().map_err(|e| {
            format!(
                "NVRTC (libnvrtc.so.13) was not found ({e}); install it (gear-cuda/ci/install-nvrtc.sh) and set \
                 {NVRTC_DIR_ENV} to its directory"
            )
        })?,
    };
    let version = lib.version()?;
    let archs = lib.archs()?;
    let info = NvrtcInfo { version, archs, preloaded_from: dir.map(Path::to_path_buf), library: lib.path.clone() };
    Ok((lib, info))
}

type NvrtcProbe = std::result::Result<(NvrtcLib, NvrtcInfo), String>;
static NVRTC: OnceLock<NvrtcProbe> = OnceLock::new();

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
    nvrtc_lib_from(dir).map(|(_, info)| info)
}

/// The loaded library with its probe result (see [`nvrtc_from`]).
pub(crate) fn nvrtc_lib_from(dir: Option<&Path>) -> Result<(&'static NvrtcLib, &'static NvrtcInfo)> {
    match NVRTC.get_or_init(|| probe_nvrtc(dir)) {
        Ok((lib, info)) => Ok((lib, info)),
        Err(e) => Err(Error::BackendUnavailable(e.clone())),
    }
}

/// The loaded library, probing with `GEAR_NVRTC_DIR` first (see [`nvrtc`]).
pub(crate) fn nvrtc_lib() -> Result<&'static NvrtcLib> {
    nvrtc()?;
    nvrtc_lib_from(None).map(|(lib, _)| lib)
}
