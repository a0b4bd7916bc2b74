//! `Sample` replies that the shard draws and gathers while tonic encodes
//! them, straight into the encode buffer.
//!
//! A reply built first and encoded after holds its window bytes twice: the
//! gather writes them into the reply's buffers, then prost copies them into
//! tonic's encode buffer (tonic's codec API writes only into that buffer).
//! On a shard serving a cross-shard sample that second copy was a fifth of
//! the server's CPU (perf: `__memmove` beside the gather and the socket
//! send). So a plain `Sample` hands tonic a [`SampleReplyOut`] that is still
//! to be drawn: when tonic encodes it, the codec lays out each column's
//! entry of field 8 (`columns`) in the buffer's spare capacity, the sampler
//! draws, gathers into those entries, re-checks each slot's generation and
//! redraws torn rows (`Sampler::sample_into_uninit`), and the reply's other
//! fields, known only then, are encoded after the columns by prost.
//! Protobuf reads a concatenation of encodings as the one message holding
//! all their fields, in any field order, so the client decodes the result
//! with the generated `SampleReply` as before.
//!
//! The draw can wait (an empty table, the rate limiter); inside the encoder
//! it runs under `tokio::task::block_in_place`, so the runtime's other
//! tasks move to another thread meanwhile. An error from the draw (the
//! timeout, say) ends the call with that status, in the response's
//! trailers, as tonic does for any encode error.

use super::table_masses;
use super::tables::{ServedTable, ServedTables};
use crate::codec::{encode_sized, OutgoingMessage};
use crate::convert::{key_to_proto, table_status};
use crate::metrics::RpcTimer;
use crate::proto::SampleReply;
use bytes::{BufMut, Bytes};
use gear_api::{ReplayTable, SampleConfig, SampledRows, Sampler};
use parking_lot::Mutex;
use prost::encoding::{encode_key, encode_varint, WireType};
use std::mem::MaybeUninit;
use tonic::codec::EncodeBuf;
use tonic::Status;

/// The field number of `SampleReply.columns`.
pub(super) const COLUMNS_FIELD: u32 = 8;

/// Samplers cached at most (one per distinct request shape).
const CACHED_SAMPLERS: usize = 8;

/// Largest encoding of a `SampleReply`'s fields other than `columns` and
/// `row_ranges`: the per-row fields (a key of four varints, a length and a
/// start as varints, two doubles) and the fixed ones (shard, incarnation,
/// size, masses, four packed fields' keys and lengths). Reserved with the
/// columns so that the encode never grows the buffer (which would copy the
/// whole batch); checked against prost's `encoded_len` in the tests.
fn other_fields_bound(rows: usize) -> usize {
    const PER_ROW: usize = (2 + 6 + 11 + 6 + 6) + 10 + 10 + 8 + 8;
    const FIXED: usize = 6 + 11 + 11 + 9 + 9 + 4 * 6;
    FIXED + PER_ROW * rows
}

/// The shard's samplers kept between calls, by request shape.
#[derive(Default)]
pub(crate) struct SamplerCache {
    kept: Mutex<Vec<(SampleConfig, Sampler)>>,
}

impl SamplerCache {
    /// A sampler for `config`: a kept one, else a new one over `table`.
    pub(crate) fn take(&self, table: &ReplayTable, config: &SampleConfig) -> Result<Sampler, Status> {
        let kept = {
            let mut kept = self.kept.lock();
            kept.iter().position(|(c, _)| c == config).map(|i| kept.swap_remove(i).1)
        };
        match kept {
            Some(s) => Ok(s),
            None => table.sampler(config.clone()).map_err(table_status),
        }
    }

    /// Keeps `sampler` for the next call of the same shape, if there is room.
    fn put(&self, config: SampleConfig, sampler: Sampler) {
        let mut kept = self.kept.lock();
        if kept.len() < CACHED_SAMPLERS {
            kept.push((config, sampler));
        }
    }
}

/// The reply to `Sample`, as the shard service returns it: built already
/// (a ranged draw, or a reply a wrapping service changed), or still to be
/// drawn and gathered, which happens as tonic encodes it (module doc).
pub struct SampleReplyOut(Out);

enum Out {
    // Boxed: a reply built already is the rare case (ranged draws).
    Built(Box<SampleReply>),
    Pending(Box<PendingSample>),
}

