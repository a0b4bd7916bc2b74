use super::*;
use proptest::prelude::*;

/// A request body of `pieces`, one DATA frame each.
fn body_of(pieces: Vec<Bytes>) -> BoxBody {
    let frames = pieces.into_iter().map(|p| Ok::<_, Status>(hyper::body::Frame::data(p)));
    tonic::body::boxed(http_body_util::StreamBody::new(futures_util::stream::iter(frames)))
}

/// Every chunk of `pieces`, or the first error.
fn decode_all(pieces: Vec<Bytes>, max: usize) -> Result<Vec<InsertChunk>, Status> {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let mut frames = Frames::new(body_of(pieces), max);
        let mut out = Vec::new();
        while let Some(chunk) = frames.next_chunk().await? {
            out.push(chunk);
        }
        Ok(out)
    })
}

/// `chunks` framed as gRPC messages, back to back.
fn stream_bytes(chunks: &[InsertChunk]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in chunks {
        let m = c.encode_to_vec();
        out.push(0);
        out.extend_from_slice(&(m.len() as u32).to_be_bytes());
        out.extend_from_slice(&m);
    }
    out
}

/// `bytes` cut at `cuts` (positions, any order, out of range ignored).
fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Bytes> {
    let mut cuts: Vec<usize> = cuts.iter().copied().filter(|&c| c > 0 && c < bytes.len()).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    let mut at = 0;
    for c in cuts.into_iter().chain([bytes.len()]) {
        out.push(Bytes::copy_from_slice(&bytes[at..c]));
        at = c;
    }
    out
}

fn chunk(steps: u64, columns: Vec<Vec<u8>>, priority: Option<f64>, end: bool, table: &str) -> InsertChunk {
    InsertChunk {
        steps,
        columns: columns.into_iter().map(Bytes::from).collect(),
        priority,
        end,
        table: table.into(),
        begin_wait_ms: None,
    }
}

#[test]
fn a_column_inside_one_frame_is_a_slice_of_it() {
    let c = chunk(2, vec![vec![5u8; 8192], vec![1, 2]], Some(2.5), true, "replay");
    let frame = Bytes::from(stream_bytes(std::slice::from_ref(&c)));
    let range = frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let got = runtime.block_on(async {
        let mut frames = Frames::new(body_of(vec![frame.clone()]), 1 << 20);
        let got = frames.next_chunk().await.unwrap().unwrap();
        assert!(frames.next_chunk().await.unwrap().is_none());
        got
    });
    assert_eq!(got, c);
    assert!(range.contains(&(got.columns[0].as_ptr() as usize)), "the column was copied");
}

#[test]
fn bad_messages_are_refused_with_the_reason() {
    let c = chunk(1, vec![vec![9u8; 100]], None, true, "");
    let good = stream_bytes(std::slice::from_ref(&c));
    // Above the limit: tonic's code and wording.
    let e = decode_all(vec![Bytes::from(good.clone())], 50).unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange);
    assert!(e.message().contains("too large") && e.message().contains("50 bytes"), "{e}");
    // Compressed.
    let mut compressed = good.clone();
    compressed[0] = 1;
    let e = decode_all(vec![Bytes::from(compressed)], 1 << 20).unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented);
    // Cut short: a header alone, or part of a message.
    for cut in [3, 5, good.len() - 1] {
        let e = decode_all(vec![Bytes::copy_from_slice(&good[..cut])], 1 << 20).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "cut at {cut}: {e}");
        assert!(e.message().contains("ended inside a message"), "{e}");
    }
    // Not an InsertChunk.
    let e = decode_all(vec![Bytes::from_static(&[0, 0, 0, 0, 2, 0xff, 0xff])], 1 << 20).unwrap_err();
    assert_eq!(e.code(), tonic::Code::Internal);
    // Nothing at all: an empty stream.
    assert!(decode_all(Vec::new(), 1 << 20).unwrap().is_empty());
}

proptest! {
    /// Any split of a stream of chunks decodes to the same chunks.
    #[test]
    fn any_split_of_a_stream_decodes_to_its_chunks(
        lens in proptest::collection::vec(0usize..3000, 1..5),
        cuts in proptest::collection::vec(0usize..20_000, 0..12),
    ) {
        let chunks: Vec<InsertChunk> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| chunk(i as u64, vec![vec![i as u8; n], vec![7; n / 3]], Some(i as f64), i % 2 == 0, "t"))
            .collect();
        let bytes = stream_bytes(&chunks);
        prop_assert_eq!(decode_all(split(&bytes, &cuts), 1 << 20).unwrap(), chunks);
    }

    /// Whatever arrives, decoding it is chunks or an error, never a panic.
    #[test]
    fn any_bytes_in_any_frames_decode_without_panicking(
        bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
        cuts in proptest::collection::vec(0usize..256, 0..8),
    ) {
        let _ = decode_all(split(&bytes, &cuts), 128);
    }
}
