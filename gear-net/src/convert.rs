//! Checks and conversions between the wire messages and GEAR's types. Every
//! number from the network is checked here before it sizes a buffer or
//! reaches the table; nothing here panics on any input.

use crate::proto::{self, InsertChunk, SampleRequest};
use gear_api::SampleConfig;
use gear_core::{ColumnSpec, DType, Pad, SlotKey, TableSpec, WindowSpec};
use std::time::Duration;
use tonic::Status;

/// Longest wait a sample request may ask for.
pub const MAX_SAMPLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Rows one sample request may ask for.
pub const MAX_SAMPLE_ROWS: u64 = 1 << 20;

/// A sample request's shape, checked against the spec and the message
/// limit.
pub(crate) struct CheckedSample {
    pub(crate) window: WindowSpec,
    /// The spec's indices of the requested columns, in the request's order.
    pub(crate) columns: Vec<usize>,
    /// Bytes of one step of each of `columns`.
    pub(crate) step_bytes: Vec<u64>,
    /// How long the shard may wait for data or its rate limiter.
    pub(crate) timeout: Duration,
}

/// What the server accepts in one message.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_message_bytes: u64,
    pub(crate) max_updates: usize,
}

impl Limits {
    pub(crate) fn new(max_message_bytes: u64) -> Self {
        Limits { max_message_bytes, max_updates: 1 << 20 }
    }

    /// What a request asks for, checked ([`sample_shape`]); refused if the
    /// reply would not fit a message.
    pub(crate) fn checked_sample(&self, spec: &TableSpec, req: &SampleRequest) -> Result<CheckedSample, Status> {
        let (window, columns) = sample_shape(spec, req)?;
        let mut total = 0u64;
        let mut step_bytes = Vec::with_capacity(columns.len());
        for &c in &columns {
            let step = spec.columns()[c].step_bytes().map_err(|e| Status::internal(e.to_string()))?;
            let row = step.checked_mul(window.len).ok_or_else(|| Status::invalid_argument("window too large"))?;
            total = row
                .checked_mul(req.rows)
                .and_then(|b| b.checked_add(total))
                .ok_or_else(|| Status::invalid_argument("reply size overflows"))?;
            step_bytes.push(step);
        }
        if total > self.max_message_bytes {
            return Err(Status::resource_exhausted(format!(
                "a reply of {total} bytes exceeds the message limit of {} bytes; ask for fewer rows",
                self.max_message_bytes
            )));
        }
        let timeout = Duration::from_millis(req.timeout_ms).min(MAX_SAMPLE_TIMEOUT);
        Ok(CheckedSample { window, columns, step_bytes, timeout })
    }

    /// The sampler config a request asks for ([`Limits::checked_sample`]).
    pub(crate) fn sample_config(&self, spec: &TableSpec, req: &SampleRequest) -> Result<SampleConfig, Status> {
        let checked = self.checked_sample(spec, req)?;
        let config = SampleConfig::new(req.rows as usize, checked.window)
            .columns(checked.columns.iter().map(|&c| spec.columns()[c].name().to_owned()))
            .timeout(Some(checked.timeout));
        Ok(if req.random_start { config.random_start() } else { config })
    }

    /// Checks one insert chunk against the spec: a buffer per column, each
    /// holding exactly `steps` steps, and room left in the trajectory.
    pub(crate) fn check_chunk(&self, spec: &TableSpec, chunk: &InsertChunk, written: u64) -> Result<(), Status> {
        if chunk.columns.len() != spec.columns().len() {
            return Err(Status::invalid_argument(format!(
                "insert chunk has {} column buffers, the spec has {} columns",
                chunk.columns.len(),
                spec.columns().len()
            )));
        }
        let room = spec.max_len().saturating_sub(written);
        if chunk.steps > room {
            return Err(Status::invalid_argument(format!(
                "insert chunk of {} steps overflows the trajectory ({written} of {} steps written)",
                chunk.steps,
                spec.max_len()
            )));
        }
        for (c, (col, bytes)) in spec.columns().iter().zip(&chunk.columns).enumerate() {
            let step = col.step_bytes().map_err(|e| Status::internal(e.to_string()))?;
            let want = step.checked_mul(chunk.steps);
            if want != Some(bytes.len() as u64) {
                return Err(Status::invalid_argument(format!(
                    "column {c} (`{}`): {} bytes for {} steps, the spec needs {} per step",
                    col.name(),
                    bytes.len(),
                    chunk.steps,
                    step
                )));
            }
        }
        Ok(())
    }
}

/// The wire key of a slot key of shard `shard`'s run `incarnation`.
pub(crate) fn key_to_proto(shard: u32, incarnation: u64, key: SlotKey) -> proto::Key {
    proto::Key { shard, incarnation, slot: key.slot, generation: key.generation }
}

/// A table error as a gRPC status (what the client sees).
pub(crate) fn table_status(e: gear_api::Error) -> Status {
    use gear_api::Error as E;
    let msg = e.to_string();
    match e {
        E::Core(_) | E::Config(_) | E::Trajectory(_) => Status::invalid_argument(msg),
        E::Timeout { .. } => Status::deadline_exceeded(msg),
        E::Closed | E::ServerGone { .. } => Status::unavailable(msg),
        E::TableFull { .. } => Status::resource_exhausted(msg),
        _ => Status::internal(msg),
    }
}

/// The spec's columns as wire messages.
pub(crate) fn columns_to_proto(spec: &TableSpec) -> Vec<proto::Column> {
    spec.columns()
        .iter()
        .map(|c| proto::Column {
            name: c.name().to_owned(),
            dtype: c.dtype().name().to_owned(),
            shape: c.shape().to_vec(),
        })
        .collect()
}

