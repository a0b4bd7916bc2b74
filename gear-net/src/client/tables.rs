//! What a shard serves: its tables and their counters (`ListTables`), for
//! `gear cluster-info` and monitoring.

use super::cluster::{status, within, AsyncClusterClient};
use crate::error::Result;
use crate::proto::{InfoReply, ListTablesRequest};
use gear_api::WaitStats;
use std::time::Duration;

/// One table of a shard and its counters, as the shard reported them.
/// `inserts` to `bytes_out` count every process using the table; `waits`
/// the server process's calls only.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableStatus {
    /// The table's name on the shard.
    pub name: String,
    /// The table's incarnation (what its keys carry).
    pub incarnation: u64,
    /// Its sampling strategy's name.
    pub sampler: String,
    /// Trajectories that can be sampled.
    pub size: u64,
    /// Slots.
    pub capacity: u64,
    /// Trajectories committed.
    pub inserts: u64,
    /// Rows sampled.
    pub samples: u64,
    /// Trajectories evicted to make room.
    pub evictions: u64,
    /// Trajectories removed after `max_times_sampled` samples.
    pub retired: u64,
    /// Step bytes written into the table.
    pub bytes_in: u64,
    /// Bytes gathered into batches.
    pub bytes_out: u64,
    /// Step bytes received in `Insert` calls.
    pub rpc_bytes_received: u64,
    /// Window bytes sent in `Sample` replies.
    pub rpc_bytes_sent: u64,
    /// Trajectories the server refused because it could not begin them
    /// within their insert stream's begin wait (held by the rate limiter).
    pub held_inserts: u64,
    /// Rows of replies sent from table memory whose slots were reused
    /// while they were sent (the client asked again).
    pub rows_overwritten: u64,
    /// The server process's waits on the table.
    pub waits: WaitStats,
}

/// A time in seconds from the network as a duration (0 when absurd).
fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or_default()
}

impl From<&InfoReply> for TableStatus {
    fn from(i: &InfoReply) -> Self {
        TableStatus {
            name: i.table.clone(),
            incarnation: i.incarnation,
            sampler: i.sampler.clone(),
            size: i.size,
            capacity: i.capacity,
            inserts: i.inserts,
            samples: i.samples,
            evictions: i.evictions,
            retired: i.retired,
            bytes_in: i.bytes_written,
            bytes_out: i.bytes_gathered,
            rpc_bytes_received: i.rpc_bytes_received,
            rpc_bytes_sent: i.rpc_bytes_sent,
            held_inserts: i.held_inserts,
            rows_overwritten: i.rows_overwritten,
            waits: WaitStats {
                insert_waits: i.insert_waits,
                insert_wait: seconds(i.insert_wait_seconds),
                sample_waits: i.sample_waits,
                sample_wait: seconds(i.sample_wait_seconds),
                lock_waits: i.lock_waits,
                lock_wait: seconds(i.lock_wait_seconds),
            },
        }
    }
}

/// A shard's tables.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardTables {
    /// The shard id it answers with.
    pub shard: u32,
    /// The server process's incarnation.
    pub incarnation: u64,
    /// Its tables, in its order.
    pub tables: Vec<TableStatus>,
}

impl AsyncClusterClient {
    /// The tables shard `shard` serves, with their counters.
    pub async fn tables(&self, shard: usize) -> Result<ShardTables> {
        let deadline = tokio::time::Instant::now() + self.core.config.call_timeout;
        let mut c = self.core.grpc(shard)?;
        let reply = within(deadline, c.list_tables(ListTablesRequest {})).await.map_err(|s| status(shard, s))?;
        Ok(ShardTables {
            shard: reply.shard,
            incarnation: reply.incarnation,
            tables: reply.tables.iter().map(TableStatus::from).collect(),
        })
    }
}
