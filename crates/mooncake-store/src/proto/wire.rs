//! A compact, strict binary encoding for the master RPC messages.
//!
//! Unsigned integers are LEB128 varints, signed ones zigzag varints, `u128`
//! is 16 bytes little-endian, strings and sequences carry a varint length.
//! Decoding never trusts a length: a sequence may not claim more elements
//! than there are bytes left, strings must be UTF-8, booleans must be 0 or 1,
//! enum tags must be known, and a varint may not overflow its type.
//!
//! Memory follows the bytes: a sequence reserves room for at most
//! [`PREALLOC_BYTES`] before its elements decode, and holds at most
//! [`MAX_SEQUENCE_LEN`] elements (a batch's keys or results), so a frame of
//! one-byte elements cannot buy more than a bounded multiple of its size.
//! Encoding inside [`encode_frame`](super::frame::encode_frame) stops once
//! the frame limit is passed, so an oversized answer is never built whole.

use std::cell::Cell;

use std::fmt;

use mooncake_common::{Error, ErrorCode};

/// Why a byte string is not a valid message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ended in the middle of a value.
    Truncated,
    /// A varint does not fit its type.
    Overflow,
    /// A tag (enum variant, bool, option) that no value uses.
    BadTag { what: &'static str, tag: u64 },
    /// A string that is not UTF-8.
    BadUtf8,
    /// A length larger than the rest of the input could hold.
    BadLength(u64),
    /// Bytes left over after the message.
    TrailingBytes(usize),
    /// A protocol version this build does not speak.
    BadVersion(u8),
    /// A sequence of more than [`MAX_SEQUENCE_LEN`] elements.
    TooMany(u64),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "truncated message"),
            DecodeError::Overflow => write!(f, "integer overflow"),
            DecodeError::BadTag { what, tag } => write!(f, "unknown {what} tag {tag}"),
            DecodeError::BadUtf8 => write!(f, "string is not UTF-8"),
            DecodeError::BadLength(n) => write!(f, "length {n} exceeds the message"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} trailing bytes"),
            DecodeError::BadVersion(v) => write!(f, "unsupported protocol version {v}"),
            DecodeError::TooMany(n) => write!(
                f,
                "sequence of {n} elements exceeds the limit of {MAX_SEQUENCE_LEN}"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        let code = match e {
            DecodeError::BadVersion(_) => ErrorCode::INVALID_VERSION,
            _ => ErrorCode::DESERIALIZE_FAIL,
        };
        Error::new(code, e.to_string())
    }
}

/// Most elements of one sequence (keys of a batch call, its results).
pub const MAX_SEQUENCE_LEN: usize = 1 << 20;

/// Most memory a sequence reserves before its elements have decoded; past
/// it the vector grows with what really arrived.
pub const PREALLOC_BYTES: usize = 64 << 10;

thread_local! {
    /// Output length past which sequences stop encoding (see
    /// [`EncodeLimit`]); unlimited outside `encode_frame`.
    static ENCODE_LIMIT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// While alive, sequences encoded on this thread stop adding elements once
/// the output is longer than `limit`: the caller refuses such an output,
/// so building the rest would only cost memory. Restores the previous
/// limit on drop.
pub(crate) struct EncodeLimit(usize);

impl EncodeLimit {
    pub(crate) fn new(limit: usize) -> EncodeLimit {
        EncodeLimit(ENCODE_LIMIT.with(|l| l.replace(limit)))
    }
}

impl Drop for EncodeLimit {
    fn drop(&mut self) {
        ENCODE_LIMIT.with(|l| l.set(self.0));
    }
}

/// A cursor over a message being decoded.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        let (&b, rest) = self.buf.split_first().ok_or(DecodeError::Truncated)?;
        self.buf = rest;
        Ok(b)
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            let bits = u64::from(b & 0x7f);
            // The tenth byte may only carry the top bit of a u64.
            if shift == 63 && bits > 1 {
                return Err(DecodeError::Overflow);
            }
            value |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::Overflow)
    }

    /// A length prefix for `min_item_bytes`-sized items, checked against the input left.
    pub fn len(&mut self, min_item_bytes: usize) -> Result<usize, DecodeError> {
        let n = self.varint()?;
        let max = (self.buf.len() / min_item_bytes.max(1)) as u64;
        if n > max {
            return Err(DecodeError::BadLength(n));
        }
        Ok(n as usize)
    }

    /// Reads a string without copying it.
    pub fn str(&mut self) -> Result<&'a str, DecodeError> {
        let n = self.len(1)?;
        std::str::from_utf8(self.bytes(n)?).map_err(|_| DecodeError::BadUtf8)
    }
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// A value with a wire form.
pub trait Encode {
    fn encode(&self, out: &mut Vec<u8>);

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

/// A value that can be read back, possibly borrowing from the input (`&'de str`).
pub trait Decode<'de>: Sized {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError>;

