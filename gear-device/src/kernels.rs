//! The kernel sources every device runs, and the kernels they define.
//!
//! The CUDA C sources in `gear-device/kernels/` are embedded with
//! `include_str!`; `kernels/common.cuh` is prepended to each. One text
//! compiles three ways: NVRTC to PTX and CUBIN (gear-cuda, at build time or
//! at run time), hiprtc for a future ROCm backend, and g++ as C++ with the
//! host shim (`cpu/shim.h`) for the CPU device and the kernel tests. The
//! rules that make that possible are written at the top of `common.cuh`.
//!
//! [`KernelFn::params`] is each kernel's parameter list; every launch of
//! this crate is checked against it before it reaches a device
//! ([`crate::launch`]), so an argument list that drifts from its kernel
//! fails on the CPU device in CI instead of corrupting a GPU's memory.

/// The shared prelude prepended to every source.
pub const COMMON_SOURCE: &str = include_str!("../kernels/common.cuh");

/// One kernel source file (one NVRTC program, one module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelSource {
    /// `kernels/gather.cu`: the window gather.
    Gather,
    /// `kernels/sample.cu`: prefix sums, proportional draws, drawn rows.
    Sample,
    /// `kernels/priority.cu`: scatters and top-k.
    Priority,
    /// `kernels/bench.cu`: the trainer stand-in's step (reads a batch,
    /// takes a set time).
    Bench,
}

impl KernelSource {
    /// Every source.
    pub const ALL: [KernelSource; 4] =
        [KernelSource::Gather, KernelSource::Sample, KernelSource::Priority, KernelSource::Bench];

    /// The file name under `kernels/`.
    pub const fn file_name(self) -> &'static str {
        match self {
            KernelSource::Gather => "gather.cu",
            KernelSource::Sample => "sample.cu",
            KernelSource::Priority => "priority.cu",
            KernelSource::Bench => "bench.cu",
        }
    }

    /// The file's text, without the prelude.
    pub const fn body(self) -> &'static str {
        match self {
            KernelSource::Gather => include_str!("../kernels/gather.cu"),
            KernelSource::Sample => include_str!("../kernels/sample.cu"),
            KernelSource::Priority => include_str!("../kernels/priority.cu"),
            KernelSource::Bench => include_str!("../kernels/bench.cu"),
        }
    }

    /// The text a runtime compiler compiles: the prelude, then the file
    /// (with a `#line` so messages name the file).
    pub fn source(self) -> String {
        compose_source(COMMON_SOURCE, self.file_name(), self.body())
    }

    /// The `extern "C"` kernels the source defines.
    pub fn entry_points(self) -> Vec<&'static str> {
        KernelFn::ALL.iter().filter(|f| f.source() == self).map(|f| f.name()).collect()
    }
}

/// The prelude, then `body` with a `#line` directive naming `file_name`.
pub fn compose_source(common: &str, file_name: &str, body: &str) -> String {
    format!("{common}\n#line 1 \"{file_name}\"\n{body}")
}

/// The type of one kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// `gear_u32`.
    U32,
    /// `gear_u64`.
    U64,
    /// `gear_i64`.
    I64,
    /// `double`.
    F64,
    /// A pointer the kernel reads through.
    In,
    /// A pointer the kernel writes through (and may read).
    Out,
}

/// One kernel: the id loaded modules are keyed by.
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
    /// `gear_train_step`.
    TrainStep,
}

impl KernelFn {
    /// Every kernel.
    pub const ALL: [KernelFn; 12] = [
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
        KernelFn::TrainStep,
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
            KernelFn::TrainStep => KernelSource::Bench,
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
            KernelFn::TrainStep => "gear_train_step",
        }
    }

    /// The kernel whose symbol is `name`.
    pub fn by_name(name: &str) -> Option<KernelFn> {
        KernelFn::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The parameter list, in order, as the `.cu` source declares it.
    pub const fn params(self) -> &'static [Param] {
        use Param::*;
        match self {
            // row_src, row_len, cols, rows, ncols, w_offset, w_len, pad_head, lengths_out
            KernelFn::Gather => &[In, In, In, U64, U64, I64, U64, U32, Out],
            // prio, n, alpha, chunk_len, nchunks, chunk_sum, chunk_min
            KernelFn::PrioChunks => &[In, U64, F64, U64, U64, Out, Out],
            // chunk_sum, chunk_min, nchunks, chunk_off, stats
            KernelFn::PrioScan => &[In, In, U64, Out, Out],
            // prio, n, alpha, chunk_len, nchunks, chunk_off, prefix
            KernelFn::PrioPrefix => &[In, U64, F64, U64, U64, In, Out],
            // prio, prefix, n, alpha, beta, stats, seed, draws, stratified, out_slot, out_prob, out_weight
            KernelFn::SampleDraws => &[In, In, U64, F64, F64, In, U64, U64, U32, Out, Out, Out],
            // drawn, ndrawn, rows, slot_key, slot_len, capacity, data_base, stride, w_len,
            // random_start, seed, draw_prob, draw_weight, row_tab, out
            KernelFn::DrawnRows => &[In, U64, U64, In, In, U64, U64, U64, U64, U32, U64, In, In, Out, Out],
            // idx, val, m, dst
            KernelFn::ScatterF64 | KernelFn::ScatterU64 => &[In, In, U64, Out],
            // n, m, idx
            KernelFn::TopkInit => &[U64, U64, Out],
            // prio, n, m, size, stride, idx
            KernelFn::TopkStep => &[In, U64, U64, U64, U64, Out],
            // prio, n, idx, k, out_slot, out_prio
            KernelFn::TopkEmit => &[In, U64, In, U64, Out, Out],
            // src, bytes, spin_ns, partial
            KernelFn::TrainStep => &[In, U64, U64, Out],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_in_its_source_with_its_parameter_count() {
        for f in KernelFn::ALL {
            let body = f.source().body();
            let decl = format!("void {}(", f.name());
            let at = body.find(&decl).unwrap_or_else(|| panic!("{} not in {}", f.name(), f.source().file_name()));
            let rest = &body[at + decl.len()..];
            let params = &rest[..rest.find(')').unwrap()];
            assert_eq!(params.split(',').count(), f.params().len(), "{}: {params}", f.name());
            // Pointers declared const are inputs, the others outputs.
            for (p, decl) in f.params().iter().zip(params.split(',')) {
                let pointer = decl.contains('*');
                match p {
                    Param::In => assert!(pointer && decl.contains("const"), "{}: {decl}", f.name()),
                    Param::Out => assert!(pointer && !decl.contains("const"), "{}: {decl}", f.name()),
                    _ => assert!(!pointer, "{}: {decl}", f.name()),
                }
            }
            assert_eq!(KernelFn::by_name(f.name()), Some(f));
        }
        let listed: usize = KernelSource::ALL.iter().map(|s| s.entry_points().len()).sum();
        assert_eq!(listed, KernelFn::ALL.len());
    }
}
