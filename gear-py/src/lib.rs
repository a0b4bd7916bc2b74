//! # gear-py
//!
//! The `gear` Python module (imported as `gear`, built as `gear._gear`
//! by maturin): GEAR-rs replay tables from Python, over gear-api's public
//! API, and clusters of shard servers over gear-net's client.
//!
//! Contract: every call that copies or waits releases the GIL; waits run
//! in slices so Ctrl-C interrupts them; every Rust error becomes a Python
//! exception of its kind with the Rust message, and no panic crosses the
//! boundary (pyo3 turns one into `PanicException`, and the code avoids
//! them on user input). Sampled batches own their buffers: column arrays
//! are zero-copy NumPy views (and DLPack exports) that keep the buffer
//! alive, and a sampler reuses a buffer only once nothing references it.

mod batch;
mod cluster;
#[cfg(feature = "cuda")]
mod cuda;
mod dlpack;
mod dtype;
pub mod error;
mod hdf5;
mod items;
mod prefetch;
mod sampler;
mod table;
mod wait;
mod writer;

use pyo3::prelude::*;

/// `p = eta * max|d| + (1 - eta) * mean|d|` over a sequence's TD errors
/// (R2D2's sequence priority; `eta` 0.9 by default).
#[pyfunction]
#[pyo3(signature = (td_errors, eta=0.9))]
fn sequence_priority(td_errors: &Bound<'_, PyAny>, eta: f64) -> PyResult<f64> {
    let values = table::float_vec(td_errors, "td_errors")?;
    Ok(gear_sampler::sequence_priority(&values, eta))
}

/// The extension module.
#[pymodule]
fn _gear(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<table::Table>()?;
    m.add_class::<table::RateLimiter>()?;
    m.add_class::<writer::Writer>()?;
    m.add_class::<writer::Trajectory>()?;
    m.add_class::<sampler::Sampler>()?;
    m.add_class::<items::ItemPattern>()?;
    m.add_class::<items::TransitionSampler>()?;
    m.add_class::<batch::Batch>()?;
    m.add_class::<batch::BatchBuffer>()?;
    m.add_class::<batch::DlpackColumn>()?;
    m.add_class::<cluster::Cluster>()?;
    m.add_class::<cluster::ClusterSampler>()?;
    m.add_class::<cluster::ClusterWriter>()?;
    m.add_class::<cluster::ClusterTrajectory>()?;
    m.add("CLUSTER_KEY_DTYPE", cluster::key_dtype(py)?)?;
    #[cfg(feature = "cuda")]
    m.add_class::<cuda::CudaSampler>()?;
    m.add_function(wrap_pyfunction!(sequence_priority, m)?)?;
    m.add_function(wrap_pyfunction!(prefetch::_stop_prefetching, m)?)?;
    // Prefetching samplers' threads end before the interpreter finalizes.
    py.import("atexit")?.call_method1("register", (m.getattr("_stop_prefetching")?,))?;
    m.add_function(wrap_pyfunction!(hdf5::import_hdf5, m)?)?;
    m.add_function(wrap_pyfunction!(hdf5::export_hdf5, m)?)?;
    m.add("GearError", py.get_type::<error::GearError>())?;
    m.add("ClosedError", py.get_type::<error::ClosedError>())?;
    m.add("TimeoutError", error::timeout_error(py)?)?;
    m.add("StaleKeyError", py.get_type::<error::StaleKeyError>())?;
    m.add("SpecError", py.get_type::<error::SpecError>())?;
    m.add("StepError", py.get_type::<error::StepError>())?;
    m.add("CheckpointError", py.get_type::<error::CheckpointError>())?;
    m.add("ShardLostError", py.get_type::<error::ShardLostError>())?;
    m.add("AuthError", py.get_type::<error::AuthError>())?;
    m.add("PartialInsertError", py.get_type::<error::PartialInsertError>())?;
    Ok(())
}
