//! `Sample` replies sent straight from the table's memory.
//!
//! A gathered reply (`server/reply.rs`) copies every window byte once on
//! the shard, from the table into tonic's encode buffer, before the socket
//! copies it again. The shard's hand routes (`routes.rs`) give every
//! `Sample` call to [`serve`], which serves those that allow it
//! (`send_from_table` in the request: the cluster client's shard-gather
//! draw) without that copy:
//!
//! 1. it draws the rows as a byte-range sample does
//!    ([`ReplayTable::draw_ranges`]: keys, probabilities, and where each
//!    row's window lies in the table's region), without copying a byte;
//! 2. the reply's body is the gRPC message laid out as pieces: its small
//!    fields and each column's field header, copied; each row's window,
//!    a [`Bytes`] over the region itself when it is at least
//!    [`OWN_FRAME_MIN_BYTES`] long (hyper hands it to the socket as it is),
//!    copied in with its neighbours when shorter; padding, zeros;
//! 3. the trailers wait until every region piece has been dropped (h2 drops
//!    a buffer once it has written it to the connection, or when the
//!    stream ends), then re-read each row's generation word, as every
//!    seqlock reader does after its copy (`gear_core::slot`). If a slot was
//!    reused meanwhile, a writer may have overwritten bytes the client got:
//!    the reply then ends with `ABORTED` and the trailers
//!    [`OVERWRITTEN_ROWS`] (how many) and [`OVERWRITTEN_ROW_LIST`] (which),
//!    and the client asks that shard again without `send_from_table` (the
//!    gathered reply, which redraws torn rows before it sends any), for
//!    as many rows as were overwritten, and puts them in their place; the
//!    rest of the reply stands. Under heavy eviction (the training
//!    benchmark at L 512: a third of the replies) asking for every row
//!    again had sent most replies' bytes twice.
//!
//! A `Sample` this module does not serve goes to the generated service:
//! without the flag, a ranged draw, a
//! table with `max_times_sampled` (a draw may take rows out, so a reply
//! asked for again would lose them), a table whose region the host cannot
//! read, or a request the generated service must refuse (it refuses it
//! with its usual status). Those are sent on with the request body as it
//! came.

use super::reply::COLUMNS_FIELD;
use super::{blocking, check_incarnation, ranged_reply_fields, table_masses, ShardService};
use crate::body::{message_too_large, MAX_OVERWRITTEN_LIST_BYTES, OVERWRITTEN_ROWS, OVERWRITTEN_ROW_LIST};
use crate::convert::{table_status, CheckedSample};
use crate::metrics::{Method, RpcTimer};
use crate::proto::{SampleReply, SampleRequest};
use crate::server::tables::ServedTables;
use bytes::{BufMut, Bytes, BytesMut};
use gear_api::table::ranges::{generation_of, RowRanges};
use gear_core::MemoryRegion;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::body::BoxBody;
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::codegen::{Body, Service};
use tonic::Status;

/// Window pieces at least this long go out as region slices of their own;
/// shorter ones are copied in with the pieces around them. Each slice is a
/// DATA frame of its own, and a frame costs both ends more than copying a
/// few KiB would (the client's allocations per batch rose sixfold with
/// 4 KiB rows sent as slices, `tests/sample_into_allocations.rs`).
const OWN_FRAME_MIN_BYTES: usize = 64 << 10;

/// Bytes copied into one piece at most (the piece's allocation).
const SMALL_PIECE_BYTES: usize = 1 << 20;