    /// Decodes a whole buffer, rejecting trailing bytes.
    fn from_bytes(buf: &'de [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(buf);
        let v = Self::decode(&mut r)?;
        r.finish()?;
        Ok(v)
    }
}

impl Encode for u8 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self);
    }
}

impl<'de> Decode<'de> for u8 {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        r.u8()
    }
}

impl Encode for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
}

impl<'de> Decode<'de> for bool {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            t => Err(DecodeError::BadTag {
                what: "bool",
                tag: t.into(),
            }),
        }
    }
}

impl Encode for u64 {
    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, *self);
    }
}

impl<'de> Decode<'de> for u64 {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        r.varint()
    }
}

impl Encode for u32 {
    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, u64::from(*self));
    }
}

impl<'de> Decode<'de> for u32 {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        u32::try_from(r.varint()?).map_err(|_| DecodeError::Overflow)
    }
}

impl Encode for usize {
    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, *self as u64);
    }
}

impl<'de> Decode<'de> for usize {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        usize::try_from(r.varint()?).map_err(|_| DecodeError::Overflow)
    }
}

impl Encode for i32 {
    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, u64::from(((*self << 1) ^ (*self >> 31)) as u32));
    }
}

impl<'de> Decode<'de> for i32 {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let z = u32::try_from(r.varint()?).map_err(|_| DecodeError::Overflow)?;
        Ok(((z >> 1) as i32) ^ -((z & 1) as i32))
    }
}

impl Encode for u128 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl<'de> Decode<'de> for u128 {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let b = r.bytes(16)?;
        Ok(u128::from_le_bytes(b.try_into().expect("16 bytes")))
    }
}

impl Encode for String {
    fn encode(&self, out: &mut Vec<u8>) {
        put_str(out, self);
    }
}

impl<'de> Decode<'de> for String {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        r.str().map(str::to_owned)
    }
}

impl Encode for str {
    fn encode(&self, out: &mut Vec<u8>) {
        put_str(out, self);
    }
}

impl<'de> Decode<'de> for &'de str {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        r.str()
    }
}

impl<T: Encode> Encode for [T] {
    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.len() as u64);
        let limit = ENCODE_LIMIT.with(Cell::get);
        for it in self {
            if out.len() > limit {
                return;
            }
            it.encode(out);
        }
    }
}

impl<T: Encode> Encode for Vec<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        self.as_slice().encode(out);
    }
}

impl<'de, T: Decode<'de>> Decode<'de> for Vec<T> {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        // Every element takes at least one byte, so the count is checked
        // against the bytes left; the reservation is also bounded in bytes,
        // since an element may take more memory than its encoding.
        let n = r.len(1)?;
        if n > MAX_SEQUENCE_LEN {
            return Err(DecodeError::TooMany(n as u64));
        }
        let mut v = Vec::with_capacity(n.min(PREALLOC_BYTES / std::mem::size_of::<T>().max(1)));
        for _ in 0..n {
            v.push(T::decode(r)?);
        }
        Ok(v)
    }
}

impl<T: Encode + ?Sized> Encode for &T {
    fn encode(&self, out: &mut Vec<u8>) {
        (**self).encode(out);
    }
}

impl<T: Encode> Encode for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.encode(out);
            }
        }
    }
}

impl<'de, T: Decode<'de>> Decode<'de> for Option<T> {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(None),
            1 => Ok(Some(T::decode(r)?)),
            t => Err(DecodeError::BadTag {
                what: "option",
                tag: t.into(),
            }),
        }
    }
}

