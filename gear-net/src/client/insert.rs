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

use super::{chunks_of, status, ClusterClient, Grpc, RemoteKey, RemoteTrajectory};
use crate::committed::committed_keys;
use crate::error::{Error, Result};

/// Trajectories per insert stream: small enough that the keys of a failed
/// stream fit the error's details ([`crate::committed::MAX_DETAIL_BYTES`]),
/// large enough that the stream's round trip is not felt.
pub const TRAJECTORIES_PER_STREAM: usize = 256;

/// What one shard's streams committed, and how the first failure ended them.
struct ShardOutcome {
    committed: Vec<(usize, RemoteKey)>,
    failure: Option<Error>,
}

/// Sends `list` to shard `shard`, stream after stream, stopping at the
/// first failure.
async fn insert_into_shard(
    shard: usize,
    mut client: Grpc,
    table: String,
    list: Vec<(usize, RemoteTrajectory)>,
    chunk_steps: u64,
) -> ShardOutcome {
    let mut committed = Vec::with_capacity(list.len());
    let mut rest = list.into_iter().peekable();
    while rest.peek().is_some() {
        let stream: Vec<(usize, RemoteTrajectory)> = rest.by_ref().take(TRAJECTORIES_PER_STREAM).collect();
        let order: Vec<usize> = stream.iter().map(|(i, _)| *i).collect();
        let chunks = chunks_of(&table, stream.into_iter().map(|(_, t)| t), chunk_steps);
        let (keys, failure) = match client.insert(tokio_stream::iter(chunks)).await {
            Ok(reply) => {
                let keys = reply.into_inner().keys;
                if keys.len() != order.len() {
                    let what = format!("{} keys for {} trajectories", keys.len(), order.len());
                    return ShardOutcome { committed, failure: Some(Error::Malformed { shard, what }) };
                }
                (keys, None)
            }
            Err(e) => (committed_keys(&e), Some(status(shard, e))),
        };
        if keys.len() > order.len() || keys.iter().any(|k| k.shard as usize != shard) {
            let what = format!("{} keys, some of another shard, for {} trajectories", keys.len(), order.len());
            return ShardOutcome { committed, failure: Some(Error::Malformed { shard, what }) };
        }
        committed.extend(order.into_iter().zip(keys.iter().map(RemoteKey::from)));
        if failure.is_some() {
            return ShardOutcome { committed, failure };
        }
    }
    ShardOutcome { committed, failure: None }
}

impl ClusterClient {
    /// Sends each shard its `(index, trajectory)` list; returns the keys in
    /// index order (indices `0..n` across the lists).
    pub(super) fn send_routed(
        &self,
        per_shard: Vec<Vec<(usize, RemoteTrajectory)>>,
        chunk_steps: u64,
    ) -> Result<Vec<RemoteKey>> {
        let total: usize = per_shard.iter().map(Vec::len).sum();
        let outcomes = self.runtime.block_on(async {
            let mut calls = Vec::new();
            for (s, list) in per_shard.into_iter().enumerate() {
                if list.is_empty() {
                    continue;
                }
                let client = self.shards[s].clone();
                calls.push((
                    s,
                    tokio::spawn(insert_into_shard(s, client, self.config.table.clone(), list, chunk_steps)),
                ));
            }
            let mut out = Vec::new();
            for (s, call) in calls {
                out.push(match call.await {
                    Ok(outcome) => outcome,
                    Err(e) => ShardOutcome {
                        committed: Vec::new(),
                        failure: Some(Error::NoShard(format!("insert into shard {s} failed: {e}"))),
                    },
                });
            }
            out
        });
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
