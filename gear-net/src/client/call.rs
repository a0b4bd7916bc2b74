//! The `Sample` and `Insert` calls made by hand over the shard's HTTP/2
//! channel: a sample reply decoded frame by frame into the caller's rows
//! (`wire`), an insert stream sent without copying its trajectories.
//!
//! tonic's generated client would decode a reply into a message first, and
//! encode each insert chunk into one buffer, copying every trajectory byte
//! once more before the socket. Here each request is framed and sent as
//! tonic would send it (POST to `/gear.v1.Shard/<method>`,
//! `application/grpc`, `te: trailers`, the cluster token); the response's
//! DATA frames go to the [`ReplyDecoder`] as they arrive, and an insert
//! chunk's column buffers go out as DATA frames of their own. The gRPC
//! status comes from the response headers (a refusal is "trailers only") or
//! from the trailers, and is read here without tonic's
//! `Status::from_header_map`, which panics on malformed binary details: a
//! shard's headers are network input.

use super::wire::ReplyDecoder;
use crate::body::{
    grpc_message, row_list, status_from_headers, ReadyFrames, INSERT_PATH, OVERWRITTEN_ROWS, OVERWRITTEN_ROW_LIST,
    SAMPLE_PATH,
};
use crate::channel::ShardChannel;
use crate::proto::{InsertChunk, InsertReply, SampleRequest};
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;
use tonic::body::BoxBody;
use tonic::codegen::http::header::{AUTHORIZATION, CONTENT_TYPE, TE};
use tonic::codegen::http::{HeaderValue, Method, Request, StatusCode, Uri};
use tonic::{Code, Status};

/// Column buffers at least this long go out as DATA frames of their own
/// (no copy); shorter ones are copied in with the fields around them, where
/// a frame each would cost more than the copy (small transitions).
const OWN_FRAME_MIN_BYTES: usize = 4 << 10;

/// Largest `Insert` reply read: the keys of one stream
/// (`TRAJECTORIES_PER_STREAM` of them, about 30 bytes each), with room.
const MAX_INSERT_REPLY_BYTES: usize = 1 << 20;

/// How a call failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The shard (or the connection) answered with this status.
    Status(Status),
    /// The reply broke the protocol: what was wrong.
    Malformed(String),
    /// The shard sent rows straight from its table's memory and found
    /// `count` of them overwritten while they were sent
    /// (`send_from_table`): ask again without it. `rows`: which rows of
    /// the reply, in ascending order, when the shard listed them (else
    /// empty); the others arrived whole.
    Overwritten { count: u64, rows: Vec<usize> },
}

impl From<Status> for CallError {
    fn from(s: Status) -> Self {
        CallError::Status(s)
    }
}

/// Sends `request` over `channel` with the `authorization` header `token`,
/// and decodes the reply with `decoder` as it arrives. `Ok` once the whole
/// message came and the trailers say OK.
pub(crate) async fn sample(
    channel: &ShardChannel,
    token: &HeaderValue,
    request: &SampleRequest,
    decoder: &mut ReplyDecoder<'_>,
) -> Result<(), CallError> {
    let body = tonic::body::boxed(http_body_util::Full::new(grpc_message(request)));
    let body = send(channel, token, SAMPLE_PATH, body).await?;
    read_reply(body, |data| decoder.feed(data)).await?;
    decoder.finish().map_err(CallError::Malformed)
}

/// Reads a reply's DATA frames into `on_data` up to its trailers; `Ok` once
/// they say OK. An error of `on_data` ends the call as malformed.
async fn read_reply(mut body: BoxBody, mut on_data: impl FnMut(&Bytes) -> Result<(), String>) -> Result<(), CallError> {
    loop {
        let frame = body.frame().await;
        let frame = match frame {
            None => return Err(Status::unavailable("the reply ended without its trailers").into()),
            Some(frame) => frame?,
        };
        let frame = match frame.into_data() {
            Ok(data) => {
                on_data(&data).map_err(CallError::Malformed)?;
                continue;
            }
            Err(frame) => frame,
        };
        let Ok(trailers) = frame.into_trailers() else { continue };
        if let Some(count) = trailers.get(OVERWRITTEN_ROWS) {
            let Some(count) = count.to_str().ok().and_then(|c| c.parse().ok()) else {
                return Err(CallError::Malformed(format!("a `{OVERWRITTEN_ROWS}` trailer that is not a count")));
            };
            let rows = trailers.get(OVERWRITTEN_ROW_LIST).map_or_else(Vec::new, |l| row_list(l.as_bytes(), count));
            return Err(CallError::Overwritten { count, rows });
        }
        return match status_from_headers(&trailers) {
            Some(s) if s.code() == Code::Ok => Ok(()),
            Some(s) => Err(s.into()),
            None => Err(CallError::Malformed("trailers without a grpc-status".into())),
        };
    }
}