impl Encode for Error {
    fn encode(&self, out: &mut Vec<u8>) {
        self.code.wire().encode(out);
        put_str(out, &self.context);
    }
}

impl<'de> Decode<'de> for Error {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let num = i32::decode(r)?;
        // OK is not an error, and numbers we do not know are not ours.
        let code = match ErrorCode::from_wire(num) {
            Some(code) if code != ErrorCode::OK => code,
            _ => {
                return Err(DecodeError::BadTag {
                    what: "error code",
                    tag: num as u32 as u64,
                })
            }
        };
        Ok(Error::new(code, String::decode(r)?))
    }
}

impl<T: Encode> Encode for Result<T, Error> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Ok(v) => {
                out.push(0);
                v.encode(out);
            }
            Err(e) => {
                out.push(1);
                e.encode(out);
            }
        }
    }
}

impl<'de, T: Decode<'de>> Decode<'de> for Result<T, Error> {
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(Ok(T::decode(r)?)),
            1 => Ok(Err(Error::decode(r)?)),
            t => Err(DecodeError::BadTag {
                what: "result",
                tag: t.into(),
            }),
        }
    }
}

impl Encode for () {
    fn encode(&self, _: &mut Vec<u8>) {}
}

impl<'de> Decode<'de> for () {
    fn decode(_: &mut Reader<'de>) -> Result<Self, DecodeError> {
        Ok(())
    }
}

/// Implements [`Encode`] and [`Decode`] for a struct by encoding its fields
/// in order. A field decoded by a function of its own rather than by its
/// type's `Decode` names it: `field = decode_fn`.
macro_rules! wire_struct {
    ($ty:ident { $($field:ident $(= $dec:path)?),* $(,)? }) => {
        impl $crate::proto::wire::Encode for $ty {
            fn encode(&self, out: &mut Vec<u8>) {
                $( $crate::proto::wire::Encode::encode(&self.$field, out); )*
            }
        }
        impl<'de> $crate::proto::wire::Decode<'de> for $ty {
            fn decode(
                r: &mut $crate::proto::wire::Reader<'de>,
            ) -> Result<Self, $crate::proto::wire::DecodeError> {
                Ok($ty { $( $field: $crate::proto::wire::wire_field!(r $($dec)?), )* })
            }
        }
    };
}

/// Decodes one field: by its type's `Decode`, or by the function named.
macro_rules! wire_field {
    ($r:ident) => {
        $crate::proto::wire::Decode::decode($r)?
    };
    ($r:ident $dec:path) => {
        $dec($r)?
    };
}

