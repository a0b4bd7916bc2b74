//! Column and table specs, their validation and their binary encoding (the
//! encoding is what a region header stores, so an attacher can compare).

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Longest column name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// Most dimensions a per-step shape may have.
pub const MAX_RANK: usize = 16;
/// Most columns a table may have.
pub const MAX_COLUMNS: usize = 4096;

/// One column: a name, an element type and the shape of one timestep.
/// An empty shape is a scalar per step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ColumnSpec {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
}

impl ColumnSpec {
    /// A column; validated when it becomes part of a [`TableSpec`].
    pub fn new(name: impl Into<String>, dtype: DType, shape: impl Into<Vec<u64>>) -> Self {
        ColumnSpec { name: name.into(), dtype, shape: shape.into() }
    }

    /// The column's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The per-timestep shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Elements per step (product of the shape), checked.
    pub fn elements_per_step(&self) -> Result<u64> {
        self.shape.iter().try_fold(1u64, |acc, &d| {
            acc.checked_mul(d).ok_or_else(|| Error::SizeOverflow(format!("column `{}`: elements per step", self.name)))
        })
    }

    /// Bytes per step: dtype size times the product of the shape, checked.
    pub fn step_bytes(&self) -> Result<u64> {
        self.elements_per_step()?
            .checked_mul(self.dtype.size())
            .ok_or_else(|| Error::SizeOverflow(format!("column `{}`: bytes per step", self.name)))
    }

    fn validate(&self) -> Result<()> {
        if self.name.is_empty() {
            return Err(Error::InvalidSpec("column name is empty".into()));
        }
        if self.name.len() > MAX_NAME_BYTES {
            return Err(Error::InvalidSpec(format!(
                "column name `{}…` is {} bytes, at most {MAX_NAME_BYTES} allowed",
                self.name.chars().take(32).collect::<String>(),
                self.name.len()
            )));
        }
        if self.shape.len() > MAX_RANK {
            return Err(Error::InvalidSpec(format!(
                "column `{}`: shape has {} dimensions, at most {MAX_RANK} allowed",
                self.name,
                self.shape.len()
            )));
        }
        if let Some(i) = self.shape.iter().position(|&d| d == 0) {
            return Err(Error::InvalidSpec(format!(
                "column `{}`: dimension {i} of shape {:?} is zero",
                self.name, self.shape
            )));
        }
        self.step_bytes().map(|_| ())
    }
}

/// A table: its columns, the maximum trajectory length `T` in timesteps, the
/// capacity in trajectories and, for tables whose rows are items, how many
/// items each trajectory may hold ([`TableSpec::with_items_per_trajectory`]).
/// Construct with [`TableSpec::new`], which validates; a `TableSpec` value
/// is always valid and its sizes fit in `u64`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableSpec {
    columns: Vec<ColumnSpec>,
    max_len: u64,
    capacity: u64,
    /// Item records per slot (0: no items; trajectories are the rows).
    items_per_trajectory: u32,
}