/// Sends `body` to `path` over `channel` as a gRPC request with the
/// `authorization` header `token`; returns the response body once its
/// headers say the call goes on (a refusal in the headers is the error).
pub(crate) async fn send(
    channel: &ShardChannel,
    token: &HeaderValue,
    path: &'static str,
    body: BoxBody,
) -> Result<BoxBody, CallError> {
    let mut http = Request::new(body);
    *http.method_mut() = Method::POST;
    *http.uri_mut() = Uri::from_static(path);
    let headers = http.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    headers.insert(AUTHORIZATION, token.clone());
    let response = channel.send(http).await?;
    let (parts, body) = response.into_parts();
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
    Ok(body)
}

/// Sends `chunks` as one `Insert` stream over `channel` (with the
/// `authorization` header `token`) and returns the shard's reply. A chunk
/// whose encoding is longer than `max_message_bytes` is refused before
/// anything is sent (`OutOfRange`, as tonic's encoder refuses it). A
/// failed stream's status keeps its binary details: the keys it had
/// committed (`crate::committed`).
pub(crate) async fn insert(
    channel: &ShardChannel,
    token: &HeaderValue,
    chunks: Vec<InsertChunk>,
    max_message_bytes: usize,
) -> Result<InsertReply, CallError> {
    let pieces = insert_pieces(chunks, max_message_bytes)?;
    let frames = pieces.into_iter().map(hyper::body::Frame::data).collect();
    let body = send(channel, token, INSERT_PATH, tonic::body::boxed(ReadyFrames::new(frames))).await?;
    let mut reply = Vec::new();
    read_reply(body, |data| {
        if reply.len() + data.len() > MAX_INSERT_REPLY_BYTES {
            return Err(format!("an insert reply longer than {MAX_INSERT_REPLY_BYTES} bytes"));
        }
        reply.extend_from_slice(data);
        Ok(())
    })
    .await?;
    insert_reply(&reply).map_err(CallError::Malformed)
}

/// The one `InsertReply` message framed in `bytes`.
fn insert_reply(bytes: &[u8]) -> Result<InsertReply, String> {
    let (head, message) = match bytes {
        [flag, a, b, c, d, message @ ..] => ((*flag, u32::from_be_bytes([*a, *b, *c, *d]) as usize), message),
        _ => return Err(format!("an insert reply of {} bytes, shorter than a gRPC frame header", bytes.len())),
    };
    match head {
        (0, len) if len == message.len() => {
            InsertReply::decode(message).map_err(|e| format!("an insert reply that is not an InsertReply: {e}"))
        }
        (0, len) => Err(format!("an insert reply framed as {len} bytes carries {}", message.len())),
        (flag, _) => Err(format!("an insert reply with gRPC flag {flag} (compressed; none was asked for)")),
    }
}

