//! Tests of the reply decoder: any split of any reply, arbitrary bytes,
//! unknown fields and malformed replies.

use super::*;
use crate::client::assemble::Assembly;
use crate::proto::{Key, SampleReply};
use bytes::Bytes;
use proptest::prelude::*;
use std::mem::MaybeUninit;

fn reply(rows: usize, row_bytes: &[usize], seed: u8) -> SampleReply {
    SampleReply {
        shard: 2,
        incarnation: 0xdead_beef_1234,
        keys: (0..rows as u32)
            .map(|i| Key { shard: 2, incarnation: 0xdead_beef_1234, slot: i * 7, generation: i + 300 })
            .collect(),
        lengths: (0..rows as u64).map(|i| i % 5 + 1).collect(),
        starts: (0..rows as u64).map(|i| i * 1000).collect(),
        probabilities: (0..rows).map(|i| 1.0 / (i + 2) as f64).collect(),
        weights: (0..rows).map(|i| 0.5 + i as f64 / 1e3).collect(),
        columns: row_bytes
            .iter()
            .enumerate()
            .map(|(c, &b)| Bytes::from((0..rows * b).map(|i| (i as u8) ^ seed ^ (c as u8 * 16)).collect::<Vec<_>>()))
            .collect(),
        size: 77,
        total_mass: 12.5,
        min_mass: 0.25,
        row_ranges: Vec::new(),
        outcome: None,
    }
}

/// The reply as a gRPC frame: with `columns_first`, the columns' entries
/// before the other fields, as the shard sends them.
fn framed(r: &SampleReply, columns_first: bool) -> Vec<u8> {
    let body = if columns_first {
        let columns = SampleReply { columns: r.columns.clone(), ..SampleReply::default() };
        let rest = SampleReply { columns: Vec::new(), ..r.clone() };
        [columns.encode_to_vec(), rest.encode_to_vec()].concat()
    } else {
        r.encode_to_vec()
    };
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes `frames` into a batch of `rows` rows at `start`; returns the
/// columns (rows outside the block are 0xAA) and the meta.
fn decode(
    frames: &[&[u8]],
    rows: usize,
    start: usize,
    batch_rows: usize,
    row_bytes: &[usize],
) -> Result<(Vec<Vec<u8>>, ReplyMeta), String> {
    decode_restarted(&[], frames, rows, start, batch_rows, row_bytes)
}

/// As [`decode`], after feeding the decoder `abandoned` (part of another
/// reply, given up) and restarting it.
fn decode_restarted(
    abandoned: &[&[u8]],
    frames: &[&[u8]],
    rows: usize,
    start: usize,
    batch_rows: usize,
    row_bytes: &[usize],
) -> Result<(Vec<Vec<u8>>, ReplyMeta), String> {
    let mut buffers: Vec<Vec<u8>> = row_bytes.iter().map(|&b| vec![0xAA; b * batch_rows]).collect();
    let mut meta = ReplyMeta::default();
    {
        let mut views: Vec<&mut [MaybeUninit<u8>]> = buffers
            .iter_mut()
            .map(|b| {
                // SAFETY: u8 and MaybeUninit<u8> share a layout; only
                // initialised bytes are written.
                unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast(), b.len()) }
            })
            .collect();
        let mut bases = Vec::new();
        let mut blocks = Vec::new();
        let mut a = Assembly::new(&mut views, row_bytes, batch_rows, &mut bases, &mut blocks).unwrap();
        // Rows before the block belong to another (never written here).
        if start > 0 {
            a.add_block(0, start).unwrap();
        }
        a.add_block(1, rows).unwrap();
        let (_, rows_mut) = a.targets().last().unwrap();
        let mut d = ReplyDecoder::new(rows_mut, &mut meta, 1 << 30);
        if !abandoned.is_empty() {
            for f in abandoned {
                d.feed(f)?;
            }
            d.restart();
        }
        for f in frames {
            d.feed(f)?;
        }
        d.finish()?;
    }
    Ok((buffers, meta))
}

proptest! {
    /// Any split of the body into frames, fields in either order,
    /// decodes to what prost decodes, at the block's rows only.
    #[test]
    fn a_reply_split_anywhere_decodes_as_prost_does(
        rows in 1usize..9,
        row_bytes in prop::collection::vec(1usize..40, 1..4),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        columns_first in any::<bool>(),
        start in 0usize..3,
    ) {
        let r = reply(rows, &row_bytes, 5);
        let body = framed(&r, columns_first);
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
        at.push(0);
        at.push(body.len());
        at.sort_unstable();
        let frames: Vec<&[u8]> = at.windows(2).map(|w| &body[w[0]..w[1]]).collect();
        let (columns, meta) = decode(&frames, rows, start, start + rows + 1, &row_bytes).unwrap();
        for (c, &b) in row_bytes.iter().enumerate() {
            prop_assert!(columns[c][..start * b].iter().all(|&x| x == 0xAA));
            prop_assert_eq!(&columns[c][start * b..(start + rows) * b], &r.columns[c][..]);
            prop_assert!(columns[c][(start + rows) * b..].iter().all(|&x| x == 0xAA));
        }
        prop_assert_eq!(meta.shard, r.shard);
        prop_assert_eq!(meta.incarnation, r.incarnation);
        prop_assert_eq!(&meta.keys, &r.keys.iter().map(RemoteKey::from_proto).collect::<Vec<_>>());
        prop_assert_eq!(&meta.lengths, &r.lengths);
        prop_assert_eq!(&meta.starts, &r.starts);
        prop_assert_eq!(&meta.probabilities, &r.probabilities);
        prop_assert_eq!(&meta.weights, &r.weights);
        prop_assert_eq!((meta.size, meta.total_mass, meta.min_mass), (r.size, r.total_mass, r.min_mass));
    }

    /// Arbitrary bytes, and replies cut short or flipped anywhere, are
    /// errors or decode; never a panic, never a write outside the block.
    #[test]
    fn arbitrary_bytes_never_panic_or_write_outside_the_block(
        noise in prop::collection::vec(any::<u8>(), 0..200),
        flip in any::<prop::sample::Index>(),
        cut in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let row_bytes = [3usize, 8];
        let _ = decode(&[&noise], 2, 1, 4, &row_bytes);
        let mut prefixed = vec![0u8, 0, 0, 0, noise.len() as u8];
        prefixed.extend_from_slice(&noise);
        let _ = decode(&[&prefixed], 2, 1, 4, &row_bytes);
        let mut body = framed(&reply(2, &row_bytes, 1), true);
        let i = flip.index(body.len());
        body[i] = byte;
        if let Ok((columns, _)) = decode(&[&body], 2, 1, 4, &row_bytes) {
            for (c, &b) in row_bytes.iter().enumerate() {
                prop_assert!(columns[c][..b].iter().all(|&x| x == 0xAA));
                prop_assert!(columns[c][3 * b..].iter().all(|&x| x == 0xAA));
            }
        }
        let short = &body[..cut.index(body.len())];
        prop_assert!(decode(&[short], 2, 1, 4, &row_bytes).is_err());
    }
}

