//! The checkpoint file format: a 16-byte preamble, then checksummed chunks.
//! See the module doc of [`super`] for the layout; this file holds the
//! framing (write and read one chunk, check its checksum) and the fixed
//! records, so that the writer and the reader cannot disagree.

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::path::Path;

/// First eight bytes of every checkpoint.
pub const MAGIC: [u8; 8] = *b"GEARCKPT";
/// The format version this build writes (2: items). It reads this one and
/// every older one down to `OLDEST_VERSION` (1).
pub const VERSION: u32 = 2;
/// The oldest format version this build reads.
pub const OLDEST_VERSION: u32 = 1;
/// Bytes before the first chunk: magic, version, reserved.
pub(super) const PREAMBLE_BYTES: usize = 16;
/// Chunk header: tag (u32) and payload length (u64).
pub(super) const CHUNK_HEADER_BYTES: usize = 12;
/// Bytes of one trajectory record's fixed part: slot, generation, length,
/// priority, times sampled, insert sequence.
pub(super) const RECORD_BYTES: usize = 40;
/// Bytes of one item record: slot, slot generation, index in the slot,
/// item generation, start, length (u32 each), priority (f64), times
/// sampled (u64).
pub(super) const ITEM_RECORD_BYTES: usize = 40;
/// Data chunks are cut once they hold this much (a single trajectory
/// larger than this gets a chunk of its own).
pub(super) const CHUNK_TARGET: usize = 4 << 20;

/// What a chunk holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tag {
    Header = 1,
    Data = 2,
    Strategy = 3,
    End = 4,
    Items = 5,
}

impl Tag {
    fn from_u32(v: u32) -> Option<Tag> {
        Some(match v {
            1 => Tag::Header,
            2 => Tag::Data,
            3 => Tag::Strategy,
            4 => Tag::End,
            5 => Tag::Items,
            _ => return None,
        })
    }
}

/// A checkpoint error naming the file.
pub(super) fn problem(path: &Path, problem: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.to_owned(), problem: problem.into() }
}

/// An I/O error naming the file and what was being done.
pub(super) fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::CheckpointIo { op, path: path.to_owned(), source }
}

/// The preamble this build writes.
pub(super) fn preamble() -> [u8; PREAMBLE_BYTES] {
    let mut p = [0u8; PREAMBLE_BYTES];
    p[..8].copy_from_slice(&MAGIC);
    p[8..12].copy_from_slice(&VERSION.to_le_bytes());
    p
}

/// Checks a preamble: the magic, then the version. Returns the version.
pub(super) fn check_preamble(path: &Path, p: &[u8; PREAMBLE_BYTES]) -> Result<u32> {
    if p[..8] != MAGIC {
        return Err(problem(path, "not a GEAR checkpoint (its first bytes are not the GEARCKPT magic)"));
    }
    let version = u32::from_le_bytes([p[8], p[9], p[10], p[11]]);
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(problem(
            path,
            format!("format version {version}, this build reads versions {OLDEST_VERSION} to {VERSION}"),
        ));
    }
    Ok(version)
}

/// Writes one chunk: header, payload, CRC-32 of both. Returns the bytes
/// written.
pub(super) fn write_chunk(out: &mut impl Write, tag: Tag, payload: &[u8]) -> std::io::Result<u64> {
    let mut header = [0u8; CHUNK_HEADER_BYTES];
    header[..4].copy_from_slice(&(tag as u32).to_le_bytes());
    header[4..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header);
    crc.update(payload);
    out.write_all(&header)?;
    out.write_all(payload)?;
    out.write_all(&crc.finalize().to_le_bytes())?;
    Ok((CHUNK_HEADER_BYTES + payload.len() + 4) as u64)
}

/// Bytes [`ChunkReader`] reads ahead for small pieces (chunk headers,
/// records, short columns). Pieces at least this long are read straight
/// from the input into their destination, so trajectory bytes are copied
/// once (from the page cache into the slot) and not twice through a
/// buffer; keeping the read-ahead short bounds the bytes of a long piece
/// that still come through it.
pub(super) const READ_AHEAD: usize = 16 << 10;

