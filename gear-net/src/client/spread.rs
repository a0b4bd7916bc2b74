//! Writers spread by free space ([`WriteTarget::MostFree`]).
//!
//! The client keeps an estimate of each shard's free slots, `capacity -
//! size` from the shard's `Info`, asked again at most every
//! [`ClusterConfig::free_space_refresh`](super::ClusterConfig::free_space_refresh).
//! Each trajectory goes to the shard with the most free slots, ties to the
//! lowest shard id, and counts one slot off that shard's estimate, so one
//! call spreads its trajectories and calls between refreshes see what the
//! client already sent. A full cluster (evicting everywhere) is spread
//! evenly the same way, since estimates go below zero. Shards that do not
//! answer `Info` are left out until the next refresh; if none answers the
//! insert fails.
//!
//! [`WriteTarget::MostFree`]: super::WriteTarget::MostFree

use super::cluster::ClientCore;
use crate::error::{Error, Result};
use std::time::Instant;

/// The free-space estimate of every shard.
#[derive(Debug, Default)]
pub(crate) struct FreeSpace {
    /// When the estimate was last asked of the shards (`None`: never).
    refreshed: Option<Instant>,
    /// Free slots per shard, less the trajectories sent since; `None` for a
    /// shard that did not answer.
    free: Vec<Option<i64>>,
}

/// The shard for each of `n` trajectories: the most free, ties to the lowest id.
fn assign(free: &mut [Option<i64>], n: usize) -> Option<Vec<usize>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut best: Option<(usize, i64)> = None;
        for (s, f) in free.iter().enumerate() {
            if let Some(f) = *f {
                if best.is_none_or(|(_, b)| f > b) {
                    best = Some((s, f));
                }
            }
        }
        let (s, _) = best?;
        if let Some(f) = free[s].as_mut() {
            *f -= 1;
        }
        out.push(s);
    }
    Some(out)
}

impl ClientCore {
    /// Asks every shard's `Info` and returns the new estimate.
    async fn refresh_free_space(&self) -> Vec<Option<i64>> {
        let deadline = tokio::time::Instant::now() + self.config.call_timeout;
        let infos = self.all_infos(deadline).await;
        let mut free = Vec::with_capacity(infos.len());
        for (s, r) in infos.into_iter().enumerate() {
            free.push(match r {
                Ok(info) if info.shard as usize == s => {
                    self.mark_alive(s, info.incarnation);
                    let capacity = i64::try_from(info.capacity).unwrap_or(i64::MAX);
                    let size = i64::try_from(info.size).unwrap_or(i64::MAX);
                    Some(capacity.saturating_sub(size))
                }
                Ok(_) => {
                    self.mark_lost(s, "answers with another shard id");
                    None
                }
                Err(e) => {
                    self.mark_lost(s, e.message());
                    None
                }
            });
        }
        free
    }

    /// The shard for each of `n` trajectories (see the module doc).
    pub(crate) async fn spread_by_free_space(&self, n: usize) -> Result<Vec<usize>> {
        let stale = {
            let space = self.free_space.lock();
            space.refreshed.is_none_or(|t| t.elapsed() >= self.config.free_space_refresh)
        };
        if stale {
            // Asked without the lock held: a call dropped while it waits
            // leaves the old estimate in place.
            let free = self.refresh_free_space().await;
            let mut space = self.free_space.lock();
            space.free = free;
            space.refreshed = Some(Instant::now());
        }
        let mut space = self.free_space.lock();
        assign(&mut space.free, n).ok_or_else(|| Error::NoShard("no shard answered `Info`".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::assign;

    #[test]
    fn the_emptiest_shard_first_ties_to_the_lowest_id() {
        let mut free = vec![Some(3), Some(5), None, Some(5)];
        assert_eq!(assign(&mut free, 5), Some(vec![1, 3, 1, 3, 0]));
        assert_eq!(free, vec![Some(2), Some(3), None, Some(3)]);
        // A full cluster still spreads.
        let mut full = vec![Some(0), Some(0)];
        assert_eq!(assign(&mut full, 3), Some(vec![0, 1, 0]));
        assert_eq!(assign(&mut [None, None], 1), None);
        assert_eq!(assign(&mut [None], 0), Some(vec![]));
    }
}
