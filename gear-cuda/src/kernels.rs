//! The kernels' compilation for CUDA.
//!
//! The CUDA C sources live in `gear-device/kernels/` (every device runs
//! them; [`KernelSource`] and [`KernelFn`] are gear-device's), with
//! `kernels/common.cuh` prepended to each.
//!
//! When NVRTC is present at build time, `build.rs` compiles every source to
//! PTX (`compute_80`) and CUBIN (`sm_80`, `sm_90`) and embeds the images
//! ([`built_images`], [`images_for`]): a GPU machine then needs only the
//! driver. The driver loads the exact CUBIN, else JIT-compiles the PTX (PTX
//! from NVRTC 13 needs a CUDA 13 driver). Only when no image fits or loads
//! is the source compiled by NVRTC at run time ([`compile`]; target choice
//! [`target_for`]: a CUBIN for `sm_XY` when NVRTC supports the device's
//! compute capability exactly, else PTX for the newest supported
//! `compute_XY` below it). Modules are loaded once per process and device
//! (see [`crate::CudaDevice`]).

use crate::error::{Error, Result};
use crate::nvrtc_lib::{CompileFailure, Image};
use crate::probe;

pub use gear_device::kernels::{KernelFn, KernelSource, Param, COMMON_SOURCE};

/// What NVRTC produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compiled {
    /// PTX text (for a virtual `compute_XY` target).
    Ptx(String),
    /// A CUBIN image (for a real `sm_XY` target).
    Cubin(Vec<u8>),
}

/// The `--gpu-architecture` value for a device of compute capability
/// `(major, minor)` given the real architectures NVRTC supports (see the
/// module doc). `None` when the device is older than all of them.
pub fn target_for(cc: (i32, i32), supported: &[i32]) -> Option<String> {
    let want = cc.0 * 10 + cc.1;
    if supported.contains(&want) {
        return Some(format!("sm_{want}"));
    }
    supported.iter().copied().filter(|&a| a <= want).max().map(|a| format!("compute_{a}"))
}

fn build(source: KernelSource, arch: &str) -> Result<(Compiled, String)> {
    let lib = probe::nvrtc_lib()?;
    match lib.compile(&source.source(), source.file_name(), arch) {
        Ok((Image::Ptx(t), log)) => Ok((Compiled::Ptx(t), log)),
        Ok((Image::Cubin(b), log)) => Ok((Compiled::Cubin(b), log)),
        Err(CompileFailure::Call(e)) => Err(Error::Nvrtc(e)),
        Err(CompileFailure::Source(log)) => {
            Err(Error::KernelCompile { kernel: source.file_name(), arch: arch.to_owned(), log })
        }
    }
}

/// Compiles `source` for `arch` (`compute_XY` gives PTX, `sm_XY` a CUBIN)
/// with NVRTC at run time. Probes NVRTC first; a compile error returns
/// NVRTC's log.
pub fn compile(source: KernelSource, arch: &str) -> Result<Compiled> {
    build(source, arch).map(|(c, _)| c)
}

/// NVRTC's log for a successful compile (warnings; empty when none), so
/// tests can require kernels to compile cleanly.
pub fn compile_log(source: KernelSource, arch: &str) -> Result<String> {
    build(source, arch).map(|(_, log)| log)
}

mod generated {
    include!(concat!(env!("OUT_DIR"), "/kernel_images.rs"));
}

/// A kernel image compiled at build time (see `gear-cuda/build.rs`).
#[derive(Clone, Copy, Debug)]
pub struct BuiltImage {
    /// The source it was compiled from.
    pub source: KernelSource,
    /// `compute_XY` (PTX) or `sm_XY` (CUBIN).
    pub target: &'static str,
    /// FNV-1a of the text compiled, to check it against [`KernelSource::source`].
    pub source_hash: u64,
    /// PTX text or CUBIN bytes.
    pub bytes: &'static [u8],
}

