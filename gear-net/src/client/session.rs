//! `SampleStream` sessions: a shard's `Sample` exchanges on one long-lived
//! HTTP/2 stream (the shard's side: `server/sample_stream.rs`).
//!
//! A `Sample` call per shard and batch allocated about thirty small
//! buffers on the client (the request and its headers, the response's
//! headers and trailers, hyper's and tower's futures). A session is opened
//! once; an exchange then encodes its request into a buffer the session
//! keeps, hands it to the stream's body through a channel whose blocks are
//! reused, and decodes the reply's message into the caller's rows
//! ([`ReplyDecoder`]) and the outcome message into bytes the session
//! keeps: it allocates nothing. (h2's frame reader under it still takes a
//! buffer per reply: `tests/sample_into_allocations.rs` counts both.)
//!
//! A session is in step with its shard only between exchanges: one that
//! failed, timed out or was dropped part way is never used again (dropping
//! it resets its stream). The client keeps the sessions that ended their
//! last exchange in step, per shard, and opens another when none is free.

use super::call::{self, CallError};
use super::wire::ReplyDecoder;
use crate::body::{listed_rows, status_from_headers, QueuedFrames, SAMPLE_STREAM_PATH};
use crate::channel::ShardChannel;
use crate::proto::{SampleOutcome, SampleReply};
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Frame;
use prost::Message;
use tokio::sync::mpsc;
use tonic::body::BoxBody;
use tonic::codegen::http::HeaderValue;
use tonic::{Code, Status};

/// Largest outcome message read: a status message and the list of
/// overwritten rows (a varint each).
const MAX_OUTCOME_BYTES: usize = 1 << 20;

/// One open `SampleStream` (module doc).
pub(crate) struct SampleSession {
    /// Request messages, to the stream's body.
    requests: mpsc::Sender<Result<Frame<Bytes>, Status>>,
    /// The stream's reply messages.
    replies: BoxBody,
    /// The encode buffer of requests: its bytes come back once h2 wrote a
    /// request, and the next is encoded into them.
    request_bytes: BytesMut,
    /// Reads each exchange's answer.
    answer: AnswerReader,
    /// Whether the last exchange ended in step (false from its start until
    /// its outcome was read).
    in_step: bool,
}

impl SampleSession {
    /// Opens a session on `channel` with the `authorization` header
    /// `token`, once the shard's response headers say it goes on.
    pub(crate) async fn open(channel: &ShardChannel, token: &HeaderValue) -> Result<Self, CallError> {
        let (requests, queued) = mpsc::channel(1);
        let replies = call::send(channel, token, SAMPLE_STREAM_PATH, tonic::body::boxed(QueuedFrames(queued))).await?;
        Ok(SampleSession {
            requests,
            replies,
            request_bytes: BytesMut::new(),
            answer: AnswerReader::default(),
            in_step: true,
        })
    }

    /// Whether the session may serve another exchange.
    pub(crate) fn in_step(&self) -> bool {
        self.in_step
    }

    /// One exchange: sends `request`, decodes its reply into `decoder`,
    /// and returns its outcome: `Ok` once the reply is whole and the
    /// outcome says OK, else the outcome's status (the session stays in
    /// step) or what broke the stream (it does not).
    pub(crate) async fn exchange(
        &mut self,
        request: &crate::proto::SampleRequest,
        decoder: &mut ReplyDecoder<'_>,
    ) -> Result<(), CallError> {
        if !self.in_step {
            return Err(Status::internal("a sample session out of step was used again").into());
        }
        self.in_step = false;
        let len = request.encoded_len();
        self.request_bytes.reserve(5 + len);
        self.request_bytes.put_u8(0);
        self.request_bytes.put_u32(len as u32);
        // The buffer was reserved for the whole message: encoding cannot fail.
        let _ = request.encode(&mut self.request_bytes);
        let message = self.request_bytes.split().freeze();
        if self.requests.send(Ok(Frame::data(message))).await.is_err() {
            return Err(Status::unavailable("the sample stream's request side closed").into());
        }
        self.answer.start();
        let outcome = loop {
            let frame = match self.replies.frame().await {
                None => return Err(Status::unavailable("the sample stream ended inside an exchange").into()),
                Some(frame) => frame?,
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => return Err(stream_end(frame)),
            };
            if let Some(outcome) = self.answer.take(&data, decoder)? {
                break outcome;
            }
        };
        self.in_step = true;
        outcome_result(outcome, decoder)
    }
}

/// Reads one exchange's answer from the stream's DATA frames: the reply
/// message into a [`ReplyDecoder`], then the outcome message into bytes
/// kept from exchange to exchange.
#[derive(Default)]
struct AnswerReader {
    /// The outcome message read so far, with its gRPC prefix.
    outcome: Vec<u8>,
}

impl AnswerReader {
    /// Readies the reader for the next exchange.
    fn start(&mut self) {
        self.outcome.clear();
    }

