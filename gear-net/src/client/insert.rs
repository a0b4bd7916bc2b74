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

use super::call::{self, CallError};
use super::cluster::{status, ClientCore};
use super::{RemoteKey, RemoteTrajectory};
use crate::channel::ShardChannel;
use crate::committed::committed_keys;
use crate::error::{Error, Result};
use crate::proto::InsertChunk;
use bytes::Bytes;
use std::time::Duration;
use tonic::codegen::http::HeaderValue;

/// Trajectories per insert stream: small enough that the keys of a failed
/// stream fit the error's details ([`crate::committed::MAX_DETAIL_BYTES`]),
/// large enough that the stream's round trip is not felt.
pub const TRAJECTORIES_PER_STREAM: usize = 256;

/// What one shard's streams committed, and how the first failure ended them.
struct ShardOutcome {
    committed: Vec<(usize, RemoteKey)>,
    failure: Option<Error>,
}

/// How one shard's insert streams are sent.
struct ShardCall {
    shard: usize,
    channel: ShardChannel,
    token: HeaderValue,
    table: String,
    timeout: Duration,
    max_message_bytes: usize,
}

/// Sends `list` to the call's shard, stream after stream, each finished
/// within the call's timeout, stopping at the first failure.
async fn insert_into_shard(call: ShardCall, list: Vec<(usize, RemoteTrajectory)>, chunk_steps: u64) -> ShardOutcome {
    let ShardCall { shard, channel, token, table, timeout, max_message_bytes } = call;
    let mut committed = Vec::with_capacity(list.len());
    let mut rest = list.into_iter().peekable();
    while rest.peek().is_some() {
        let stream: Vec<(usize, RemoteTrajectory)> = rest.by_ref().take(TRAJECTORIES_PER_STREAM).collect();
        let order: Vec<usize> = stream.iter().map(|(i, _)| *i).collect();
        let chunks = chunks_of(&table, stream.into_iter().map(|(_, t)| t), chunk_steps);
        let call = tokio::time::timeout(timeout, call::insert(&channel, &token, chunks, max_message_bytes));
        let reply = call.await.unwrap_or_else(|_| {
            Err(CallError::Status(tonic::Status::deadline_exceeded(format!(
                "the insert stream did not finish within {timeout:?}"
            ))))
        });
        let (keys, failure) = match reply {
            Ok(reply) => {
                let keys = reply.keys;
                if keys.len() != order.len() {
                    let what = format!("{} keys for {} trajectories", keys.len(), order.len());
                    return ShardOutcome { committed, failure: Some(Error::Malformed { shard, what }) };
                }
                (keys, None)
            }
            Err(CallError::Status(e)) => (committed_keys(&e), Some(status(shard, e))),
            Err(CallError::Malformed(what)) => (Vec::new(), Some(Error::Malformed { shard, what })),
            Err(CallError::Overwritten(rows)) => {
                let what = format!("an insert reply says {rows} sampled rows were overwritten");
                (Vec::new(), Some(Error::Malformed { shard, what }))
            }
        };
        if keys.len() > order.len() || keys.iter().any(|k| k.shard as usize != shard) {
            let what = format!("{} keys, some of another shard, for {} trajectories", keys.len(), order.len());
            return ShardOutcome { committed, failure: Some(Error::Malformed { shard, what }) };
        }
        committed.extend(order.into_iter().zip(keys.iter().map(RemoteKey::from_proto)));
        if failure.is_some() {
            return ShardOutcome { committed, failure };
        }
    }
    ShardOutcome { committed, failure: None }
}

impl ClientCore {
    /// Sends each shard its `(index, trajectory)` list; returns the keys in
    /// index order (indices `0..n` across the lists). Shards are written in
    /// parallel, one task each; the tasks are aborted (their streams cut
    /// off, so nothing half sent is stored) if the future is dropped.
    pub(crate) async fn send_routed(
        &self,
        per_shard: Vec<Vec<(usize, RemoteTrajectory)>>,
        chunk_steps: u64,
    ) -> Result<Vec<RemoteKey>> {
        let total: usize = per_shard.iter().map(Vec::len).sum();
        let mut calls = tokio::task::JoinSet::new();
        let mut shard_of = std::collections::HashMap::new();
        for (s, list) in per_shard.into_iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let call = ShardCall {
                shard: s,
                channel: self.shards[s].channel.clone(),
                token: self.token.clone(),
                table: self.config.table.clone(),
                timeout: self.config.call_timeout,
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
                }),
            ));
        }
        // The first failure reported is the lowest shard's, whatever order
        // the streams ended in.
        outcomes.sort_by_key(|(s, _)| *s);
        let outcomes = outcomes.into_iter().map(|(_, o)| o);
        let mut committed = Vec::with_capacity(total);
        let mut first_failure = None;
        for outcome in outcomes {
            committed.extend(outcome.committed);
            if let Some(e) = outcome.failure {
                if let Error::Status { shard, status } = &e {
                    if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded) {
                        self.mark_lost(*shard, status.message());
                    }
                }
                first_failure.get_or_insert(e);
            }
        }
        committed.sort_unstable_by_key(|&(i, _)| i);
        match first_failure {
            None if committed.len() == total => Ok(committed.into_iter().map(|(_, k)| k).collect()),
            None => Err(Error::NoShard(format!("{} of {total} trajectories got no key", total - committed.len()))),
            Some(e) if committed.is_empty() => Err(e),
            Some(e) => Err(Error::PartialInsert { committed, source: Box::new(e) }),
        }
    }
}

/// The insert stream of `trajectories` into `table`: chunks of at most
/// `chunk_steps`, the first naming the table.
fn chunks_of(table: &str, trajectories: impl Iterator<Item = RemoteTrajectory>, chunk_steps: u64) -> Vec<InsertChunk> {
    let mut out = Vec::new();
    for t in trajectories {
        if chunk_steps == 0 || chunk_steps >= t.steps {
            // One chunk: the buffers move, no copy.
            out.push(InsertChunk {
                steps: t.steps,
                columns: t.columns,
                priority: t.priority,
                end: true,
                table: String::new(),
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
            out.push(InsertChunk { steps, columns, priority, end: done >= t.steps, table: String::new() });
        }
    }
    if let Some(first) = out.first_mut() {
        first.table = table.to_owned();
    }
    out
}
