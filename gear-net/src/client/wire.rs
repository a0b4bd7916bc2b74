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
use protobuf::{field, parse_head, read_varint, Head, MAX_HEAD};

#[cfg(test)]
mod allocation_tests;
mod protobuf;
#[cfg(test)]
mod tests;

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

    /// Bytes of one row of each column.
    pub(crate) fn row_bytes(&self) -> &[usize] {
        self.rows.row_bytes()
    }

    /// After a reply that arrived whole with the rows `rows` overwritten
    /// (ascending): puts in their place the rows of `other`, a reply of
    /// `rows.len()` rows of the same shard whose columns are in `columns`
    /// (one buffer per column, row after row), bytes and per-row fields.
    /// `Ok(false)`: `other` comes from another run of the shard and
    /// cannot stand in (nothing was changed).
    pub(crate) fn replace_rows(
        &mut self,
        rows: &[usize],
        columns: &[Vec<u8>],
        other: &ReplyMeta,
    ) -> Result<bool, String> {
        let (k, n) = (rows.len(), self.rows.rows());
        let m = &mut *self.meta;
        if other.shard != m.shard {
            return Err(format!("the rows drawn again came from shard {}, not {}", other.shard, m.shard));
        }
        if other.incarnation != m.incarnation {
            return Ok(false);
        }
        let ours = [m.keys.len(), m.lengths.len(), m.starts.len(), m.probabilities.len(), m.weights.len()];
        let theirs =
            [other.keys.len(), other.lengths.len(), other.starts.len(), other.probabilities.len(), other.weights.len()];
        if ours.iter().any(|&c| c != n) || theirs.iter().any(|&c| c != k) {
            return Err(format!("per-row fields of {ours:?} and {theirs:?} entries for {n} rows and {k} drawn again"));
        }
        if rows.iter().any(|&r| r >= n) || columns.len() != self.rows.columns() {
            return Err(format!("rows {rows:?} to replace in a block of {n} rows"));
        }
        for (i, &r) in rows.iter().enumerate() {
            for (c, column) in columns.iter().enumerate() {
                let rb = self.rows.row_bytes()[c];
                let row = column.get(i * rb..(i + 1) * rb).ok_or_else(|| format!("column {c} misses row {i}"))?;
                self.rows.write(c, r * rb, row)?;
            }
            m.keys[r] = other.keys[i];
            m.lengths[r] = other.lengths[i];
            m.starts[r] = other.starts[i];
            m.probabilities[r] = other.probabilities[i];
            m.weights[r] = other.weights[i];
        }
        Ok(true)
    }

    /// Starts over for another reply to the same rows (the first was
    /// refused part way): what it decoded is dropped and its rows are
    /// written again.
    pub(crate) fn restart(&mut self) {
        self.meta.clear();
        self.prefix_len = 0;
        self.message_left = 0;
        self.state = FieldState::Head;
        self.head_len = 0;
        self.columns_seen = 0;
        self.meta_bytes = 0;
    }

    /// Bytes this decoder still takes before its message is whole: the
    /// rest of the gRPC prefix, then of the message; 0 once it is whole (a
    /// stream of messages gives it no more than this).
    pub(crate) fn wanted(&self) -> usize {
        if self.prefix_len < 5 {
            5 - self.prefix_len
        } else {
            self.message_left
        }
    }

    /// Whether no byte was fed since the decoder was made or restarted.
    pub(crate) fn untouched(&self) -> bool {
        self.prefix_len == 0
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