/// Reads chunks one at a time, checking each checksum: small chunks into
/// one reused buffer ([`ChunkReader::next`]), data chunks piece by piece
/// straight to where they go ([`ChunkReader::begin`], [`ChunkReader::part`],
/// [`ChunkReader::finish`]). It buffers for itself (pass it the unbuffered
/// file): see [`READ_AHEAD`].
pub(super) struct ChunkReader<'p, R> {
    input: R,
    /// Read-ahead: `ahead[pos..filled]` are input bytes not consumed yet.
    ahead: Box<[u8]>,
    pos: usize,
    filled: usize,
    path: &'p Path,
    /// Byte offset of the current chunk in the file (for messages).
    offset: u64,
    /// Chunks read so far (for messages).
    index: u64,
    /// Payload bytes of the current chunk not yet read.
    left: u64,
    /// Payload length of the current chunk.
    len: u64,
    crc: crc32fast::Hasher,
    buf: Vec<u8>,
}

impl<'p, R: Read> ChunkReader<'p, R> {
    pub(super) fn new(input: R, path: &'p Path) -> Self {
        ChunkReader {
            input,
            ahead: vec![0u8; READ_AHEAD].into_boxed_slice(),
            pos: 0,
            filled: 0,
            path,
            offset: PREAMBLE_BYTES as u64,
            index: 0,
            left: 0,
            len: 0,
            crc: crc32fast::Hasher::new(),
            buf: Vec::new(),
        }
    }

    /// Reads the next chunk's header, refusing payloads over `limit` bytes
    /// (a corrupted length must not make the reader allocate or read
    /// without bound). Returns the tag and the payload length.
    pub(super) fn begin(&mut self, limit: u64) -> Result<(Tag, u64)> {
        let mut header = [0u8; CHUNK_HEADER_BYTES];
        self.read_exact_or_truncated(&mut header)?;
        let raw_tag = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let mut len_bytes = [0u8; 8];
        len_bytes.copy_from_slice(&header[4..]);
        let len = u64::from_le_bytes(len_bytes);
        let (at, index) = (self.offset, self.index);
        let tag = Tag::from_u32(raw_tag).ok_or_else(|| {
            problem(self.path, format!("corrupted: chunk {index} at byte {at} has unknown tag {raw_tag}"))
        })?;
        if len > limit {
            return Err(problem(
                self.path,
                format!("corrupted: chunk {index} at byte {at} claims {len} bytes, at most {limit} can be right"),
            ));
        }
        self.crc = crc32fast::Hasher::new();
        self.crc.update(&header);
        self.len = len;
        self.left = len;
        Ok((tag, len))
    }

