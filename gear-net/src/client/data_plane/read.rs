//! Reading the drawn rows: one-sided reads of their windows, then of
//! their generation words, and the torn rows drawn again.

use std::time::{Duration, Instant};

use gear_api::table::ranges::generation_of;
use gear_core::ReadOp;
use tokio::runtime::Handle;

use super::{buffer_bytes, row_of, DataPlaneState, Deadline, Placement, Row, RowBytes, MAX_READ_ATTEMPTS};
use crate::client::cluster::ClientCore;
use crate::client::ClusterSample;
use crate::error::{Error, Result};

impl ClientCore {
    /// Reads rows `first..` (windows, then generations), redrawing torn
    /// rows from their shard. Returns the shards whose reads failed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_rows(
        &self,
        rt: &Handle,
        st: &mut DataPlaneState,
        request: &ClusterSample,
        place: &Placement,
        rows: &mut [Row],
        first: usize,
        deadline: Deadline,
    ) -> Result<Vec<(usize, String)>> {
        // Gathered rows are complete already.
        let mut pending: Vec<usize> = (first..rows.len()).filter(|&r| rows[r].range().is_some()).collect();
        let mut failed: Vec<(usize, String)> = Vec::new();
        for attempt in 1..=MAX_READ_ATTEMPTS {
            pending.retain(|&r| !failed.iter().any(|(s, _)| *s == rows[r].shard));
            if pending.is_empty() {
                return Ok(failed);
            }
            // Windows first, to every shard before waiting on any.
            let mut window_ops: Vec<(usize, Vec<ReadOp>)> = Vec::new();
            for &r in &pending {
                let Some(range) = rows[r].range() else { continue };
                let ops = place
                    .window_ops(r, &rows[r], range)
                    .map_err(|what| Error::Malformed { shard: rows[r].shard, what })?;
                match window_ops.iter_mut().find(|(s, _)| *s == rows[r].shard) {
                    Some((_, list)) => list.extend(ops),
                    None => window_ops.push((rows[r].shard, ops)),
                }
            }
            failed.extend(self.post_and_wait(st, &window_ops, deadline));
            // Then every row's generation word.
            pending.retain(|&r| !failed.iter().any(|(s, _)| *s == rows[r].shard));
            let mut gen_ops: Vec<(usize, Vec<ReadOp>)> = Vec::new();
            for &r in &pending {
                let Some(range) = rows[r].range() else { continue };
                let op = ReadOp {
                    remote_offset: range.generation_offset,
                    local_offset: place.generation_base() + 8 * r as u64,
                    len: 8,
                };
                match gen_ops.iter_mut().find(|(s, _)| *s == rows[r].shard) {
                    Some((_, list)) => list.push(op),
                    None => gen_ops.push((rows[r].shard, vec![op])),
                }
            }
            failed.extend(self.post_and_wait(st, &gen_ops, deadline));
            pending.retain(|&r| !failed.iter().any(|(s, _)| *s == rows[r].shard));
            let Some((region, _)) = &st.buffer else { return Err(Error::Config("no batch buffer".into())) };
            let torn: Vec<usize> = pending
                .iter()
                .copied()
                .filter(|&r| {
                    let at = (place.generation_base() + 8 * r as u64) as usize;
                    let word = u64::from_le_bytes(buffer_bytes(region)[at..at + 8].try_into().unwrap_or([0; 8]));
                    // The slot's generation the shard drew the row with
                    // (an item's trajectory's, for an item).
                    rows[r].range().is_none_or(|range| generation_of(word) != range.generation)
                })
                .collect();
            if torn.is_empty() {
                return Ok(failed);
            }
            if attempt == MAX_READ_ATTEMPTS {
                break;
            }
            // Draw the torn rows again from the same shards.
            let mut counts: Vec<(usize, u64)> = Vec::new();
            for &r in &torn {
                match counts.iter_mut().find(|(s, _)| *s == rows[r].shard) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((rows[r].shard, 1)),
                }
            }
            for (s, _, reply) in self.draw(rt, request, &counts, true, st.session, deadline) {
                let targets: Vec<usize> = torn.iter().copied().filter(|&r| rows[r].shard == s).collect();
                match reply {
                    Ok(reply) => {
                        for (i, &r) in targets.iter().enumerate() {
                            let (mass, total) = (rows[r].mass, rows[r].total);
                            rows[r] = row_of(&reply, i, s, mass, total, RowBytes::Remote(reply.row_ranges[i].clone()));
                        }
                    }
                    Err(e) => failed.push((s, e.to_string())),
                }
            }
            pending = torn;
        }
        Err(Error::NoShard(format!("rows were overwritten during {MAX_READ_ATTEMPTS} reads in a row")))
    }

    /// Posts each shard's ops, then waits for all with one deadline.
    /// Returns the shards whose reads failed.
    fn post_and_wait(
        &self,
        st: &mut DataPlaneState,
        ops: &[(usize, Vec<ReadOp>)],
        deadline: Deadline,
    ) -> Vec<(usize, String)> {
        let mut failed = Vec::new();
        let (Some(transport), Some((_, local))) = (st.transport.as_ref(), st.buffer.as_ref()) else {
            return ops.iter().map(|(s, _)| (*s, "no transport".to_owned())).collect();
        };
        let mut tickets = Vec::new();
        let mut shards = Vec::new();
        for (s, list) in ops {
            let Some(conn) = st.connections[*s].as_ref() else {
                failed.push((*s, "not connected".to_owned()));
                continue;
            };
            match transport.post_reads(&conn.handle, local, list) {
                Ok(t) => {
                    tickets.push(t);
                    shards.push(*s);
                }
                Err(e) => failed.push((*s, format!("reads refused: {e}"))),
            }
        }
        // Three quarters of the time left, as for the draws: a shard whose
        // reads hang leaves time to draw its rows from the others.
        let now = Deadline::now();
        let deadline = (now + deadline.saturating_duration_since(now) * 3 / 4).into_std();
        for ((s, t), r) in shards.iter().zip(&tickets).zip(transport.wait_all(&tickets, deadline)) {
            if let Err(e) = r {
                // End the connection and connect again next time: after a
                // timeout its reads are still in flight (end them before
                // the buffer is reused); after a failed read it may have
                // no live queue pair left.
                if let Some(conn) = st.connections[*s].take() {
                    let _ = transport.disconnect(&conn.handle);
                }
                if matches!(e, gear_core::Error::Timeout(_)) {
                    let _ = transport.wait(t, Instant::now() + Duration::from_secs(1));
                }
                failed.push((*s, format!("reads failed: {e}")));
            }
        }
        failed
    }
}