    /// Takes one DATA frame's bytes: the reply message's to `decoder`,
    /// then the outcome message's. `Some` once the outcome message is
    /// whole (its `outcome` field), which must end the frame.
    fn take(
        &mut self,
        mut data: &[u8],
        decoder: &mut ReplyDecoder<'_>,
    ) -> Result<Option<Option<SampleOutcome>>, CallError> {
        while !data.is_empty() {
            let wanted = decoder.wanted();
            if wanted > 0 {
                let take = wanted.min(data.len());
                decoder.feed(&data[..take]).map_err(CallError::Malformed)?;
                data = &data[take..];
                continue;
            }
            let wanted = self.outcome_wanted()?;
            if wanted == 0 {
                return Err(CallError::Malformed(format!("{} bytes after an exchange's outcome", data.len())));
            }
            let take = wanted.min(data.len());
            self.outcome.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        if decoder.wanted() > 0 || self.outcome_wanted()? > 0 {
            return Ok(None);
        }
        let reply = SampleReply::decode(&self.outcome[5..])
            .map_err(|e| CallError::Malformed(format!("an exchange's outcome that is not a SampleReply: {e}")))?;
        Ok(Some(reply.outcome))
    }

    /// Bytes the outcome message still needs (0: whole).
    fn outcome_wanted(&self) -> Result<usize, CallError> {
        let Some((&[flag, a, b, c, d], _)) = self.outcome.split_first_chunk::<5>() else {
            return Ok(5 - self.outcome.len());
        };
        if flag != 0 {
            return Err(CallError::Malformed(format!("an exchange's outcome with gRPC flag {flag}")));
        }
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        if len > MAX_OUTCOME_BYTES {
            return Err(CallError::Malformed(format!("a {len}-byte outcome message (at most {MAX_OUTCOME_BYTES})")));
        }
        Ok(5 + len - self.outcome.len())
    }
}

/// What an exchange whose answer ended with `outcome` returns: `Ok` once
/// `decoder`'s reply is whole and the outcome says OK; the rows a reply
/// sent from table memory lost to writers; else the outcome's status.
fn outcome_result(outcome: Option<SampleOutcome>, decoder: &ReplyDecoder<'_>) -> Result<(), CallError> {
    let outcome = outcome.ok_or_else(|| CallError::Malformed("an exchange's second message has no outcome".into()))?;
    match Code::from_i32(outcome.code) {
        Code::Ok => decoder.finish().map_err(CallError::Malformed),
        _ if outcome.overwritten_rows > 0 => {
            let rows = outcome.overwritten_row_list.iter().map(|&r| r as usize).collect();
            Err(CallError::Overwritten {
                count: outcome.overwritten_rows,
                rows: listed_rows(rows, outcome.overwritten_rows),
            })
        }
        code => Err(Status::new(code, outcome.message).into()),
    }
}

/// How one block's `Sample` exchanges reach a shard: a session, or calls
/// (a shard that does not serve `SampleStream`).
pub(crate) enum ShardLink<'c> {
    Session(SampleSession),
    Calls { channel: &'c ShardChannel, token: &'c HeaderValue },
}

impl ShardLink<'_> {
    /// One exchange (see [`SampleSession::exchange`]), or one `Sample` call.
    pub(crate) async fn sample(
        &mut self,
        request: &crate::proto::SampleRequest,
        decoder: &mut ReplyDecoder<'_>,
    ) -> Result<(), CallError> {
        match self {
            ShardLink::Session(session) => session.exchange(request, decoder).await,
            // Boxed: a call's future is large, and only shards without
            // sessions make calls.
            ShardLink::Calls { channel, token } => Box::pin(call::sample(channel, token, request, decoder)).await,
        }
    }
}