    /// The file being read.
    pub(super) fn path(&self) -> &'p Path {
        self.path
    }

    /// Payload bytes of the current chunk not read yet.
    pub(super) fn left(&self) -> u64 {
        self.left
    }

    /// Reads the next `out.len()` payload bytes of the current chunk
    /// (refused past its end). They are not checked until
    /// [`ChunkReader::finish`]: use them only once that succeeded, or
    /// throw away what they went into.
    pub(super) fn part(&mut self, out: &mut [u8]) -> Result<()> {
        if out.len() as u64 > self.left {
            return Err(problem(
                self.path,
                format!("corrupted: a record runs past the end of chunk {} (at byte {})", self.index, self.offset),
            ));
        }
        self.read_exact_or_truncated(out)?;
        self.crc.update(out);
        self.left -= out.len() as u64;
        Ok(())
    }

    /// Reads the current chunk's checksum and compares it with what was
    /// read of it (all of its payload must have been).
    pub(super) fn finish(&mut self) -> Result<()> {
        let (at, index, len) = (self.offset, self.index, self.len);
        if self.left != 0 {
            return Err(problem(self.path, format!("corrupted: chunk {index} at byte {at} has bytes left over")));
        }
        let mut crc_bytes = [0u8; 4];
        self.read_exact_or_truncated(&mut crc_bytes)?;
        let crc = std::mem::replace(&mut self.crc, crc32fast::Hasher::new());
        if crc.finalize() != u32::from_le_bytes(crc_bytes) {
            return Err(problem(
                self.path,
                format!("corrupted: checksum mismatch in chunk {index} ({len} bytes at byte {at})"),
            ));
        }
        self.offset += (CHUNK_HEADER_BYTES as u64) + len + 4;
        self.index += 1;
        Ok(())
    }

    /// Reads a whole chunk of at most `limit` bytes into the reused
    /// buffer and checks it.
    pub(super) fn next(&mut self, limit: u64) -> Result<(Tag, &[u8])> {
        let (tag, len) = self.begin(limit)?;
        let len = len as usize;
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        let mut payload = std::mem::take(&mut self.buf);
        let read = self.part(&mut payload[..len]).and_then(|()| self.finish());
        self.buf = payload;
        read?;
        Ok((tag, &self.buf[..len]))
    }

    /// Whether the input has ended (no byte follows).
    pub(super) fn at_end(&mut self) -> Result<bool> {
        if self.pos < self.filled {
            return Ok(false);
        }
        let mut b = [0u8; 1];
        loop {
            match self.input.read(&mut b) {
                Ok(0) => return Ok(true),
                Ok(_) => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(self.path, "read")(e)),
            }
        }
    }

    /// Fills `out` from the read-ahead, then (the rest being long) straight
    /// from the input or (short) through a refill of the read-ahead.
    fn read_exact_or_truncated(&mut self, out: &mut [u8]) -> Result<()> {
        let buffered = (self.filled - self.pos).min(out.len());
        out[..buffered].copy_from_slice(&self.ahead[self.pos..self.pos + buffered]);
        self.pos += buffered;
        let mut done = buffered;
        while done < out.len() {
            let rest = &mut out[done..];
            let got = if rest.len() >= READ_AHEAD {
                self.read_input(Some(rest))?
            } else {
                let got = self.read_input(None)?;
                let n = got.min(rest.len());
                rest[..n].copy_from_slice(&self.ahead[..n]);
                (self.pos, self.filled) = (n, got);
                n
            };
            if got == 0 {
                let (at, index) = (self.offset, self.index);
                return Err(problem(
                    self.path,
                    format!("truncated: the file ends inside chunk {index} (which starts at byte {at})"),
                ));
            }
            done += got;
        }
        Ok(())
    }

    /// One `read` of the input into `into`, or into the (consumed)
    /// read-ahead when `None`, retried on `EINTR`. Returns the bytes read.
    fn read_input(&mut self, into: Option<&mut [u8]>) -> Result<usize> {
        let out = match into {
            Some(out) => out,
            None => &mut self.ahead[..],
        };
        loop {
            match self.input.read(out) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(self.path, "read")(e)),
            }
        }
    }
}

/// Little-endian fields read from a payload, each checked against its end.
pub(super) struct Fields<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Fields<'a> {
    pub(super) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Fields { bytes, what }
    }

    pub(super) fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!("corrupted: the {} ends early", self.what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub(super) fn u64(&mut self) -> std::result::Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    pub(super) fn u32(&mut self) -> std::result::Result<u32, String> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    /// A string of at most 64 KiB: u16 length, UTF-8 bytes.
    pub(super) fn string(&mut self) -> std::result::Result<String, String> {
        let mut b = [0u8; 2];
        b.copy_from_slice(self.take(2)?);
        let n = u16::from_le_bytes(b) as usize;
        let what = self.what;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| format!("corrupted: a name in the {what} is not UTF-8"))
    }

    pub(super) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }
}

/// Appends a string as [`Fields::string`] reads it (names longer than
/// 64 KiB are cut; strategy names are short).
pub(super) fn put_string(out: &mut Vec<u8>, s: &str) {
    let bytes = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}
