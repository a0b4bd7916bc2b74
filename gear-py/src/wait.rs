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

/// Runs `call` on one of the process's call threads and waits for its
/// answer with the GIL released, one [`WAIT_SLICE`] at a time, running
/// Python's signal handlers in between: Ctrl-C ends the wait within a
/// slice. A call left behind that way finishes on its thread (every cluster
/// call has a deadline) and its answer is dropped; it owns everything it
/// touches.
pub(crate) fn off_thread<T, F>(py: Python<'_>, call: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    use std::sync::mpsc::{sync_channel, RecvTimeoutError};
    let (answer, answered) = sync_channel(1);
    call_threads::run(Box::new(move || {
        let _ = answer.send(call());
    }))?;
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

/// The threads [`off_thread`] runs calls on: started when every one is
/// busy, kept while calls come (a thread per call cost a Python actor's
/// small remote inserts a third of their speed), ended after
/// [`call_threads::IDLE_EXIT`] without one.
mod call_threads {
    use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
    use std::sync::{Mutex, MutexGuard};
    use std::time::Duration;

    /// One call.
    pub(super) type Job = Box<dyn FnOnce() + Send>;

    /// How long an idle thread waits for a call before it ends.
    pub(super) const IDLE_EXIT: Duration = Duration::from_secs(30);

    /// An idle thread: its number and where its next call goes.
    struct Idle {
        id: u64,
        jobs: Sender<Job>,
    }

    /// The process's call threads.
    struct Pool {
        /// The idle threads, the most recently idle last.
        idle: Vec<Idle>,
        /// The number of the last thread started.
        last_id: u64,
        /// The process the threads belong to.
        pid: u32,
    }

    static POOL: Mutex<Pool> = Mutex::new(Pool { idle: Vec::new(), last_id: 0, pid: 0 });

    /// The pool (a panic elsewhere while it was held left it whole).
    /// In a child forked from a process that had call threads it starts
    /// empty: those threads were not copied, and a call handed to one would
    /// never run.
    fn pool() -> MutexGuard<'static, Pool> {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        if pool.pid != pid {
            // Forgotten, not dropped: a forked copy's senders are inert.
            std::mem::forget(std::mem::take(&mut pool.idle));
            pool.pid = pid;
        }
        pool
    }

    /// Hands `job` to an idle thread, or to a new one when none is idle.
    pub(super) fn run(job: Job) -> crate::error::Result<()> {
        let mut job = job;
        loop {
            let popped = pool().idle.pop();
            let Some(popped) = popped else { break };
            // A thread that was popped never ends before it receives
            // (see `serve`), so this fails only if it panicked.
            match popped.jobs.send(job) {
                Ok(()) => return Ok(()),
                Err(returned) => job = returned.0,
            }
        }
        let (to_thread, inbox) = channel::<Job>();
        let id = {
            let mut pool = pool();
            pool.last_id += 1;
            pool.last_id
        };
        to_thread.send(job).expect("`inbox` is alive: the thread has not started");
        std::thread::Builder::new()
            .name("gear-call".into())
            .spawn(move || serve(id, to_thread, inbox))
            .map_err(|e| crate::error::Error::Spec(format!("cannot start a thread for the call: {e}")))?;
        Ok(())
    }

    /// A call thread's loop: run a call, offer itself as idle, wait for the
    /// next; end when no call came for [`IDLE_EXIT`] and it is still idle.
    fn serve(id: u64, me: Sender<Job>, jobs: std::sync::mpsc::Receiver<Job>) {
        loop {
            match jobs.recv_timeout(IDLE_EXIT) {
                Ok(job) => {
                    job();
                    pool().idle.push(Idle { id, jobs: me.clone() });
                }
                Err(RecvTimeoutError::Timeout) => {
                    let mut pool = pool();
                    if let Some(at) = pool.idle.iter().position(|i| i.id == id) {
                        pool.idle.remove(at);
                        return;
                    }
                    // Popped by `run` just now: its call is on the way.
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::sync::mpsc::sync_channel;

        /// Calls in a row reuse one thread; calls at once get threads of
        /// their own.
        #[test]
        fn threads_are_reused_and_added_when_busy() {
            let name = || std::thread::current().id();
            let (tx, rx) = sync_channel(1);
            run(Box::new(move || tx.send(name()).unwrap())).unwrap();
            let first = rx.recv().unwrap();
            // Wait until it is idle again.
            while pool().idle.is_empty() {
                std::thread::yield_now();
            }
            let (tx, rx) = sync_channel(1);
            run(Box::new(move || tx.send(name()).unwrap())).unwrap();
            assert_eq!(rx.recv().unwrap(), first, "an idle thread takes the next call");

            let (release, blocked) = std::sync::mpsc::channel::<()>();
            let (tx, rx) = sync_channel(2);
            let tx2 = tx.clone();
            run(Box::new(move || {
                tx.send(name()).unwrap();
                let _ = blocked.recv();
            }))
            .unwrap();
            let busy = rx.recv().unwrap();
            run(Box::new(move || tx2.send(name()).unwrap())).unwrap();
            assert_ne!(rx.recv().unwrap(), busy, "a busy thread's call does not hold the next");
            drop(release);
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
