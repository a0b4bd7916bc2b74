//! The error type for configuring strategies (parsing a name, checking a
//! parameter). Operations of a built strategy go through
//! [`gear_core::Selector`] and return [`gear_core::Error`].

use crate::kind::STRATEGY_NAMES;

/// Result alias for gear-sampler's configuration functions.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything gear-sampler refuses while building a strategy.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A strategy name that is not one of ours.
    #[error("unknown selection strategy `{0}` (expected one of {names})", names = STRATEGY_NAMES)]
    UnknownStrategy(String),
    /// A strategy parameter outside its domain.
    #[error("invalid parameter {name} = {value}: expected {expected}")]
    InvalidParameter {
        /// The parameter, e.g. `alpha`.
        name: &'static str,
        /// The value given.
        value: f64,
        /// What the parameter must be.
        expected: &'static str,
    },
}

impl From<Error> for gear_core::Error {
    /// A configuration error is an invalid spec to the rest of GEAR-rs.
    fn from(e: Error) -> Self {
        gear_core::Error::InvalidSpec(e.to_string())
    }
}
