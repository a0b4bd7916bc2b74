//! `SampleStream`: many `Sample` exchanges on one HTTP/2 stream.
//!
//! A `Sample` call per batch costs the client a request, its headers, the
//! response's headers and trailers and the call's futures: about thirty
//! small allocations per shard and batch, the whole of what a trainer's
//! `sample_into` still allocated (`tests/sample_into_allocations.rs`). On a
//! stream opened once, a batch is one request message and two reply
//! messages, which the client reads into buffers it keeps.
//!
//! Each request message is served exactly as a `Sample` call with the
//! stream's metadata: [`serve`] hands it to the `Sample` route
//! (`sample_route.rs`: from table memory, or gathered by the generated
//! service), and forwards that call's response on the stream. Its one
//! message goes out unchanged (the region pieces of a reply sent from
//! table memory included, so the route's check after the send still
//! follows the send); its status (the headers of a refusal, or the
//! trailers) becomes a second message, a `SampleReply` holding only
//! `outcome`. A refusal's first message is empty. The exchanges of one
//! stream are served one after the other, in order.
//!
//! The stream ends with OK when the client ends its side; `UNAVAILABLE`
//! between exchanges once the server stops (a client keeps its sessions
//! open between batches, and a graceful shutdown waits for every open
//! stream); with the status when a request cannot be read (read as the
//! `Insert` route reads its messages, `insert_route::Frames`: compressed,
//! above the limit, cut inside a message), and `INTERNAL` if a call's
//! response breaks the framing (never expected: the routes' replies are
//! one message each).

use super::insert_route::Frames;
use super::{sample_route, ShardService};
use crate::body::{row_list, status_from_headers, QueuedFrames, OVERWRITTEN_ROWS, OVERWRITTEN_ROW_LIST, SAMPLE_PATH};
use crate::proto::{SampleOutcome, SampleReply};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc;
use tonic::body::BoxBody;
use tonic::codegen::http::{self, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use tonic::codegen::Service;
use tonic::Status;

/// Frames queued between the exchanges' task and the stream's body.
const QUEUED_FRAMES: usize = 16;

/// Serves one `SampleStream` call whose token was checked (its request
/// `parts` and `body`; messages of at most `max_message_bytes`), each
/// exchange by the `Sample` route with `inner` behind it (module doc).
pub(super) fn serve<S>(
    service: Arc<ShardService>,
    inner: S,
    parts: http::request::Parts,
    body: BoxBody,
    max_message_bytes: usize,
) -> http::Response<BoxBody>
where
    S: Service<http::Request<BoxBody>, Response = http::Response<BoxBody>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let (frames, queued) = mpsc::channel(QUEUED_FRAMES);
    tokio::spawn(async move {
        let end = exchanges(&service, inner, &parts, body, max_message_bytes, &frames).await;
        let mut trailers = HeaderMap::new();
        // A status of ours always makes valid headers.
        let _ = end.unwrap_or_else(|s| s).add_header(&mut trailers);
        // The client may be gone: nothing is left to tell it.
        let _ = frames.send(Ok(Frame::trailers(trailers))).await;
    });
    let mut response = http::Response::new(tonic::body::boxed(QueuedFrames(queued)));
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// The stream's exchanges, until the client ends its side (`Ok`: the
/// status the stream ends with) or a request or a response breaks it
/// (`Err`). Returns early, with either, once the client is gone.
async fn exchanges<S>(
    service: &ShardService,
    inner: S,
    parts: &http::request::Parts,
    body: BoxBody,
    max_message_bytes: usize,
    frames: &mpsc::Sender<Result<Frame<Bytes>, Status>>,
) -> Result<Status, Status>
where
    S: Service<http::Request<BoxBody>, Response = http::Response<BoxBody>, Error = Infallible> + Clone,
{
    let mut requests = Frames::new(body, max_message_bytes);
    let mut stopping = service.stopping.subscribe();
    loop {
        let request = tokio::select! {
            request = requests.next_framed() => request?,
            // The server is stopping (or gone): a stream kept open between
            // batches would hold its graceful shutdown forever.
            _ = stopping.wait_for(|&stop| stop) => return Ok(Status::unavailable("the shard server is stopping")),
        };
        let Some(request) = request else { break };
        let mut call = http::Request::new(tonic::body::boxed(http_body_util::Full::new(request)));
        *call.method_mut() = Method::POST;
        *call.uri_mut() = Uri::from_static(SAMPLE_PATH);
        *call.headers_mut() = parts.headers.clone();
        *call.extensions_mut() = parts.extensions.clone();
        let (call_parts, call_body) = call.into_parts();
        let response = sample_route::serve(service, inner.clone(), call_parts, call_body, max_message_bytes).await;
        if !forward(response, frames).await? {
            return Ok(Status::cancelled("the client left the stream"));
        }
    }
    Ok(Status::ok(""))
}

/// Sends `response`'s message, then its status as the outcome message, on
/// the stream. `Ok(false)`: the client is gone.
async fn forward(
    response: http::Response<BoxBody>,
    frames: &mpsc::Sender<Result<Frame<Bytes>, Status>>,
) -> Result<bool, Status> {
    let (parts, mut body) = response.into_parts();
    let refusal = if parts.status != StatusCode::OK {
        Some(Status::unknown(format!("HTTP status {} from the Sample route", parts.status.as_u16())))
    } else {
        status_from_headers(&parts.headers)
    };
    let mut message = MessageLength::default();
    let outcome = match refusal {
        Some(status) => outcome_of(&status, &HeaderMap::new()),
        None => loop {
            let Some(frame) = body.frame().await else {
                break outcome_of(&Status::internal("the Sample reply ended without its trailers"), &HeaderMap::new());
            };
            let frame = match frame {
                Ok(frame) => frame,
                // Before the message began, a failed call is an outcome;
                // inside it, the stream's framing is lost.
                Err(status) if message.seen == 0 => break outcome_of(&status, &HeaderMap::new()),
                Err(status) => return Err(status),
            };
            match frame.into_data() {
                Ok(data) => {
                    message.count(&data)?;
                    if frames.send(Ok(Frame::data(data))).await.is_err() {
                        return Ok(false);
                    }
                }
                Err(frame) => {
                    let Ok(trailers) = frame.into_trailers() else { continue };
                    let status = status_from_headers(&trailers)
                        .unwrap_or_else(|| Status::internal("the Sample reply's trailers have no grpc-status"));
                    break outcome_of(&status, &trailers);
                }
            }
        },
    };
    if !message.whole() {
        if message.seen > 0 {
            return Err(Status::internal("the Sample reply ended inside its message"));
        }
        // A refusal: its reply is the empty message.
        if frames.send(Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0])))).await.is_err() {
            return Ok(false);
        }
    }
    let outcome = SampleReply { outcome: Some(outcome), ..SampleReply::default() };
    Ok(frames.send(Ok(Frame::data(crate::body::grpc_message(&outcome)))).await.is_ok())
}

