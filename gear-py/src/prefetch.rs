//! Batches drawn ahead on a Rust thread (`sampler(..., prefetch=N)`):
//! the thread samples into pooled buffers without the GIL while Python
//! trains, and hands each filled buffer over through a bounded channel, so
//! taking a batch that is ready costs no Python thread, no GIL hand-off
//! and no wake-up of a waiting Python thread.
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

/// One batch drawn ahead: the buffer holding its columns and what else the
/// batch is made of (`F`: its per-row facts).
pub(crate) type Drawn<F> = (Arc<BatchStorage>, F);

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
pub(crate) struct Prefetcher<F: Send + 'static> {
    /// Batches in the order they were drawn, then the error that ended the
    /// thread, if one did. (`Receiver` is not `Sync`; the lock makes the
    /// sampler shareable as pyo3 requires, and is never contended: a
    /// sampler is used by one thread at a time.)
    ready: Mutex<Option<Receiver<Result<Drawn<F>>>>>,
    /// Set to end the thread.
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    ended: Mutex<Option<Ended>>,
    depth: usize,
    /// The process the thread runs in (a forked child has no copy of it).
    pid: u32,
}

impl<F: Send + 'static> Prefetcher<F> {
    /// Starts a thread that keeps `depth` batches (1..=[`MAX_PREFETCH`])
    /// ready: each in a pooled buffer of columns of `column_bytes`, filled
    /// by `draw`, which returns the batch's facts, or `None` once it sees
    /// `stop` set (it must check it at least every [`WAIT_SLICE`] or
    /// cluster call while it waits).
    pub(crate) fn start<D>(depth: usize, column_bytes: Vec<usize>, mut draw: D) -> Result<Self>
    where
        D: FnMut(&mut [&mut [u8]], &AtomicBool) -> Result<Option<F>> + Send + 'static,
    {
        if !(1..=MAX_PREFETCH).contains(&depth) {
            return Err(Error::Spec(format!("prefetch must be 0 (off) to {MAX_PREFETCH} batches, got {depth}")));
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
                while !stopping.load(Ordering::Acquire) {
                    let drawn = pool.take_or(|| BatchStorage::new(&column_bytes)).and_then(|mut storage| {
                        let Some(unique) = Arc::get_mut(&mut storage) else {
                            return Err(Error::Spec("a pooled batch buffer is still shared".into()));
                        };
                        let facts = draw(&mut unique.columns_mut(), &stopping);
                        pool.keep(storage.clone());
                        Ok(facts?.map(|f| (storage, f)))
                    });
                    // An error sampling may go on after is raised in its
                    // turn and the thread goes on.
                    let fatal = drawn.as_ref().is_err_and(|e| !may_retry(e));
                    let sent = match drawn {
                        Ok(Some(batch)) => to_learner.send(Ok(batch)),
                        Ok(None) => return,
                        Err(e) => to_learner.send(Err(e)),
                    };
                    if fatal || sent.is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| Error::Spec(format!("cannot start the prefetch thread: {e}")))?;
        Ok(Prefetcher {
            ready: Mutex::new(Some(ready)),
            stop,
            thread: Mutex::new(Some(thread)),
            ended: Mutex::new(None),
            depth,
            pid: std::process::id(),
        })
    }

    /// The next batch drawn ahead: at once when one is ready, else waiting
    /// for it with the GIL released, one slice at a time (Ctrl-C
    /// interrupts). The thread's own error (a timeout of the sampler's
    /// `timeout`, a closed table) is raised here, in its turn.
    pub(crate) fn next(&self, py: Python<'_>) -> Result<Drawn<F>> {
        if std::process::id() != self.pid {
            return Err(Error::Spec(
                "a prefetching sampler was made in the parent process; its thread is not in this forked child: \
                 make the sampler here"
                    .into(),
            ));
        }
        if let Some(ended) = self.ended.lock().clone() {
            return Err(ended_error(ended));
        }
        let first = match self.ready.lock().as_ref() {
            Some(ready) => ready.try_recv(),
            None => return Err(ended_error(Ended::Stopped)),
        };
        let received = match first {
            Ok(got) => Some(got),
            Err(TryRecvError::Disconnected) => None,
            Err(TryRecvError::Empty) => loop {
                let waited = py.detach(|| self.ready.lock().as_ref().map(|ready| ready.recv_timeout(WAIT_SLICE)));
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

    /// Ends the thread and waits for it (at most one draw; without the GIL).
    /// Batches already drawn are dropped; those the caller holds stay valid.
    pub(crate) fn close(&self, py: Python<'_>) {
        self.stop.store(true, Ordering::Release);
        // Dropping the receiver frees a thread blocked on a full channel.
        drop(self.ready.lock().take());
        if let Some(thread) = self.thread.lock().take() {
            py.detach(|| {
                let _ = thread.join();
            });
        }
        self.ended.lock().get_or_insert(Ended::Stopped);
    }
}

impl<F: Send + 'static> Drop for Prefetcher<F> {
    /// Tells the thread to end without waiting for it: it owns what it
    /// touches and ends at its next check.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
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
