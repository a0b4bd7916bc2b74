//! The shard's `Insert` method served without tonic's decode buffer.
//!
//! tonic copies every DATA frame of a request into one buffer before it
//! decodes a message, so each inserted byte was copied twice on the shard
//! (into that buffer, then into the table). The shard's hand routes
//! (`routes.rs`) take `/gear.v1.Shard/Insert` and give it to [`serve`],
//! which keeps the request's DATA frames
//! as they arrived (slices of hyper's read buffer), and decodes each gRPC
//! message with prost over those frames ([`Frames`]), so a column that
//! arrived inside one frame becomes a slice of it and reaches the table with
//! its one copy. A column split across frames is gathered into one buffer
//! (prost's `copy_to_bytes`), as before.
//!
//! The rest is the gRPC protocol as tonic serves it: a message above the
//! server's limit is `OutOfRange` with tonic's wording, a compressed one
//! `Unimplemented`, a stream that ends inside a message `Internal`; the
//! reply is one message and `grpc-status: 0` in the trailers, a failure a
//! "trailers only" response (`Status::into_http`), with the committed keys
//! in its details as before. What arrives is network input: lengths are
//! checked before anything is buffered past them, and nothing panics.

use super::ShardService;
use crate::body::{grpc_message, message_too_large, ReadyFrames};
use crate::metrics::{Method, RpcTimer};
use crate::proto::{InsertChunk, InsertReply};
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Frame;
use prost::Message;
use std::collections::VecDeque;
use std::future::Future;
use tonic::body::BoxBody;
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::Status;

/// Where an insert stream's chunks come from: tonic's decoder, or
/// [`Frames`] (this module).
pub(crate) trait ChunkSource: Send {
    /// The next chunk; `None` once the stream ended cleanly.
    fn next_chunk(&mut self) -> impl Future<Output = Result<Option<InsertChunk>, Status>> + Send;
}

impl ChunkSource for tonic::Streaming<InsertChunk> {
    async fn next_chunk(&mut self) -> Result<Option<InsertChunk>, Status> {
        self.message().await
    }
}

/// Serves one `Insert` stream whose token was checked: `body`'s messages
/// (each at most `max_message_bytes`) decoded over its frames ([`Frames`])
/// into [`ShardService::insert_into`].
pub(super) async fn serve(service: &ShardService, body: BoxBody, max_message_bytes: usize) -> http::Response<BoxBody> {
    let mut timer = RpcTimer::start(&service.tables, Method::Insert);
    let reply = service.insert_into(Frames::new(body, max_message_bytes), &mut timer).await;
    timer.finish(reply.is_ok());
    match reply {
        Ok(reply) => reply_response(&reply),
        Err(status) => status.into_http(),
    }
}

/// A successful `Insert` response: `reply` as one gRPC message, then
/// `grpc-status: 0` in the trailers.
fn reply_response(reply: &InsertReply) -> http::Response<BoxBody> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let body = ReadyFrames::new(vec![Frame::data(grpc_message(reply)), Frame::trailers(trailers)]);
    let mut response = http::Response::new(tonic::body::boxed(body));
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// A request body's DATA frames as they arrived, taken message by
/// message: decoded into insert chunks (see the module doc), or as the
/// framed bytes of each message (`SampleStream`'s requests,
/// `sample_stream.rs`).
pub(crate) struct Frames {
    body: BoxBody,
    frames: VecDeque<Bytes>,
    /// Bytes in `frames`.
    buffered: usize,
    /// The request's body has ended.
    ended: bool,
    max_message_bytes: usize,
}

impl Frames {
    /// Chunks of `body`, each message at most `max_message_bytes` long.
    pub(crate) fn new(body: BoxBody, max_message_bytes: usize) -> Self {
        Frames { body, frames: VecDeque::new(), buffered: 0, ended: false, max_message_bytes }
    }

    /// Adds one DATA frame's bytes (empty frames are dropped).
    fn push(&mut self, data: Bytes) {
        if !data.is_empty() {
            self.buffered += data.len();
            self.frames.push_back(data);
        }
    }

    /// The first `N` bytes buffered, without consuming them (`None` if
    /// fewer are there).
    fn peek<const N: usize>(&self) -> Option<[u8; N]> {
        if self.buffered < N {
            return None;
        }
        let mut out = [0u8; N];
        let mut filled = 0;
        for frame in &self.frames {
            let take = (N - filled).min(frame.len());
            out[filled..filled + take].copy_from_slice(&frame[..take]);
            filled += take;
            if filled == N {
                break;
            }
        }
        Some(out)
    }