/// Zeros for padding pieces, shared by every reply.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Serves one `Sample` call whose token was checked (its request
/// `parts`, its `body` of at most `max_message_bytes`): from table memory
/// if the request allows it and the table can, else by `inner` (the
/// generated service), given the request as it came.
pub(super) async fn serve<S>(
    service: &ShardService,
    mut inner: S,
    parts: http::request::Parts,
    body: BoxBody,
    max_message_bytes: usize,
) -> http::Response<BoxBody>
where
    S: Service<http::Request<BoxBody>, Response = http::Response<BoxBody>, Error = Infallible>,
{
    let bytes = match read_request(body, max_message_bytes).await {
        Ok(bytes) => bytes,
        Err(status) => return status.into_http(),
    };
    if let Some(req) = decode_request(&bytes).filter(|r| r.send_from_table) {
        match service.sample_from_table(req).await {
            Ok(Some(response)) => return response,
            Ok(None) => {}
            Err(status) => return status.into_http(),
        }
    }
    let body = tonic::body::boxed(http_body_util::Full::new(bytes));
    match inner.call(http::Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The request body's bytes (one small message), refused past
/// `max_message_bytes` as tonic refuses a message over its limit.
async fn read_request(mut body: BoxBody, max_message_bytes: usize) -> Result<Bytes, Status> {
    let mut bytes = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else { continue };
        if bytes.len() + data.len() > max_message_bytes.saturating_add(5) {
            return Err(message_too_large(format!("{} and more", bytes.len() + data.len()), max_message_bytes));
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes.freeze())
}

/// The request in `bytes` if they are exactly one uncompressed gRPC
/// message that decodes; `None` leaves the verdict to the generated
/// service.
fn decode_request(bytes: &[u8]) -> Option<SampleRequest> {
    let (&[flag, a, b, c, d], message) = bytes.split_first_chunk::<5>()?;
    if flag != 0 || u32::from_be_bytes([a, b, c, d]) as usize != message.len() {
        return None;
    }
    SampleRequest::decode(message).ok()
}

impl ShardService {
    /// Serves `req` from table memory (module doc), or `Ok(None)` where
    /// the generated service must answer it instead.
    async fn sample_from_table(&self, req: SampleRequest) -> Result<Option<http::Response<BoxBody>>, Status> {
        let Ok((index, served)) = self.tables.find(&req.table) else { return Ok(None) };
        let table = served.table.clone();
        let memory = table.memory();
        let not_here = req.ranges
            || table.max_times_sampled().is_some()
            || memory.host_ptr().is_none()
            || check_incarnation(self.shard, served, req.incarnation).is_err();
        if not_here {
            return Ok(None);
        }
        let Ok(CheckedSample { window, columns, step_bytes, timeout }) = self.limits.checked_sample(table.spec(), &req)
        else {
            return Ok(None);
        };
        let mut timer = RpcTimer::start(&self.tables, Method::Sample);
        timer.table(index);
        let (shard, incarnation) = (self.shard, served.incarnation);
        let (rows, random_start) = (req.rows as usize, req.random_start);
        // The draw waits only for data or the rate limiter: it is tried at
        // once on this thread (no hand-off to another), and on tokio's
        // blocking pool with the request's timeout when it would wait. The
        // rest takes the table lock for a moment at most.
        let drawn = match table.draw_ranges(rows, window, random_start, &columns, Some(Duration::ZERO)) {
            Err(gear_api::Error::Timeout { .. }) => {
                let table = table.clone();
                blocking(move || {
                    table.draw_ranges(rows, window, random_start, &columns, Some(timeout)).map_err(table_status)
                })
                .await
            }
            drawn => drawn.map_err(table_status),
        };
        let drawn = drawn.and_then(|drawn| {
            let meta = ranged_reply_fields(shard, incarnation, &drawn, table_masses(&table)?);
            TableReply::lay_out(&meta, &drawn, &step_bytes, window.len, memory)
        });
        match drawn {
            Ok(reply) => Ok(Some(reply.into_response(self.tables.clone(), index, timer))),
            Err(status) => {
                timer.finish(false);
                Err(status)
            }
        }
    }
}

/// A drawn reply laid out as pieces, before it is sent.
struct TableReply {
    pieces: Vec<Bytes>,
    /// Per row, where its slot's generation word is and what it must hold.
    checks: Vec<(u64, u32)>,
    /// The region the pieces and the checks point into.
    memory: Arc<dyn MemoryRegion>,
    /// Dropped by the last region piece (see [`PieceOwner`]).
    all_sent: oneshot::Receiver<()>,
    /// Window bytes in the reply (padding included).
    column_bytes: u64,
    /// Stored bytes of the rows' windows in the reply (padding left out).
    stored_bytes: u64,
}

impl TableReply {
    /// `meta` (the reply without its columns), then each of `drawn`'s
    /// columns (`step_bytes` a step, `window_len` steps a row), from
    /// `memory`.
    fn lay_out(
        meta: &SampleReply,
        drawn: &[RowRanges],
        step_bytes: &[u64],
        window_len: u64,
        memory: Arc<dyn MemoryRegion>,
    ) -> Result<Self, Status> {
        let base = memory.host_ptr().ok_or_else(|| Status::internal("the table's region left host memory"))?;
        let region_len = memory.len();
        let column_lens: Vec<u64> = step_bytes.iter().map(|&b| b * window_len * drawn.len() as u64).collect();
        let column_bytes: u64 = column_lens.iter().sum();
        let message_len = meta.encoded_len() as u64
            + column_lens.iter().map(|&n| (key_len(COLUMNS_FIELD) + encoded_len_varint(n)) as u64 + n).sum::<u64>();
        let message_len = u32::try_from(message_len)
            .map_err(|_| Status::resource_exhausted(format!("a reply of {message_len} bytes")))?;
        let (sent_signal, all_sent) = oneshot::channel();
        let sent_signal = Arc::new(sent_signal);
        let small = BytesMut::with_capacity((message_len as usize + 5).min(SMALL_PIECE_BYTES));
        let mut out = Pieces { pieces: Vec::new(), small };
        let mut stored_bytes = 0;
        out.small.put_u8(0);
        out.small.put_u32(message_len);
        // A `BytesMut` grows as needed: encoding into it cannot fail.
        let _ = meta.encode(&mut out.small);
        for (c, (&step, &len)) in step_bytes.iter().zip(&column_lens).enumerate() {
            encode_key(COLUMNS_FIELD, WireType::LengthDelimited, &mut out.small);
            encode_varint(len, &mut out.small);
            for row in drawn {
                let w = row.window;
                let range = row.columns.get(c).ok_or_else(|| Status::internal("a drawn row lacks a column"))?;
                if range.end < range.start || range.end > region_len || range.end - range.start != w.steps * step {
                    return Err(Status::internal(format!("a drawn row's bytes {range:?} do not fit the region")));
                }
                let after = window_len
                    .checked_sub(w.dst_step + w.steps)
                    .ok_or_else(|| Status::internal("a drawn window overruns its row"))?;
                out.zeros((w.dst_step * step) as usize);
                let len = (range.end - range.start) as usize;
                stored_bytes += len as u64;
                if len >= OWN_FRAME_MIN_BYTES {
                    out.flush();
                    let owner = PieceOwner {
                        // SAFETY: `range` lies inside the region (checked
                        // above), which `memory` keeps mapped.
                        ptr: unsafe { base.as_ptr().add(range.start as usize) },
                        len,
                        _memory: memory.clone(),
                        _sent: sent_signal.clone(),
                    };
                    out.pieces.push(Bytes::from_owner(owner));
                } else {
                    out.make_room(len);
                    // SAFETY: as above for the source; the destination is
                    // `len` bytes of `small`'s spare capacity, reserved
                    // here. The region's bytes may be written concurrently
                    // (copied as the table's own readers copy them); the
                    // generation check after the send catches that.
                    unsafe {
                        out.small.reserve(len);
                        let dst = out.small.chunk_mut().as_mut_ptr();
                        gear_core::copy::copy_bytes(base.as_ptr().add(range.start as usize), dst, len);
                        out.small.advance_mut(len);
                    }
                }
                out.zeros((after * step) as usize);
            }
        }
        out.flush();
        let checks = drawn.iter().map(|r| (r.generation_offset, r.generation)).collect::<Vec<_>>();
        if checks.iter().any(|&(offset, _)| offset % 8 != 0 || offset + 8 > region_len) {
            return Err(Status::internal("a drawn row's generation word lies outside the region"));
        }
        Ok(TableReply { pieces: out.pieces, checks, memory, all_sent, column_bytes, stored_bytes })
    }

    /// The response: headers, the pieces, then the trailers once they were
    /// sent and checked; `timer` ends with them.
    fn into_response(self, tables: ServedTables, index: usize, timer: RpcTimer) -> http::Response<BoxBody> {
        let mut response = http::Response::new(tonic::body::boxed(self.into_body(tables, index, timer)));
        response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        response
    }

    /// The response's body (see [`TableReply::into_response`]).
    fn into_body(self, tables: ServedTables, index: usize, timer: RpcTimer) -> TableReplyBody {
        TableReplyBody {
            pieces: self.pieces.into_iter(),
            all_sent: Some(self.all_sent),
            after: Some(AfterSend {
                checks: self.checks,
                memory: self.memory,
                tables,
                index,
                timer,
                column_bytes: self.column_bytes,
                stored_bytes: self.stored_bytes,
            }),
        }
    }
}

/// Pieces being laid out: the ones done, and small bytes being collected.
struct Pieces {
    pieces: Vec<Bytes>,
    small: BytesMut,
}

impl Pieces {
    /// Ends the small bytes collected so far as one piece.
    fn flush(&mut self) {
        if !self.small.is_empty() {
            self.pieces.push(self.small.split().freeze());
        }
    }

    /// Ends the small bytes collected as a piece if `n` more would take
    /// them past [`SMALL_PIECE_BYTES`].
    fn make_room(&mut self, n: usize) {
        if self.small.len() + n > SMALL_PIECE_BYTES {
            self.flush();
        }
    }

    /// `n` zero bytes: copied in when short, else pieces of [`ZEROS`].
    fn zeros(&mut self, mut n: usize) {
        if n < OWN_FRAME_MIN_BYTES {
            self.make_room(n);
            self.small.put_bytes(0, n);
            return;
        }
        self.flush();
        while n > 0 {
            let take = n.min(ZEROS.len());
            self.pieces.push(Bytes::from_static(&ZEROS[..take]));
            n -= take;
        }
    }
}

/// The owner of a region piece's [`Bytes`]: keeps the region mapped, and
/// holds the reply's "sent" signal, which fires when the last piece is
/// dropped.
struct PieceOwner {
    ptr: *const u8,
    len: usize,
    _memory: Arc<dyn MemoryRegion>,
    _sent: Arc<oneshot::Sender<()>>,
}

// SAFETY: `ptr` points into the region `_memory` keeps alive, which is
// `Send + Sync`; nothing is written through it.
unsafe impl Send for PieceOwner {}

impl AsRef<[u8]> for PieceOwner {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` lies inside the region (checked when
        // the piece was made), mapped while `_memory` lives. Its bytes may
        // be written concurrently by the table's writers: this slice is
        // only ever copied out (by h2 into a frame, by the kernel into the
        // socket), as the table's own readers copy, and the reply's
        // generation check, made after the piece is dropped, discards what
        // such a write may have torn.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// What the trailers are made of, once every piece was sent.
struct AfterSend {
    checks: Vec<(u64, u32)>,
    memory: Arc<dyn MemoryRegion>,
    tables: ServedTables,
    index: usize,
    timer: RpcTimer,
    column_bytes: u64,
    stored_bytes: u64,
}

impl AfterSend {
    /// The rows whose slot was reused since they were drawn, in order.
    fn overwritten(&self) -> Vec<usize> {
        let Some(base) = self.memory.host_ptr() else { return (0..self.checks.len()).collect() };
        // The pieces' bytes were read (copied, or written to the socket)
        // before their owners were dropped, which happened before this
        // (the signal's channel orders them); the fence orders those reads
        // before the loads below, as a seqlock reader's second load.
        fence(Ordering::Acquire);
        self.checks
            .iter()
            .enumerate()
            .filter(|(_, &(offset, generation))| {
                // SAFETY: `offset` is 8-byte aligned and `offset + 8` lies
                // inside the region (checked when laid out), which
                // `memory` keeps mapped; the word is an atomic of the
                // slot's record, written by writers with atomic stores.
                let word = unsafe { &*base.as_ptr().add(offset as usize).cast::<AtomicU64>() };
                generation_of(word.load(Ordering::Acquire)) != generation
            })
            .map(|(row, _)| row)
            .collect()
    }

    /// The trailers: OK, or `ABORTED` with [`OVERWRITTEN_ROWS`] and (when
    /// it fits) [`OVERWRITTEN_ROW_LIST`].
    fn trailers(self) -> HeaderMap {
        let rows = self.overwritten();
        let overwritten = rows.len();
        let served = self.tables.served().get(self.index);
        let mut trailers = HeaderMap::new();
        if overwritten == 0 {
            if let Some(served) = served {
                served.count_sent(self.column_bytes);
                served.table.count_bytes_read_out(self.stored_bytes);
            }
            self.timer.finish(true);
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            return trailers;
        }
        if let Some(served) = served {
            served.count_overwritten(overwritten as u64);
        }
        self.timer.finish(false);
        let status = Status::aborted(format!(
            "{overwritten} of {} rows were overwritten while they were sent; ask again without send_from_table",
            self.checks.len()
        ));
        // A status of ours always makes valid headers.
        let _ = status.add_header(&mut trailers);
        trailers.insert(OVERWRITTEN_ROWS, HeaderValue::from(overwritten));
        let list = rows.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        if list.len() <= MAX_OVERWRITTEN_LIST_BYTES {
            // Digits and commas always make a valid header value.
            if let Ok(value) = HeaderValue::from_str(&list) {
                trailers.insert(OVERWRITTEN_ROW_LIST, value);
            }
        }
        trailers
    }
}

/// The body of a reply sent from table memory: its pieces, then (once
/// every region piece has been dropped) the trailers.
struct TableReplyBody {
    pieces: std::vec::IntoIter<Bytes>,
    /// Resolves once the last region piece is dropped.
    all_sent: Option<oneshot::Receiver<()>>,
    after: Option<AfterSend>,
}

impl Body for TableReplyBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(piece) = self.pieces.next() {
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        if let Some(all_sent) = self.all_sent.as_mut() {
            // Never sent: the sender is only ever dropped.
            let _ = std::task::ready!(Pin::new(all_sent).poll(cx));
            self.all_sent = None;
        }
        Poll::Ready(self.after.take().map(|after| Ok(Frame::trailers(after.trailers()))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.len() == 0 && self.after.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.pieces.as_slice().iter().map(|p| p.len() as u64).sum())
    }
}

#[cfg(test)]
mod tests;
