//! Sampling: the batch calls, the requests they send and the checks of
//! what the shards answer, shared by both data planes.

use super::{status, within, AsyncClusterClient, ClientCore};
use crate::client::{BatchRows, ClusterBatch, ClusterSample, RemoteKey};
use crate::error::{Error, Result};
use crate::proto::{self, SampleRequest};
use gear_core::{Pad, RandomSource, TableSpec};
use std::mem::MaybeUninit;
use tokio::time::Instant;

/// The local probability of a shard's own draw, scaled to the cluster.
pub(crate) fn global_probability(local: f64, shard_mass: f64, total_mass: f64) -> f64 {
    if total_mass > 0.0 {
        local * shard_mass / total_mass
    } else {
        0.0
    }
}

/// The request for `rows` rows of `table` from a shard the client knows as
/// `incarnation` (`None`: any run), answered before `deadline`.
pub(crate) fn sample_request(
    table: &str,
    request: &ClusterSample,
    rows: u64,
    deadline: Instant,
    incarnation: Option<u64>,
) -> SampleRequest {
    let mut req = SampleRequest::default();
    fill_sample_request(&mut req, table, request, rows, deadline, incarnation);
    req
}

/// Makes `req` the request [`sample_request`] makes, in place: its strings
/// are copied into the buffers `req` has (a request kept from batch to
/// batch allocates nothing).
pub(crate) fn fill_sample_request(
    req: &mut SampleRequest,
    table: &str,
    request: &ClusterSample,
    rows: u64,
    deadline: Instant,
    incarnation: Option<u64>,
) {
    let window = deadline.saturating_duration_since(Instant::now());
    req.table.clear();
    req.table.push_str(table);
    req.rows = rows;
    req.window_offset = request.window.offset;
    req.window_len = request.window.len;
    req.pad = match request.window.pad {
        Pad::Tail => proto::Pad::Tail as i32,
        Pad::Head => proto::Pad::Head as i32,
    };
    req.columns.clone_from(&request.columns);
    // The shard gives up waiting (for data, its rate limiter) a little
    // before the call's deadline, so its answer still arrives.
    req.timeout_ms = (window.as_millis() as u64).saturating_mul(3) / 4;
    req.ranges = false;
    req.incarnation = incarnation.unwrap_or(0);
    req.data_plane_session = 0;
    req.random_start = request.random_start;
    req.send_from_table = false;
}

/// A shard's reply must have one entry per row in every per-row field.
pub(crate) fn check_sample_reply(shard: usize, rows: u64, r: &proto::SampleReply) -> Result<()> {
    let n = rows as usize;
    let counts = [r.keys.len(), r.lengths.len(), r.starts.len(), r.probabilities.len(), r.weights.len()];
    if counts.iter().any(|&c| c != n) {
        return Err(Error::Malformed { shard, what: format!("per-row fields have {counts:?} entries for {n} rows") });
    }
    if r.shard as usize != shard || r.keys.iter().any(|k| k.shard as usize != shard || k.incarnation != r.incarnation) {
        return Err(Error::Malformed { shard, what: "keys name another shard or run".into() });
    }
    if r.columns.iter().any(|c| c.len() % n.max(1) != 0) {
        return Err(Error::Malformed { shard, what: "a column buffer is not a whole number of rows".into() });
    }
    Ok(())
}

/// Whether a failed shard call must end the whole call: the request is
/// invalid or too large for the shard (every shard would refuse it).
pub(crate) fn refuses_the_request(s: &tonic::Status) -> bool {
    matches!(s.code(), tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted)
}

