//! HDF5 datatypes and gear dtypes: which HDF5 types an import reads, the
//! lossless conversions it makes, and the HDF5 type an export writes for
//! each gear dtype.

use gear_core::DType;
use hdf5_pure::{Datatype, DatatypeByteOrder, EnumTypeBuilder, FloatingPointLayout};

/// The element type of a dataset, as an import sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// A gear dtype, stored as the table stores it (bools as h5py's enum
    /// `{FALSE = 0, TRUE = 1}` over one byte).
    Gear(DType),
    /// Unsigned 16-bit integer (no gear dtype; widened to i32 or i64).
    U16,
    /// Unsigned 32-bit integer (no gear dtype; widened to i64).
    U32,
    /// Unsigned 64-bit integer (no gear dtype can hold every value).
    U64,
}

impl Element {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Element::Gear(d) => d.size() as usize,
            Element::U16 => 2,
            Element::U32 => 4,
            Element::U64 => 8,
        }
    }

    /// The gear dtype a new column for this element gets
    /// ([`crate::FileInfo::table_spec`]): itself, or the narrowest wider
    /// signed type; `None` for u64.
    pub fn column_dtype(self) -> Option<DType> {
        match self {
            Element::Gear(d) => Some(d),
            Element::U16 => Some(DType::I32),
            Element::U32 => Some(DType::I64),
            Element::U64 => None,
        }
    }
}

impl std::fmt::Display for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Element::Gear(d) => write!(f, "{}", d.name()),
            Element::U16 => f.write_str("u16"),
            Element::U32 => f.write_str("u32"),
            Element::U64 => f.write_str("u64"),
        }
    }
}

/// A dataset's element type and byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SourceType {
    pub element: Element,
    pub big_endian: bool,
}

/// Reads an HDF5 datatype as an element gear can store, or says why not.
pub(crate) fn source_type(dt: &Datatype) -> Result<SourceType, String> {
    let order = |o: &DatatypeByteOrder| match o {
        DatatypeByteOrder::LittleEndian => Ok(false),
        DatatypeByteOrder::BigEndian => Ok(true),
        DatatypeByteOrder::Vax => Err("VAX byte order is not supported".to_owned()),
    };
    match dt {
        Datatype::FixedPoint { size, byte_order, layout } => {
            if layout.bit_offset != 0 || u32::from(layout.bit_precision) != size * 8 {
                return Err(format!(
                    "a {size}-byte integer with {} bits of precision is not supported",
                    layout.bit_precision
                ));
            }
            let element = match (size, layout.signed) {
                (1, false) => Element::Gear(DType::U8),
                (1, true) => Element::Gear(DType::I8),
                (2, true) => Element::Gear(DType::I16),
                (4, true) => Element::Gear(DType::I32),
                (8, true) => Element::Gear(DType::I64),
                (2, false) => Element::U16,
                (4, false) => Element::U32,
                (8, false) => Element::U64,
                _ => return Err(format!("a {size}-byte integer is not supported")),
            };
            Ok(SourceType { element, big_endian: order(byte_order)? })
        }
        Datatype::FloatingPoint { size, byte_order, layout } => {
            let element = match (size, layout.exponent_size, layout.mantissa_size) {
                (2, 5, 10) => DType::F16,
                (2, 8, 7) => DType::BF16,
                (4, 8, 23) => DType::F32,
                (8, 11, 52) => DType::F64,
                _ => return Err(format!("a {size}-byte float of this layout is not supported")),
            };
            Ok(SourceType { element: Element::Gear(element), big_endian: order(byte_order)? })
        }
        Datatype::Enumeration { size: 1, base_type, members } => {
            let mut values: Vec<u8> = members.iter().filter_map(|m| m.value.first().copied()).collect();
            values.sort_unstable();
            let integer = matches!(**base_type, Datatype::FixedPoint { size: 1, .. });
            if integer && members.len() == 2 && values == [0, 1] {
                Ok(SourceType { element: Element::Gear(DType::Bool), big_endian: false })
            } else {
                Err("an enumeration other than h5py's bool {FALSE = 0, TRUE = 1} is not supported".to_owned())
            }
        }
        other => Err(format!("HDF5 type {} is not supported (numbers and bools only)", class_name(other))),
    }
}