/// The window and the column indices a sample request asks for, checked
/// against the spec: 1 to [`MAX_SAMPLE_ROWS`] rows, a known pad, a window
/// valid for the table, known column names (empty: all columns).
pub(crate) fn sample_shape(spec: &TableSpec, req: &SampleRequest) -> Result<(WindowSpec, Vec<usize>), Status> {
    if req.rows == 0 || req.rows > MAX_SAMPLE_ROWS {
        return Err(Status::invalid_argument(format!("rows {} must be between 1 and {MAX_SAMPLE_ROWS}", req.rows)));
    }
    let pad = match proto::Pad::try_from(req.pad) {
        Ok(proto::Pad::Tail) => Pad::Tail,
        Ok(proto::Pad::Head) => Pad::Head,
        Err(_) => return Err(Status::invalid_argument(format!("unknown pad {}", req.pad))),
    };
    let window = WindowSpec { offset: req.window_offset, len: req.window_len, pad };
    window.validate(spec.max_len()).map_err(|e| Status::invalid_argument(e.to_string()))?;
    if req.columns.len() > spec.columns().len() {
        return Err(Status::invalid_argument(format!(
            "{} columns requested, the table has {}",
            req.columns.len(),
            spec.columns().len()
        )));
    }
    let indices = if req.columns.is_empty() {
        (0..spec.columns().len()).collect()
    } else {
        req.columns
            .iter()
            .map(|n| spec.column_index(n).map_err(|e| Status::invalid_argument(e.to_string())))
            .collect::<Result<_, _>>()?
    };
    Ok((window, indices))
}

/// The table spec a shard describes, checked as a local spec is.
pub(crate) fn spec_from_proto(reply: &proto::SpecReply) -> crate::Result<TableSpec> {
    let columns = reply
        .columns
        .iter()
        .map(|c| Ok(ColumnSpec::new(c.name.clone(), DType::from_name(&c.dtype)?, c.shape.clone())))
        .collect::<gear_core::Result<Vec<_>>>()?;
    Ok(TableSpec::new(columns, reply.max_len, reply.capacity)?.with_items_per_trajectory(reply.items_per_trajectory)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec() -> TableSpec {
        TableSpec::new(vec![ColumnSpec::new("obs", DType::F32, vec![3]), ColumnSpec::new("r", DType::U8, vec![])], 8, 4)
            .unwrap()
    }

    proptest! {
        // Arbitrary bytes decoded as any request never panic the checks.
        #[test]
        fn arbitrary_bytes_never_panic_the_checks(bytes in proptest::collection::vec(any::<u8>(), 0..512), written in any::<u64>()) {
            use prost::Message;
            let limits = Limits::new(1 << 20);
            if let Ok(req) = SampleRequest::decode(bytes.as_slice()) {
                let _ = limits.sample_config(&spec(), &req);
            }
            if let Ok(chunk) = InsertChunk::decode(bytes.as_slice()) {
                let _ = limits.check_chunk(&spec(), &chunk, written);
            }
            if let Ok(reply) = proto::SpecReply::decode(bytes.as_slice()) {
                let _ = spec_from_proto(&reply);
            }
        }

        // Arbitrary field values (not just what random bytes decode to).
        #[test]
        fn arbitrary_sample_requests_are_checked(rows in any::<u64>(), offset in any::<i64>(), len in any::<u64>(), pad in any::<i32>(), timeout_ms in any::<u64>(), cols in proptest::collection::vec("[a-z]{0,4}", 0..4)) {
            let req = SampleRequest {
                rows,
                window_offset: offset,
                window_len: len,
                pad,
                columns: cols,
                timeout_ms,
                ranges: false,
                incarnation: 0,
                data_plane_session: 0,
                table: String::new(),
                random_start: false,
                send_from_table: false,
            };
            if let Ok(config) = Limits::new(1 << 20).sample_config(&spec(), &req) {
                prop_assert!(config.batch_size as u64 <= MAX_SAMPLE_ROWS);
                let spec = spec();
                let bytes: u64 = config
                    .columns
                    .iter()
                    .map(|n| spec.columns()[spec.column_index(n).unwrap()].step_bytes().unwrap() * config.window.len * rows)
                    .sum();
                prop_assert!(bytes <= 1 << 20);
            }
        }
    }

    #[test]
    fn chunks_must_match_the_spec() {
        let limits = Limits::new(1 << 20);
        let ok = InsertChunk {
            columns: vec![vec![0; 24].into(), vec![0; 2].into()],
            steps: 2,
            end: true,
            ..Default::default()
        };
        limits.check_chunk(&spec(), &ok, 0).unwrap();
        assert!(limits.check_chunk(&spec(), &ok, 7).unwrap_err().message().contains("overflows"));
        let short = InsertChunk { columns: vec![vec![0; 23].into(), vec![0; 2].into()], ..ok.clone() };
        assert!(limits.check_chunk(&spec(), &short, 0).unwrap_err().message().contains("23 bytes"));
        let missing = InsertChunk { columns: vec![vec![0; 24].into()], ..ok };
        assert!(limits.check_chunk(&spec(), &missing, 0).is_err());
    }

    #[test]
    fn oversized_replies_are_refused() {
        let req = SampleRequest {
            rows: 1 << 20,
            window_offset: 0,
            window_len: 8,
            pad: 0,
            columns: vec![],
            timeout_ms: 10,
            ..Default::default()
        };
        assert_eq!(
            Limits::new(1 << 20).sample_config(&spec(), &req).unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
    }
}
