//! Reply buffers the shard server reuses between `Sample` calls.
//!
//! A sample reply carries tens of MiB of window bytes. A fresh allocation
//! per reply costs a page fault and the kernel zeroing every page, then the
//! gather writes the same pages again; a reused buffer is already mapped. A
//! buffer goes out inside the reply as [`Bytes`] and comes back to the pool
//! when tonic has encoded the reply and drops it.

use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// Buffers kept for reuse at most.
const KEPT_BUFFERS: usize = 16;

/// A pool of byte buffers (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

/// A buffer on loan from a [`BufferPool`]; returns there when dropped.
struct Loan {
    buf: Vec<u8>,
    pool: Weak<BufferPool>,
}

impl AsRef<[u8]> for Loan {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            let mut free = pool.free.lock();
            if free.len() < KEPT_BUFFERS {
                free.push(std::mem::take(&mut self.buf));
            }
        }
    }
}

impl BufferPool {
    /// A buffer of exactly `len` initialised bytes (their values are
    /// whatever an earlier reply left: callers overwrite all of them).
    /// Prefers the smallest kept buffer that holds `len` bytes.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        let mut buf = {
            let mut free = self.free.lock();
            let fit = free.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity());
            match fit.map(|(i, _)| i) {
                Some(i) => free.swap_remove(i),
                None => free.pop().unwrap_or_default(),
            }
        };
        if buf.len() > len {
            buf.truncate(len);
        } else {
            // Only bytes never initialised before are written here.
            buf.resize(len, 0);
        }
        buf
    }

    /// Lends `buf` out as [`Bytes`]; it comes back when the last clone drops.
    pub(crate) fn lend(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Loan { buf, pool: Arc::downgrade(self) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_and_are_reused() {
        let pool = Arc::new(BufferPool::default());
        let mut a = pool.take(1000);
        assert_eq!(a.len(), 1000);
        a.fill(7);
        let ptr = a.as_ptr();
        let lent = pool.lend(a);
        assert_eq!(lent.len(), 1000);
        let clone = lent.clone();
        drop(lent);
        assert!(pool.free.lock().is_empty(), "a clone still holds the buffer");
        drop(clone);
        let b = pool.take(600);
        assert_eq!((b.len(), b.as_ptr()), (600, ptr), "the same buffer, cut to length");
        let c = pool.take(5000);
        assert_eq!(c.len(), 5000);
        assert!(c.iter().all(|&x| x == 0));
    }

    #[test]
    fn the_pool_keeps_a_bounded_number() {
        let pool = Arc::new(BufferPool::default());
        let lent: Vec<Bytes> = (0..KEPT_BUFFERS + 5).map(|_| pool.lend(pool.take(10))).collect();
        drop(lent);
        assert_eq!(pool.free.lock().len(), KEPT_BUFFERS);
    }
}