impl BuiltImage {
    /// The image as cudarc loads it.
    pub fn to_ptx(&self) -> cudarc::nvrtc::Ptx {
        if self.target.starts_with("sm_") {
            cudarc::nvrtc::Ptx::from_binary(self.bytes.to_vec())
        } else {
            cudarc::nvrtc::Ptx::from_src(String::from_utf8_lossy(self.bytes).into_owned())
        }
    }

    /// The compute capability the image targets, as 10 * major + minor.
    pub fn arch(&self) -> i32 {
        self.target.rsplit('_').next().and_then(|a| a.parse().ok()).unwrap_or(i32::MAX)
    }
}

/// The NVRTC version that compiled the embedded images, or `None` when the
/// crate was built without NVRTC (then every kernel is compiled at run time).
pub const fn build_nvrtc() -> Option<(i32, i32)> {
    generated::BUILD_NVRTC
}

/// Every image compiled at build time.
pub fn built_images() -> impl Iterator<Item = BuiltImage> {
    generated::IMAGES.iter().filter_map(|&(file, target, source_hash, bytes)| {
        let source = KernelSource::ALL.into_iter().find(|s| s.file_name() == file)?;
        Some(BuiltImage { source, target, source_hash, bytes })
    })
}

/// The build-time images of `source` that a device of compute capability
/// `cc` can load, best first: a CUBIN for exactly its architecture, then
/// PTX for the newest virtual architecture not above it (JIT-compiled by
/// the driver). Empty when none fits (or none was built).
pub fn images_for(source: KernelSource, cc: (i32, i32)) -> Vec<BuiltImage> {
    let want = cc.0 * 10 + cc.1;
    let mut v: Vec<BuiltImage> = built_images().filter(|i| i.source == source).collect();
    let cubin = v.iter().copied().find(|i| i.target.starts_with("sm_") && i.arch() == want);
    v.retain(|i| i.target.starts_with("compute_") && i.arch() <= want);
    v.sort_by_key(|i| std::cmp::Reverse(i.arch()));
    v.truncate(1);
    cubin.into_iter().chain(v).collect()
}

/// NVRTC's version, probing first.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    Ok(probe::nvrtc()?.version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvrtc_lib::fnv1a;

    #[test]
    fn target_prefers_exact_cubin_then_older_ptx() {
        let archs = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(target_for((9, 0), &archs).as_deref(), Some("sm_90"));
        assert_eq!(target_for((8, 7), &archs).as_deref(), Some("compute_86"));
        assert_eq!(target_for((7, 0), &archs), None);
        assert_eq!(target_for((13, 0), &archs).as_deref(), Some("compute_120"));
    }

    /// Build-time images (when NVRTC was found at build time) come from the
    /// sources embedded now, for every source, with PTX and an sm_90 CUBIN.
    #[test]
    fn built_images_match_the_embedded_sources() {
        if build_nvrtc().is_none() {
            println!("skipped: built without NVRTC, kernels are compiled at run time");
            return;
        }
        for s in KernelSource::ALL {
            let hash = fnv1a(s.source().as_bytes());
            let imgs: Vec<_> = built_images().filter(|i| i.source == s).collect();
            assert!(imgs.len() >= 2, "{}: {} images", s.file_name(), imgs.len());
            for i in &imgs {
                assert_eq!(i.source_hash, hash, "{} {}: stale image", s.file_name(), i.target);
            }
            let h100 = images_for(s, (9, 0));
            assert_eq!(h100.iter().map(|i| i.target).collect::<Vec<_>>(), ["sm_90", "compute_80"]);
            let ptx = std::str::from_utf8(h100[1].bytes).unwrap();
            for e in s.entry_points() {
                assert!(ptx.contains(&format!(".entry {e}(")), "{e} missing");
            }
            assert_eq!(images_for(s, (8, 9)).iter().map(|i| i.target).collect::<Vec<_>>(), ["compute_80"]);
            assert!(images_for(s, (7, 5)).is_empty());
        }
    }
}