/// `u8` buffers seen as possibly uninitialised bytes, for the writers
/// that take either; a cast in place (a batch allocates nothing for it).
pub(crate) fn as_uninit<'a, 'b>(columns: &'a mut [&'b mut [u8]]) -> &'a mut [&'b mut [MaybeUninit<u8>]] {
    // SAFETY: `&mut [u8]` and `&mut [MaybeUninit<u8>]` have the same layout
    // (`MaybeUninit<u8>` has `u8`'s size and alignment), and the borrows
    // carry over. The buffers stay initialised: every writer here writes
    // only initialised bytes (copies of received or read bytes) into them,
    // and none puts another slice in `columns`' place.
    unsafe { &mut *(columns as *mut [&'b mut [u8]] as *mut [&'b mut [MaybeUninit<u8>]]) }
}

impl AsyncClusterClient {
    /// Bytes of each column buffer a batch of `request` fills (rows ×
    /// window × step bytes, in the request's column order): what
    /// [`AsyncClusterClient::sample_into`] needs. Refused, naming what was
    /// wrong, for a request the table cannot serve.
    pub async fn column_bytes(&self, request: &ClusterSample) -> Result<Vec<usize>> {
        let deadline = Instant::now() + self.core.config.call_timeout;
        let spec = self.core.cached_spec(deadline).await?;
        let mut row_bytes = Vec::new();
        self.core.check_request(&spec, request, &mut row_bytes)?;
        Ok(row_bytes.into_iter().map(|rb| rb * request.rows as usize).collect())
    }

    /// Draws one batch across every live shard with one table's
    /// distribution (see the `client` module doc), into new buffers.
    pub async fn sample(&self, request: &ClusterSample) -> Result<ClusterBatch> {
        let sizes = self.column_bytes(request).await?;
        let mut columns = Vec::with_capacity(sizes.len());
        for &n in &sizes {
            let mut c: Vec<u8> = Vec::new();
            c.try_reserve_exact(n).map_err(|e| Error::Config(format!("a batch column of {n} bytes: {e}")))?;
            columns.push(c);
        }
        let mut rows = BatchRows::default();
        {
            let mut views: Vec<&mut [MaybeUninit<u8>]> = columns.iter_mut().map(|c| c.spare_capacity_mut()).collect();
            self.sample_into_uninit(request, &mut views, &mut rows).await?;
        }
        for (c, &n) in columns.iter_mut().zip(&sizes) {
            // SAFETY: a successful `sample_into_uninit` wrote every byte of
            // the batch's rows, the first `n` bytes of each buffer (its
            // capacity is `n`).
            unsafe { c.set_len(n) };
        }
        Ok(ClusterBatch::from_parts(columns, rows))
    }

    /// Draws one batch as [`AsyncClusterClient::sample`] does, into the
    /// caller's buffers: column `c` of the request (every column of the
    /// spec when it names none) goes to the first
    /// [`column_bytes`](AsyncClusterClient::column_bytes)`()[c]` bytes of
    /// `columns[c]` (longer buffers are fine), rows in the order of
    /// `rows.keys`; each shard's reply is decoded straight into them as it
    /// arrives. `rows` is cleared and refilled, its vectors reused. Any
    /// `&mut [u8]` will do: pinned or registered memory included. On an
    /// error the buffers hold whatever had arrived.
    pub async fn sample_into(
        &self,
        request: &ClusterSample,
        columns: &mut [&mut [u8]],
        rows: &mut BatchRows,
    ) -> Result<()> {
        self.sample_into_uninit(request, as_uninit(columns), rows).await
    }

    /// [`AsyncClusterClient::sample_into`] into possibly uninitialised
    /// buffers; on success the batch's bytes of every buffer are
    /// initialised (only initialised bytes are ever written).
    pub async fn sample_into_uninit(
        &self,
        request: &ClusterSample,
        columns: &mut [&mut [MaybeUninit<u8>]],
        rows: &mut BatchRows,
    ) -> Result<()> {
        rows.clear();
        if request.rows == 0 {
            return Err(Error::Config("a batch needs at least 1 row".into()));
        }
        let deadline = Instant::now() + self.core.config.call_timeout;
        if self.sample_by_ranges_into(request, columns, rows, deadline).await? {
            return Ok(());
        }
        self.core.sample_gathered(request, columns, rows, deadline).await
    }

