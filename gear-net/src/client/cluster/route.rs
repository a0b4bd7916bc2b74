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
    /// trajectories) has `call_timeout` to finish.
    pub async fn insert(
        &self,
        target: WriteTarget,
        trajectories: Vec<RemoteTrajectory>,
        chunk_steps: u64,
    ) -> Result<Vec<RemoteKey>> {
        let n = self.core.shards.len();
        let mut per_shard: Vec<Vec<(usize, RemoteTrajectory)>> = vec![Vec::new(); n];
        match target {
            WriteTarget::Shard(s) if s < n => per_shard[s] = trajectories.into_iter().enumerate().collect(),
            WriteTarget::Shard(s) => return Err(Error::Config(format!("no shard {s}; the cluster has {n}"))),
            WriteTarget::RoundRobin => {
                let shards = self.core.round_robin(trajectories.len());
                for ((i, t), s) in trajectories.into_iter().enumerate().zip(shards) {
                    per_shard[s].push((i, t));
                }
            }
            WriteTarget::MostFree => {
                let shards = self.core.spread_by_free_space(trajectories.len()).await?;
                for ((i, t), s) in trajectories.into_iter().enumerate().zip(shards) {
                    per_shard[s].push((i, t));
                }
            }
        }
        for (s, list) in per_shard.iter().enumerate() {
            if !list.is_empty() {
                self.core.forget_mass(s);
            }
        }
        self.core.send_routed(per_shard, chunk_steps).await
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
}