#[test]
fn unpacked_per_row_fields_and_unknown_fields_are_read() {
    let r = reply(3, &[4], 9);
    let mut body = Vec::new();
    // Unpacked lengths and starts, unpacked doubles, and an unknown
    // field of each wire type, in an odd order.
    for i in 0..3 {
        prost::encoding::uint64::encode(4, &r.lengths[i], &mut body);
        prost::encoding::double::encode(7, &r.weights[i], &mut body);
    }
    prost::encoding::uint64::encode(99, &5, &mut body);
    prost::encoding::bytes::encode(98, &vec![1u8; 40], &mut body);
    prost::encoding::fixed32::encode(97, &1, &mut body);
    prost::encoding::double::encode(96, &1.0, &mut body);
    let rest = SampleReply { lengths: Vec::new(), weights: Vec::new(), ..r.clone() };
    body.extend_from_slice(&rest.encode_to_vec());
    let mut framed_body = vec![0u8];
    framed_body.extend_from_slice(&(body.len() as u32).to_be_bytes());
    framed_body.extend_from_slice(&body);
    let (columns, meta) = decode(&[&framed_body], 3, 0, 3, &[4]).unwrap();
    assert_eq!(columns[0], r.columns[0].to_vec());
    assert_eq!(meta.lengths, r.lengths);
    assert_eq!(meta.weights, r.weights);
    assert_eq!(meta.keys.len(), 3);
}

#[test]
fn replies_that_break_the_request_are_refused_with_what_was_wrong() {
    let row_bytes = [4usize, 2];
    let check = |r: SampleReply, rows: usize, want: &str| {
        let e = decode(&[&framed(&r, true)], rows, 0, rows, &row_bytes).unwrap_err();
        assert!(e.contains(want), "{want}: {e}");
    };
    let mut extra = reply(2, &row_bytes, 0);
    extra.columns.push(Bytes::from(vec![0u8; 4]));
    check(extra, 2, "beyond the 2 requested");
    let mut missing = reply(2, &row_bytes, 0);
    missing.columns.pop();
    check(missing, 2, "1 columns for the 2 requested");
    check(reply(2, &[8, 2], 0), 2, "column 0 has 16 bytes for 2 rows");
    let mut more = reply(2, &row_bytes, 0);
    more.keys.push(more.keys[0]);
    check(more, 2, "more keys than the 2 rows");
    let mut short = reply(2, &row_bytes, 0);
    short.weights.pop();
    check(short, 2, "entries for 2 rows");
    let mut compressed = framed(&reply(2, &row_bytes, 0), true);
    compressed[0] = 1;
    let e = decode(&[&compressed], 2, 0, 2, &row_bytes).unwrap_err();
    assert!(e.contains("compressed"), "{e}");
    let mut two = framed(&reply(2, &row_bytes, 0), true);
    two.extend_from_slice(&two.clone());
    let e = decode(&[&two], 2, 0, 2, &row_bytes).unwrap_err();
    assert!(e.contains("after the reply message"), "{e}");
    let e = decode(&[&[0, 0x7f, 0xff, 0xff, 0xff]], 2, 0, 2, &row_bytes).unwrap_err();
    assert!(e.contains("exceeds the limit"), "{e}");
}

proptest! {
    /// A decoder restarted part way through one reply decodes the next as
    /// if it were new: the rows hold the second reply's bytes only.
    #[test]
    fn a_restarted_decoder_keeps_nothing_of_the_reply_it_gave_up(
        rows in 1usize..9,
        row_bytes in prop::collection::vec(1usize..40, 1..4),
        cut in any::<prop::sample::Index>(),
        columns_first in any::<bool>(),
    ) {
        let (first, second) = (reply(rows, &row_bytes, 5), reply(rows, &row_bytes, 9));
        let first = framed(&first, columns_first);
        let body = framed(&second, columns_first);
        let abandoned = &first[..cut.index(first.len())];
        let (columns, meta) = decode_restarted(&[abandoned], &[&body], rows, 1, rows + 1, &row_bytes).unwrap();
        for (c, &b) in row_bytes.iter().enumerate() {
            prop_assert_eq!(&columns[c][b..(1 + rows) * b], &second.columns[c][..]);
        }
        prop_assert_eq!(&meta.keys, &second.keys.iter().map(RemoteKey::from_proto).collect::<Vec<_>>());
        prop_assert_eq!(&meta.weights, &second.weights);
    }
}