    /// Draws a batch from one shard only (its own probabilities and
    /// weights; for deterministic strategies).
    pub async fn sample_shard(&self, shard: usize, request: &ClusterSample) -> Result<ClusterBatch> {
        let deadline = Instant::now() + self.core.config.call_timeout;
        let mut c = self.core.grpc(shard)?;
        let table = &self.core.config.table;
        let req = sample_request(table, request, request.rows, deadline, self.core.incarnation_of(shard));
        let reply = match within(deadline, c.sample(req)).await {
            Ok(r) => r,
            Err(e) => {
                self.core.mark_lost(shard, e.message());
                return Err(status(shard, e));
            }
        };
        check_sample_reply(shard, request.rows, &reply)?;
        let rejoined = self.core.mark_alive(shard, reply.incarnation);
        self.core.note_mass(shard, reply.incarnation, reply.size, reply.total_mass, reply.min_mass);
        Ok(ClusterBatch {
            keys: reply.keys.iter().map(RemoteKey::from_proto).collect(),
            columns: reply.columns.into_iter().map(Vec::from).collect(),
            lengths: reply.lengths,
            starts: reply.starts,
            probabilities: reply.probabilities,
            weights: reply.weights,
            lost: Vec::new(),
            rejoined: if rejoined { vec![shard] } else { Vec::new() },
        })
    }
}

impl ClientCore {
    /// The bytes per row of each column `request` asks for, into
    /// `row_bytes`; refused, naming what was wrong, when the table cannot
    /// serve it or its reply would not fit a message.
    pub(crate) fn check_request(
        &self,
        spec: &TableSpec,
        request: &ClusterSample,
        row_bytes: &mut Vec<usize>,
    ) -> Result<()> {
        if request.rows == 0 || request.rows > crate::convert::MAX_SAMPLE_ROWS {
            return Err(Error::Config(format!(
                "a batch of {} rows; between 1 and {} may be asked for",
                request.rows,
                crate::convert::MAX_SAMPLE_ROWS
            )));
        }
        request.window.validate(spec.max_len())?;
        row_bytes.clear();
        let mut add = |c: usize| -> Result<()> {
            let step = spec.columns()[c].step_bytes()?;
            let bytes = step.checked_mul(request.window.len).and_then(|b| usize::try_from(b).ok());
            row_bytes.push(bytes.ok_or_else(|| Error::Config(format!("column {c}: a window's bytes overflow")))?);
            Ok(())
        };
        if request.columns.is_empty() {
            (0..spec.columns().len()).try_for_each(&mut add)?;
        } else {
            for name in &request.columns {
                add(spec.column_index(name)?)?;
            }
        }
        let total = row_bytes
            .iter()
            .try_fold(0u64, |sum, &rb| (rb as u64).checked_mul(request.rows)?.checked_add(sum))
            .filter(|&t| t <= self.config.max_message_bytes as u64);
        if total.is_none() {
            return Err(Error::Config(format!(
                "a batch of {} rows of {:?} bytes exceeds the message limit of {} bytes; ask for fewer rows",
                request.rows, row_bytes, self.config.max_message_bytes
            )));
        }
        Ok(())
    }

    /// Rows per shard into `counts`: each row independently from shard `s`
    /// with probability `masses[s] / sum`.
    pub(crate) fn allocate(&self, masses: &[f64], rows: u64, counts: &mut Vec<u64>) {
        let total: f64 = masses.iter().sum();
        counts.clear();
        counts.resize(masses.len(), 0);
        let last = masses.iter().rposition(|&m| m > 0.0).unwrap_or(0);
        let mut rng = self.rng.lock();
        for _ in 0..rows {
            let mut u = rng.next_f64() * total;
            let mut pick = last;
            for (s, &m) in masses.iter().enumerate() {
                if m > 0.0 && u < m {
                    pick = s;
                    break;
                }
                u -= m;
            }
            counts[pick] += 1;
        }
    }
}