impl std::fmt::Debug for SampleReplyOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Out::Built(r) => f.debug_tuple("SampleReplyOut::Built").field(r).finish(),
            Out::Pending(p) => f
                .debug_struct("SampleReplyOut::Pending")
                .field("rows", &p.config.batch_size)
                .field("column_bytes", &p.column_bytes)
                .finish_non_exhaustive(),
        }
    }
}

impl From<SampleReply> for SampleReplyOut {
    fn from(reply: SampleReply) -> Self {
        SampleReplyOut(Out::Built(Box::new(reply)))
    }
}

impl SampleReplyOut {
    /// A reply whose rows `sampler` (made for `config` on the table at
    /// `index` of `tables`) draws and gathers when the reply is encoded
    /// (or [`SampleReplyOut::into_reply`] is called), which ends `timer`.
    /// The sampler goes back to the table's cache afterwards.
    pub(super) fn pending(
        tables: ServedTables,
        index: usize,
        shard: u32,
        sampler: Sampler,
        config: SampleConfig,
        timer: RpcTimer,
    ) -> Self {
        let column_bytes = (0..sampler.layout().columns().len()).map(|i| sampler.layout().column_bytes(i)).collect();
        let sampler = Some(sampler);
        SampleReplyOut(Out::Pending(Box::new(PendingSample {
            tables,
            index,
            sampler,
            config,
            column_bytes,
            shard,
            timer: Some(timer),
        })))
    }

    /// The reply as a message; a pending one is drawn and gathered now,
    /// into buffers of its own (for services that wrap the shard's and
    /// look at or change its replies).
    pub fn into_reply(self) -> Result<SampleReply, Status> {
        match self.0 {
            Out::Built(reply) => Ok(*reply),
            Out::Pending(pending) => pending.gather_into_vecs(),
        }
    }
}

impl OutgoingMessage for SampleReplyOut {
    fn encode_to(self, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match self.0 {
            Out::Built(reply) => encode_sized(&*reply, buf),
            Out::Pending(pending) => pending.gather_into_encode_buffer(buf),
        }
    }
}

/// A `Sample` call accepted and checked but not drawn yet.
struct PendingSample {
    tables: ServedTables,
    /// The table's index in `tables`.
    index: usize,
    /// Always `Some` until dropped (then it goes back to the table's cache).
    sampler: Option<Sampler>,
    config: SampleConfig,
    /// Bytes of each column of the batch, from the sampler's layout: what
    /// a successful `sample_into_uninit` writes, every byte of it.
    column_bytes: Vec<u64>,
    shard: u32,
    /// The call's timer, ended by the draw (dropped unended: a failed call).
    timer: Option<RpcTimer>,
}

impl Drop for PendingSample {
    fn drop(&mut self) {
        if let Some(sampler) = self.sampler.take() {
            let config = self.config.clone();
            if let Some(served) = self.tables.served().get(self.index) {
                served.samplers.put(config, sampler);
            }
        }
    }
}

impl PendingSample {
    fn served(&self) -> Result<&ServedTable, Status> {
        self.tables.served().get(self.index).ok_or_else(|| Status::internal("the sampled table is gone"))
    }

    /// Ends the call's timer with `result`'s outcome, counting the window
    /// bytes sent when it succeeded.
    fn finish<T>(&mut self, result: Result<T, Status>) -> Result<T, Status> {
        if result.is_ok() {
            if let Ok(served) = self.served() {
                served.count_sent(self.column_bytes.iter().sum());
            }
        }
        if let Some(timer) = self.timer.take() {
            timer.finish(result.is_ok());
        }
        result
    }

