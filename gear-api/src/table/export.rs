//! Reading a table's committed trajectories back out, for tools that
//! export a table to another format (gear-hdf5 writes D4RL and Minari
//! files with it).
//!
//! The walk is the checkpoint writer's: a snapshot of the committed slots'
//! records taken under the table lock (metadata only), sorted by insertion
//! order, then each trajectory's bytes copied without the lock and with
//! the seqlock check samplers use. A trajectory evicted or replaced between
//! the snapshot and its copy is reported as gone (`Ok(false)`), never
//! returned torn.

use super::ReplayTable;
use crate::error::Result;
use crate::writer::ColumnId;
use gear_core::{SlotKey, SlotState};

/// One committed trajectory of a [`ReplayTable::committed_trajectories`]
/// snapshot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CommittedTrajectory {
    /// Its key (slot and generation).
    pub key: SlotKey,
    /// Its length in steps.
    pub len: u64,
    /// Its priority.
    pub priority: f64,
    /// Its insertion sequence number: smaller is older.
    pub insert_seq: u64,
}

impl ReplayTable {
    /// The committed trajectories at this moment, oldest insert first (the
    /// order they were committed in). Takes the table lock for a scan of
    /// the slot records, never for trajectory bytes; read the bytes with
    /// [`ReplayTable::read_trajectory`]. Slots being written or retiring
    /// are not listed.
    pub fn committed_trajectories(&self) -> Result<Vec<CommittedTrajectory>> {
        let sh = &self.shared;
        let l = sh.lock(None)?;
        let max_len = self.spec().max_len();
        let mut out: Vec<CommittedTrajectory> = sh
            .region
            .slots()
            .iter()
            .enumerate()
            .map(|(s, rec)| rec.meta(s as u32))
            // A length past T is a record no correct writer leaves (the
            // region is shared): left out rather than trusted.
            .filter(|m| m.state == SlotState::Committed && m.len <= max_len)
            .map(|m| CommittedTrajectory { key: m.key, len: m.len, priority: m.priority, insert_seq: m.insert_seq })
            .collect();
        drop(l);
        out.sort_unstable_by_key(|t| t.insert_seq);
        Ok(out)
    }

    /// Copies steps `first_step..first_step + out.len() / step_bytes` of
    /// `column` of the trajectory `key` into `out` (the column's bytes,
    /// step after step, as written). Returns `Ok(true)` when the copy is
    /// intact, `Ok(false)` when the trajectory was evicted or replaced (the
    /// key is no longer current, or a writer reused the slot during the
    /// copy): `out` then holds nothing usable. An `out` whose length is not
    /// a whole number of steps, or steps past the trajectory's length, are
    /// errors.
    pub fn read_trajectory(
        &self,
        key: SlotKey,
        column: impl ColumnId,
        first_step: u64,
        out: &mut [u8],
    ) -> Result<bool> {
        let c = column.index_in(self.spec())?;
        match self.shared.region.read_steps(key, c, first_step, out) {
            Ok(intact) => Ok(intact),
            Err(gear_core::Error::StaleKey { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}