fn class_name(dt: &Datatype) -> &'static str {
    match dt {
        Datatype::FixedPoint { .. } => "integer",
        Datatype::FloatingPoint { .. } => "float",
        Datatype::Time { .. } => "time",
        Datatype::String { .. } => "string",
        Datatype::BitField { .. } => "bitfield",
        Datatype::Opaque { .. } => "opaque",
        Datatype::Compound { .. } => "compound",
        Datatype::Reference { .. } => "reference",
        Datatype::Enumeration { .. } => "enum",
        Datatype::VariableLength { .. } => "variable-length",
        Datatype::Array { .. } => "array",
        _ => "of an unknown class",
    }
}

/// How an import turns a dataset's elements into a column's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Conversion {
    /// Same type: the bytes are copied.
    Copy,
    /// A widening that keeps every value exactly.
    Widen { from: Element, to: DType },
}

/// The conversion from `from` to `to`, when it loses nothing; `None`
/// otherwise (the import refuses it).
pub(crate) fn conversion(from: Element, to: DType) -> Option<Conversion> {
    use DType as D;
    if from == Element::Gear(to) {
        return Some(Conversion::Copy);
    }
    let ok = match from {
        Element::Gear(D::Bool) => matches!(to, D::U8 | D::I8 | D::I16 | D::I32 | D::I64 | D::F32 | D::F64),
        Element::Gear(D::U8) => matches!(to, D::I16 | D::I32 | D::I64 | D::F32 | D::F64),
        Element::Gear(D::I8) | Element::Gear(D::I16) | Element::U16 => {
            matches!(to, D::I16 | D::I32 | D::I64 | D::F32 | D::F64) && to.size() as usize > from.size()
        }
        Element::Gear(D::I32) | Element::U32 => matches!(to, D::I64 | D::F64),
        Element::Gear(D::F32) => to == D::F64,
        _ => false,
    };
    ok.then_some(Conversion::Widen { from, to })
}

/// Converts little-endian elements of `from` in `src` to elements of `to`,
/// appended to `out`. Only pairs [`conversion`] accepts are passed here.
pub(crate) fn widen(src: &[u8], from: Element, to: DType, out: &mut Vec<u8>) {
    let n = from.size();
    out.reserve(src.len() / n * to.size() as usize);
    for e in src.chunks_exact(n) {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(e);
        let (int, float): (i64, f64) = match from {
            Element::Gear(DType::F32) => {
                let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                (0, f64::from(v))
            }
            Element::Gear(DType::I8) => (i64::from(b[0] as i8), 0.0),
            Element::Gear(DType::I16) => (i64::from(i16::from_le_bytes([b[0], b[1]])), 0.0),
            Element::Gear(DType::I32) => (i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])), 0.0),
            // bool, u8, u16, u32: zero-extended.
            _ => (i64::from_le_bytes(b), 0.0),
        };
        let is_float = from == Element::Gear(DType::F32);
        match to {
            DType::F64 => out.extend_from_slice(&(if is_float { float } else { int as f64 }).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(int as f32).to_le_bytes()),
            _ => out.extend_from_slice(&int.to_le_bytes()[..to.size() as usize]),
        }
    }
}

/// Reverses each `size`-byte element of `bytes` (big-endian to little).
pub(crate) fn swap_bytes(bytes: &mut [u8], size: usize) {
    if size > 1 {
        for e in bytes.chunks_exact_mut(size) {
            e.reverse();
        }
    }
}

