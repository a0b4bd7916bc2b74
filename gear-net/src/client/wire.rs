//! The client's codec for `Sample` replies: the reply decoded as its HTTP/2
//! DATA frames arrive, each column's bytes copied once, straight from the
//! frame into the caller's rows.
//!
//! tonic's decoder would first copy the whole message out of the DATA
//! frames into one buffer, then prost would hand out the columns as slices
//! of it, and the client would copy them again into the batch: two copies
//! after the socket's. Here the gRPC frame (a flag byte and a 4-byte length)
//! and the protobuf fields of `SampleReply` are parsed incrementally: a
//! field header (key, then its length or value) may be split across frames
//! and is gathered in a few bytes of its own; an entry of `columns` (field
//! 8, one per requested column, in order) is checked against the bytes the
//! block's rows hold before a byte is copied, then copied piece by piece
//! into [`RowsMut`]; the small per-row fields (keys, lengths, starts,
//! probabilities, weights) are collected and decoded into a [`ReplyMeta`]
//! whose vectors are reused from batch to batch. Fields may come in any
//! order (the shard sends the columns first), packed or not; unknown fields
//! are skipped, as protobuf requires.
//!
//! Everything here comes from the network: lengths are checked against the
//! block and the message limit before they size anything, the per-row
//! fields may not hold more entries than the block has rows, and a
//! malformed reply is an error naming what was wrong, never a panic.

use super::assemble::RowsMut;
use super::RemoteKey;
use prost::Message;

/// `SampleReply`'s field numbers (`proto/gear.proto`).
mod field {
    pub const SHARD: u32 = 1;
    pub const INCARNATION: u32 = 2;
    pub const KEYS: u32 = 3;
    pub const LENGTHS: u32 = 4;
    pub const STARTS: u32 = 5;
    pub const PROBABILITIES: u32 = 6;
    pub const WEIGHTS: u32 = 7;
    pub const COLUMNS: u32 = 8;
    pub const SIZE: u32 = 9;
    pub const TOTAL_MASS: u32 = 10;
    pub const MIN_MASS: u32 = 11;
}

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// Longest field header: a key and a length, each at most 10 varint bytes.
const MAX_HEAD: usize = 20;

/// Bytes of the per-row fields a reply may carry per row (a key message
/// with four varints and its header, unpacked length and start varints,
/// unpacked doubles: 31 + 11 + 11 + 9 + 9), with room to spare.
const META_BYTES_PER_ROW: usize = 96;

/// The fields of one shard's reply other than its columns, in vectors
/// kept between batches.
#[derive(Debug, Default)]
pub(crate) struct ReplyMeta {
    pub shard: u32,
    pub incarnation: u64,
    pub keys: Vec<RemoteKey>,
    pub lengths: Vec<u64>,
    pub starts: Vec<u64>,
    /// The shard-local probability of each row.
    pub probabilities: Vec<f64>,
    /// The shard-local importance weight of each row.
    pub weights: Vec<f64>,
    /// The shard's size and masses just after the draw.
    pub size: u64,
    pub total_mass: f64,
    pub min_mass: f64,
    /// The bytes of a per-row field being collected.
    carry: Vec<u8>,
}

impl ReplyMeta {
    /// Empties the fields, keeping the vectors' capacity.
    pub(crate) fn clear(&mut self) {
        self.shard = 0;
        self.incarnation = 0;
        self.keys.clear();
        self.lengths.clear();
        self.starts.clear();
        self.probabilities.clear();
        self.weights.clear();
        self.size = 0;
        self.total_mass = 0.0;
        self.min_mass = 0.0;
        self.carry.clear();
    }
}

/// What the protobuf parser is in the middle of.
#[derive(Clone, Copy, Debug)]
enum FieldState {
    /// Reading a field header.
    Head,
    /// Copying `len` bytes of column `index`; `done` are in.
    Column { index: usize, done: usize, len: usize },
    /// Collecting `left` more bytes of a per-row field.
    Collect { field: u32, left: usize },
    /// Skipping `left` bytes of a field this client does not use.
    Skip { left: usize },
}

/// A field header, parsed.
#[derive(Clone, Copy, Debug)]
enum Head {
    Varint { field: u32, value: u64 },
    Fixed64 { field: u32, value: u64 },
    Fixed32,
    Len { field: u32, len: u64 },
}

