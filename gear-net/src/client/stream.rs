//! One trajectory streamed to a shard while it is written.
//!
//! [`ClusterClient::insert`] sends whole trajectories; an actor with long
//! episodes would have to hold a whole one first. A [`TrajectoryStream`]
//! instead opens the shard's `Insert` stream when the trajectory begins and
//! sends its steps in chunks as they come, so the actor holds one chunk at
//! most. The shard appends each chunk to a slot it holds for the stream and
//! commits the trajectory when the chunk marked `end` arrives; a stream
//! that ends any other way (dropped, the actor killed, the connection
//! broken, a chunk refused) leaves nothing stored.
//!
//! Deadlines: the stream itself may stay open for as long as the episode
//! runs (the one call the client puts under no call deadline; HTTP/2
//! keepalive still closes it if the shard goes silent); each chunk waits
//! at most the deadline it is given for room in the stream, and the key at
//! most the one [`TrajectoryStream::key`] is given. Short deadlines that
//! the caller repeats let it stay responsive (Python's Ctrl-C).
//!
//! Its methods block, as [`ClusterClient`]'s do, and are refused the same
//! way inside a tokio runtime ([`Error::InsideRuntime`]).

use super::cluster::status;
use super::{ClusterClient, RemoteKey, WriteTarget};
use crate::error::{Error, Result};
use crate::proto::{InsertChunk, InsertReply};
use bytes::Bytes;
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Chunks in flight between the actor and the stream (so a slow shard
/// holds the actor back instead of chunks piling up in memory).
const CHUNKS_IN_FLIGHT: usize = 2;

/// A trajectory being streamed to one shard (see the module doc). Dropped
/// before [`send_end`](TrajectoryStream::send_end), it is abandoned: the shard
/// stores none of it.
pub struct TrajectoryStream {
    shard: usize,
    runtime: tokio::runtime::Handle,
    sender: Option<mpsc::Sender<InsertChunk>>,
    call: Option<JoinHandle<std::result::Result<tonic::Response<InsertReply>, tonic::Status>>>,
    /// Whether a chunk has been sent (the priority rides on the first).
    started: bool,
    /// The client's call deadline: how long a refused chunk's status is
    /// awaited.
    call_timeout: Duration,
    /// The table the first chunk names (the client's configured one).
    table: String,
}

impl std::fmt::Debug for TrajectoryStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrajectoryStream").field("shard", &self.shard).field("started", &self.started).finish()
    }
}

impl ClusterClient {
    /// Opens a stream for one trajectory to the shard `target` picks now
    /// (round-robin over the live shards, the most free one, or the one
    /// named). Nothing is stored until [`TrajectoryStream::send_end`].
    pub fn open_trajectory(&self, target: WriteTarget) -> Result<TrajectoryStream> {
        let core = &self.inner.core;
        let n = core.shards.len();
        let shard = match target {
            WriteTarget::Shard(s) if s < n => s,
            WriteTarget::Shard(s) => return Err(Error::Config(format!("no shard {s}; the cluster has {n}"))),
            WriteTarget::RoundRobin => core.round_robin(1)[0],
            WriteTarget::MostFree => self.block_on(core.spread_by_free_space(1))?[0],
        };
        let runtime = self.handle()?;
        core.forget_mass(shard);
        let (sender, receiver) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(receiver));
        let mut client = core.grpc(shard)?;
        let call = runtime.spawn(async move { client.insert(request).await });
        Ok(TrajectoryStream {
            shard,
            runtime,
            sender: Some(sender),
            call: Some(call),
            started: false,
            call_timeout: core.config.call_timeout,
            table: core.config.table.clone(),
        })
    }
}

impl TrajectoryStream {
    /// The shard the trajectory goes to.
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// Whether any chunk was sent yet (a priority given now would no
    /// longer ride on the first chunk).
    pub fn started(&self) -> bool {
        self.started
    }

    /// Sends `steps` steps, one buffer per column of the spec (`steps x
    /// step bytes`). `priority` is the trajectory's, read by the shard from
    /// the first chunk only. Waits at most `timeout` for room in the
    /// stream: `Ok(false)` means there was none and nothing was sent (send
    /// the same chunk again).
    pub fn send(&mut self, steps: u64, columns: Vec<Bytes>, priority: Option<f64>, timeout: Duration) -> Result<bool> {
        self.push(InsertChunk { steps, columns, priority, end: false, ..InsertChunk::default() }, timeout)
    }

