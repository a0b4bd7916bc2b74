//! Tuning of the RDMA transport's reading side.

use gear_core::transport::MAX_QUEUE_PAIRS;

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
        }
    }
}

impl RdmaConfig {
    pub(crate) fn validate(&self) -> Result<()> {
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
        Ok(())
    }
}
