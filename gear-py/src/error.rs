//! The error type of gear-py and the Python exception each kind becomes.
//!
//! Every Rust error reaches Python as an exception whose class says what
//! went wrong and whose message is the Rust error's own: `ClosedError`,
//! `TimeoutError` (also a built-in `TimeoutError`), `StaleKeyError`,
//! `SpecError` (a table, column, window, sampler, shared-memory name or
//! rate-limiter configuration that cannot work), `StepError` (data or
//! priorities that do not fit the table), `CheckpointError` (a checkpoint
//! that cannot be written or restored), and for clusters
//! `ShardLostError` (no shard could serve the call), `AuthError` (the
//! cluster token was refused) and `PartialInsertError` (an insert failed
//! after some trajectories were committed; it lists them): all
//! subclasses of `GearError`.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::{create_exception, PyErr};

create_exception!(gear, GearError, PyException, "Base class of every error GEAR raises.");
create_exception!(gear, ClosedError, GearError, "The table was closed (by its creator or `Table.close`).");
create_exception!(gear, StaleKeyError, GearError, "A key whose trajectory was evicted or replaced.");
create_exception!(
    gear,
    SpecError,
    GearError,
    "A table, column, window, sampler, shared-memory name or rate-limiter configuration that cannot work."
);
create_exception!(
    gear,
    StepError,
    GearError,
    "Step data or priorities that do not fit the table (dtype, shape, column, value)."
);
create_exception!(
    gear,
    CheckpointError,
    GearError,
    "A checkpoint that cannot be restored (truncated, corrupted, another version or spec) or written."
);
create_exception!(
    gear,
    ShardLostError,
    GearError,
    "No shard of a cluster could serve the call (unreachable, restarted, or holding nothing)."
);
create_exception!(gear, AuthError, GearError, "A shard refused the cluster token.");
create_exception!(
    gear,
    PartialInsertError,
    GearError,
    "An insert failed part way; `committed` lists (index, key) of every trajectory that was stored."
);

/// `gear.TimeoutError`: a `GearError` and a built-in `TimeoutError`, so
/// `except TimeoutError` catches GEAR's waits too. (`create_exception!`
/// takes one base, so the class is made with `type(...)` once.)
static TIMEOUT_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The `gear.TimeoutError` class.
pub(crate) fn timeout_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    let ty = TIMEOUT_ERROR.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let builtins = py.import("builtins")?;
        let bases = PyTuple::new(py, [py.get_type::<GearError>().into_any(), builtins.getattr("TimeoutError")?])?;
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "gear")?;
        namespace.set_item(
            "__doc__",
            "A wait (rate limiter, empty table, table lock, a shard's answer) ran out. Also a built-in TimeoutError.",
        )?;
        let ty = builtins.getattr("type")?.call1(("TimeoutError", bases, namespace))?;
        Ok(ty.cast_into::<PyType>()?.unbind())
    })?;
    Ok(ty.bind(py))
}

fn timeout_err(msg: String) -> PyErr {
    Python::attach(|py| match timeout_error(py) {
        Ok(ty) => PyErr::from_type(ty.clone(), msg),
        Err(e) => e,
    })
}

/// Result alias for gear-py.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the binding can refuse.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of the library, classified by its kind.
    #[error(transparent)]
    Gear(#[from] gear_api::Error),
    /// An error of the cluster client, classified by its kind.
    #[error(transparent)]
    Net(#[from] gear_net::Error),
    /// A configuration the binding itself refuses (before reaching gear-api).
    #[error("{0}")]
    Spec(String),
    /// Step data the binding itself refuses (wrong dtype, shape, column).
    #[error("{0}")]
    Step(String),
    /// A wait of the binding's own that ran out (a cluster with nothing
    /// to sample, for the sampler's whole timeout).
    #[error("{0}")]
    Timeout(String),
    /// An exception raised by Python code the binding called (NumPy,
    /// signal handlers): passed through unchanged.
    #[error("{0}")]
    Python(#[from] PyErr),
}

impl From<gear_core::Error> for Error {
    fn from(e: gear_core::Error) -> Self {
        Error::Gear(e.into())
    }
}

/// Which exception class a core error belongs to.
fn core_class(e: &gear_core::Error, msg: String) -> PyErr {
    use gear_core::Error as C;
    match e {
        C::StaleKey { .. } => StaleKeyError::new_err(msg),
        C::InvalidSpec(_) | C::SizeOverflow(_) | C::UnknownDType(_) | C::InvalidWindow(_) => SpecError::new_err(msg),
        C::UnknownColumn(_)
        | C::ColumnIndex { .. }
        | C::StepSize { .. }
        | C::StepDType { .. }
        | C::StepShape { .. }
        | C::StepColumns { .. }
        | C::TrajectoryTooLong { .. }
        | C::InvalidPriority(_)
        | C::PriorityTooLarge { .. } => StepError::new_err(msg),
        _ => GearError::new_err(msg),
    }
}

/// Which exception class a library error belongs to.
fn gear_class(g: &gear_api::Error, msg: String) -> PyErr {
    use gear_api::Error as G;
    match g {
        G::Closed => ClosedError::new_err(msg),
        G::Timeout { .. } => timeout_err(msg),
        G::Config(_) => SpecError::new_err(msg),
        G::Trajectory(_) => StepError::new_err(msg),
        G::Checkpoint { .. } | G::CheckpointIo { .. } => CheckpointError::new_err(msg),
        G::Core(c) => core_class(c, msg),
        G::Backend(b) => match b.downcast_ref::<gear_cpu::Error>() {
            Some(gear_cpu::Error::InvalidName { .. }) => SpecError::new_err(msg),
            Some(gear_cpu::Error::Core(c)) => core_class(c, msg),
            _ => GearError::new_err(msg),
        },
        _ => GearError::new_err(msg),
    }
}

/// Which exception class a cluster error belongs to.
fn net_class(e: &gear_net::Error, msg: String) -> PyErr {
    use gear_net::Error as N;
    use tonic::Code;
    match e {
        N::Table(g) => gear_class(g, msg),
        N::Core(c) => core_class(c, msg),
        N::Config(_) | N::Unsupported(_) => SpecError::new_err(msg),
        N::NoShard(_) | N::Transport(_) | N::Io(_) => ShardLostError::new_err(msg),
        N::Status { status, .. } => match status.code() {
            Code::Unauthenticated | Code::PermissionDenied => AuthError::new_err(msg),
            Code::DeadlineExceeded => timeout_err(msg),
            Code::Unavailable | Code::Aborted | Code::Cancelled => ShardLostError::new_err(msg),
            Code::InvalidArgument | Code::OutOfRange | Code::ResourceExhausted => SpecError::new_err(msg),
            _ => GearError::new_err(msg),
        },
        // The committed list is attached by the caller, which knows the
        // key layout (`cluster::partial_insert`).
        N::PartialInsert { .. } => PartialInsertError::new_err(msg),
        _ => GearError::new_err(msg),
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let msg = e.to_string();
        match e {
            Error::Python(err) => err,
            Error::Spec(_) => SpecError::new_err(msg),
            Error::Step(_) => StepError::new_err(msg),
            Error::Timeout(_) => timeout_err(msg),
            Error::Gear(g) => gear_class(&g, msg),
            Error::Net(n) => net_class(&n, msg),
        }
    }
}
