//! What the hand-made gRPC calls send: a message framed as gRPC frames it,
//! and an HTTP body whose frames are all ready before it is sent (the
//! client's `Sample` and `Insert` requests, `client/call.rs`, and the
//! shard's `Insert` replies, `server/insert_route.rs`).

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::codegen::Body;
use tonic::Status;

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