/// Whether a little-endian element of `dtype` is nonzero (true): the
/// meaning of `terminals`, `timeouts`, `terminations` and `truncations`.
pub(crate) fn is_set(e: &[u8], element: Element) -> bool {
    match element {
        Element::Gear(DType::F32) => f32::from_le_bytes([e[0], e[1], e[2], e[3]]) != 0.0,
        Element::Gear(DType::F64) => f64::from_le_bytes(e[..8].try_into().unwrap_or([0; 8])) != 0.0,
        // Zero of both signs.
        Element::Gear(DType::F16) | Element::Gear(DType::BF16) => u16::from_le_bytes([e[0], e[1]]) & 0x7fff != 0,
        _ => e.iter().any(|&b| b != 0),
    }
}

/// The HDF5 type an export writes for a column of `dtype`: little-endian
/// numbers, and bools as h5py writes them (an enum over a signed byte,
/// `FALSE = 0`, `TRUE = 1`), so h5py and NumPy read them back as `bool`.
pub(crate) fn hdf5_type(dtype: DType) -> Result<Datatype, String> {
    let float = |size: u32, exponent_location, exponent_size, mantissa_size, exponent_bias| Datatype::FloatingPoint {
        size,
        byte_order: DatatypeByteOrder::LittleEndian,
        layout: FloatingPointLayout {
            bit_offset: 0,
            bit_precision: (size * 8) as u16,
            exponent_location,
            exponent_size,
            mantissa_location: 0,
            mantissa_size,
            exponent_bias,
        },
    };
    Ok(match dtype {
        DType::Bool => EnumTypeBuilder::with_base(hdf5_pure::make_i8_type())
            .value("FALSE", 0)
            .value("TRUE", 1)
            .build()
            .map_err(|e| format!("cannot build the bool type: {e}"))?,
        DType::U8 => hdf5_pure::make_u8_type(),
        DType::I8 => hdf5_pure::make_i8_type(),
        DType::I16 => hdf5_pure::make_i16_type(),
        DType::I32 => hdf5_pure::make_i32_type(),
        DType::I64 => hdf5_pure::make_i64_type(),
        DType::F16 => float(2, 10, 5, 10, 15),
        DType::BF16 => float(2, 7, 8, 7, 127),
        DType::F32 => hdf5_pure::make_f32_type(),
        DType::F64 => hdf5_pure::make_f64_type(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_its_hdf5_type() {
        for d in DType::ALL {
            let dt = hdf5_type(d).unwrap();
            assert_eq!(source_type(&dt).unwrap(), SourceType { element: Element::Gear(d), big_endian: false }, "{d:?}");
        }
    }

    #[test]
    fn only_lossless_conversions() {
        assert_eq!(
            conversion(Element::Gear(DType::Bool), DType::U8),
            Some(Conversion::Widen { from: Element::Gear(DType::Bool), to: DType::U8 })
        );
        assert_eq!(conversion(Element::Gear(DType::F64), DType::F32), None);
        assert_eq!(conversion(Element::Gear(DType::U8), DType::Bool), None);
        assert_eq!(conversion(Element::Gear(DType::I32), DType::F32), None);
        assert_eq!(conversion(Element::U64, DType::I64), None);
        let mut out = Vec::new();
        widen(&[0xff, 0x7f, 0x00, 0x80], Element::Gear(DType::I16), DType::I32, &mut out);
        assert_eq!(out, [0xff, 0x7f, 0, 0, 0x00, 0x80, 0xff, 0xff]);
        out.clear();
        widen(&1.5f32.to_le_bytes(), Element::Gear(DType::F32), DType::F64, &mut out);
        assert_eq!(out, 1.5f64.to_le_bytes());
        out.clear();
        widen(&[1, 0], Element::Gear(DType::Bool), DType::F32, &mut out);
        assert_eq!(out, [1f32.to_le_bytes(), 0f32.to_le_bytes()].concat());
    }
}