/// Decodes one shard's `Sample` reply (a gRPC-framed `SampleReply`) from
/// the DATA frames of its response, in order; see the module doc.
pub(crate) struct ReplyDecoder<'a> {
    rows: RowsMut<'a>,
    meta: &'a mut ReplyMeta,
    /// Largest message accepted.
    max_message: usize,
    /// The gRPC frame's 5-byte prefix, as far as it came.
    prefix: [u8; 5],
    prefix_len: usize,
    /// Message bytes still to come (known once the prefix is in).
    message_left: usize,
    state: FieldState,
    head: [u8; MAX_HEAD],
    head_len: usize,
    /// Entries of `columns` seen.
    columns_seen: usize,
    /// Per-row field bytes collected so far (bounded by the rows).
    meta_bytes: usize,
}

impl<'a> ReplyDecoder<'a> {
    /// A decoder writing the reply's columns into `rows` and its other
    /// fields into `meta` (cleared first); messages above `max_message`
    /// bytes are refused.
    pub(crate) fn new(rows: RowsMut<'a>, meta: &'a mut ReplyMeta, max_message: usize) -> Self {
        meta.clear();
        ReplyDecoder {
            rows,
            meta,
            max_message,
            prefix: [0; 5],
            prefix_len: 0,
            message_left: 0,
            state: FieldState::Head,
            head: [0; MAX_HEAD],
            head_len: 0,
            columns_seen: 0,
            meta_bytes: 0,
        }
    }

    /// Feeds the next bytes of the response body.
    pub(crate) fn feed(&mut self, mut data: &[u8]) -> Result<(), String> {
        while !data.is_empty() {
            if self.prefix_len < 5 {
                let take = (5 - self.prefix_len).min(data.len());
                self.prefix[self.prefix_len..self.prefix_len + take].copy_from_slice(&data[..take]);
                self.prefix_len += take;
                data = &data[take..];
                if self.prefix_len == 5 {
                    self.start_message()?;
                }
                continue;
            }
            if self.message_left == 0 {
                return Err(format!("{} bytes after the reply message (one was expected)", data.len()));
            }
            let take = self.message_left.min(data.len());
            self.feed_message(&data[..take])?;
            self.message_left -= take;
            data = &data[take..];
        }
        Ok(())
    }

    fn start_message(&mut self) -> Result<(), String> {
        match self.prefix[0] {
            0 => {}
            1 => return Err("the reply is compressed, which was not asked for".into()),
            flag => return Err(format!("gRPC frame flag {flag}")),
        }
        let len = u32::from_be_bytes([self.prefix[1], self.prefix[2], self.prefix[3], self.prefix[4]]) as usize;
        if len > self.max_message {
            return Err(format!("a {len}-byte message exceeds the limit of {} bytes", self.max_message));
        }
        self.message_left = len;
        Ok(())
    }

    /// Parses message bytes (never past the message's end).
    fn feed_message(&mut self, mut data: &[u8]) -> Result<(), String> {
        while !data.is_empty() {
            match self.state {
                FieldState::Head => {
                    let take = (MAX_HEAD - self.head_len).min(data.len());
                    self.head[self.head_len..self.head_len + take].copy_from_slice(&data[..take]);
                    match parse_head(&self.head[..self.head_len + take])? {
                        None if self.head_len + take == MAX_HEAD => {
                            return Err("a field header is longer than protobuf allows".into())
                        }
                        None => {
                            self.head_len += take;
                            data = &[];
                        }
                        Some((used, head)) => {
                            data = &data[used - self.head_len..];
                            self.head_len = 0;
                            self.apply(head)?;
                        }
                    }
                }
                FieldState::Column { index, done, len } => {
                    let take = (len - done).min(data.len());
                    self.rows.write(index, done, &data[..take])?;
                    data = &data[take..];
                    self.state = if done + take == len {
                        FieldState::Head
                    } else {
                        FieldState::Column { index, done: done + take, len }
                    };
                }
                FieldState::Collect { field, left } => {
                    let take = left.min(data.len());
                    self.meta.carry.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if take == left {
                        self.state = FieldState::Head;
                        self.decode_collected(field)?;
                    } else {
                        self.state = FieldState::Collect { field, left: left - take };
                    }
                }
                FieldState::Skip { left } => {
                    let take = left.min(data.len());
                    data = &data[take..];
                    self.state = if take == left { FieldState::Head } else { FieldState::Skip { left: left - take } };
                }
            }
        }
        Ok(())
    }

