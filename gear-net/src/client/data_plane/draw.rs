//! The byte-range draw: the shards draw ranged (or, where they do not
//! serve the transport, gathered) rows, round after round until the batch
//! is whole.

use bytes::Bytes;
use tokio::runtime::Handle;

use super::{row_of, DataPlaneState, Deadline, Placement, RangedDraw, Row, RowBytes, ShardRows};
use crate::client::cluster::{check_sample_reply, refuses_the_request, sample_request, status, within, ClientCore};
use crate::client::masses::ShardMasses;
use crate::client::{ClusterSample, LostShard};
use crate::error::{Error, Result};
use crate::proto::SampleReply;

impl ClientCore {
    /// Draws of `counts[s]` rows from each shard `s`, at once: ranged
    /// (`ranges`: the shards reply with where the windows are) or gathered
    /// (the shards reply with the windows' bytes).
    /// `session` is the transport's (0 before the first connection), sent
    /// with ranged draws.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn draw(
        &self,
        rt: &Handle,
        request: &ClusterSample,
        counts: &[(usize, u64)],
        ranges: bool,
        session: u64,
        deadline: Deadline,
    ) -> Vec<(usize, u64, std::result::Result<SampleReply, Error>)> {
        if counts.is_empty() {
            return Vec::new();
        }
        // Three quarters of the time left, as the gather path's rounds.
        let now = Deadline::now();
        let round = now + deadline.saturating_duration_since(now) * 3 / 4;
        rt.block_on(async {
            let calls = counts.iter().map(|&(s, n)| {
                let mut c = self.shards[s].grpc.clone();
                let mut req = sample_request(&self.config.table, request, n, round, self.incarnation_of(s));
                req.ranges = ranges;
                req.data_plane_session = if ranges { session } else { 0 };
                async move { (s, n, within(round, c.sample(req)).await) }
            });
            let mut out = Vec::new();
            for (s, n, reply) in futures_util::future::join_all(calls).await {
                let r = match reply {
                    Ok(reply) => match check_sample_reply(s, n, &reply) {
                        Ok(()) if !ranges || reply.row_ranges.len() == n as usize => Ok(reply),
                        Ok(()) => Err(Error::Malformed { shard: s, what: "row ranges missing".into() }),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(status(s, e)),
                };
                out.push((s, n, r));
            }
            out
        })
    }

    /// [`AsyncClusterClient::sample`](crate::client::AsyncClusterClient::sample)
    /// over the transport (the `data_plane` module doc), on a blocking
    /// thread; the batch's bytes stay in the buffer.
    pub(super) fn sample_by_ranges(
        &self,
        rt: &Handle,
        st: &mut DataPlaneState,
        request: &ClusterSample,
        deadline: Deadline,
    ) -> Result<RangedDraw> {
        let (mut lost, mut rejoined) = (Vec::new(), Vec::new());
        let spec = rt.block_on(self.cached_spec(deadline))?;
        let columns: Vec<usize> = if request.columns.is_empty() {
            (0..spec.columns().len()).collect()
        } else {
            request.columns.iter().map(|n| spec.column_index(n)).collect::<gear_core::Result<_>>()?
        };
        request.window.validate(spec.max_len())?;
        let place = Placement {
            step_bytes: columns.iter().map(|&c| spec.columns()[c].step_bytes()).collect::<gear_core::Result<_>>()?,
            window: request.window.len,
            rows: request.rows,
        };
        let info_deadline = {
            let now = Deadline::now();
            now + deadline.saturating_duration_since(now) / 4
        };
        let mut m = ShardMasses::default();
        rt.block_on(self.shard_masses(&mut m, &mut lost, &mut rejoined, info_deadline))?;
        if m.deterministic > 0 {
            return Err(Error::Unsupported(
                "byte-range sampling needs a random strategy; use the shard-gather data plane".into(),
            ));
        }
        let (first_masses, mins) = (m.masses.clone(), m.mins);
        let mut masses = m.masses;
        let first_total: f64 = masses.iter().sum();
        let beta = rt.block_on(self.beta(deadline))?;
        self.ensure_buffer(st, place.bytes())?;
        let mut counts = Vec::new();
        let mut rows: Vec<Row> = Vec::with_capacity(request.rows as usize);
        let mut remaining = request.rows;
        // Set when a lost shard's rows were taken out: the rows after them
        // moved to other places in the buffer and are read again.
        let mut shifted = false;
        for _round in 0..self.shards.len() {
            let total: f64 = masses.iter().sum();
            if remaining == 0 {
                break;
            }
            if total <= 0.0 {
                return Err(Error::NoShard(format!("no shard holds items (lost: {lost:?})")));
            }
            self.allocate(&masses, remaining, &mut counts);
            let (ranged, mut gathered): (Vec<ShardRows>, Vec<ShardRows>) = counts
                .iter()
                .copied()
                .enumerate()
                .filter(|&(_, n)| n > 0)
                .partition(|&(s, _)| !self.is_gather_only(st, s));
            let first = if std::mem::take(&mut shifted) { 0 } else { rows.len() };
            let lose = |s: usize, reason: String, masses: &mut Vec<f64>, lost: &mut Vec<LostShard>| {
                self.mark_lost(s, &reason);
                lost.push(LostShard { shard: s, reason });
                masses[s] = 0.0;
            };
            let session = st.session;
            for (s, n, reply) in self.draw(rt, request, &ranged, true, session, deadline) {
                let connected = reply.map(|r| match self.connection(rt, st, s, r.incarnation, deadline) {
                    Ok(()) => Some(r),
                    // No connection: gather its rows.
                    Err(e) => {
                        self.note_connect_failure(st, s, r.incarnation, &e);
                        None
                    }
                });
                match connected {
                    Ok(Some(reply)) => {
                        remaining -= n;
                        self.note_sample_mass(s, &reply);
                        push_rows(&mut rows, s, masses[s], total, reply);
                    }
                    Ok(None) => gathered.push((s, n)),
                    Err(e) => lose(s, refusal(s, e)?, &mut masses, &mut lost),
                }
            }
            for (s, n, reply) in self.draw(rt, request, &gathered, false, 0, deadline) {
                match reply {
                    Ok(reply) => {
                        self.note_sample_mass(s, &reply);
                        push_gathered(&mut rows, s, masses[s], total, reply, &place)?;
                        remaining -= n;
                    }
                    Err(e) => lose(s, refusal(s, e)?, &mut masses, &mut lost),
                }
            }
            // Read the new rows; a shard whose reads fail gives its rows back.
            let failed = self.read_rows(rt, st, request, &place, &mut rows, first, deadline)?;
            for (s, reason) in failed {
                let before = rows.len();
                rows.retain(|r| r.shard != s);
                remaining += (before - rows.len()) as u64;
                shifted = true;
                lose(s, reason, &mut masses, &mut lost);
            }
        }
        if remaining > 0 {
            return Err(Error::NoShard(format!("{remaining} rows could not be drawn; lost: {lost:?}")));
        }
        Ok(RangedDraw { place, rows, lost, rejoined, masses: first_masses, mins, total: first_total, beta })
    }

    /// Records the masses a `Sample` reply from `shard` carries.
    fn note_sample_mass(&self, shard: usize, reply: &SampleReply) {
        self.note_mass(shard, reply.incarnation, reply.size, reply.total_mass, reply.min_mass);
    }
}