/// Implements [`Encode`] and [`Decode`] for an enum defined elsewhere: a
/// tag byte, then the variant's fields in order. A variant is one of
/// `tag => Name { field, .. }`, `tag => Name {}` (no fields),
/// `tag => Name(field)` (one unnamed field), or
/// `tag => Name(Inner::Variant { field, .. })`, which flattens the
/// variants of a wrapped enum into this one's tags. Fields take
/// `= decode_fn` as in [`wire_struct!`]. `what` names the enum in a
/// `BadTag` error.
macro_rules! wire_tagged {
    ($ty:ident as $what:literal { $( $tag:literal => $var:ident $body:tt ),* $(,)? }) => {
        impl $crate::proto::wire::Encode for $ty {
            fn encode(&self, out: &mut Vec<u8>) {
                match self {
                    $( $crate::proto::wire::wire_tagged!(@pat $ty $var $body) => {
                        out.push($tag);
                        $crate::proto::wire::wire_tagged!(@encode out $body);
                    } )*
                }
            }
        }
        impl<'de> $crate::proto::wire::Decode<'de> for $ty {
            fn decode(
                r: &mut $crate::proto::wire::Reader<'de>,
            ) -> Result<Self, $crate::proto::wire::DecodeError> {
                Ok(match r.u8()? {
                    $( $tag => $crate::proto::wire::wire_tagged!(@decode r $ty $var $body), )*
                    t => {
                        return Err($crate::proto::wire::DecodeError::BadTag {
                            what: $what,
                            tag: t.into(),
                        })
                    }
                })
            }
        }
    };
    (@pat $ty:ident $var:ident {}) => { $ty::$var };
    (@pat $ty:ident $var:ident { $($f:ident $(= $dec:path)?),* $(,)? }) => {
        $ty::$var { $($f),* }
    };
    (@pat $ty:ident $var:ident ($f:ident)) => { $ty::$var($f) };
    (@pat $ty:ident $var:ident ($inner:ident :: $ivar:ident $body:tt)) => {
        $ty::$var($crate::proto::wire::wire_tagged!(@pat $inner $ivar $body))
    };
    (@encode $out:ident { $($f:ident $(= $dec:path)?),* $(,)? }) => {
        $( $crate::proto::wire::Encode::encode($f, $out); )*
    };
    (@encode $out:ident ($f:ident)) => { $crate::proto::wire::Encode::encode($f, $out) };
    (@encode $out:ident ($inner:ident :: $ivar:ident $body:tt)) => {
        $crate::proto::wire::wire_tagged!(@encode $out $body)
    };
    (@decode $r:ident $ty:ident $var:ident {}) => { $ty::$var };
    (@decode $r:ident $ty:ident $var:ident { $($f:ident $(= $dec:path)?),* $(,)? }) => {
        $ty::$var { $( $f: $crate::proto::wire::wire_field!($r $($dec)?) ),* }
    };
    (@decode $r:ident $ty:ident $var:ident ($f:ident)) => {
        $ty::$var($crate::proto::wire::Decode::decode($r)?)
    };
    (@decode $r:ident $ty:ident $var:ident ($inner:ident :: $ivar:ident $body:tt)) => {
        $ty::$var($crate::proto::wire::wire_tagged!(@decode $r $inner $ivar $body))
    };
}
pub(crate) use {wire_field, wire_struct, wire_tagged};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_edges() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ] {
            assert_eq!(u64::from_bytes(&v.to_bytes()).unwrap(), v);
        }
        // 11 continuation bytes, and a tenth byte with too many bits.
        assert_eq!(u64::from_bytes(&[0xff; 11]), Err(DecodeError::Overflow));
        let mut too_big = vec![0xff; 9];
        too_big.push(0x02);
        assert_eq!(u64::from_bytes(&too_big), Err(DecodeError::Overflow));
        assert_eq!(
            u32::from_bytes(&(u64::from(u32::MAX) + 1).to_bytes()),
            Err(DecodeError::Overflow)
        );
        assert_eq!(u64::from_bytes(&[0x80]), Err(DecodeError::Truncated));
    }

    #[test]
    fn signed_round_trip() {
        for v in [0i32, -1, 1, -704, i32::MIN, i32::MAX] {
            assert_eq!(i32::from_bytes(&v.to_bytes()).unwrap(), v);
        }
    }

    #[test]
    fn strict_scalars_and_lengths() {
        assert!(matches!(
            bool::from_bytes(&[2]),
            Err(DecodeError::BadTag { .. })
        ));
        assert!(matches!(
            Option::<u8>::from_bytes(&[7, 0]),
            Err(DecodeError::BadTag { .. })
        ));
        assert_eq!(
            String::from_bytes(&[2, 0xff, 0xfe]),
            Err(DecodeError::BadUtf8)
        );
        // A vector claiming a billion elements in a 6-byte message.
        let mut huge = Vec::new();
        put_varint(&mut huge, 1 << 30);
        huge.push(0);
        assert_eq!(
            Vec::<u8>::from_bytes(&huge),
            Err(DecodeError::BadLength(1 << 30))
        );
        assert_eq!(u8::from_bytes(&[1, 2]), Err(DecodeError::TrailingBytes(1)));
    }

    #[test]
    fn errors_keep_their_code() {
        let r: Result<u64, Error> = Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "k"));
        assert_eq!(Result::<u64, Error>::from_bytes(&r.to_bytes()).unwrap(), r);
        // OK (0) and unknown numbers are not error codes.
        let mut bad = vec![1];
        0i32.encode(&mut bad);
        put_str(&mut bad, "");
        assert!(Result::<u64, Error>::from_bytes(&bad).is_err());
        let mut bad = vec![1];
        (-12345i32).encode(&mut bad);
        put_str(&mut bad, "");
        assert!(Result::<u64, Error>::from_bytes(&bad).is_err());
    }
}