    /// Acts on a parsed field header.
    fn apply(&mut self, head: Head) -> Result<(), String> {
        let rows = self.rows.rows();
        let m = &mut *self.meta;
        match head {
            Head::Varint { field: field::SHARD, value } => {
                m.shard = u32::try_from(value).map_err(|_| format!("shard id {value}"))?;
            }
            Head::Varint { field: field::INCARNATION, value } => m.incarnation = value,
            Head::Varint { field: field::SIZE, value } => m.size = value,
            Head::Varint { field: field::LENGTHS, value } => push_row(&mut m.lengths, value, rows, "lengths")?,
            Head::Varint { field: field::STARTS, value } => push_row(&mut m.starts, value, rows, "starts")?,
            Head::Fixed64 { field: field::TOTAL_MASS, value } => m.total_mass = f64::from_bits(value),
            Head::Fixed64 { field: field::MIN_MASS, value } => m.min_mass = f64::from_bits(value),
            Head::Fixed64 { field: field::PROBABILITIES, value } => {
                push_row(&mut m.probabilities, f64::from_bits(value), rows, "probabilities")?
            }
            Head::Fixed64 { field: field::WEIGHTS, value } => {
                push_row(&mut m.weights, f64::from_bits(value), rows, "weights")?
            }
            Head::Len { field: field::COLUMNS, len } => {
                let index = self.columns_seen;
                if index >= self.rows.columns() {
                    return Err(format!(
                        "a column {} beyond the {} requested (bytes per row {:?} of the table's spec)",
                        index + 1,
                        self.rows.columns(),
                        self.rows.row_bytes()
                    ));
                }
                let expected = self.rows.column_len(index);
                if len != expected as u64 {
                    return Err(format!(
                        "column {index} has {len} bytes for {rows} rows; the bytes per row {:?} of the table's \
                         spec give {expected}",
                        self.rows.row_bytes(),
                    ));
                }
                self.columns_seen += 1;
                if len > 0 {
                    self.state = FieldState::Column { index, done: 0, len: len as usize };
                }
            }
            Head::Len {
                field: field @ (field::KEYS | field::LENGTHS | field::STARTS | field::PROBABILITIES | field::WEIGHTS),
                len,
            } => {
                let bound = META_BYTES_PER_ROW * rows + 64;
                let len = usize::try_from(len).ok().filter(|&l| self.meta_bytes + l <= bound).ok_or_else(|| {
                    format!("per-row fields of {} bytes and more for {rows} rows", self.meta_bytes as u64 + len)
                })?;
                self.meta_bytes += len;
                self.meta.carry.clear();
                if len == 0 {
                    self.decode_collected(field)?;
                } else {
                    self.state = FieldState::Collect { field, left: len };
                }
            }
            Head::Len { field: field::SHARD | field::INCARNATION | field::SIZE, .. }
            | Head::Len { field: field::TOTAL_MASS | field::MIN_MASS, .. }
            | Head::Varint {
                field:
                    field::KEYS
                    | field::PROBABILITIES
                    | field::WEIGHTS
                    | field::COLUMNS
                    | field::TOTAL_MASS
                    | field::MIN_MASS,
                ..
            }
            | Head::Fixed64 {
                field:
                    field::SHARD
                    | field::INCARNATION
                    | field::KEYS
                    | field::LENGTHS
                    | field::STARTS
                    | field::COLUMNS
                    | field::SIZE,
                ..
            } => return Err(format!("a field with the wrong wire type ({head:?})")),
            // Another field (row ranges, a newer server's): skipped.
            Head::Len { len, .. } => {
                let len = usize::try_from(len).map_err(|_| format!("a field of {len} bytes"))?;
                if len > 0 {
                    self.state = FieldState::Skip { left: len };
                }
            }
            Head::Varint { .. } | Head::Fixed64 { .. } | Head::Fixed32 => {}
        }
        Ok(())
    }

