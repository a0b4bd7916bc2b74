//! Kernel sources and their run-time compilation.
//!
//! The CUDA C sources in `gear-cuda/kernels/` are embedded with
//! `include_str!`; `kernels/common.cuh` is prepended to each. NVRTC compiles
//! a source for the present device when it is first needed and the module is
//! cached per device context by [`KernelSource`] (candle's
//! `get_or_load_func` pattern, see [`crate::CudaDevice`]).
//!
//! Target choice ([`target_for`]): a CUBIN for `sm_XY` when NVRTC supports
//! the device's compute capability exactly, else PTX for the newest
//! supported `compute_XY` below it, which the driver JIT-compiles (PTX from
//! NVRTC 13 needs a CUDA 13 driver).

use crate::error::{Error, Result};
use crate::probe;
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use std::ffi::{c_char, CString};

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
        format!("{COMMON_SOURCE}\n#line 1 \"{}\"\n{}", self.file_name(), self.body())
    }

    /// The `extern "C"` kernels the source defines.
    pub const fn entry_points(self) -> &'static [&'static str] {
        match self {
            KernelSource::Gather => &["gear_gather"],
            KernelSource::Sample => &["gear_prio_chunks", "gear_prio_scan", "gear_prio_prefix", "gear_sample_draws"],
            KernelSource::Priority => &["gear_scatter_f64", "gear_topk_chunks", "gear_topk_merge"],
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
    /// `gear_scatter_f64`.
    ScatterF64,
    /// `gear_topk_chunks`.
    TopkChunks,
    /// `gear_topk_merge`.
    TopkMerge,
}

impl KernelFn {
    /// Every kernel.
    pub const ALL: [KernelFn; 8] = [
        KernelFn::Gather,
        KernelFn::PrioChunks,
        KernelFn::PrioScan,
        KernelFn::PrioPrefix,
        KernelFn::SampleDraws,
        KernelFn::ScatterF64,
        KernelFn::TopkChunks,
        KernelFn::TopkMerge,
    ];

    /// The source that defines it.
    pub const fn source(self) -> KernelSource {
        match self {
            KernelFn::Gather => KernelSource::Gather,
            KernelFn::PrioChunks | KernelFn::PrioScan | KernelFn::PrioPrefix | KernelFn::SampleDraws => {
                KernelSource::Sample
            }
            KernelFn::ScatterF64 | KernelFn::TopkChunks | KernelFn::TopkMerge => KernelSource::Priority,
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
            KernelFn::ScatterF64 => "gear_scatter_f64",
            KernelFn::TopkChunks => "gear_topk_chunks",
            KernelFn::TopkMerge => "gear_topk_merge",
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

/// An NVRTC program, destroyed on drop.
struct Program {
    prog: nvrtc_sys::nvrtcProgram,
    // Kept alive until the program is destroyed (NVRTC may refer to them).
    _src: CString,
    _name: CString,
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by create_program and is destroyed once.
        // A failure here leaks the program; there is nothing better to do.
        let _ = unsafe { nvrtc::destroy_program(self.prog) };
    }
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Creates and compiles a program; on success returns it with NVRTC's log
/// (warnings), on failure the log inside [`Error::KernelCompile`].
fn build(source: KernelSource, arch: &str) -> Result<(Program, String)> {
    probe::nvrtc()?;
    let src = CString::new(source.source())
        .map_err(|_| Error::InvalidArgument(format!("{}: source contains a NUL byte", source.file_name())))?;
    let name = CString::new(source.file_name())
        .map_err(|_| Error::InvalidArgument("kernel file name contains a NUL byte".into()))?;
    let prog = nvrtc::create_program(&src, Some(&name))?;
    let prog = Program { prog, _src: src, _name: name };
    let options = [format!("--gpu-architecture={arch}"), "--std=c++17".to_owned()];
    // SAFETY: `prog.prog` is a live program (destroyed only by Program's drop).
    let compiled = unsafe { nvrtc::compile_program(prog.prog, &options) };
    // SAFETY: as above.
    let log = unsafe { nvrtc::get_program_log(prog.prog) }
        .map(|l| c_chars_to_string(&l))
        .unwrap_or_else(|le| format!("(no log: {le})"));
    match compiled {
        Ok(()) => Ok((prog, log.trim().to_owned())),
        Err(e) => Err(Error::KernelCompile {
            kernel: source.file_name(),
            arch: arch.to_owned(),
            log: format!("{e}: {}", log.trim()),
        }),
    }
}

/// Compiles `source` for `arch` (`compute_XY` gives PTX, `sm_XY` a CUBIN).
/// Probes NVRTC first; a compile error returns NVRTC's log.
pub fn compile(source: KernelSource, arch: &str) -> Result<Compiled> {
    let (prog, _warnings) = build(source, arch)?;
    if arch.starts_with("sm_") {
        let mut size = 0usize;
        // SAFETY: live, compiled program; `size` is a valid out-pointer.
        unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog.prog, &mut size) }.result()?;
        let mut image = vec![0u8; size];
        // SAFETY: `image` has the size NVRTC reported.
        unsafe { nvrtc_sys::nvrtcGetCUBIN(prog.prog, image.as_mut_ptr().cast()) }.result()?;
        Ok(Compiled::Cubin(image))
    } else {
        // SAFETY: live, compiled program.
        let ptx = unsafe { nvrtc::get_ptx(prog.prog) }?;
        Ok(Compiled::Ptx(c_chars_to_string(&ptx)))
    }
}

/// NVRTC's log for a successful compile (warnings; empty when none), so
/// tests can require kernels to compile cleanly.
pub fn compile_log(source: KernelSource, arch: &str) -> Result<String> {
    build(source, arch).map(|(_, log)| log)
}

/// NVRTC's version, probing first.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    Ok(probe::nvrtc()?.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_prefers_exact_cubin_then_older_ptx() {
        let archs = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(target_for((9, 0), &archs).as_deref(), Some("sm_90"));
        assert_eq!(target_for((8, 7), &archs).as_deref(), Some("compute_86"));
        assert_eq!(target_for((7, 0), &archs), None);
        assert_eq!(target_for((13, 0), &archs).as_deref(), Some("compute_120"));
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
