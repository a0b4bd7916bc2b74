//! Batches drawn ahead on a Rust thread (`sampler(..., prefetch=N)`):
//! the thread samples into pooled buffers without the GIL while Python
//! trains, makes each into its `Batch` (and applies the sampler's
//! `transform`, if any) with the GIL, and hands it over through a bounded
//! channel, so taking a batch that is ready runs no Python code, wakes no
//! Python thread and hands no GIL over. The thread runs as a batch thread
//! (`SCHED_BATCH`), so the wake-up a take gives it never preempts the
//! learner.
//!
//! The buffers follow the ownership rule of `batch`: the thread reuses a
//! buffer only once nothing references it (its `Arc` is unique), so a
//! batch Python holds is never overwritten. The thread ends when the
//! sampler is dropped or closed (it checks between draws, and a draw waits
//! at most one wait slice or one cluster call), when the table is closed,
//! or after an error that ends sampling, which the next `sample()` raises
//! (a timeout, or shards of a cluster not answering, is raised in its turn
//! and drawing goes on).

use crate::batch::{BatchStorage, BufferPool};
use crate::error::{Error, Result};
use crate::wait::WAIT_SLICE;
use parking_lot::Mutex;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Most batches a sampler may draw ahead.
pub(crate) const MAX_PREFETCH: usize = 64;

/// How a prefetching sampler's thread ended, for every `next` after it.
#[derive(Clone, Debug)]
enum Ended {
    /// The table was closed: iteration stops.
    Closed,
    /// An error, raised once by the `next` that received it; later calls
    /// name it.
    Failed(String),
    /// The sampler was closed.
    Stopped,
}

/// The thread drawing batches ahead and the receiving end of its batches.
pub(crate) struct Prefetcher {
    control: Arc<Control>,
    ended: Mutex<Option<Ended>>,
    depth: usize,
    /// The thread's id: a `transform` that samples its own sampler would
    /// wait on itself for ever.
    thread_id: std::thread::ThreadId,
}

/// What stops a prefetching sampler's thread: shared with the registry
/// that stops every live one before the interpreter finalizes.
struct Control {
    /// Batches (Python objects, made on the thread) in the order they were
    /// drawn, then the error that ended the thread, if one did.
    /// (`Receiver` is not `Sync`; the lock makes the sampler shareable as
    /// pyo3 requires, and is never contended: a sampler is used by one
    /// thread at a time.)
    ready: Mutex<Option<Receiver<Result<Py<PyAny>>>>>,
    /// Set to end the thread.
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The process the thread runs in (a forked child has no copy of it).
    pid: u32,
}

/// Longest `_stop_prefetching` waits for one thread (a `transform` that never
/// returns is left behind).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Control {
    /// Ends the thread and waits for it (without the GIL, at most
    /// [`STOP_WAIT`]): it finishes the draw or the `transform` it is in.
    fn shut(&self, py: Python<'_>) {
        self.stop.store(true, Ordering::Release);
        // Dropping the receiver frees a thread blocked on a full channel.
        drop(self.ready.lock().take());
        if std::process::id() != self.pid {
            return;
        }
        if let Some(thread) = self.thread.lock().take() {
            py.detach(|| {
                let started = std::time::Instant::now();
                while !thread.is_finished() && started.elapsed() < STOP_WAIT {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                if thread.is_finished() {
                    let _ = thread.join();
                }
            });
        }
    }
}

/// Every prefetching sampler's control, so that [`_stop_prefetching`] can end
/// their threads before the interpreter finalizes.
static LIVE: Mutex<Vec<std::sync::Weak<Control>>> = Mutex::new(Vec::new());

/// Ends every prefetching sampler's thread of this process and waits for
/// each; registered with `atexit` by the module. A thread still inside
/// Python (making a batch, running a `transform`) when finalization
/// began would abort the process when it let go of the GIL.
#[pyfunction]
pub(crate) fn _stop_prefetching(py: Python<'_>) {
    let live: Vec<_> = std::mem::take(&mut *LIVE.lock());
    for control in live.iter().filter_map(std::sync::Weak::upgrade) {
        control.shut(py);
    }
}