impl TableSpec {
    /// Validates and builds a spec. Refuses: no columns, zero `max_len` or
    /// `capacity`, empty or duplicate names, zero dimensions, a capacity that
    /// does not fit a 32-bit slot index, and any byte size that overflows.
    pub fn new(columns: Vec<ColumnSpec>, max_len: u64, capacity: u64) -> Result<Self> {
        if columns.is_empty() {
            return Err(Error::InvalidSpec("table has no columns".into()));
        }
        if columns.len() > MAX_COLUMNS {
            return Err(Error::InvalidSpec(format!(
                "table has {} columns, at most {MAX_COLUMNS} allowed",
                columns.len()
            )));
        }
        if max_len == 0 {
            return Err(Error::InvalidSpec("max trajectory length is zero".into()));
        }
        if capacity == 0 {
            return Err(Error::InvalidSpec("capacity is zero".into()));
        }
        if capacity > u64::from(u32::MAX) {
            return Err(Error::InvalidSpec(format!(
                "capacity {capacity} exceeds the {} slots a key can address",
                u32::MAX
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for c in &columns {
            c.validate()?;
            if !seen.insert(c.name.as_str()) {
                return Err(Error::InvalidSpec(format!("duplicate column name `{}`", c.name)));
            }
        }
        let spec = TableSpec { columns, max_len, capacity, items_per_trajectory: 0 };
        // Computing the layout checks every size and offset for overflow.
        crate::layout::Layout::new(&spec)?;
        Ok(spec)
    }

    /// The same table with room for `m` items per trajectory (windows of a
    /// stored trajectory with priorities of their own, see
    /// [`crate::item`]); 0 keeps trajectories as the rows. Refused when
    /// the items of all slots could not be named by a `u32` index
    /// (`capacity * m < 2^32 - 1`) or `T` does not fit 32 bits (an item's
    /// window is stored in 32-bit steps).
    pub fn with_items_per_trajectory(mut self, m: u64) -> Result<Self> {
        if m > 0 {
            let items = self.capacity.checked_mul(m).filter(|&n| n < u64::from(u32::MAX));
            if items.is_none() {
                return Err(Error::InvalidSpec(format!(
                    "{m} items per trajectory x capacity {} is {} items, more than the {} an item index can name",
                    self.capacity,
                    self.capacity.saturating_mul(m),
                    u32::MAX - 1
                )));
            }
            if self.max_len > u64::from(u32::MAX) {
                return Err(Error::InvalidSpec(format!(
                    "a table with items keeps windows in 32 bits: max trajectory length {} is above {}",
                    self.max_len,
                    u32::MAX
                )));
            }
        }
        self.items_per_trajectory = m as u32;
        Ok(self)
    }

    /// Item records per trajectory (0: the table has no items).
    pub fn items_per_trajectory(&self) -> u64 {
        u64::from(self.items_per_trajectory)
    }

    /// Whether the table's rows are items rather than whole trajectories.
    pub fn has_items(&self) -> bool {
        self.items_per_trajectory > 0
    }

    /// Item records in the table: `capacity * items_per_trajectory`.
    pub fn item_capacity(&self) -> u64 {
        self.capacity * u64::from(self.items_per_trajectory)
    }

    /// The columns, in storage order.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// Maximum trajectory length `T` in timesteps.
    pub fn max_len(&self) -> u64 {
        self.max_len
    }

    /// Capacity in trajectories (slots).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The column with this name.
    pub fn column(&self, name: &str) -> Result<(usize, &ColumnSpec)> {
        self.columns
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == name)
            .ok_or_else(|| Error::UnknownColumn(name.to_owned()))
    }

    /// Index of the column with this name.
    pub fn column_index(&self, name: &str) -> Result<usize> {
        self.column(name).map(|(i, _)| i)
    }

    /// Bytes of one step across all columns.
    pub fn step_bytes(&self) -> u64 {
        // Checked in `new`.
        self.columns.iter().map(|c| c.step_bytes().unwrap_or(0)).sum()
    }

    /// Bytes of the whole data area: capacity x T x step bytes.
    pub fn data_bytes(&self) -> u64 {
        self.capacity * self.max_len * self.step_bytes()
    }

    /// Encodes the spec for a region header (little-endian, versioned by the
    /// header that holds it). Items per trajectory follow the columns as a
    /// `u32` only when non-zero, so a spec without items encodes as it did
    /// before items existed (checkpoints of such tables stay readable).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.max_len.to_le_bytes());
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&(self.columns.len() as u32).to_le_bytes());
        for c in &self.columns {
            out.push(c.name.len() as u8);
            out.extend_from_slice(c.name.as_bytes());
            out.push(c.dtype.code());
            out.push(c.shape.len() as u8);
            for d in &c.shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
        }
        if self.items_per_trajectory > 0 {
            out.extend_from_slice(&self.items_per_trajectory.to_le_bytes());
        }
        out
    }

    /// Decodes what [`TableSpec::encode`] wrote; any truncation or bad field
    /// is an error, never a panic, since the bytes may come from another
    /// process or the network.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader { bytes, pos: 0 };
        let max_len = r.u64()?;
        let capacity = r.u64()?;
        let n = r.u32()? as usize;
        if n > MAX_COLUMNS {
            return Err(Error::Decode(format!("{n} columns, at most {MAX_COLUMNS} allowed")));
        }
        let mut columns = Vec::with_capacity(n);
        for _ in 0..n {
            let name_len = usize::from(r.u8()?);
            let name = std::str::from_utf8(r.take(name_len)?)
                .map_err(|_| Error::Decode("column name is not UTF-8".into()))?
                .to_owned();
            let dtype = DType::from_code(r.u8()?)?;
            let rank = usize::from(r.u8()?);
            if rank > MAX_RANK {
                return Err(Error::Decode(format!("column `{name}` has rank {rank}")));
            }
            let shape = (0..rank).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
            columns.push(ColumnSpec { name, dtype, shape });
        }
        let items = if r.pos + 4 == bytes.len() { r.u32()? } else { 0 };
        if r.pos != bytes.len() {
            return Err(Error::Decode(format!("{} trailing bytes after the spec", bytes.len() - r.pos)));
        }
        TableSpec::new(columns, max_len, capacity)
            .and_then(|s| s.with_items_per_trajectory(u64::from(items)))
            .map_err(|e| Error::Decode(format!("stored spec is invalid: {e}")))
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            Error::Decode(format!("truncated: needed {n} bytes at offset {}, have {}", self.pos, self.bytes.len()))
        })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, dtype: DType, shape: &[u64]) -> ColumnSpec {
        ColumnSpec::new(name, dtype, shape.to_vec())
    }

    #[test]
    fn rejects_bad_specs_with_named_errors() {
        let ok = vec![col("obs", DType::U8, &[4])];
        let msg = |r: Result<TableSpec>| r.unwrap_err().to_string();
        assert!(msg(TableSpec::new(vec![], 4, 4)).contains("no columns"));
        assert!(msg(TableSpec::new(ok.clone(), 0, 4)).contains("length is zero"));
        assert!(msg(TableSpec::new(ok.clone(), 4, 0)).contains("capacity is zero"));
        assert!(msg(TableSpec::new(vec![col("", DType::U8, &[])], 4, 4)).contains("empty"));
        let dup = vec![col("a", DType::U8, &[]), col("a", DType::F32, &[])];
        assert!(msg(TableSpec::new(dup, 4, 4)).contains("duplicate column name `a`"));
        assert!(msg(TableSpec::new(vec![col("z", DType::U8, &[3, 0])], 4, 4)).contains("zero"));
        let huge = vec![col("big", DType::F64, &[u64::MAX / 4])];
        assert!(matches!(TableSpec::new(huge, 4, 4), Err(Error::SizeOverflow(_))));
        let wide = vec![col("w", DType::U8, &[1 << 40])];
        assert!(matches!(TableSpec::new(wide, 1 << 20, 1 << 20), Err(Error::SizeOverflow(_))));
    }

    #[test]
    fn encode_decode_round_trip_and_truncation() {
        let spec = TableSpec::new(
            vec![col("obs", DType::U8, &[84, 84, 4]), col("reward", DType::F32, &[]), col("done", DType::Bool, &[])],
            500,
            1000,
        )
        .unwrap();
        let bytes = spec.encode();
        assert_eq!(TableSpec::decode(&bytes).unwrap(), spec);
        for cut in 0..bytes.len() {
            assert!(TableSpec::decode(&bytes[..cut]).is_err(), "cut at {cut} decoded");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(TableSpec::decode(&extra).is_err());
        let items = spec.clone().with_items_per_trajectory(500).unwrap();
        let encoded = items.encode();
        assert_eq!(encoded.len(), bytes.len() + 4, "no items: the encoding of before");
        assert_eq!(TableSpec::decode(&encoded).unwrap(), items);
        assert_ne!(items, spec);
    }

    #[test]
    fn items_are_bounded_by_a_u32_index() {
        let spec = TableSpec::new(vec![col("x", DType::U8, &[])], 8, 1 << 20).unwrap();
        assert_eq!(spec.clone().with_items_per_trajectory(4095).unwrap().item_capacity(), 4095 << 20);
        let e = spec.clone().with_items_per_trajectory(4096).unwrap_err().to_string();
        assert!(e.contains("4096 items per trajectory"), "{e}");
        let long = TableSpec::new(vec![col("x", DType::U8, &[])], 1 << 33, 1).unwrap();
        assert!(long.with_items_per_trajectory(1).unwrap_err().to_string().contains("32 bits"));
        assert!(!spec.has_items());
    }
}
