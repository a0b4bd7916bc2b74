//! Tuning of the RDMA transport's two sides: [`RdmaConfig`] for the reader
//! (a trainer's transport), [`RdmaServerConfig`] for a shard's server.

use std::time::Duration;

use gear_core::transport::MAX_QUEUE_PAIRS;

use crate::verbs::MAX_SERVICE_LEVEL;

use crate::error::{Error, Result};

/// Bits of a `wr_id` that hold the request's index in its chain (so a
/// chain has at most 64 requests).
pub(crate) const INDEX_BITS: u32 = 6;

/// Tuning of the reading side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaConfig {
    /// Queue pairs per connection (reads are spread over them).
    pub queue_pairs: usize,
    /// READs per chain (one doorbell, only the last signalled); 1 to 64.
    pub chain_len: usize,
    /// Requests outstanding per queue pair.
    pub send_queue_depth: u32,
    /// Completion queue entries; also the cap on requests outstanding over
    /// all queue pairs.
    pub completion_queue_entries: u32,
    /// Tries per piece for retryable failures (retry exceeded, ...).
    pub max_attempts: u32,
    /// Largest single READ; longer ops are split.
    pub max_read_bytes: u32,
    /// Local ACK timeout exponent given to the queue pairs.
    pub ack_timeout: u8,
    /// Transport retry count given to the queue pairs.
    pub retry_count: u8,
    /// Traffic class of the queue pairs' global route header (on RoCE v2
    /// the DSCP and ECN bits of the IP header).
    pub traffic_class: u8,
    /// Service level of the queue pairs' address vector, 0 to 15.
    pub service_level: u8,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            queue_pairs: 4,
            chain_len: 32,
            send_queue_depth: 256,
            completion_queue_entries: 8192,
            max_attempts: 3,
            max_read_bytes: 1 << 30,
            ack_timeout: 14,
            retry_count: 7,
            traffic_class: 0,
            service_level: 0,
        }
    }
}

impl RdmaConfig {
    /// Refuses settings no queue pair can have, naming the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Core(gear_core::Error::InvalidSpec(format!("rdma config: {what}"))));
        if self.queue_pairs == 0 || self.queue_pairs > MAX_QUEUE_PAIRS {
            return bad(format!("{} queue pairs, expected 1 to {MAX_QUEUE_PAIRS}", self.queue_pairs));
        }
        if self.chain_len == 0 || self.chain_len > 1 << INDEX_BITS {
            return bad(format!("chain length {}, expected 1 to {}", self.chain_len, 1 << INDEX_BITS));
        }
        if (self.send_queue_depth as usize) < self.chain_len || self.completion_queue_entries < self.send_queue_depth {
            return bad(format!(
                "send queue depth {} must hold a chain ({}) and fit the completion queue ({})",
                self.send_queue_depth, self.chain_len, self.completion_queue_entries
            ));
        }
        if self.max_attempts == 0 || self.max_read_bytes == 0 {
            return bad("max_attempts and max_read_bytes must be at least 1".into());
        }
        check_service_level(self.service_level)
    }
}

fn check_service_level(service_level: u8) -> Result<()> {
    if service_level > MAX_SERVICE_LEVEL {
        return Err(Error::Core(gear_core::Error::InvalidSpec(format!(
            "rdma config: service level {service_level}, expected 0 to {MAX_SERVICE_LEVEL}"
        ))));
    }
    Ok(())
}

/// Bounds and path settings of a shard's [`RdmaServer`](crate::RdmaServer).
///
/// Every accepted client connection holds queue pairs (device memory, and
/// a finite number per device) until the client connects again (same
/// session: the new connection replaces it), the region is withdrawn, or
/// the server reaps it: when an accept needs room, connections idle (no
/// accept or keep-alive) for [`idle_timeout`](Self::idle_timeout) are
/// closed, least recently used first. An accept that still finds no room
/// is refused with `gear_core::Error::Exhausted`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaServerConfig {
    /// Queue pairs the server holds at most, over all clients and regions.
    pub max_queue_pairs: usize,
    /// Queue pairs one client host (one GID) holds at most, over all its
    /// sessions and regions.
    pub max_queue_pairs_per_client: usize,
    /// How long a connection must have been idle to be reaped for room.
    pub idle_timeout: Duration,
    /// Local ACK timeout exponent given to the queue pairs.
    pub ack_timeout: u8,
    /// Transport retry count given to the queue pairs.
    pub retry_count: u8,
    /// Traffic class of the queue pairs' global route header.
    pub traffic_class: u8,
    /// Service level of the queue pairs' address vector, 0 to 15.
    pub service_level: u8,
}

impl Default for RdmaServerConfig {
    fn default() -> Self {
        RdmaServerConfig {
            // 1024 clients of 4 queue pairs; a ConnectX serves far more
            // queue pairs, but each costs device and host memory.
            max_queue_pairs: 4096,
            // 64 trainer processes of 4 queue pairs on one host.
            max_queue_pairs_per_client: 256,
            idle_timeout: Duration::from_secs(60),
            ack_timeout: 14,
            retry_count: 7,
            traffic_class: 0,
            service_level: 0,
        }
    }
}

impl RdmaServerConfig {
    /// Refuses settings no queue pair can have, naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.max_queue_pairs == 0 || self.max_queue_pairs_per_client == 0 {
            return Err(Error::Core(gear_core::Error::InvalidSpec(format!(
                "rdma server config: max_queue_pairs {} and max_queue_pairs_per_client {} must be at least 1",
                self.max_queue_pairs, self.max_queue_pairs_per_client
            ))));
        }
        check_service_level(self.service_level)
    }
}
