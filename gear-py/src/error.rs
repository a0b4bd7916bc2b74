//! The error type of gear-py and the Python exception each kind becomes.
//!
//! Every Rust error reaches Python as an exception whose class says what
//! went wrong and whose message is the Rust error's own: `ClosedError`,
//! `TimeoutError`, `StaleKeyError`, `SpecError` (a table, column, sampler
//! or rate-limiter configuration that cannot work), `StepError` (data or
//! priorities that do not fit the table), all subclasses of `GearError`.

use pyo3::exceptions::PyException;
use pyo3::{create_exception, PyErr};

create_exception!(gear, GearError, PyException, "Base class of every error GEAR raises.");
create_exception!(gear, ClosedError, GearError, "The table was closed (by its creator or `Table.close`).");
create_exception!(gear, TimeoutError, GearError, "A wait (rate limiter, empty table, table lock) ran out.");
create_exception!(gear, StaleKeyError, GearError, "A key whose trajectory was evicted or replaced.");
create_exception!(
    gear,
    SpecError,
    GearError,
    "A table, column, sampler or rate-limiter configuration that cannot work."
);
create_exception!(
    gear,
    StepError,
    GearError,
    "Step data or priorities that do not fit the table (dtype, shape, column, value)."
);

/// Result alias for gear-py.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the binding can refuse.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of the library, classified by its kind.
    #[error(transparent)]
    Gear(#[from] gear_api::Error),
    /// A configuration the binding itself refuses (before reaching gear-api).
    #[error("{0}")]
    Spec(String),
    /// Step data the binding itself refuses (wrong dtype, shape, column).
    #[error("{0}")]
    Step(String),
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
        C::InvalidSpec(_) | C::SizeOverflow(_) | C::UnknownDType(_) => SpecError::new_err(msg),
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

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        use gear_api::Error as G;
        let msg = e.to_string();
        match e {
            Error::Python(err) => err,
            Error::Spec(_) => SpecError::new_err(msg),
            Error::Step(_) => StepError::new_err(msg),
            Error::Gear(g) => match &g {
                G::Closed => ClosedError::new_err(msg),
                G::Timeout { .. } => TimeoutError::new_err(msg),
                G::Config(_) => SpecError::new_err(msg),
                G::Trajectory(_) => StepError::new_err(msg),
                G::Core(c) => core_class(c, msg),
                _ => GearError::new_err(msg),
            },
        }
    }
}
