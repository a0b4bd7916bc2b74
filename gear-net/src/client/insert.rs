//! Sending routed trajectories, and what a failure part way reports.
//!
//! Each shard's trajectories go in streams of at most
//! [`TRAJECTORIES_PER_STREAM`], one after another; shards are written in
//! parallel. A shard commits each trajectory as its last chunk arrives, so
//! when a stream fails the trajectories before the failure are stored: the
//! shard lists their keys in the error ([`crate::committed`]), and the
//! client adds the keys of every stream that had finished, on every shard.
//! If anything was committed the error is [`Error::PartialInsert`] naming
//! each committed trajectory by its index; otherwise it is the failure
//! itself. A shard that dies mid-stream reports nothing: its unfinished
//! stream counts as not committed (whatever it had stored went with it or is
//! stale under its next incarnation).
//!
//! Held trajectories: each stream tells its shard how long it may wait to
//! begin a trajectory (`begin_wait_ms`). A writer aimed at one shard lets
//! it wait most of the call's deadline, so the shard's refusal arrives
//! before the client gives up (and the shard stops waiting when the client
//! does). A writer that spreads its trajectories (round robin, most free)
//! lets each shard wait [`HELD_INSERT_SLICE`] at first: a trajectory the
//! shard's rate limiter holds longer goes to the next live shard, which
//! may wait twice as long, and so on (at most [`HELD_INSERT_SLICE_MAX`]),
//! until all are stored or the call's deadline has passed. Per-shard
//! limiters need this. Rows of a batch are spread over the shards by
//! priority mass and trajectories by count, so one shard can run out of
//! inserts (its sampling waits) while the others have too many (their
//! writers wait): a writer waiting on a full shard while the trainer's
//! batch waits on a hungry one deadlocked both until a wait ran out (30
//! s). A held trajectory is never stored in part, so sending it again
//! elsewhere stores it once. What a refusal costs: the trajectory's bytes
//! were sent (the shard reads a chunk before it begins the trajectory);
//! the growing waits keep such resends few where every shard holds its
//! writers for long (a trainer slower than its actors).

use super::call::{self, CallError};
use super::cluster::{status, ClientCore};
use super::{RemoteKey, RemoteTrajectory};
use crate::channel::ShardChannel;
use crate::committed::{committed_keys, was_held};
use crate::error::{Error, Result};
use crate::proto::InsertChunk;
use bytes::Bytes;
use std::time::Duration;
use tokio::time::Instant;
use tonic::codegen::http::HeaderValue;

/// Trajectories per insert stream: small enough that the keys of a failed
/// stream fit the error's details ([`crate::committed::MAX_DETAIL_BYTES`]),
/// large enough that the stream's round trip is not felt.
pub const TRAJECTORIES_PER_STREAM: usize = 256;

/// How long a shard may first hold a spreading writer's trajectory (round
/// robin, most free) before the client sends it to the next shard (module
/// doc); each further shard may hold it twice as long as the one before.
pub const HELD_INSERT_SLICE: Duration = Duration::from_millis(100);

/// The longest a shard may hold a spreading writer's trajectory before it
/// moves on: with [`HELD_INSERT_SLICE`], the longest a trainer waits on a
/// shard starved of inserts while writers wait on the others.
pub const HELD_INSERT_SLICE_MAX: Duration = Duration::from_millis(1600);

/// What one shard's streams committed, and how the first failure ended them.
struct ShardOutcome {
    committed: Vec<(usize, RemoteKey)>,
    failure: Option<Error>,
    /// When the shard held a trajectory back: it and every one after it,
    /// none of them stored.
    held: Vec<(usize, RemoteTrajectory)>,
}

/// How one shard's insert streams are sent.
struct ShardCall {
    shard: usize,
    channel: ShardChannel,
    token: HeaderValue,
    table: String,
    timeout: Duration,
    /// How long the shard may wait to begin each trajectory.
    begin_wait: Duration,
    max_message_bytes: usize,
}

