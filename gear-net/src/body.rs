//! What the hand-made gRPC calls and routes share, on both sides: the
//! methods' paths, a message framed as gRPC frames it, HTTP bodies whose
//! frames are ready before they are sent or come through a channel, and
//! the reading of a status and of the overwritten-row trailers from
//! headers (the client's calls and sessions, `client/call.rs` and
//! `client/session.rs`; the shard's routes, `server/insert_route.rs`,
//! `server/sample_route.rs`, `server/sample_stream.rs`).

use base64::Engine;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tonic::codegen::http::HeaderMap;
use tonic::codegen::Body;
use tonic::{Code, Status};

/// The `Insert` method's path.
pub(crate) const INSERT_PATH: &str = "/gear.v1.Shard/Insert";

/// The `Sample` method's path.
pub(crate) const SAMPLE_PATH: &str = "/gear.v1.Shard/Sample";

/// The `SampleStream` method's path.
pub(crate) const SAMPLE_STREAM_PATH: &str = "/gear.v1.Shard/SampleStream";

/// The trailer of a `Sample` reply sent from table memory whose rows were
/// overwritten while it was sent: how many (the shard's
/// `server/sample_route.rs`; the client then asks again, `client/call.rs`).
pub(crate) const OVERWRITTEN_ROWS: &str = "gear-overwritten-rows";

/// Beside [`OVERWRITTEN_ROWS`]: which rows of the reply were overwritten,
/// their indices in ascending order separated by commas (left out when the
/// list would be longer than [`MAX_OVERWRITTEN_LIST_BYTES`]). A client may
/// then draw that many rows again in their place instead of all of them.
pub(crate) const OVERWRITTEN_ROW_LIST: &str = "gear-overwritten-row-list";

/// Longest [`OVERWRITTEN_ROW_LIST`] sent: one HTTP/2 header well under the
/// 16 KiB header list clients accept by default.
pub(crate) const MAX_OVERWRITTEN_LIST_BYTES: usize = 4 << 10;

/// A message above the limit refused as tonic refuses it (`OutOfRange`,
/// its wording); `found` says how large it was seen to be.
pub(crate) fn message_too_large(found: impl std::fmt::Display, limit: usize) -> Status {
    Status::out_of_range(format!(
        "Error, decoded message length too large: found {found} bytes, the limit is: {limit} bytes"
    ))
}

/// `message` framed as one gRPC message: a zero flag byte (not
/// compressed), its length in 4 big-endian bytes, its encoding.
pub(crate) fn grpc_message(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = Vec::with_capacity(5 + len);
    buf.push(0);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    // A `Vec` grows as needed: encoding into it cannot fail.
    let _ = message.encode(&mut buf);
    Bytes::from(buf)
}

/// Sends its frames in order, each as it is (no copy, no coalescing).
pub(crate) struct ReadyFrames(std::vec::IntoIter<Frame<Bytes>>);

impl ReadyFrames {
    /// A body of `frames` (DATA frames, then at most one of trailers).
    pub(crate) fn new(frames: Vec<Frame<Bytes>>) -> Self {
        ReadyFrames(frames.into_iter())
    }
}

impl Body for ReadyFrames {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Poll::Ready(self.0.next().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.len() == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_slice().iter().filter_map(Frame::data_ref).map(|d| d.len() as u64).sum())
    }
}

/// A body of the frames sent into a channel, as they come; it ends when
/// every sender is dropped (a `SampleStream`'s requests on the client, its
/// replies on the shard).
pub(crate) struct QueuedFrames(pub(crate) mpsc::Receiver<Result<Frame<Bytes>, Status>>);

impl Body for QueuedFrames {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.0.poll_recv(cx)
    }
}

/// The rows an [`OVERWRITTEN_ROW_LIST`] trailer names, if it lists `count`
/// distinct rows in ascending order; else none (the list is network input:
/// a client that cannot use it asks for every row again).
pub(crate) fn row_list(list: &[u8], count: u64) -> Vec<usize> {
    let rows: Option<Vec<usize>> = std::str::from_utf8(list)
        .ok()
        .and_then(|l| l.split(',').map(|r| r.parse().ok()).collect::<Option<Vec<usize>>>());
    rows.map_or_else(Vec::new, |rows| listed_rows(rows, count))
}

/// `rows` if they are `count` distinct rows in ascending order, else none:
/// what a shard's list of overwritten rows (a trailer, or a
/// `SampleStream` outcome's list) may be used as.
pub(crate) fn listed_rows(rows: Vec<usize>, count: u64) -> Vec<usize> {
    if rows.len() as u64 == count && rows.windows(2).all(|w| w[0] < w[1]) {
        rows
    } else {
        Vec::new()
    }
}

/// The status in `headers` (`grpc-status`, `grpc-message` and binary
/// details in `grpc-status-details-bin`), if any. Details that are not
/// base64 are left out.
pub(crate) fn status_from_headers(headers: &HeaderMap) -> Option<Status> {
    let code = Code::from_bytes(headers.get("grpc-status")?.as_bytes());
    let message = headers.get("grpc-message").map(|m| percent_decoded(m.as_bytes())).unwrap_or_default();
    let details = headers.get("grpc-status-details-bin").and_then(|d| DETAILS_BASE64.decode(d.as_bytes()).ok());
    Some(match details {
        Some(details) => Status::with_details(code, message, details.into()),
        None => Status::new(code, message),
    })
}

/// gRPC's binary headers: standard base64, padded or not.
const DETAILS_BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// `grpc-message` is percent-encoded UTF-8; a malformed escape or invalid
/// UTF-8 is kept as it came (lossily), never an error.
fn percent_decoded(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