    /// As [`send`](Self::send), for the last steps (none is fine): the
    /// shard commits the trajectory when this chunk arrives, and the stream
    /// closes once it is sent. Then [`key`](Self::key) gives the key.
    pub fn send_end(
        &mut self,
        steps: u64,
        columns: Vec<Bytes>,
        priority: Option<f64>,
        timeout: Duration,
    ) -> Result<bool> {
        let sent = self.push(InsertChunk { steps, columns, priority, end: true, ..InsertChunk::default() }, timeout)?;
        if sent {
            // Closing the stream lets the shard answer.
            self.sender = None;
        }
        Ok(sent)
    }

    /// After [`send_end`](Self::send_end): the committed trajectory's key,
    /// or `Ok(None)` if the shard has not answered within `timeout` (ask
    /// again; the client's call deadline is the caller's to keep).
    pub fn key(&mut self, timeout: Duration) -> Result<Option<RemoteKey>> {
        if self.sender.is_some() {
            return Err(Error::Config("the trajectory's last chunk has not been sent".into()));
        }
        let Some(reply) = self.reply(timeout)? else { return Ok(None) };
        match reply.keys.as_slice() {
            [key] if key.shard as usize == self.shard => Ok(Some(RemoteKey::from_proto(key))),
            keys => Err(Error::Malformed {
                shard: self.shard,
                what: format!("{} keys for one trajectory (or a key of another shard)", keys.len()),
            }),
        }
    }

    /// Runs `f` to its end on the client's runtime; refused inside a
    /// runtime.
    fn block_on<T>(&self, f: impl Future<Output = T>) -> Result<T> {
        block_on(&self.runtime, f)
    }

    fn push(&mut self, chunk: InsertChunk, timeout: Duration) -> Result<bool> {
        let Some(sender) = &self.sender else {
            return Err(Error::Config("the trajectory stream is closed".into()));
        };
        // The priority and the table ride on the first chunk only.
        let chunk = if self.started {
            InsertChunk { priority: None, ..chunk }
        } else {
            InsertChunk { table: self.table.clone(), ..chunk }
        };
        let sent = self.block_on(async {
            match tokio::time::timeout(timeout, sender.reserve()).await {
                Ok(Ok(permit)) => {
                    permit.send(chunk);
                    Ok(true)
                }
                Err(_) => Ok(false),
                Ok(Err(_)) => Err(()),
            }
        })?;
        match sent {
            Ok(sent) => {
                self.started |= sent;
                Ok(sent)
            }
            // The call ended (the shard refused a chunk, or went away):
            // its status says why.
            Err(()) => {
                self.sender = None;
                Err(match self.reply(self.call_timeout) {
                    Err(e) => e,
                    Ok(_) => Error::Malformed { shard: self.shard, what: "the insert stream ended early".into() },
                })
            }
        }
    }

    /// The shard's answer, awaited at most `timeout` (`None`: not yet).
    fn reply(&mut self, timeout: Duration) -> Result<Option<InsertReply>> {
        let shard = self.shard;
        let Some(call) = self.call.as_mut() else {
            return Err(Error::Config("the trajectory stream's answer was taken".into()));
        };
        let joined = block_on(&self.runtime, async { tokio::time::timeout(timeout, call).await })?;
        let answer = match joined {
            Err(_) => return Ok(None),
            Ok(answer) => answer,
        };
        self.call = None;
        match answer {
            Err(e) => Err(Error::NoShard(format!("insert into shard {shard} failed: {e}"))),
            Ok(Err(s)) => Err(status(shard, s)),
            Ok(Ok(reply)) => Ok(Some(reply.into_inner())),
        }
    }
}

/// `f` run on `runtime` from a thread outside any runtime (where
/// `Handle::block_on` would panic, [`Error::InsideRuntime`]).
fn block_on<T>(runtime: &tokio::runtime::Handle, f: impl Future<Output = T>) -> Result<T> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::InsideRuntime);
    }
    Ok(runtime.block_on(f))
}

impl Drop for TrajectoryStream {
    fn drop(&mut self) {
        // Closing the stream without `end` makes the shard abandon the
        // open trajectory; the call's task ends on its own.
        self.sender = None;
    }
}