impl Prefetcher {
    /// Starts a thread that keeps `depth` batches (1..=[`MAX_PREFETCH`])
    /// ready: each drawn by `draw` into a pooled buffer of columns of
    /// `column_bytes` (without the GIL; it returns the batch's facts, or
    /// `None` once it sees `stop` set, which it must check at least every
    /// [`WAIT_SLICE`] or cluster call while it waits), then made into its
    /// Python object by `make` and passed through `transform`, if given,
    /// with the GIL held: so taking a ready batch runs no Python code on
    /// the caller's thread.
    pub(crate) fn start<F, D, M>(
        depth: usize,
        column_bytes: Vec<usize>,
        mut draw: D,
        mut make: M,
        transform: Option<Py<PyAny>>,
    ) -> Result<Self>
    where
        F: Send + 'static,
        D: FnMut(&mut [&mut [u8]], &AtomicBool) -> Result<Option<F>> + Send + 'static,
        M: FnMut(Python<'_>, Arc<BatchStorage>, F) -> Result<Py<PyAny>> + Send + 'static,
    {
        if !(1..=MAX_PREFETCH).contains(&depth) {
            return Err(Error::Spec(format!("prefetch must be 0 (off) to {MAX_PREFETCH} batches, got {depth}")));
        }
        if let Some(f) = &transform {
            Python::attach(|py| {
                let f = f.bind(py);
                if f.is_callable() {
                    Ok(())
                } else {
                    Err(Error::Spec(format!("transform must be callable, got a {}", f.get_type())))
                }
            })?;
        }
        let (to_learner, ready) = sync_channel(depth);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        // The ready batches, the one being filled, and a few the caller
        // still holds.
        let mut pool = BufferPool::holding(depth + 4);
        let thread = std::thread::Builder::new()
            .name("gear-prefetch".into())
            .spawn(move || {
                run_as_background_thread();
                while !stopping.load(Ordering::Acquire) {
                    let drawn = pool.take_or(|| BatchStorage::new(&column_bytes)).and_then(|mut storage| {
                        let Some(unique) = Arc::get_mut(&mut storage) else {
                            return Err(Error::Spec("a pooled batch buffer is still shared".into()));
                        };
                        let facts = draw(&mut unique.columns_mut(), &stopping);
                        pool.keep(storage.clone());
                        Ok(facts?.map(|f| (storage, f)))
                    });
                    let made = match drawn {
                        // Told to stop: no Python (the interpreter may be
                        // finalizing).
                        Ok(None) => return,
                        _ if stopping.load(Ordering::Acquire) => return,
                        Ok(Some((storage, facts))) => Python::attach(|py| {
                            let batch = make(py, storage, facts)?;
                            match &transform {
                                Some(f) => Ok(f.call1(py, (batch,))?),
                                None => Ok(batch),
                            }
                        }),
                        Err(e) => Err(e),
                    };
                    // An error sampling may go on after is raised in its
                    // turn and the thread goes on.
                    let fatal = made.as_ref().is_err_and(|e| !may_retry(e));
                    if to_learner.send(made).is_err() || fatal {
                        return;
                    }
                }
            })
            .map_err(|e| Error::Spec(format!("cannot start the prefetch thread: {e}")))?;
        let thread_id = thread.thread().id();
        let control = Arc::new(Control {
            ready: Mutex::new(Some(ready)),
            stop,
            thread: Mutex::new(Some(thread)),
            pid: std::process::id(),
        });
        let mut live = LIVE.lock();
        live.retain(|c| c.strong_count() > 0);
        live.push(Arc::downgrade(&control));
        Ok(Prefetcher { control, ended: Mutex::new(None), depth, thread_id })
    }

    /// The next batch drawn ahead: at once when one is ready, else waiting
    /// for it with the GIL released, one slice at a time (Ctrl-C
    /// interrupts). The thread's own error (a timeout of the sampler's
    /// `timeout`, a closed table) is raised here, in its turn.
    pub(crate) fn next(&self, py: Python<'_>) -> Result<Py<PyAny>> {
        if std::process::id() != self.control.pid {
            return Err(Error::Spec(
                "a prefetching sampler was made in the parent process; its thread is not in this forked child: \
                 make the sampler here"
                    .into(),
            ));
        }
        if std::thread::current().id() == self.thread_id {
            return Err(Error::Spec("a sampler's transform cannot sample from that sampler".into()));
        }
        if let Some(ended) = self.ended.lock().clone() {
            return Err(ended_error(ended));
        }
        let first = match self.control.ready.lock().as_ref() {
            Some(ready) => ready.try_recv(),
            None => return Err(ended_error(Ended::Stopped)),
        };
        let received = match first {
            Ok(got) => Some(got),
            Err(TryRecvError::Disconnected) => None,
            Err(TryRecvError::Empty) => loop {
                let waited =
                    py.detach(|| self.control.ready.lock().as_ref().map(|ready| ready.recv_timeout(WAIT_SLICE)));
                match waited {
                    Some(Ok(got)) => break Some(got),
                    Some(Err(RecvTimeoutError::Disconnected)) | None => break None,
                    Some(Err(RecvTimeoutError::Timeout)) => py.check_signals()?,
                }
            },
        };
        let ended = match received {
            Some(Ok(batch)) => return Ok(batch),
            Some(Err(Error::Gear(gear_api::Error::Closed))) => Ended::Closed,
            Some(Err(e)) if may_retry(&e) => return Err(e),
            Some(Err(e)) => {
                *self.ended.lock() = Some(Ended::Failed(e.to_string()));
                return Err(e);
            }
            // The thread ended without a word: only `close` does that.
            None => Ended::Stopped,
        };
        *self.ended.lock() = Some(ended.clone());
        Err(ended_error(ended))
    }

    /// Batches drawn ahead at most.
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// Ends the thread and waits for it (it finishes the draw or the
    /// `transform` it is in; without the GIL). Batches already drawn are
    /// dropped; those the caller holds stay valid.
    pub(crate) fn close(&self, py: Python<'_>) {
        self.control.shut(py);
        self.ended.lock().get_or_insert(Ended::Stopped);
    }
}

impl Drop for Prefetcher {
    /// Tells the thread to end without waiting for it: it owns what it
    /// touches and ends at its next check (or when its send fails).
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        drop(self.control.ready.lock().take());
    }
}