    /// Decodes the collected bytes of per-row field `field`.
    fn decode_collected(&mut self, field: u32) -> Result<(), String> {
        let rows = self.rows.rows();
        let m = &mut *self.meta;
        let mut bytes = &m.carry[..];
        match field {
            field::KEYS => {
                let k = crate::proto::Key::decode(bytes).map_err(|e| format!("a key: {e}"))?;
                let key =
                    RemoteKey { shard: k.shard, incarnation: k.incarnation, slot: k.slot, generation: k.generation };
                push_row(&mut m.keys, key, rows, "keys")?;
            }
            field::LENGTHS | field::STARTS => {
                let (list, name) =
                    if field == field::LENGTHS { (&mut m.lengths, "lengths") } else { (&mut m.starts, "starts") };
                while !bytes.is_empty() {
                    let (value, used) = read_varint(bytes)?.ok_or("a packed varint runs past its field")?;
                    push_row(list, value, rows, name)?;
                    bytes = &bytes[used..];
                }
            }
            _ => {
                let (list, name) = if field == field::PROBABILITIES {
                    (&mut m.probabilities, "probabilities")
                } else {
                    (&mut m.weights, "weights")
                };
                if !bytes.len().is_multiple_of(8) {
                    return Err(format!("packed {name} of {} bytes (not whole doubles)", bytes.len()));
                }
                for chunk in bytes.chunks_exact(8) {
                    let bits = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
                    push_row(list, f64::from_bits(bits), rows, name)?;
                }
            }
        }
        m.carry.clear();
        Ok(())
    }

    /// Whether the whole message came and ended between fields, with one
    /// entry per row in every per-row field and every column in.
    pub(crate) fn finish(&self) -> Result<(), String> {
        if self.prefix_len < 5 {
            return Err(format!("the reply ended after {} bytes, inside its gRPC frame header", self.prefix_len));
        }
        if self.message_left > 0 {
            return Err(format!("the reply ended {} bytes short of its message", self.message_left));
        }
        if !matches!(self.state, FieldState::Head) || self.head_len > 0 {
            return Err("the reply message ends inside a field".into());
        }
        let n = self.rows.rows();
        let m = &*self.meta;
        let counts = [m.keys.len(), m.lengths.len(), m.starts.len(), m.probabilities.len(), m.weights.len()];
        if counts.iter().any(|&c| c != n) {
            return Err(format!("per-row fields have {counts:?} entries for {n} rows"));
        }
        let want = self.rows.columns();
        if self.columns_seen != want {
            return Err(format!("{} columns for the {want} requested", self.columns_seen));
        }
        Ok(())
    }
}

/// Appends `value` to a per-row field that may hold at most `rows` entries.
fn push_row<T>(list: &mut Vec<T>, value: T, rows: usize, name: &str) -> Result<(), String> {
    if list.len() >= rows {
        return Err(format!("more {name} than the {rows} rows asked for"));
    }
    list.push(value);
    Ok(())
}

/// A varint at the start of `bytes`: `None` if it runs past them.
fn read_varint(bytes: &[u8]) -> Result<Option<(u64, usize)>, String> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            if i == 9 && b > 1 {
                return Err("a varint overflows 64 bits".into());
            }
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 10 {
        return Err("a varint longer than 10 bytes".into());
    }
    Ok(None)
}

/// A field header at the start of `bytes`, and its length: `None` if it
/// runs past them.
fn parse_head(bytes: &[u8]) -> Result<Option<(usize, Head)>, String> {
    let Some((key, at)) = read_varint(bytes)? else { return Ok(None) };
    let field = u32::try_from(key >> 3).ok().filter(|&f| f > 0).ok_or_else(|| format!("field key {key}"))?;
    let rest = &bytes[at..];
    Ok(match (key & 7) as u8 {
        VARINT => read_varint(rest)?.map(|(value, n)| (at + n, Head::Varint { field, value })),
        LEN => read_varint(rest)?.map(|(len, n)| (at + n, Head::Len { field, len })),
        FIXED64 => rest.get(..8).map(|b| {
            let value = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
            (at + 8, Head::Fixed64 { field, value })
        }),
        FIXED32 => (rest.len() >= 4).then_some((at + 4, Head::Fixed32)),
        other => return Err(format!("wire type {other} (field {field})")),
    })
}

#[cfg(test)]
mod tests {
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
                .map(|(c, &b)| {
                    Bytes::from((0..rows * b).map(|i| (i as u8) ^ seed ^ (c as u8 * 16)).collect::<Vec<_>>())
                })
                .collect(),
            size: 77,
            total_mass: 12.5,
            min_mass: 0.25,
            row_ranges: Vec::new(),
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
}

/// The client's codec and assembly allocate nothing per batch once their
/// buffers have grown: a counting allocator (this crate's unit-test build
/// only) counts every allocation of the decoding thread while batches of
/// three shards' replies, split into DATA frames, are decoded into caller
/// buffers with the scratch a `sample_into` call reuses.
#[cfg(test)]
mod allocation_tests {
    use super::*;
    use crate::client::assemble::Assembly;
    use crate::client::weights::WeightNorm;
    use crate::client::BatchRows;
    use crate::proto::{Key, SampleReply};
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::mem::MaybeUninit;