/// The insert stream's body: each chunk framed as a gRPC message, its
/// fields other than `columns` first (prost's encoding of them), then each
/// column as field 2. Protobuf lets fields come in any order, and repeated
/// fields keep theirs, so the shard decodes the same message; the table
/// and priority coming first would also let a shard read them before the
/// bytes. Columns of [`OWN_FRAME_MIN_BYTES`] or more are the caller's
/// buffers themselves; the rest is copied into shared pieces between them.
fn insert_pieces(chunks: Vec<InsertChunk>, max_message_bytes: usize) -> Result<Vec<Bytes>, Status> {
    let mut pieces = Vec::new();
    let mut small = BytesMut::new();
    for mut chunk in chunks {
        let columns = std::mem::take(&mut chunk.columns);
        let columns_len: usize =
            columns.iter().map(|c| key_len(2) + encoded_len_varint(c.len() as u64) + c.len()).sum();
        let len = chunk.encoded_len() + columns_len;
        if len > max_message_bytes {
            return Err(Status::out_of_range(format!(
                "an insert chunk of {len} bytes is longer than the client's max_message_bytes ({max_message_bytes})"
            )));
        }
        small.put_u8(0);
        small.put_u32(len as u32);
        // Encoding into a `BytesMut` grows it as needed: it cannot fail.
        let _ = chunk.encode(&mut small);
        for column in columns {
            encode_key(2, WireType::LengthDelimited, &mut small);
            encode_varint(column.len() as u64, &mut small);
            if column.len() >= OWN_FRAME_MIN_BYTES {
                pieces.push(small.split().freeze());
                pieces.push(column);
            } else {
                small.extend_from_slice(&column);
            }
        }
    }
    if !small.is_empty() {
        pieces.push(small.freeze());
    }
    Ok(pieces)
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

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use tonic::codegen::http::HeaderMap;

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
        assert!(s.details().is_empty());
        h.insert("grpc-status", HeaderValue::from_static("banana"));
        assert_eq!(status_from_headers(&h).unwrap().code(), Code::Unknown);
        assert_eq!(http_status(StatusCode::SERVICE_UNAVAILABLE).code(), Code::Unavailable);
    }

    #[test]
    fn a_failed_streams_committed_keys_survive_the_headers() {
        let keys: Vec<crate::proto::Key> =
            (0..5).map(|i| crate::proto::Key { shard: 2, incarnation: 9, slot: i, generation: 3 * i }).collect();
        let status = crate::committed::failed(Status::invalid_argument("chunk 6: bad size"), &keys, 40);
        // As tonic's server writes them, padded or not.
        let mut headers = HeaderMap::new();
        status.add_header(&mut headers).unwrap();
        let read = status_from_headers(&headers).unwrap();
        assert_eq!(read.code(), Code::InvalidArgument);
        assert_eq!(read.message(), status.message());
        assert_eq!(crate::committed::committed_keys(&read), keys);
        let mut padded = headers.clone();
        let details = base64::engine::general_purpose::STANDARD.encode(status.details());
        padded.insert("grpc-status-details-bin", HeaderValue::from_str(&details).unwrap());
        assert_eq!(crate::committed::committed_keys(&status_from_headers(&padded).unwrap()), keys);
    }

    /// The chunks `pieces` carry, decoded as a shard decodes its stream.
    fn decoded(pieces: &[Bytes]) -> Vec<InsertChunk> {
        let all: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        let mut rest = &all[..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            assert_eq!(rest[0], 0, "uncompressed");
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            out.push(InsertChunk::decode(&rest[5..5 + len]).unwrap());
            rest = &rest[5 + len..];
        }
        out
    }

    #[test]
    fn insert_chunks_decode_unchanged_and_large_columns_are_not_copied() {
        let big = Bytes::from(vec![7u8; 3 * OWN_FRAME_MIN_BYTES]);
        let small = Bytes::from_static(&[1, 2, 3]);
        let chunks = vec![
            InsertChunk {
                steps: 3,
                columns: vec![big.clone(), small.clone(), Bytes::new()],
                priority: Some(0.5),
                end: false,
                table: "replay".into(),
                begin_wait_ms: Some(100),
            },
            InsertChunk { steps: 0, columns: vec![], end: true, ..InsertChunk::default() },
            InsertChunk { steps: 1, columns: vec![small.clone(), big.clone()], end: true, ..InsertChunk::default() },
        ];
        let pieces = insert_pieces(chunks.clone(), 1 << 20).unwrap();
        assert_eq!(decoded(&pieces), chunks);
        // The large column goes out as the caller's buffer, twice.
        assert_eq!(pieces.iter().filter(|p| p.as_ptr() == big.as_ptr() && p.len() == big.len()).count(), 2);
        // A stream of small chunks is one piece.
        let tiny: Vec<InsertChunk> = (0..100)
            .map(|i| InsertChunk {
                steps: 1,
                columns: vec![small.clone()],
                priority: Some(i as f64),
                end: true,
                ..InsertChunk::default()
            })
            .collect();
        let pieces = insert_pieces(tiny.clone(), 1 << 20).unwrap();
        assert_eq!(pieces.len(), 1);
        assert_eq!(decoded(&pieces), tiny);
        // Nothing at all: an empty stream.
        assert!(insert_pieces(Vec::new(), 1 << 20).unwrap().is_empty());
    }

    #[test]
    fn an_overwritten_row_list_is_used_only_when_it_lists_its_count_in_order() {
        assert_eq!(row_list(b"0,3,17", 3), vec![0, 3, 17]);
        assert_eq!(row_list(b"5", 1), vec![5]);
        // Anything else: ask for every row again.
        assert!(row_list(b"0,3,17", 2).is_empty());
        assert!(row_list(b"3,0", 2).is_empty());
        assert!(row_list(b"3,3", 2).is_empty());
        assert!(row_list(b"1,x", 2).is_empty());
        assert!(row_list(b"", 1).is_empty());
        assert!(row_list(b"1,-2", 2).is_empty());
        assert!(row_list(&[0xff, b','], 2).is_empty());
        assert!(row_list(b"99999999999999999999999", 1).is_empty());
    }

    #[test]
    fn an_insert_chunk_above_the_message_limit_is_refused_before_sending() {
        let chunk = InsertChunk { steps: 1, columns: vec![Bytes::from(vec![0u8; 5000])], ..InsertChunk::default() };
        let len = chunk.encoded_len();
        assert!(insert_pieces(vec![chunk.clone()], len).is_ok());
        let e = insert_pieces(vec![chunk], len - 1).unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange);
        assert!(e.message().contains(&format!("{len} bytes")) && e.message().contains("max_message_bytes"), "{e}");
    }

    #[test]
    fn insert_replies_are_checked_before_they_are_decoded() {
        let reply = InsertReply {
            keys: vec![crate::proto::Key { shard: 1, incarnation: 2, slot: 3, generation: 4 }],
            steps: 9,
            held: false,
        };
        let message = reply.encode_to_vec();
        let mut framed = vec![0];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        assert_eq!(insert_reply(&framed).unwrap(), reply);
        assert!(insert_reply(&framed[..3]).unwrap_err().contains("shorter than a gRPC frame header"));
        assert!(insert_reply(&framed[..framed.len() - 1]).unwrap_err().contains("carries"));
        let mut compressed = framed.clone();
        compressed[0] = 1;
        assert!(insert_reply(&compressed).unwrap_err().contains("compressed"));
        let mut garbage = vec![0, 0, 0, 0, 2];
        garbage.extend_from_slice(&[0xff, 0xff]);
        assert!(insert_reply(&garbage).unwrap_err().contains("not an InsertReply"));
    }

    proptest::proptest! {
        /// Whatever a shard sends as an insert reply or a status, reading
        /// it is an answer or an error, never a panic.
        #[test]
        fn any_insert_reply_or_status_headers_are_read_without_panicking(
            reply in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            status in proptest::collection::vec(0x20u8..0x7f, 0..8),
            message in proptest::collection::vec(0x20u8..0x7f, 0..32),
            details in proptest::collection::vec(0x20u8..0x7f, 0..48),
        ) {
            let _ = insert_reply(&reply);
            let mut h = HeaderMap::new();
            for (name, value) in [("grpc-status", &status), ("grpc-message", &message), ("grpc-status-details-bin", &details)] {
                h.insert(name, HeaderValue::from_bytes(value).unwrap());
            }
            let read = status_from_headers(&h).unwrap();
            let _ = crate::committed::committed_keys(&read);
        }
    }

    #[test]
    fn a_request_is_framed_as_one_grpc_message() {
        let r = SampleRequest { rows: 3, window_len: 2, ..SampleRequest::default() };
        let f = grpc_message(&r);
        assert_eq!(f[0], 0);
        assert_eq!(u32::from_be_bytes([f[1], f[2], f[3], f[4]]) as usize, f.len() - 5);
        assert_eq!(SampleRequest::decode(&f[5..]).unwrap(), r);
    }
}
