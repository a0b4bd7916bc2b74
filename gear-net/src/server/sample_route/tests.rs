use super::*;
use crate::StrategyInfo;
use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, Pad, TableSpec, WindowSpec};
use gear_sampler::{StrategyKind, StrategyParams};

/// Bytes of one step's `obs`: a 4-step window of it is a region piece of
/// its own, a 1-step one is copied in.
const OBS: u64 = 32 << 10;

/// A table of `obs` (`OBS` bytes a step) and `id` (an i64 a step), 8 slots
/// of at most 4 steps; trajectory `v` (1..=8) has `v % 4 + 1` steps, each
/// byte and id `v`.
fn table() -> ReplayTable {
    let spec = TableSpec::new(
        vec![ColumnSpec::new("obs", DType::U8, vec![OBS]), ColumnSpec::new("id", DType::I64, vec![])],
        4,
        8,
    )
    .unwrap();
    let table = ReplayTable::builder(spec).seed(7).build().unwrap();
    for v in 1..=8u8 {
        insert(&table, v, u64::from(v) % 4 + 1);
    }
    table
}

fn insert(table: &ReplayTable, value: u8, steps: u64) {
    let mut t = table.writer().begin(None).unwrap();
    t.append_column(0, steps, StepValue::bytes(&vec![value; (steps * OBS) as usize])).unwrap();
    t.append_column(1, steps, StepValue::typed(&vec![i64::from(value); steps as usize])).unwrap();
    t.end().unwrap();
}

/// A reply of `rows` rows of `window` over both columns (`obs`, `id`),
/// laid out but not sent.
fn laid_out(table: &ReplayTable, rows: usize, window: WindowSpec) -> TableReply {
    let drawn = table.draw_ranges(rows, window, false, &[0, 1], None).unwrap();
    let meta = ranged_reply_fields(3, 9, &drawn, (8, 8.0, 1.0));
    TableReply::lay_out(&meta, &drawn, &[OBS, 8], window.len, table.memory()).unwrap()
}

fn served(table: &ReplayTable) -> ServedTables {
    ServedTables::single(table.clone(), StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() })
}

fn poll(body: &mut TableReplyBody) -> Poll<Option<Frame<Bytes>>> {
    let waker = futures_util::task::noop_waker();
    Pin::new(body).poll_frame(&mut Context::from_waker(&waker)).map(|f| f.map(|f| f.unwrap()))
}

/// The body's DATA frames, up to where it waits (kept: dropping them is
/// what lets the trailers come), and the trailers if they came then (no
/// piece was a slice of the region).
fn data_frames(body: &mut TableReplyBody) -> (Vec<Bytes>, Option<HeaderMap>) {
    let mut out = Vec::new();
    while let Poll::Ready(Some(frame)) = poll(body) {
        match frame.into_data() {
            Ok(data) => out.push(data),
            Err(frame) => return (out, frame.into_trailers().ok()),
        }
    }
    (out, None)
}

/// Whether `piece` is a slice of `table`'s region (not a copy).
fn in_region(table: &ReplayTable, piece: &Bytes) -> bool {
    let memory = table.memory();
    let base = memory.host_ptr().unwrap().as_ptr() as usize;
    (base..base + memory.len() as usize).contains(&(piece.as_ptr() as usize))
}

/// The trailers, once the body is polled after its pieces were dropped.
fn trailers(body: &mut TableReplyBody) -> HeaderMap {
    match poll(body) {
        Poll::Ready(Some(frame)) => frame.into_trailers().unwrap(),
        other => panic!("no trailers: {other:?}"),
    }
}

/// Each row's id, after checking that every valid step of both columns
/// holds it and the padding is zero.
fn check_rows(reply: &SampleReply, window: WindowSpec) -> Vec<i64> {
    let (rows, l) = (reply.keys.len(), window.len as usize);
    let (obs, ids) = (&reply.columns[0], &reply.columns[1]);
    assert_eq!(obs.len(), rows * l * OBS as usize);
    assert_eq!(ids.len(), rows * l * 8);
    (0..rows)
        .map(|r| {
            let n = reply.lengths[r] as usize;
            let dst = if window.pad == Pad::Head { l - n } else { 0 };
            let id = i64::from_le_bytes(ids[(r * l + dst) * 8..][..8].try_into().unwrap());
            for step in 0..l {
                let want = if step >= dst && step < dst + n { id } else { 0 };
                let o = &obs[(r * l + step) * OBS as usize..][..OBS as usize];
                assert!(o.iter().all(|&b| i64::from(b) == want), "row {r} step {step}: obs is not {want}");
                let i = i64::from_le_bytes(ids[(r * l + step) * 8..][..8].try_into().unwrap());
                assert_eq!(i, want, "row {r} step {step}");
            }
            let stored = id as u64 % 4 + 1;
            assert_eq!(stored.min(window.len), n as u64, "row {r}: trajectory {id} has {stored} steps");
            id
        })
        .collect()
}

