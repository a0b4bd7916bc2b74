//! What the client knows of each shard's selection mass, which cross-shard
//! sampling splits a batch's rows by.
//!
//! Every `Sample` and `UpdatePriorities` reply carries the shard's size and
//! masses just after the draw or the updates, so a trainer that samples
//! every shard on every batch (and updates priorities between batches)
//! keeps a current view without asking. The client asks every shard
//! (`Info`, one round trip before the draw) only when that view cannot be
//! used:
//! - a shard is lost (asking is how it is noticed back),
//! - a shard's mass is unknown (never asked, its last reply came from
//!   another incarnation, or this client just inserted into it),
//! - no shard had items when last reported (an empty cluster is asked
//!   again on every batch, so the first inserts are seen at once),
//! - or a shard's mass is older than [`ClusterConfig::mass_refresh`]
//!   (a shard drawn no rows for that long; `Duration::ZERO` asks on every
//!   batch).
//!
//! Inserts and updates by other clients between a shard's last reply and
//! the next allocation make its mass stale, by at most one batch for a
//! shard that had rows in the last batch and `mass_refresh` for one that
//! had none. The reported probabilities remain the ones each row was drawn
//! with (see the client module doc).
//!
//! Each `Sample` request names the shard run the split was made for; a
//! shard restarted since (its table restored or empty) refuses at once
//! with `ABORTED`, is left out of that batch, and the next batch asks every
//! shard again. A shard that another client empties within `mass_refresh`
//! (`max_times_sampled` retiring its last items) holds this client's call
//! for its wait for data, then is left out the same way.
//!
//! [`ClusterConfig::mass_refresh`]: super::ClusterConfig::mass_refresh

use super::cluster::{within, ClientCore};
use super::{LostShard, ShardInfo};
use crate::error::{Error, Result};
use crate::proto::InfoRequest;
use std::time::Instant;

/// Every shard's mass as the client splits a batch's rows by it.
#[derive(Debug, Default)]
pub(crate) struct ShardMasses {
    /// Total mass of each shard (0: lost, empty, or deterministic).
    pub masses: Vec<f64>,
    /// Smallest positive per-item mass of each shard (+inf: none).
    pub mins: Vec<f64>,
    /// Shards with items whose strategy has no mass (FIFO, LIFO, heaps).
    pub deterministic: usize,
}

/// A shard's size and masses as it last reported them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KnownMass {
    size: u64,
    total: f64,
    min: f64,
    at: Instant,
}

impl KnownMass {
    /// The report, or `None` when the total is not a finite number ≥ 0 or
    /// the smallest mass is negative or NaN (an empty shard's is +inf).
    fn new(size: u64, total: f64, min: f64) -> Option<Self> {
        let valid = total.is_finite() && total >= 0.0 && min >= 0.0;
        valid.then(|| KnownMass { size, total, min, at: Instant::now() })
    }
}

impl ShardMasses {
    /// No shard counted yet (the vectors' capacity is kept).
    fn reset(&mut self, shards: usize) {
        self.masses.clear();
        self.masses.resize(shards, 0.0);
        self.mins.clear();
        self.mins.resize(shards, f64::INFINITY);
        self.deterministic = 0;
    }

    /// Counts shard `s` with `mass`.
    fn add(&mut self, s: usize, mass: &KnownMass) {
        if mass.size == 0 {
            return;
        }
        if mass.total == 0.0 {
            self.deterministic += 1;
        }
        self.masses[s] = mass.total;
        if mass.min > 0.0 {
            self.mins[s] = mass.min;
        }
    }
}

/// What one shard's `Info` call came to.
pub(crate) type InfoOutcome = std::result::Result<ShardInfo, tonic::Status>;

impl ClientCore {
    /// Every shard's `Info`, asked at once, each answered by `deadline`:
    /// one outcome per shard, in order.
    pub(crate) async fn all_infos(&self, deadline: tokio::time::Instant) -> Vec<InfoOutcome> {
        let calls = self.shards.iter().map(|c| {
            let mut c = c.grpc.clone();
            let request = InfoRequest { table: self.config.table.clone() };
            async move { within(deadline, c.info(request)).await.map(|r| ShardInfo::from_proto(&r)) }
        });
        futures_util::future::join_all(calls).await
    }

    /// Every shard's selection mass (see the module doc) into `out`,
    /// asking every shard's `Info` by `deadline` if the view cannot be
    /// used. Shards that fail or answer as another shard are left out and
    /// recorded in `lost`, shards back from being lost in `rejoined`.
    pub(crate) async fn shard_masses(
        &self,
        out: &mut ShardMasses,
        lost: &mut Vec<LostShard>,
        rejoined: &mut Vec<usize>,
        deadline: tokio::time::Instant,
    ) -> Result<()> {
        if self.known_masses(out) {
            return Ok(());
        }
        let infos = self.all_infos(deadline).await;
        out.reset(self.shards.len());
        for (s, r) in infos.into_iter().enumerate() {
            match r {
                Ok(info) => {
                    if info.shard as usize != s {
                        self.mark_lost(s, "answers with another shard id");
                        lost.push(LostShard { shard: s, reason: format!("reports shard id {}", info.shard) });
                        continue;
                    }
                    if self.mark_alive(s, info.incarnation) {
                        rejoined.push(s);
                    }
                    let mass = KnownMass::new(info.size, info.total_mass, info.min_mass).ok_or_else(|| {
                        Error::Malformed { shard: s, what: format!("masses {} and {}", info.total_mass, info.min_mass) }
                    })?;
                    self.state.lock()[s].mass = Some(mass);
                    out.add(s, &mass);
                }
                // The table is unknown there, or must be named: the
                // cluster or this client is misconfigured, not the shard down.
                Err(e) if matches!(e.code(), tonic::Code::NotFound | tonic::Code::InvalidArgument) => {
                    return Err(super::cluster::status(s, e));
                }
                Err(e) => {
                    self.mark_lost(s, e.message());
                    lost.push(LostShard { shard: s, reason: format!("{}: {}", e.code(), e.message()) });
                }
            }
        }
        Ok(())
    }

    /// The masses the shards last reported into `out`, if every shard is
    /// live and every report is recent enough; else `false`.
    fn known_masses(&self, out: &mut ShardMasses) -> bool {
        let refresh = self.config.mass_refresh;
        if refresh.is_zero() {
            return false;
        }
        let state = self.state.lock();
        out.reset(state.len());
        for (s, shard) in state.iter().enumerate() {
            match shard.mass.filter(|m| !shard.lost && m.at.elapsed() < refresh) {
                Some(mass) => out.add(s, &mass),
                None => return false,
            }
        }
        // Nothing to draw from: ask, rather than fail on old news.
        out.deterministic > 0 || out.masses.iter().any(|&m| m > 0.0)
    }

    /// Records what `shard` reported with a reply from `incarnation`; a
    /// report from another run than the one known, or with an invalid
    /// mass, makes the shard's mass unknown (asked again next batch).
    pub(crate) fn note_mass(&self, shard: usize, incarnation: u64, size: u64, total: f64, min: f64) {
        let mut state = self.state.lock();
        let Some(s) = state.get_mut(shard) else { return };
        s.mass = (s.incarnation == Some(incarnation)).then(|| KnownMass::new(size, total, min)).flatten();
    }

    /// Forgets `shard`'s mass (this client changed it: an insert).
    pub(crate) fn forget_mass(&self, shard: usize) {
        if let Some(s) = self.state.lock().get_mut(shard) {
            s.mass = None;
        }
    }
}
