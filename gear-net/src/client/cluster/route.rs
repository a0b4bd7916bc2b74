//! Inserts: which shard each trajectory goes to (the write target).

use super::{AsyncClusterClient, ClientCore};
use crate::client::{RemoteKey, RemoteTrajectory, WriteTarget};
use crate::error::{Error, Result};

impl AsyncClusterClient {
    /// Inserts whole trajectories, each sent in chunks of at most
    /// `chunk_steps` steps (0: one chunk each), into `target`. Returns the
    /// keys in the order of `trajectories`. A failure after some
    /// trajectories were committed is [`Error::PartialInsert`], which lists
    /// them; a trajectory is never stored in part. Each insert stream (at
    /// most [`TRAJECTORIES_PER_STREAM`](crate::client::TRAJECTORIES_PER_STREAM)
    /// trajectories) has `call_timeout` to finish. A shard's rate limiter
    /// may hold a trajectory back: aimed at one shard, it waits there for
    /// up to 3/4 of `call_timeout`; spread (round robin, most free), it
    /// waits [`HELD_INSERT_SLICE`](crate::client::HELD_INSERT_SLICE) on a
    /// shard, then goes to the next live one (which may hold it twice as
    /// long, up to [`HELD_INSERT_SLICE_MAX`](crate::client::HELD_INSERT_SLICE_MAX)),
    /// until `call_timeout` has passed. Either way a trajectory held to the end fails with the
    /// shard's `DeadlineExceeded` ("rate limiter") and is not stored.
    pub async fn insert(
        &self,
        target: WriteTarget,
        trajectories: Vec<RemoteTrajectory>,
        chunk_steps: u64,
    ) -> Result<Vec<RemoteKey>> {
        let n = self.core.shards.len();
        let mut per_shard: Vec<Vec<(usize, RemoteTrajectory)>> = vec![Vec::new(); n];
        let shards = match target {
            WriteTarget::Shard(s) if s < n => vec![s; trajectories.len()],
            WriteTarget::Shard(s) => return Err(Error::Config(format!("no shard {s}; the cluster has {n}"))),
            WriteTarget::RoundRobin => self.core.round_robin(trajectories.len()),
            WriteTarget::MostFree => self.core.spread_by_free_space(trajectories.len()).await?,
        };
        for ((i, t), s) in trajectories.into_iter().enumerate().zip(shards) {
            per_shard[s].push((i, t));
        }
        let spread = !matches!(target, WriteTarget::Shard(_));
        self.core.send_routed(per_shard, chunk_steps, spread).await
    }
}

impl ClientCore {
    /// The shard for each of `n` trajectories written round-robin: the
    /// next live shard in turn (every shard when none is known live).
    pub(crate) fn round_robin(&self, n: usize) -> Vec<usize> {
        let live: Vec<usize> = {
            let st = self.state.lock();
            (0..self.shards.len()).filter(|&s| !st[s].lost).collect()
        };
        let live = if live.is_empty() { (0..self.shards.len()).collect() } else { live };
        let mut next = self.next_writer.lock();
        (0..n)
            .map(|_| {
                let s = live[*next % live.len()];
                *next = next.wrapping_add(1);
                s
            })
            .collect()
    }

    /// The live shard after `shard` in turn (`shard` itself when no other
    /// is live): where a trajectory `shard` held back goes next.
    pub(crate) fn next_live_after(&self, shard: usize) -> usize {
        let n = self.shards.len();
        let st = self.state.lock();
        (1..n).map(|k| (shard + k) % n).find(|&s| !st[s].lost).unwrap_or(shard)
    }
}