/// Asks the kernel to schedule the calling thread (a prefetch thread, and
/// the gather threads it spawns, which inherit it) as a batch thread,
/// `SCHED_BATCH`: it then never preempts the thread that woke it.
///
/// The learner's take of a ready batch wakes the prefetch thread (its send
/// into the full channel completes). As an ordinary thread it was often
/// run at once on the learner's core, where it drew the next batch (a few
/// ms of CPU) before the take could return; in such processes the take's
/// median was 3.2 to 3.8 ms, against 20 to 26 µs as a batch thread
/// (docs/PERFORMANCE.md, "The take of a prefetched batch after a model
/// step"). A batch thread is otherwise scheduled as an ordinary one of
/// the same nice value, so the draws keep their share of the CPU. Best
/// effort: where the kernel refuses, the thread stays as it was.
fn run_as_background_thread() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // Pid 0 is the calling thread, whose policy alone changes
        // (priority 0 is the only one SCHED_BATCH takes); a refusal (-1)
        // is ignored: best effort.
        // SAFETY: `param` is a valid `sched_param` that outlives the call.
        let _refused = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    }
}

/// Whether sampling may go on after `e`, as a direct `sample()` may be
/// called again: a timeout (nothing to sample for the sampler's whole
/// timeout), or a cluster's shards not answering (they may come back).
fn may_retry(e: &Error) -> bool {
    use gear_net::Error as Net;
    matches!(
        e,
        Error::Gear(gear_api::Error::Timeout { .. })
            | Error::Timeout(_)
            | Error::Net(Net::NoShard(_) | Net::Transport(_) | Net::Status { .. } | Net::Malformed { .. })
    )
}

fn ended_error(ended: Ended) -> Error {
    match ended {
        Ended::Closed => Error::Gear(gear_api::Error::Closed),
        Ended::Failed(why) => Error::Spec(format!("the prefetching sampler stopped after an error: {why}")),
        Ended::Stopped => Error::Spec("the sampler was closed".into()),
    }
}