    struct Counting;

    thread_local! {
        static COUNTING: Cell<bool> = const { Cell::new(false) };
        static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    fn count() {
        let _ = COUNTING.try_with(|on| {
            if on.get() {
                ALLOCATIONS.with(|a| a.set(a.get() + 1));
            }
        });
    }

    // SAFETY: every call goes to the system allocator unchanged; the
    // counters are thread-local cells that never allocate.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count();
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count();
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count();
            // SAFETY: the caller's contract, passed on.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// Shard `s`'s reply of `rows` rows, framed, cut into 1000-byte frames.
    fn frames(s: u32, rows: usize, row_bytes: &[usize]) -> Vec<Vec<u8>> {
        let reply = SampleReply {
            shard: s,
            incarnation: 7,
            keys: (0..rows as u32).map(|i| Key { shard: s, incarnation: 7, slot: i, generation: 1 }).collect(),
            lengths: vec![1; rows],
            starts: vec![0; rows],
            probabilities: vec![0.25; rows],
            weights: vec![1.0; rows],
            columns: row_bytes.iter().map(|&b| bytes::Bytes::from(vec![s as u8; b * rows])).collect(),
            size: 4,
            total_mass: 4.0,
            min_mass: 1.0,
            row_ranges: Vec::new(),
        };
        let body = reply.encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        framed.chunks(1000).map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn decoding_a_batch_into_caller_buffers_allocates_nothing_in_steady_state() {
        let row_bytes = [96usize, 8];
        let rows_per_shard = [40usize, 30, 58];
        let rows: usize = rows_per_shard.iter().sum();
        let replies: Vec<Vec<Vec<u8>>> =
            rows_per_shard.iter().enumerate().map(|(s, &n)| frames(s as u32, n, &row_bytes)).collect();
        let mut columns: Vec<Vec<MaybeUninit<u8>>> =
            row_bytes.iter().map(|&b| vec![MaybeUninit::new(0); b * rows]).collect();
        // The scratch one `sample_into` keeps between calls.
        let (mut bases, mut blocks, mut metas, mut settled) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut out = BatchRows::default();
        let mut batch = |count: bool| {
            COUNTING.with(|c| c.set(count));
            let mut views: Vec<&mut [MaybeUninit<u8>]> = Vec::new();
            COUNTING.with(|c| c.set(false));
            views.extend(columns.iter_mut().map(|c| &mut c[..]));
            COUNTING.with(|c| c.set(count));
            let mut a = Assembly::new(&mut views, &row_bytes, rows, &mut bases, &mut blocks).unwrap();
            for (s, &n) in rows_per_shard.iter().enumerate() {
                a.add_block(s, n).unwrap();
            }
            if metas.len() < 3 {
                metas.resize_with(3, ReplyMeta::default);
            }
            settled.clear();
            for ((tag, target), meta) in a.targets().zip(metas.iter_mut()) {
                let mut d = ReplyDecoder::new(target, meta, 1 << 30);
                for f in &replies[tag] {
                    d.feed(f).unwrap();
                }
                d.finish().unwrap();
                settled.push(tag);
            }
            for &tag in &settled {
                a.settle(tag, true);
            }
            a.close_holes();
            out.clear();
            let mut norm = WeightNorm::default();
            for (tag, _) in a.placed_blocks() {
                let m = &metas[tag];
                out.keys.extend_from_slice(&m.keys);
                out.lengths.extend_from_slice(&m.lengths);
                out.starts.extend_from_slice(&m.starts);
                for &p in &m.probabilities {
                    norm.row(p / 3.0);
                    out.probabilities.push(p / 3.0);
                }
            }
            out.weights.extend(out.probabilities.iter().map(|&p| norm.weight(p, 0.5)));
            COUNTING.with(|c| c.set(false));
            drop(views);
        };
        for _ in 0..3 {
            batch(false);
        }
        ALLOCATIONS.with(|a| a.set(0));
        for _ in 0..20 {
            batch(true);
        }
        assert_eq!(out.keys.len(), rows);
        assert_eq!(ALLOCATIONS.with(Cell::get), 0, "allocations in 20 batches");
        // SAFETY: every row was written (the columns were initialised anyway).
        let first = unsafe { columns[0][0].assume_init() };
        // SAFETY: as above.
        let last = unsafe { columns[0][96 * rows - 1].assume_init() };
        assert_eq!((first, last), (0, 2));
    }
}