    /// The length of the next message if all of it is buffered; a
    /// compressed one or one above the limit is refused as tonic refuses
    /// it.
    fn whole_message_len(&self) -> Result<Option<usize>, Status> {
        let Some([flag, a, b, c, d]) = self.peek::<5>() else { return Ok(None) };
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        if flag != 0 {
            return Err(Status::unimplemented(format!(
                "a compressed message (gRPC flag {flag}): this server takes uncompressed messages only"
            )));
        }
        if len > self.max_message_bytes {
            return Err(message_too_large(len, self.max_message_bytes));
        }
        Ok((self.buffered >= 5 + len).then_some(len))
    }

    /// The next whole message's chunk, if all of it is buffered.
    fn take_chunk(&mut self) -> Result<Option<InsertChunk>, Status> {
        let Some(len) = self.whole_message_len()? else { return Ok(None) };
        let mut message = MessageBytes { frames: &mut self.frames, remaining: 5 + len };
        message.advance(5);
        let chunk = InsertChunk::decode(&mut message).map_err(|e| Status::internal(e.to_string()));
        // prost reads a message to the end of its buffer; what it left (on an
        // error) is dropped with the message.
        let rest = message.remaining;
        message.advance(rest);
        self.buffered -= 5 + len;
        chunk.map(Some)
    }

    /// The next whole message as it came, its 5-byte gRPC prefix included
    /// (a slice of its frame when one frame holds it), if all of it is
    /// buffered.
    fn take_framed(&mut self) -> Result<Option<Bytes>, Status> {
        let Some(len) = self.whole_message_len()? else { return Ok(None) };
        let framed = MessageBytes { frames: &mut self.frames, remaining: 5 + len }.copy_to_bytes(5 + len);
        self.buffered -= 5 + len;
        Ok(Some(framed))
    }

    /// The next message as `take` makes it, reading frames until it is
    /// whole; `None` once the body ended between messages.
    async fn next_with<T>(
        &mut self,
        take: impl Fn(&mut Self) -> Result<Option<T>, Status>,
    ) -> Result<Option<T>, Status> {
        loop {
            if let Some(message) = take(self)? {
                return Ok(Some(message));
            }
            if self.ended {
                return match self.buffered {
                    0 => Ok(None),
                    n => Err(Status::internal(format!("the request stream ended inside a message ({n} bytes of it)"))),
                };
            }
            let frame = self.body.frame().await;
            match frame {
                None => self.ended = true,
                Some(Err(status)) => return Err(status),
                // Trailers of a request carry nothing for us.
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.push(data);
                    }
                }
            }
        }
    }

    /// The next message, framed (see [`Frames::take_framed`]); `None` once
    /// the body ended between messages. Cancel safe: a frame read is kept
    /// for the next call.
    pub(crate) async fn next_framed(&mut self) -> Result<Option<Bytes>, Status> {
        self.next_with(Self::take_framed).await
    }
}

impl ChunkSource for Frames {
    async fn next_chunk(&mut self) -> Result<Option<InsertChunk>, Status> {
        self.next_with(Self::take_chunk).await
    }
}

/// One message's bytes at the front of `frames` as a [`Buf`] whose
/// `copy_to_bytes` slices a frame instead of copying when the bytes lie
/// inside it (prost takes `bytes` fields that way).
struct MessageBytes<'a> {
    frames: &'a mut VecDeque<Bytes>,
    remaining: usize,
}

impl Buf for MessageBytes<'_> {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        match self.frames.front() {
            Some(front) => &front[..front.len().min(self.remaining)],
            None => &[],
        }
    }

    fn advance(&mut self, mut n: usize) {
        assert!(n <= self.remaining, "advance past the message's end");
        self.remaining -= n;
        while n > 0 {
            let Some(front) = self.frames.front_mut() else { return };
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.frames.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(len <= self.remaining, "copy_to_bytes past the message's end");
        if let Some(front) = self.frames.front_mut() {
            if front.len() >= len {
                let out = front.split_to(len);
                if front.is_empty() {
                    self.frames.pop_front();
                }
                self.remaining -= len;
                return out;
            }
        }
        let mut out = BytesMut::with_capacity(len);
        while out.len() < len && !self.chunk().is_empty() {
            let take = (len - out.len()).min(self.chunk().len());
            out.extend_from_slice(&self.chunk()[..take]);
            self.advance(take);
        }
        out.freeze()
    }
}

#[cfg(test)]
mod tests;
