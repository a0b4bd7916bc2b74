//! [`CacheFill`]: a sampler's device cache and the thread that fills it.

use super::device_error;
use crate::error::{Error, Result};
use crate::table::ranges::TableMemory;
use crate::table::ReplayTable;
use gear_core::{DeviceApi, SlotKey, TableRegion};
use gear_device::DeviceCache;
use std::collections::HashSet;
use std::sync::Arc;

/// A sampler's device cache, the thread that fills it, and the admission
/// bookkeeping.
pub(super) struct CacheFill<A: DeviceApi> {
    pub(super) cache: Arc<DeviceCache<A, TableMemory>>,
    /// Bounded: a full queue drops the request rather than block sampling.
    pub(super) tx: Option<std::sync::mpsc::SyncSender<SlotKey>>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
    pub(super) admit_after: u64,
    /// Keys already sent (cleared when it grows past a few cache sizes).
    pub(super) requested: HashSet<SlotKey>,
}

impl<A: DeviceApi> CacheFill<A> {
    pub(super) fn new(device: &A::Device, table: &ReplayTable, entries: usize, admit_after: u64) -> Result<Self> {
        let region = TableRegion::open(TableMemory::new(table.clone()), Some(table.spec()))?;
        let cache = Arc::new(DeviceCache::<A, _>::new(device, Arc::new(region), entries).map_err(device_error)?);
        let (tx, rx) = std::sync::mpsc::sync_channel::<SlotKey>(entries.clamp(16, 4096));
        let filler = cache.clone();
        let thread = std::thread::Builder::new()
            .name("gear-device-cache-fill".into())
            .spawn(move || {
                for key in rx {
                    // A key gone stale before or during its copy is simply
                    // not cached.
                    let _ = filler.insert(key);
                }
            })
            .map_err(|e| Error::Config(format!("cannot start the cache fill thread: {e}")))?;
        Ok(CacheFill { cache, tx: Some(tx), thread: Some(thread), admit_after, requested: HashSet::new() })
    }

    /// Applies the admission rule to the rows of a finished batch.
    pub(super) fn admit(&mut self, table: &ReplayTable, keys: &[SlotKey]) {
        let Some(tx) = &self.tx else { return };
        if self.requested.len() > 4 * self.cache.capacity() {
            self.requested.clear();
        }
        for &key in keys {
            // The cache holds trajectories: an item's is cached for it.
            let Some((trajectory, times)) = table.trajectory_sampled(key) else { continue };
            if self.requested.contains(&trajectory) || self.cache.contains(trajectory) {
                continue;
            }
            if times >= self.admit_after && tx.try_send(trajectory).is_ok() {
                self.requested.insert(trajectory);
            }
        }
    }
}

impl<A: DeviceApi> Drop for CacheFill<A> {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
