//! Element types of table columns.

use crate::error::{Error, Result};

/// The element type of a column. Every type has a fixed byte size; `bool` is
/// stored as one byte (0 or 1), `f16`/`bf16` as their raw 16-bit patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// One byte, 0 or 1.
    Bool = 0,
    /// Unsigned 8-bit integer.
    U8 = 1,
    /// Signed 8-bit integer.
    I8 = 2,
    /// Signed 16-bit integer.
    I16 = 3,
    /// Signed 32-bit integer.
    I32 = 4,
    /// Signed 64-bit integer.
    I64 = 5,
    /// IEEE half precision, raw bits.
    F16 = 6,
    /// bfloat16, raw bits.
    BF16 = 7,
    /// IEEE single precision.
    F32 = 8,
    /// IEEE double precision.
    F64 = 9,
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 10] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> u64 {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The lowercase name used in configs, the CLI and error messages.
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// NumPy's name of the dtype (`float32`, `uint8`; `bfloat16` as
    /// `ml_dtypes` names it), which configs and Python accept as well.
    pub const fn long_name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    /// Parses a name as printed by [`DType::name`] (`f32`) or NumPy's
    /// name of it, [`DType::long_name`] (`float32`).
    pub fn from_name(name: &str) -> Result<Self> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == name || d.long_name() == name)
            .ok_or_else(|| Error::UnknownDType(name.to_owned()))
    }

    /// The stable one-byte code stored in region headers.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Decodes a header code.
    pub fn from_code(code: u8) -> Result<Self> {
        DType::ALL.get(usize::from(code)).copied().ok_or_else(|| Error::Decode(format!("unknown dtype code {code}")))
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust element type that maps to exactly one [`DType`]; lets typed step
/// data carry its dtype so a mismatch against the spec is caught.
///
/// The trait is sealed: it is implemented for `bool`, `u8`, `i8`, `i16`,
/// `i32`, `i64`, `f32` and `f64` and cannot be implemented outside this
/// crate, because [`as_bytes`] and the typed views of batches rely on every
/// implementor being a primitive with no padding bytes whose every bit
/// pattern is valid (`bool` excepted: views of `bool` columns check that
/// each byte is 0 or 1 first). A padded struct would make those views read
/// uninitialised bytes from safe code.
///
/// ```compile_fail
/// #[derive(Clone, Copy)]
/// struct Padded(u8, u32);
/// impl gear_core::Element for Padded {
///     const DTYPE: gear_core::DType = gear_core::DType::I64;
/// }
/// ```
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The column dtype this Rust type stores as.
    const DTYPE: DType;
}

mod sealed {
    /// Keeps [`super::Element`] to the primitives listed in its doc.
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl sealed::Sealed for $t {} impl Element for $t { const DTYPE: DType = DType::$d; })*
    };
}
element!(bool => Bool, u8 => U8, i8 => I8, i16 => I16, i32 => I32, i64 => I64, f32 => F32, f64 => F64);

/// Views bytes as elements of `T` when the address is aligned to `T` and
/// the length a multiple of its size; `None` otherwise, and for `bool` when
/// any byte is neither 0 nor 1.
pub fn from_bytes<T: Element>(bytes: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) || !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return None;
    }
    if T::DTYPE == DType::Bool && bytes.iter().any(|&b| b > 1) {
        return None;
    }
    // SAFETY: alignment and length were checked above; `T: Element` is one
    // of the sealed primitives, for which every bit pattern is a valid value
    // except for `bool`, whose bytes were just checked to be 0 or 1.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
}

/// Views a slice of plain elements as bytes.
pub fn as_bytes<T: Element>(values: &[T]) -> &[u8] {
    // SAFETY: every `Element` is a primitive with no padding and no invalid
    // byte patterns when read as `u8`; the length is the slice's byte size.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()).unwrap(), d);
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
            assert_eq!(DType::from_name(d.long_name()).unwrap(), d, "NumPy's name is accepted too");
        }
        assert_eq!(DType::from_name("float32").unwrap(), DType::F32);
        assert!(DType::from_code(10).is_err());
        assert!(matches!(DType::from_name("f8"), Err(Error::UnknownDType(n)) if n == "f8"));
    }

    #[test]
    fn typed_views_check_alignment_length_and_bools() {
        let words = [0i64; 4];
        let bytes = as_bytes(&words);
        assert_eq!(from_bytes::<f32>(bytes).unwrap().len(), 8);
        assert!(from_bytes::<f32>(&bytes[1..5]).is_none(), "misaligned");
        assert!(from_bytes::<f64>(&bytes[..12]).is_none(), "not a multiple of 8 bytes");
        assert_eq!(from_bytes::<bool>(&[0, 1, 1]).unwrap(), &[false, true, true]);
        assert!(from_bytes::<bool>(&[0, 2]).is_none(), "2 is not a bool");
    }

    #[test]
    fn element_sizes_match_dtypes() {
        assert_eq!(std::mem::size_of::<bool>() as u64, bool::DTYPE.size());
        assert_eq!(std::mem::size_of::<i16>() as u64, i16::DTYPE.size());
        assert_eq!(std::mem::size_of::<f64>() as u64, f64::DTYPE.size());
    }
}
