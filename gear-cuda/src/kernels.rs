//! Kernel sources and their run-time compilation.
//!
//! The CUDA C sources in `gear-cuda/kernels/` are embedded with
//! `include_str!`; `kernels/common.cuh` is prepended to each.
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

/// The shared prelude prepended to every source.
pub const COMMON_SOURCE: &str = include_str!("../kernels/common.cuh");

/// One kernel source file (one NVRTC program, one module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelSource {
    /// `kernels/gather.cu`: the window gather.
    Gather,
    /// `kernels/sample.cu`: prefix sums and proportional draws.
    Sample,
    /// `kernels/priority.cu`: priority scatter and top-k.
    Priority,
}

impl KernelSource {
    /// Every source.
    pub const ALL: [KernelSource; 3] = [KernelSource::Gather, KernelSource::Sample, KernelSource::Priority];

    /// The file name under `kernels/`.
    pub const fn file_name(self) -> &'static str {
        match self {
            KernelSource::Gather => "gather.cu",
            KernelSource::Sample => "sample.cu",
            KernelSource::Priority => "priority.cu",
        }
    }

    /// The file's text, without the prelude.
    pub const fn body(self) -> &'static str {
        match self {
            KernelSource::Gather => include_str!("../kernels/gather.cu"),
            KernelSource::Sample => include_str!("../kernels/sample.cu"),
            KernelSource::Priority => include_str!("../kernels/priority.cu"),
        }
    }

    /// The text NVRTC compiles: the prelude, then the file.
    pub fn source(self) -> String {
        crate::nvrtc_lib::compose_source(COMMON_SOURCE, self.file_name(), self.body())
    }

    /// The `extern "C"` kernels the source defines.
    pub const fn entry_points(self) -> &'static [&'static str] {
        match self {
            KernelSource::Gather => &["gear_gather"],
            KernelSource::Sample => {
                &["gear_prio_chunks", "gear_prio_scan", "gear_prio_prefix", "gear_sample_draws", "gear_drawn_rows"]
            }
            KernelSource::Priority => {
                &["gear_scatter_f64", "gear_scatter_u64", "gear_topk_init", "gear_topk_step", "gear_topk_emit"]
            }
        }
    }
}

/// One kernel: the id the per-context cache is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelFn {
    /// `gear_gather`.
    Gather,
    /// `gear_prio_chunks`.
    PrioChunks,
    /// `gear_prio_scan`.
    PrioScan,
    /// `gear_prio_prefix`.
    PrioPrefix,
    /// `gear_sample_draws`.
    SampleDraws,
    /// `gear_drawn_rows`.
    DrawnRows,
    /// `gear_scatter_f64`.
    ScatterF64,
    /// `gear_scatter_u64`.
    ScatterU64,
    /// `gear_topk_init`.
    TopkInit,
    /// `gear_topk_step`.
    TopkStep,
    /// `gear_topk_emit`.
    TopkEmit,
}

impl KernelFn {
    /// Every kernel.
    pub const ALL: [KernelFn; 11] = [
        KernelFn::Gather,
        KernelFn::PrioChunks,
        KernelFn::PrioScan,
        KernelFn::PrioPrefix,
        KernelFn::SampleDraws,
        KernelFn::DrawnRows,
        KernelFn::ScatterF64,
        KernelFn::ScatterU64,
        KernelFn::TopkInit,
        KernelFn::TopkStep,
        KernelFn::TopkEmit,
    ];

    /// The source that defines it.
    pub const fn source(self) -> KernelSource {
        match self {
            KernelFn::Gather => KernelSource::Gather,
            KernelFn::PrioChunks
            | KernelFn::PrioScan
            | KernelFn::PrioPrefix
            | KernelFn::SampleDraws
            | KernelFn::DrawnRows => KernelSource::Sample,
            KernelFn::ScatterF64
            | KernelFn::ScatterU64
            | KernelFn::TopkInit
            | KernelFn::TopkStep
            | KernelFn::TopkEmit => KernelSource::Priority,
        }
    }

    /// The symbol name.
    pub const fn name(self) -> &'static str {
        match self {
            KernelFn::Gather => "gear_gather",
            KernelFn::PrioChunks => "gear_prio_chunks",
            KernelFn::PrioScan => "gear_prio_scan",
            KernelFn::PrioPrefix => "gear_prio_prefix",
            KernelFn::SampleDraws => "gear_sample_draws",
            KernelFn::DrawnRows => "gear_drawn_rows",
            KernelFn::ScatterF64 => "gear_scatter_f64",
            KernelFn::ScatterU64 => "gear_scatter_u64",
            KernelFn::TopkInit => "gear_topk_init",
            KernelFn::TopkStep => "gear_topk_step",
            KernelFn::TopkEmit => "gear_topk_emit",
        }
    }
}

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

    #[test]
    fn every_entry_point_is_in_its_source_and_every_fn_is_listed() {
        for s in KernelSource::ALL {
            for e in s.entry_points() {
                assert!(s.body().contains(&format!("void {e}(")), "{e} not in {}", s.file_name());
            }
        }
        for f in KernelFn::ALL {
            assert!(f.source().entry_points().contains(&f.name()));
        }
        let listed: usize = KernelSource::ALL.iter().map(|s| s.entry_points().len()).sum();
        assert_eq!(listed, KernelFn::ALL.len());
    }
}