/// A failed call's error if it must end the batch (the request is invalid
/// or too large for the shard: every shard would refuse it), else the
/// reason to report the shard lost with.
fn refusal(shard: usize, e: Error) -> Result<String> {
    match e {
        Error::Status { status: e, .. } if refuses_the_request(&e) => Err(status(shard, *e)),
        e => Ok(e.to_string()),
    }
}

/// Adds the rows of a gathered `Sample` reply (checked by
/// `check_sample_reply`), each column cut into its rows' windows without
/// copying.
fn push_gathered(
    rows: &mut Vec<Row>,
    shard: usize,
    mass: f64,
    total: f64,
    reply: SampleReply,
    place: &Placement,
) -> Result<()> {
    let n = reply.keys.len();
    let sizes: Vec<usize> = reply.columns.iter().map(Bytes::len).collect();
    let expected: Vec<usize> = (0..place.step_bytes.len()).map(|c| n * place.window_bytes(c) as usize).collect();
    if sizes != expected {
        return Err(Error::Malformed {
            shard,
            what: format!("gathered columns have {sizes:?} bytes for {n} rows, expected {expected:?}"),
        });
    }
    for i in 0..n {
        let columns = reply
            .columns
            .iter()
            .enumerate()
            .map(|(c, bytes)| {
                let w = place.window_bytes(c) as usize;
                bytes.slice(i * w..(i + 1) * w)
            })
            .collect();
        rows.push(row_of(&reply, i, shard, mass, total, RowBytes::Gathered(columns)));
    }
    Ok(())
}

fn push_rows(rows: &mut Vec<Row>, shard: usize, mass: f64, total: f64, reply: SampleReply) {
    for i in 0..reply.keys.len() {
        rows.push(row_of(&reply, i, shard, mass, total, RowBytes::Remote(reply.row_ranges[i].clone())));
    }
}