/// Sends `list` to the call's shard, stream after stream, each finished
/// within the call's timeout, stopping at the first failure.
async fn insert_into_shard(call: ShardCall, list: Vec<(usize, RemoteTrajectory)>, chunk_steps: u64) -> ShardOutcome {
    let ShardCall { shard, channel, token, table, timeout, begin_wait, max_message_bytes } = call;
    let mut committed = Vec::with_capacity(list.len());
    let mut sent = 0;
    while sent < list.len() {
        let stream = &list[sent..list.len().min(sent + TRAJECTORIES_PER_STREAM)];
        let order: Vec<usize> = stream.iter().map(|(i, _)| *i).collect();
        let chunks = chunks_of(&table, stream.iter().map(|(_, t)| t), chunk_steps, begin_wait);
        let call = tokio::time::timeout(timeout, call::insert(&channel, &token, chunks, max_message_bytes));
        let reply = call.await.unwrap_or_else(|_| {
            Err(CallError::Status(tonic::Status::deadline_exceeded(format!(
                "the insert stream did not finish within {timeout:?}"
            ))))
        });
        let malformed = |committed, what| ShardOutcome {
            committed,
            failure: Some(Error::Malformed { shard, what }),
            held: Vec::new(),
        };
        let mut held = false;
        let (keys, failure) = match reply {
            Ok(reply) => {
                let keys = reply.keys;
                if keys.len() != order.len() {
                    return malformed(committed, format!("{} keys for {} trajectories", keys.len(), order.len()));
                }
                (keys, None)
            }
            Err(CallError::Status(e)) => {
                held = was_held(&e);
                (committed_keys(&e), Some(status(shard, e)))
            }
            Err(CallError::Malformed(what)) => (Vec::new(), Some(Error::Malformed { shard, what })),
            Err(CallError::Overwritten { count, .. }) => {
                let what = format!("an insert reply says {count} sampled rows were overwritten");
                (Vec::new(), Some(Error::Malformed { shard, what }))
            }
        };
        if keys.len() > order.len() || keys.iter().any(|k| k.shard as usize != shard) {
            let what = format!("{} keys, some of another shard, for {} trajectories", keys.len(), order.len());
            return malformed(committed, what);
        }
        let stored = keys.len();
        committed.extend(order.into_iter().zip(keys.iter().map(RemoteKey::from_proto)));
        if failure.is_some() {
            let held = if held { list.into_iter().skip(sent + stored).collect() } else { Vec::new() };
            return ShardOutcome { committed, failure, held };
        }
        sent += stream.len();
    }
    ShardOutcome { committed, failure: None, held: Vec::new() }
}

impl ClientCore {
    /// Sends each shard its `(index, trajectory)` list; returns the keys in
    /// index order (indices `0..n` across the lists). With `spread`, a
    /// trajectory a shard holds back longer than [`HELD_INSERT_SLICE`] goes
    /// to the next live shard, round after round (each shard's wait twice
    /// the last one's, at most [`HELD_INSERT_SLICE_MAX`]), until the call's
    /// timeout has passed (module doc); without, each shard may hold its
    /// trajectories for most of the call's timeout. Shards are written in
    /// parallel, one task each; the tasks are aborted (their streams cut
    /// off, so nothing half sent is stored) if the future is dropped.
    pub(crate) async fn send_routed(
        &self,
        per_shard: Vec<Vec<(usize, RemoteTrajectory)>>,
        chunk_steps: u64,
        spread: bool,
    ) -> Result<Vec<RemoteKey>> {
        let total: usize = per_shard.iter().map(Vec::len).sum();
        let timeout = self.config.call_timeout;
        let deadline = Instant::now() + timeout;
        let mut begin_wait = if spread { HELD_INSERT_SLICE.min(timeout) } else { timeout.mul_f64(0.75) };
        let mut committed = Vec::with_capacity(total);
        let mut round = per_shard;
        let first_failure = loop {
            let mut next: Vec<Vec<(usize, RemoteTrajectory)>> = vec![Vec::new(); round.len()];
            let mut first_failure = None;
            let mut held_failure = None;
            for (s, outcome) in self.send_round(round, chunk_steps, begin_wait).await {
                committed.extend(outcome.committed);
                let Some(e) = outcome.failure else { continue };
                if !outcome.held.is_empty() {
                    if spread {
                        next[self.next_live_after(s)].extend(outcome.held);
                    }
                    held_failure.get_or_insert(e);
                    continue;
                }
                if let Error::Status { shard, status } = &e {
                    if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded) {
                        self.mark_lost(*shard, status.message());
                    }
                }
                first_failure.get_or_insert(e);
            }
            let pending: usize = next.iter().map(Vec::len).sum();
            if first_failure.is_some() || pending == 0 || Instant::now() >= deadline {
                break first_failure.or_else(|| held_failure.map(|e| held_everywhere(e, pending, timeout)));
            }
            round = next;
            // The last round's waits end by the call's deadline.
            let left = deadline.saturating_duration_since(Instant::now());
            begin_wait = (begin_wait * 2).min(HELD_INSERT_SLICE_MAX).min(left);
        };
        committed.sort_unstable_by_key(|&(i, _)| i);
        match first_failure {
            None if committed.len() == total => Ok(committed.into_iter().map(|(_, k)| k).collect()),
            None => Err(Error::NoShard(format!("{} of {total} trajectories got no key", total - committed.len()))),
            Some(e) if committed.is_empty() => Err(e),
            Some(e) => Err(Error::PartialInsert { committed, source: Box::new(e) }),
        }
    }

    /// One round of [`send_routed`](Self::send_routed): every shard's list
    /// sent in parallel; the outcomes by shard, lowest first (so the first
    /// failure reported is the lowest shard's, whatever order the streams
    /// ended in).
    async fn send_round(
        &self,
        per_shard: Vec<Vec<(usize, RemoteTrajectory)>>,
        chunk_steps: u64,
        begin_wait: Duration,
    ) -> Vec<(usize, ShardOutcome)> {
        let mut calls = tokio::task::JoinSet::new();
        let mut shard_of = std::collections::HashMap::new();
        for (s, list) in per_shard.into_iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            // The shard's mass grows with the insert: ask it afresh.
            self.forget_mass(s);
            let call = ShardCall {
                shard: s,
                channel: self.shards[s].channel.clone(),
                token: self.token.clone(),
                table: self.config.table.clone(),
                timeout: self.config.call_timeout,
                begin_wait,
                max_message_bytes: self.config.max_message_bytes,
            };
            let id = calls.spawn(insert_into_shard(call, list, chunk_steps)).id();
            shard_of.insert(id, s);
        }
        let mut outcomes = Vec::new();
        while let Some(joined) = calls.join_next_with_id().await {
            let id = match &joined {
                Ok((id, _)) => *id,
                Err(e) => e.id(),
            };
            let s = shard_of.get(&id).copied().unwrap_or(usize::MAX);
            outcomes.push((
                s,
                joined.map(|(_, o)| o).unwrap_or_else(|e| ShardOutcome {
                    committed: Vec::new(),
                    failure: Some(Error::NoShard(format!("insert into shard {s} failed: {e}"))),
                    held: Vec::new(),
                }),
            ));
        }
        outcomes.sort_by_key(|(s, _)| *s);
        outcomes
    }
}

