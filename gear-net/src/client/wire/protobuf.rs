//! The protobuf wire format as `SampleReply`'s decoder reads it: field
//! numbers, wire types and the parsing of varints and field headers.

/// `SampleReply`'s field numbers (`proto/gear.proto`).
pub(super) mod field {
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
pub(super) const MAX_HEAD: usize = 20;

/// A field header, parsed.
#[derive(Clone, Copy, Debug)]
pub(super) enum Head {
    Varint { field: u32, value: u64 },
    Fixed64 { field: u32, value: u64 },
    Fixed32,
    Len { field: u32, len: u64 },
}

/// A varint at the start of `bytes`: `None` if it runs past them.
pub(super) fn read_varint(bytes: &[u8]) -> Result<Option<(u64, usize)>, String> {
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
pub(super) fn parse_head(bytes: &[u8]) -> Result<Option<(usize, Head)>, String> {
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