/// The outcome message for a `Sample` call that ended with `status` (and,
/// for a reply sent from table memory, `trailers` naming overwritten rows).
fn outcome_of(status: &Status, trailers: &HeaderMap) -> SampleOutcome {
    let overwritten_rows =
        trailers.get(OVERWRITTEN_ROWS).and_then(|c| c.to_str().ok()).and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
    let overwritten_row_list = match (overwritten_rows, trailers.get(OVERWRITTEN_ROW_LIST)) {
        (0, _) | (_, None) => Vec::new(),
        (count, Some(list)) => row_list(list.as_bytes(), count).into_iter().map(|r| r as u64).collect(),
    };
    SampleOutcome {
        code: status.code() as i32,
        message: status.message().to_owned(),
        overwritten_rows,
        overwritten_row_list,
    }
}

/// Counts a forwarded reply's bytes against its gRPC framing: exactly one
/// message.
#[derive(Default)]
struct MessageLength {
    prefix: [u8; 5],
    /// Bytes forwarded so far.
    seen: usize,
}

impl MessageLength {
    fn count(&mut self, data: &[u8]) -> Result<(), Status> {
        for (i, &b) in data.iter().take(5usize.saturating_sub(self.seen)).enumerate() {
            self.prefix[self.seen + i] = b;
        }
        self.seen += data.len();
        if self.seen >= 5 && self.seen > 5 + self.length() {
            return Err(Status::internal("the Sample reply carries more than one message"));
        }
        Ok(())
    }

    fn length(&self) -> usize {
        u32::from_be_bytes([self.prefix[1], self.prefix[2], self.prefix[3], self.prefix[4]]) as usize
    }

    fn whole(&self) -> bool {
        self.seen >= 5 && self.seen == 5 + self.length()
    }
}
