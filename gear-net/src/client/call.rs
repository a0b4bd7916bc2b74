//! One `Sample` call made by hand over the shard's HTTP/2 channel, its
//! reply decoded frame by frame into the caller's rows (`wire`).
//!
//! tonic's generated client would decode the reply into a message first;
//! here the request is framed and sent as tonic would send it (POST to
//! `/gear.v1.Shard/Sample`, `application/grpc`, `te: trailers`, the cluster
//! token), and the response's DATA frames go to the [`ReplyDecoder`] as they
//! arrive. The gRPC status comes from the response headers (a refusal is
//! "trailers only") or from the trailers, and is read here without tonic's
//! `Status::from_header_map`, which panics on malformed binary details: a
//! shard's headers are network input.

use super::wire::ReplyDecoder;
use crate::channel::ShardChannel;
use crate::proto::SampleRequest;
use bytes::Bytes;
use prost::Message;
use std::pin::Pin;
use tonic::codegen::http::header::{AUTHORIZATION, CONTENT_TYPE, TE};
use tonic::codegen::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri};
use tonic::codegen::Body;
use tonic::{Code, Status};

/// The `Sample` method's path.
const SAMPLE_PATH: &str = "/gear.v1.Shard/Sample";

/// How a call failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The shard (or the connection) answered with this status.
    Status(Status),
    /// The reply broke the protocol: what was wrong.
    Malformed(String),
}

impl From<Status> for CallError {
    fn from(s: Status) -> Self {
        CallError::Status(s)
    }
}

/// `request` framed as one gRPC message (flag byte, 4-byte length, bytes).
fn framed(request: &SampleRequest) -> Bytes {
    let len = request.encoded_len();
    let mut buf = Vec::with_capacity(5 + len);
    buf.push(0);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    // A `Vec` grows as needed: encoding into it cannot fail.
    let _ = request.encode(&mut buf);
    Bytes::from(buf)
}

/// Sends `request` over `channel` with the `authorization` header `token`,
/// and decodes the reply with `decoder` as it arrives. `Ok` once the whole
/// message came and the trailers say OK.
pub(crate) async fn sample(
    channel: &ShardChannel,
    token: &HeaderValue,
    request: &SampleRequest,
    mut decoder: ReplyDecoder<'_>,
) -> Result<(), CallError> {
    let body = tonic::body::boxed(http_body_util::Full::new(framed(request)));
    let mut http = Request::new(body);
    *http.method_mut() = Method::POST;
    *http.uri_mut() = Uri::from_static(SAMPLE_PATH);
    let headers = http.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    headers.insert(AUTHORIZATION, token.clone());
    let response = channel.send(http).await?;
    let (parts, mut body) = response.into_parts();
    if parts.status != StatusCode::OK {
        return Err(http_status(parts.status).into());
    }
    // A refusal comes as headers alone ("trailers only").
    if let Some(status) = status_from_headers(&parts.headers) {
        return Err(match status.code() {
            Code::Ok => CallError::Malformed("an OK status before the reply".into()),
            _ => status.into(),
        });
    }
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let frame = match frame {
            None => return Err(Status::unavailable("the reply ended without its trailers").into()),
            Some(frame) => frame?,
        };
        let frame = match frame.into_data() {
            Ok(data) => {
                decoder.feed(&data).map_err(CallError::Malformed)?;
                continue;
            }
            Err(frame) => frame,
        };
        let Ok(trailers) = frame.into_trailers() else { continue };
        return match status_from_headers(&trailers) {
            Some(s) if s.code() == Code::Ok => decoder.finish().map_err(CallError::Malformed),
            Some(s) => Err(s.into()),
            None => Err(CallError::Malformed("trailers without a grpc-status".into())),
        };
    }
}

/// The status a non-200 HTTP response stands for (gRPC's mapping).
fn http_status(status: StatusCode) -> Status {
    let code = match status {
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("HTTP status {} instead of a gRPC reply", status.as_u16()))
}

/// The status in `headers` (`grpc-status`, `grpc-message`), if any; binary
/// details are not read.
pub(crate) fn status_from_headers(headers: &HeaderMap) -> Option<Status> {
    let code = Code::from_bytes(headers.get("grpc-status")?.as_bytes());
    let message = headers.get("grpc-message").map(|m| percent_decoded(m.as_bytes())).unwrap_or_default();
    Some(Status::new(code, message))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_read_from_headers_without_trusting_them() {
        let mut h = HeaderMap::new();
        assert!(status_from_headers(&h).is_none());
        h.insert("grpc-status", HeaderValue::from_static("4"));
        h.insert("grpc-message", HeaderValue::from_static("waiting%20to%20sample%3A%20%E2%9C%93%zz%4"));
        // Details that are not base64: tonic's reader would panic.
        h.insert("grpc-status-details-bin", HeaderValue::from_static("!!not base64!!"));
        let s = status_from_headers(&h).unwrap();
        assert_eq!(s.code(), Code::DeadlineExceeded);
        assert_eq!(s.message(), "waiting to sample: \u{2713}%zz%4");
        h.insert("grpc-status", HeaderValue::from_static("banana"));
        assert_eq!(status_from_headers(&h).unwrap().code(), Code::Unknown);
        assert_eq!(http_status(StatusCode::SERVICE_UNAVAILABLE).code(), Code::Unavailable);
    }

    #[test]
    fn a_request_is_framed_as_one_grpc_message() {
        let r = SampleRequest { rows: 3, window_len: 2, ..SampleRequest::default() };
        let f = framed(&r);
        assert_eq!(f[0], 0);
        assert_eq!(u32::from_be_bytes([f[1], f[2], f[3], f[4]]) as usize, f.len() - 5);
        assert_eq!(SampleRequest::decode(&f[5..]).unwrap(), r);
    }
}
