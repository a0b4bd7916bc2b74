//! Priority updates: each sent to the shard that owns its key.

use super::{status, within, AsyncClusterClient};
use crate::client::{PriorityUpdates, RemoteKey};
use crate::error::{Error, Result};
use crate::proto::{self, UpdateRequest};
use tokio::time::Instant;

impl AsyncClusterClient {
    /// Sends each update to the shard that owns its key, every shard at
    /// once. Returns how many were applied and how many were stale (the
    /// key's item was evicted or replaced, or the key is from a previous
    /// run of its shard): `applied + stale == updates.len()`. A shard that
    /// cannot be reached is an error (the other shards' updates may have
    /// been applied).
    pub async fn update_priorities(&self, updates: &[(RemoteKey, f64)]) -> Result<PriorityUpdates> {
        let deadline = Instant::now() + self.core.config.call_timeout;
        let n = self.core.shards.len();
        let mut per_shard: Vec<Vec<proto::PriorityUpdate>> = vec![Vec::new(); n];
        for &(key, priority) in updates {
            let s = key.shard as usize;
            let list = per_shard
                .get_mut(s)
                .ok_or_else(|| Error::Config(format!("key names shard {s}, the cluster has {n}")))?;
            list.push(proto::PriorityUpdate { key: Some(key.to_proto()), priority });
        }
        let calls = per_shard.into_iter().enumerate().filter(|(_, l)| !l.is_empty()).map(|(s, list)| {
            let mut c = self.core.shards[s].grpc.clone();
            let sent = list.len() as u64;
            let request = UpdateRequest { updates: list, table: self.core.config.table.clone() };
            async move { (s, sent, within(deadline, c.update_priorities(request)).await) }
        });
        let mut total = PriorityUpdates::default();
        for (s, sent, reply) in futures_util::future::join_all(calls).await {
            let reply = reply.map_err(|e| status(s, e))?;
            if reply.applied > sent {
                let what = format!("{} updates applied of {sent} sent", reply.applied);
                return Err(Error::Malformed { shard: s, what });
            }
            self.core.note_mass(s, reply.incarnation, reply.size, reply.total_mass, reply.min_mass);
            total.applied += reply.applied;
            total.stale += sent - reply.applied;
        }
        Ok(total)
    }
}