    /// Draws and gathers with `gather`, then returns the reply's fields
    /// other than `columns`. A panic is a status, as on tokio's blocking
    /// threads, and the sampler it left is not kept.
    fn draw(
        &mut self,
        gather: impl for<'s> FnOnce(&'s mut Sampler) -> gear_api::Result<SampledRows<'s>>,
    ) -> Result<SampleReply, Status> {
        let shard = self.shard;
        let (table, incarnation) = {
            let served = self.served()?;
            (served.table.clone(), served.incarnation)
        };
        let sampler = self.sampler.as_mut().ok_or_else(|| Status::internal("the sample was drawn already"))?;
        let drawn = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gather(sampler))) {
            Ok(drawn) => drawn.map_err(table_status)?,
            Err(_) => {
                self.sampler = None;
                return Err(Status::internal("the shard's sampler failed (panicked) drawing this batch"));
            }
        };
        let (size, total_mass, min_mass) = table_masses(&table)?;
        Ok(SampleReply {
            shard,
            incarnation,
            keys: drawn.keys().iter().map(|&k| key_to_proto(shard, incarnation, k)).collect(),
            lengths: drawn.lengths().to_vec(),
            starts: drawn.starts().to_vec(),
            probabilities: drawn.probabilities().to_vec(),
            weights: drawn.weights().to_vec(),
            columns: Vec::new(),
            size,
            total_mass,
            min_mass,
            row_ranges: Vec::new(),
            outcome: None,
        })
    }

    /// [`SampleReplyOut::into_reply`] of a pending reply.
    fn gather_into_vecs(mut self: Box<Self>) -> Result<SampleReply, Status> {
        let mut buffers: Vec<Vec<u8>> = self.column_bytes.iter().map(|&n| vec![0u8; n as usize]).collect();
        let drawn = run_blocking(|| {
            let mut views: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
            self.draw(|s| s.sample_into(&mut views))
        });
        let mut reply = self.finish(drawn)?;
        reply.columns = buffers.into_iter().map(Bytes::from).collect();
        Ok(reply)
    }

    /// Encodes the reply into `buf`, gathering the columns in place (module
    /// doc).
    fn gather_into_encode_buffer(mut self: Box<Self>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // Checked against the message limit with the request.
        let lens: Vec<usize> = self.column_bytes.iter().map(|&n| n as usize).collect();
        // Each column is one entry of field 8: its key and length, then its
        // bytes.
        let heads: Vec<Vec<u8>> = lens
            .iter()
            .map(|&n| {
                let mut head = Vec::with_capacity(12);
                encode_key(COLUMNS_FIELD, WireType::LengthDelimited, &mut head);
                encode_varint(n as u64, &mut head);
                head
            })
            .collect();
        let total: usize = heads.iter().zip(&lens).map(|(h, n)| h.len() + n).sum();
        buf.reserve(total + other_fields_bound(self.config.batch_size));
        let reply = {
            // SAFETY: only initialised bytes are written through `spare`:
            // the heads' bytes below, and the windows' bytes and padding by
            // `sample_into_uninit`, which never writes uninit bytes.
            let spare = unsafe { buf.chunk_mut().as_uninit_slice_mut() };
            let spare_len = spare.len();
            let mut rest = spare.get_mut(..total).ok_or_else(|| {
                Status::internal(format!("the encode buffer has {spare_len} bytes free, {total} were reserved"))
            })?;
            let mut columns: Vec<&mut [MaybeUninit<u8>]> = Vec::with_capacity(lens.len());
            for (head, &n) in heads.iter().zip(&lens) {
                let (at, tail) = std::mem::take(&mut rest).split_at_mut(head.len());
                for (dst, &b) in at.iter_mut().zip(head) {
                    dst.write(b);
                }
                let (data, tail) = tail.split_at_mut(n);
                columns.push(data);
                rest = tail;
            }
            let drawn = run_blocking(|| self.draw(|s| s.sample_into_uninit(&mut columns)));
            self.finish(drawn)?
        };
        // SAFETY: the `total` bytes past the buffer's end are initialised:
        // the heads were written above, and `sample_into_uninit` returned
        // `Ok`, so it wrote every byte of every column.
        unsafe { buf.advance_mut(total) };
        // The other fields, after the columns (module doc).
        encode_sized(&reply, buf)
    }
}

/// Runs `f`, which may block, from wherever the caller is (the encoder, an
/// insert stream): on a multi-thread tokio runtime under `block_in_place`
/// (the runtime moves its other tasks to another thread meanwhile),
/// elsewhere directly.
pub(super) fn run_blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Key;
    use prost::Message;

    #[test]
    fn the_other_fields_never_outgrow_their_reservation() {
        for rows in [0usize, 1, 7, 1000] {
            let reply = SampleReply {
                shard: u32::MAX,
                incarnation: u64::MAX,
                keys: vec![Key { shard: u32::MAX, incarnation: u64::MAX, slot: u32::MAX, generation: u32::MAX }; rows],
                lengths: vec![u64::MAX; rows],
                starts: vec![u64::MAX; rows],
                probabilities: vec![f64::MAX; rows],
                weights: vec![f64::MAX; rows],
                columns: Vec::new(),
                size: u64::MAX,
                total_mass: f64::MAX,
                min_mass: f64::MAX,
                row_ranges: Vec::new(),
                outcome: None,
            };
            assert!(reply.encoded_len() <= other_fields_bound(rows), "{rows} rows: {}", reply.encoded_len());
        }
    }
}
