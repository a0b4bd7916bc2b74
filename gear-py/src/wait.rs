//! Waits that Ctrl-C can interrupt. Rust-side waits (rate limiter, empty
//! table, table lock) run with the GIL released, one slice at a time;
//! between slices Python's signal handlers run, so a `KeyboardInterrupt`
//! (or any exception a handler raises) ends the wait within a slice.

use crate::error::Result;
use pyo3::prelude::*;
use std::time::{Duration, Instant};

/// Longest one uninterruptible wait lasts.
pub(crate) const WAIT_SLICE: Duration = Duration::from_millis(100);

/// The timeout of one slice of a wait of `timeout` (`None`: forever).
pub(crate) fn slice_of(timeout: Option<Duration>) -> Duration {
    timeout.map_or(WAIT_SLICE, |t| t.min(WAIT_SLICE))
}

/// Runs `attempt` with the GIL released until it succeeds or fails with
/// anything but a timeout, or until `timeout` has passed since the start.
/// Each attempt must wait at most about one [`WAIT_SLICE`] and must change
/// nothing when it times out. The final timeout error reports the whole
/// time waited.
pub(crate) fn interruptible<T, F>(py: Python<'_>, timeout: Option<Duration>, mut attempt: F) -> Result<T>
where
    T: Send,
    F: FnMut() -> gear_api::Result<T> + Send,
{
    let started = Instant::now();
    loop {
        match py.detach(&mut attempt) {
            Err(gear_api::Error::Timeout { op, holder, .. }) => {
                let waited = started.elapsed();
                if timeout.is_some_and(|t| waited + Duration::from_millis(1) >= t) {
                    return Err(gear_api::Error::Timeout { op, waited, holder }.into());
                }
                py.check_signals()?;
            }
            other => return Ok(other?),
        }
    }
}

/// Runs `call` on a thread of its own and waits for its answer with the
/// GIL released, one [`WAIT_SLICE`] at a time, running Python's signal
/// handlers in between: Ctrl-C ends the wait within a slice. A call left
/// behind that way finishes on its thread (every cluster call has a
/// deadline) and its answer is dropped; it owns everything it touches.
pub(crate) fn off_thread<T, F>(py: Python<'_>, call: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    use std::sync::mpsc::{sync_channel, RecvTimeoutError};
    let (answer, answered) = sync_channel(1);
    std::thread::Builder::new()
        .name("gear-call".into())
        .spawn(move || {
            let _ = answer.send(call());
        })
        .map_err(|e| crate::error::Error::Spec(format!("cannot start a thread for the call: {e}")))?;
    // A receiver is not `Sync`; the lock lets the GIL-free closure borrow it.
    let answered = std::sync::Mutex::new(answered);
    loop {
        match py.detach(|| answered.lock().unwrap_or_else(|e| e.into_inner()).recv_timeout(WAIT_SLICE)) {
            Ok(value) => return Ok(value),
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(crate::error::Error::Spec("the call's thread ended without an answer".into()))
            }
        }
    }
}

/// Sleeps `duration` with the GIL released, in slices, running Python's
/// signal handlers in between.
pub(crate) fn sleep(py: Python<'_>, duration: Duration) -> Result<()> {
    let until = Instant::now() + duration;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        py.detach(|| std::thread::sleep(left.min(WAIT_SLICE)));
        py.check_signals()?;
    }
}

/// Seconds (a Python float or `None`) as a timeout.
pub(crate) fn seconds(value: Option<f64>, what: &str) -> Result<Option<Duration>> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => {
            Err(crate::error::Error::Spec(format!("{what} must be a finite number of seconds >= 0 or None, got {s}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_never_exceed_the_wait_or_the_slice() {
        assert_eq!(slice_of(None), WAIT_SLICE);
        assert_eq!(slice_of(Some(Duration::from_secs(5))), WAIT_SLICE);
        assert_eq!(slice_of(Some(Duration::from_millis(20))), Duration::from_millis(20));
    }

    #[test]
    fn seconds_must_be_finite_and_non_negative() {
        assert_eq!(seconds(Some(1.5), "t").unwrap(), Some(Duration::from_millis(1500)));
        assert_eq!(seconds(None, "t").unwrap(), None);
        assert!(seconds(Some(-1.0), "t").is_err());
        assert!(seconds(Some(f64::NAN), "t").is_err());
    }
}