/// What a stream that ended inside an exchange (its trailers) means.
fn stream_end(frame: Frame<Bytes>) -> CallError {
    match frame.into_trailers().ok().as_ref().and_then(status_from_headers) {
        Some(s) if s.code() == Code::Ok => Status::unavailable("the sample stream ended inside an exchange").into(),
        Some(s) => s.into(),
        None => CallError::Malformed("the sample stream's trailers have no grpc-status".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::assemble::Assembly;
    use crate::client::wire::ReplyMeta;
    use crate::proto::Key;
    use proptest::prelude::*;
    use std::mem::MaybeUninit;

    const ROW_BYTES: [usize; 2] = [3, 8];

    /// A reply of `rows` rows, framed as one gRPC message.
    fn reply(rows: usize) -> Vec<u8> {
        let r = SampleReply {
            shard: 1,
            incarnation: 9,
            keys: (0..rows as u32).map(|i| Key { shard: 1, incarnation: 9, slot: i, generation: 2 }).collect(),
            lengths: vec![1; rows],
            starts: vec![0; rows],
            probabilities: vec![0.5; rows],
            weights: vec![1.0; rows],
            columns: ROW_BYTES
                .iter()
                .map(|&b| Bytes::from((0..rows * b).map(|i| i as u8).collect::<Vec<_>>()))
                .collect(),
            ..SampleReply::default()
        };
        framed(&r)
    }

    fn framed(message: &SampleReply) -> Vec<u8> {
        crate::body::grpc_message(message).to_vec()
    }

    fn outcome(o: SampleOutcome) -> Vec<u8> {
        framed(&SampleReply { outcome: Some(o), ..SampleReply::default() })
    }

    /// Reads `frames` as one exchange's answer for `rows` rows: the
    /// exchange's result and the columns it wrote; an error too if the
    /// outcome came before the last frame.
    fn read(frames: &[&[u8]], rows: usize) -> (Result<(), CallError>, Vec<Vec<u8>>) {
        let mut columns: Vec<Vec<u8>> = ROW_BYTES.iter().map(|&b| vec![0xAA; b * rows]).collect();
        let mut meta = ReplyMeta::default();
        let result = {
            let mut views: Vec<&mut [MaybeUninit<u8>]> = columns
                .iter_mut()
                // SAFETY: u8 and MaybeUninit<u8> share a layout; only
                // initialised bytes are written.
                .map(|c| unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast(), c.len()) })
                .collect();
            let (mut bases, mut blocks) = (Vec::new(), Vec::new());
            let mut a = Assembly::new(&mut views, &ROW_BYTES, rows, &mut bases, &mut blocks).unwrap();
            a.add_block(0, rows).unwrap();
            let (_, rows_mut) = a.targets().next().unwrap();
            let mut decoder = ReplyDecoder::new(rows_mut, &mut meta, 1 << 20);
            let mut reader = AnswerReader::default();
            reader.start();
            let mut result = Err(CallError::Malformed("the answer did not end".into()));
            for (i, f) in frames.iter().enumerate() {
                match reader.take(f, &mut decoder) {
                    Ok(None) => continue,
                    Ok(Some(o)) if i + 1 == frames.len() => result = outcome_result(o, &decoder),
                    Ok(Some(_)) => result = Err(CallError::Malformed("the outcome came before the last frame".into())),
                    Err(e) => result = Err(e),
                }
                break;
            }
            result
        };
        (result, columns)
    }

    proptest! {
        /// An answer split anywhere into frames reads as it does whole.
        #[test]
        fn an_answer_split_anywhere_reads_whole(rows in 1usize..6, cuts in prop::collection::vec(0usize..10_000, 0..6)) {
            let answer = [reply(rows), outcome(SampleOutcome::default())].concat();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (answer.len() + 1)).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut frames = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([answer.len()]) {
                if c > at {
                    frames.push(&answer[at..c]);
                    at = c;
                }
            }
            let (result, columns) = read(&frames, rows);
            prop_assert!(result.is_ok(), "{result:?}");
            for (c, &b) in ROW_BYTES.iter().enumerate() {
                prop_assert_eq!(&columns[c], &(0..rows * b).map(|i| i as u8).collect::<Vec<_>>());
            }
        }

        /// Whatever a shard sends on the stream, reading it is an answer
        /// or an error, never a panic.
        #[test]
        fn any_bytes_read_without_panicking(frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 1..4)) {
            let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            let _ = read(&frames, 2);
        }
    }

    #[test]
    fn a_refusal_is_the_outcomes_status_after_an_empty_reply() {
        let refusal =
            SampleOutcome { code: Code::DeadlineExceeded as i32, message: "no data".into(), ..Default::default() };
        let answer = [vec![0, 0, 0, 0, 0], outcome(refusal)].concat();
        match read(&[&answer], 3).0 {
            Err(CallError::Status(s)) => {
                assert_eq!(s.code(), Code::DeadlineExceeded);
                assert_eq!(s.message(), "no data");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn overwritten_rows_are_named_only_when_listed_in_order() {
        let overwritten = |list: Vec<u64>| SampleOutcome {
            code: Code::Aborted as i32,
            overwritten_rows: 2,
            overwritten_row_list: list,
            ..Default::default()
        };
        for (list, rows) in [(vec![0, 2], vec![0, 2]), (vec![2, 0], vec![]), (vec![1], vec![]), (vec![], vec![])] {
            let answer = [reply(3), outcome(overwritten(list))].concat();
            match read(&[&answer], 3).0 {
                Err(CallError::Overwritten { count: 2, rows: got }) => assert_eq!(got, rows),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_broken_answer_is_malformed() {
        let ok = outcome(SampleOutcome::default());
        let cases: [(Vec<u8>, &str); 5] = [
            ([reply(2), ok.clone(), vec![0]].concat(), "after an exchange's outcome"),
            ([reply(2), framed(&SampleReply::default())].concat(), "no outcome"),
            ([reply(2), vec![1, 0, 0, 0, 0]].concat(), "gRPC flag 1"),
            ([reply(2), vec![0, 0xff, 0xff, 0xff, 0xff]].concat(), "outcome message"),
            // A reply of 2 rows for a block of 3.
            ([reply(2), ok].concat(), "for 3 rows"),
        ];
        for (i, (answer, what)) in cases.iter().enumerate() {
            let rows = if i == 4 { 3 } else { 2 };
            match read(&[answer], rows).0 {
                Err(CallError::Malformed(m)) => assert!(m.contains(what), "case {i}: {m}"),
                other => panic!("case {i}: {other:?}"),
            }
        }
    }
}