#[test]
fn a_reply_from_table_memory_decodes_as_a_gathered_one() {
    let table = table();
    let tables = served(&table);
    for window in [WindowSpec::last(4), WindowSpec::first(4), WindowSpec::last(1), WindowSpec::first(3)] {
        let reply = laid_out(&table, 16, window);
        let mut body = reply.into_body(tables.clone(), 0, RpcTimer::start(&tables, Method::Sample));
        let (frames, early) = data_frames(&mut body);
        let region_pieces = frames.iter().filter(|p| in_region(&table, p)).count();
        assert!(frames.iter().all(|p| !in_region(&table, p) || p.len() >= OWN_FRAME_MIN_BYTES));
        if window.len == 1 {
            assert_eq!(region_pieces, 0, "rows under {OWN_FRAME_MIN_BYTES} bytes are copied in");
        } else {
            assert!(region_pieces > 0, "rows of 2 and more {OBS}-byte steps go out as region pieces");
        }
        assert_eq!(early.is_some(), region_pieces == 0, "trailers wait for region pieces only");
        let mut bytes: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        drop(frames);
        let trailers = early.unwrap_or_else(|| trailers(&mut body));
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
        assert!(trailers.get(OVERWRITTEN_ROWS).is_none());
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
        assert_eq!(bytes[0], 0, "not compressed");
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 5, "the gRPC length is the message's");
        let decoded = SampleReply::decode(&bytes.split_off(5)[..]).unwrap();
        assert_eq!(decoded.shard, 3);
        assert_eq!(decoded.keys.len(), 16);
        let ids = check_rows(&decoded, window);
        assert!(ids.iter().all(|id| (1..=8).contains(id)), "{ids:?}");
    }
}

#[test]
fn the_trailers_wait_for_every_piece_to_be_sent() {
    let table = table();
    let tables = served(&table);
    let mut body =
        laid_out(&table, 8, WindowSpec::last(4)).into_body(tables.clone(), 0, RpcTimer::start(&tables, Method::Sample));
    let (mut frames, early) = data_frames(&mut body);
    assert!(early.is_none() && frames.len() > 2);
    // One region piece still held (not written yet): no trailers.
    let held = frames.iter().position(|f| in_region(&table, f)).unwrap();
    let piece = frames.swap_remove(held);
    drop(frames);
    assert!(poll(&mut body).is_pending(), "trailers while a piece was still unsent");
    drop(piece);
    assert_eq!(trailers(&mut body).get("grpc-status").unwrap(), "0");
    let sent = tables.served()[0].rpc_bytes_sent.load(Ordering::Relaxed);
    assert_eq!(sent, 8 * 4 * (OBS + 8), "window bytes counted once sent");
}

#[test]
fn rows_overwritten_before_their_pieces_were_sent_end_the_reply_aborted() {
    let table = table();
    let tables = served(&table);
    let window = WindowSpec::last(4);
    let reply = laid_out(&table, 16, window);
    let keys: Vec<u32> = reply.checks.iter().map(|&(_, generation)| generation).collect();
    assert_eq!(keys.len(), 16);
    let mut body = reply.into_body(tables.clone(), 0, RpcTimer::start(&tables, Method::Sample));
    let (frames, early) = data_frames(&mut body);
    assert!(early.is_none());
    // Writers reuse every slot (FIFO eviction) while the pieces are unsent.
    for v in 11..=18u8 {
        insert(&table, v, 4);
    }
    drop(frames);
    let trailers = trailers(&mut body);
    assert_eq!(trailers.get("grpc-status").unwrap(), &(tonic::Code::Aborted as i32).to_string());
    assert_eq!(trailers.get(OVERWRITTEN_ROWS).unwrap(), "16");
    let every: Vec<String> = (0..16).map(|r| r.to_string()).collect();
    assert_eq!(trailers.get(OVERWRITTEN_ROW_LIST).unwrap(), every.join(",").as_str());
    let message = trailers.get("grpc-message").unwrap().to_str().unwrap();
    assert!(message.contains("overwritten"), "{message}");
    let served = &tables.served()[0];
    assert_eq!(served.rows_overwritten.load(Ordering::Relaxed), 16);
    assert_eq!(served.rpc_bytes_sent.load(Ordering::Relaxed), 0, "nothing counted as sent");
    let metrics = tables.metrics_text();
    let line = format!("gear_table_rpc_overwritten_rows_total{{table=\"{}\"}} 16", crate::DEFAULT_TABLE);
    assert!(metrics.contains(&line), "{metrics}");
}

#[test]
fn a_reply_dropped_unsent_releases_the_region() {
    let table = table();
    let tables = served(&table);
    let memory = table.memory();
    let before = Arc::strong_count(&memory);
    let reply = laid_out(&table, 8, WindowSpec::last(4));
    let mut body = reply.into_body(tables.clone(), 0, RpcTimer::start(&tables, Method::Sample));
    let (frames, _) = data_frames(&mut body);
    drop(body);
    drop(frames);
    assert_eq!(Arc::strong_count(&memory), before);
}

#[test]
fn only_one_whole_uncompressed_message_is_taken_as_a_request() {
    let req = SampleRequest { rows: 3, send_from_table: true, ..SampleRequest::default() };
    let framed = crate::body::grpc_message(&req);
    assert_eq!(decode_request(&framed), Some(req));
    assert_eq!(decode_request(&framed[..framed.len() - 1]), None, "short");
    let mut long = framed.to_vec();
    long.push(0);
    assert_eq!(decode_request(&long), None, "a byte after the message");
    let mut compressed = framed.to_vec();
    compressed[0] = 1;
    assert_eq!(decode_request(&compressed), None);
    assert_eq!(decode_request(&[]), None);
    assert_eq!(decode_request(&[0, 0, 0, 0, 2, 0xff, 0xff]), None, "not protobuf");
}