/// The failure of a spread insert whose `pending` trajectories every shard
/// held back until `timeout` passed: the last shard's refusal (a rate
/// limiter's `DeadlineExceeded`), told as what happened to the call.
fn held_everywhere(last: Error, pending: usize, timeout: Duration) -> Error {
    match last {
        Error::Status { shard, status } if pending > 0 => {
            let message = format!(
                "the shards' rate limiters held {pending} trajectories back for the call's {timeout:?}, moved from \
                 shard to shard (the last refusal, shard {shard}: {})",
                status.message()
            );
            Error::Status { shard, status: Box::new(tonic::Status::new(status.code(), message)) }
        }
        e => e,
    }
}

/// The insert stream of `trajectories` into `table`: chunks of at most
/// `chunk_steps`, the first naming the table and the shard's `begin_wait`.
/// The chunks share the trajectories' buffers (no copy), which stay the
/// caller's to send again.
fn chunks_of<'a>(
    table: &str,
    trajectories: impl Iterator<Item = &'a RemoteTrajectory>,
    chunk_steps: u64,
    begin_wait: Duration,
) -> Vec<InsertChunk> {
    let mut out = Vec::new();
    for t in trajectories {
        if chunk_steps == 0 || chunk_steps >= t.steps {
            out.push(InsertChunk {
                steps: t.steps,
                columns: t.columns.clone(),
                priority: t.priority,
                end: true,
                ..InsertChunk::default()
            });
            continue;
        }
        let step_bytes: Vec<usize> = t.columns.iter().map(|c| c.len() / t.steps as usize).collect();
        let mut done = 0u64;
        while done < t.steps {
            let steps = chunk_steps.min(t.steps - done);
            let columns = t
                .columns
                .iter()
                .zip(&step_bytes)
                .map(|(c, &b)| {
                    let range = done as usize * b..(done + steps) as usize * b;
                    if range.end <= c.len() {
                        c.slice(range)
                    } else {
                        Bytes::new()
                    }
                })
                .collect();
            let priority = if done == 0 { t.priority } else { None };
            done += steps;
            out.push(InsertChunk { steps, columns, priority, end: done >= t.steps, ..InsertChunk::default() });
        }
    }
    if let Some(first) = out.first_mut() {
        first.table = table.to_owned();
        first.begin_wait_ms = Some(begin_wait.as_millis().try_into().unwrap_or(u64::MAX));
    }
    out
}
