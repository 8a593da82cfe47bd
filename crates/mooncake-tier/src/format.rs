//! The on-disk formats, little-endian, versioned and checksummed (crc32c).
//!
//! **Bucket layout.** A bucket is two files. `b<id:016x>.bucket` holds the
//! values back to back; a value of [`VALUE_ALIGN_MIN`] bytes or more starts at a
//! [`DIO_ALIGN`] boundary so it can be read with `O_DIRECT` straight into an
//! aligned buffer, smaller ones are packed at 8-byte boundaries, and the file
//! is zero-padded to a multiple of [`DIO_ALIGN`]. `b<id:016x>.meta` is the
//! commit record, written only after the data is durable and renamed into
//! place atomically:
//!
//! ```text
//! header  magic "MCTIERBM" | version u16 | flags u16 | entry_count u32
//!         | bucket_id u64 | data_len u64 | body_len u32 | reserved u32   (40 bytes)
//! entry   key_len u32 | value_crc u32 | offset u64 | len u64 | tag u64 | key   (32 + key_len)
//! trailer crc32c of everything before it (u32)
//! ```
//!
//! **File-per-key layout.** One file per object: a header, the key, the value
//! at `value_offset` (a [`DIO_ALIGN`] boundary), no padding after it:
//!
//! ```text
//! magic "MCTIEROF" | version u16 | flags u16 | key_len u32 | value_len u64 | tag u64
//! | seq u64 | value_offset u32 | value_crc u32 | header_crc u32 | reserved u32 | key
//! ```
//!
//! `header_crc` covers the 48 bytes before it and the key. `tag` is the
//! caller's version of the object (kept so a restarted tier can prove which
//! put its copy belongs to); `seq` orders file-per-key objects for fifo.
//!
//! The `decode_*` functions never panic and never allocate more than the input
//! they are given; fuzz targets call them on arbitrary bytes.

use std::fmt;

/// Offset, length and memory alignment of `O_DIRECT` I/O (any logical block
/// size up to 4 KiB divides it).
pub const DIO_ALIGN: usize = 4096;
/// Values at least this large start on a [`DIO_ALIGN`] boundary.
pub const VALUE_ALIGN_MIN: u64 = 64 << 10;
/// Longest key either layout stores.
pub const MAX_KEY_LEN: usize = 64 << 10;

pub const BUCKET_META_MAGIC: [u8; 8] = *b"MCTIERBM";
pub const OBJECT_FILE_MAGIC: [u8; 8] = *b"MCTIEROF";
pub const FORMAT_VERSION: u16 = 1;

const META_HEADER_LEN: usize = 40;
const META_ENTRY_FIXED: usize = 32;
const OBJECT_HEADER_FIXED: usize = 56;

/// Why bytes did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// Fewer bytes than the structure needs; `need` is the total it needs.
    Truncated {
        need: usize,
    },
    BadMagic,
    UnsupportedVersion(u16),
    Checksum,
    Invalid(&'static str),
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Truncated { need } => write!(f, "truncated (needs {need} bytes)"),
            FormatError::BadMagic => write!(f, "bad magic"),
            FormatError::UnsupportedVersion(v) => write!(f, "unsupported format version {v}"),
            FormatError::Checksum => write!(f, "checksum mismatch"),
            FormatError::Invalid(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for FormatError {}

pub fn align_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Where a value of `len` bytes starts when appended at `end`.
pub fn value_start(end: u64, len: u64) -> u64 {
    if len >= VALUE_ALIGN_MIN {
        align_up(end, DIO_ALIGN as u64)
    } else {
        align_up(end, 8)
    }
}

/// One object of a bucket, as its metadata file records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaEntry {
    pub key: String,
    pub offset: u64,
    pub len: u64,
    pub crc: u32,
    pub tag: u64,
}

/// A bucket's metadata file, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketMeta {
    pub bucket_id: u64,
    /// Bytes of the data file this metadata covers (a multiple of [`DIO_ALIGN`]).
    pub data_len: u64,
    /// In file order: increasing, non-overlapping offsets.
    pub entries: Vec<MetaEntry>,
}

pub fn encode_bucket_meta(meta: &BucketMeta) -> Vec<u8> {
    let body_len: usize = meta
        .entries
        .iter()
        .map(|e| META_ENTRY_FIXED + e.key.len())
        .sum();
    let mut out = Vec::with_capacity(META_HEADER_LEN + body_len + 4);
    out.extend_from_slice(&BUCKET_META_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(meta.entries.len() as u32).to_le_bytes());
    out.extend_from_slice(&meta.bucket_id.to_le_bytes());
    out.extend_from_slice(&meta.data_len.to_le_bytes());
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for e in &meta.entries {
        out.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&e.crc.to_le_bytes());
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.len.to_le_bytes());
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(e.key.as_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A cursor that reads little-endian fields or reports truncation.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(FormatError::Invalid("length overflow"))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(FormatError::Truncated { need: end })?;
        self.pos = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

fn key_from(bytes: &[u8]) -> Result<String, FormatError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| FormatError::Invalid("key is not UTF-8"))
}

/// Decodes a bucket metadata file. Checks the magic, version, checksum, that
/// the entry count fits the bytes, and that every entry lies inside
/// `data_len` in increasing, non-overlapping order.
pub fn decode_bucket_meta(bytes: &[u8]) -> Result<BucketMeta, FormatError> {
    if bytes.len() < 8 || bytes[..8] != BUCKET_META_MAGIC {
        return Err(if bytes.len() < 8 {
            FormatError::Truncated { need: 8 }
        } else {
            FormatError::BadMagic
        });
    }
    let mut r = Reader { buf: bytes, pos: 8 };
    let version = r.u16()?;
    if version != FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion(version));
    }
    let _flags = r.u16()?;
    let count = r.u32()? as usize;
    let bucket_id = r.u64()?;
    let data_len = r.u64()?;
    let body_len = r.u32()? as usize;
    let _reserved = r.u32()?;
    let total = META_HEADER_LEN + body_len + 4;
    if bytes.len() < total {
        return Err(FormatError::Truncated { need: total });
    }
    if bytes.len() > total {
        return Err(FormatError::Invalid("trailing bytes after the checksum"));
    }
    let stored = u32::from_le_bytes(bytes[total - 4..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&bytes[..total - 4]) != stored {
        return Err(FormatError::Checksum);
    }
    if count > body_len / META_ENTRY_FIXED {
        return Err(FormatError::Invalid("entry count exceeds the body"));
    }
    if !data_len.is_multiple_of(DIO_ALIGN as u64) {
        return Err(FormatError::Invalid("data length is not block aligned"));
    }
    let mut r = Reader {
        buf: &bytes[..total - 4],
        pos: META_HEADER_LEN,
    };
    let mut entries = Vec::with_capacity(count);
    let mut end = 0u64;
    for _ in 0..count {
        let key_len = r.u32()? as usize;
        let crc = r.u32()?;
        let offset = r.u64()?;
        let len = r.u64()?;
        let tag = r.u64()?;
        if key_len > MAX_KEY_LEN {
            return Err(FormatError::Invalid("key too long"));
        }
        let key = key_from(r.take(key_len)?)?;
        let stop = offset
            .checked_add(len)
            .ok_or(FormatError::Invalid("entry overflows"))?;
        if offset < end || stop > data_len {
            return Err(FormatError::Invalid(
                "entry out of order or outside the data",
            ));
        }
        end = stop;
        entries.push(MetaEntry {
            key,
            offset,
            len,
            crc,
            tag,
        });
    }
    if r.pos != r.buf.len() {
        return Err(FormatError::Invalid(
            "body length does not match its entries",
        ));
    }
    Ok(BucketMeta {
        bucket_id,
        data_len,
        entries,
    })
}

/// The header of a file-per-key object file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectHeader {
    pub key: String,
    pub value_len: u64,
    pub tag: u64,
    pub seq: u64,
    /// Where the value starts in the file (a [`DIO_ALIGN`] boundary).
    pub value_offset: u64,
    pub value_crc: u32,
}

impl ObjectHeader {
    /// The bytes before the value: header, key, zero padding.
    pub fn value_offset_for(key_len: usize) -> u64 {
        align_up((OBJECT_HEADER_FIXED + key_len) as u64, DIO_ALIGN as u64)
    }
}

/// The header bytes (without padding) of an object file.
pub fn encode_object_header(h: &ObjectHeader) -> Vec<u8> {
    let mut out = Vec::with_capacity(OBJECT_HEADER_FIXED + h.key.len());
    out.extend_from_slice(&OBJECT_FILE_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(h.key.len() as u32).to_le_bytes());
    out.extend_from_slice(&h.value_len.to_le_bytes());
    out.extend_from_slice(&h.tag.to_le_bytes());
    out.extend_from_slice(&h.seq.to_le_bytes());
    out.extend_from_slice(&(h.value_offset as u32).to_le_bytes());
    out.extend_from_slice(&h.value_crc.to_le_bytes());
    let mut crc = crc32c::crc32c(&out);
    crc = crc32c::crc32c_append(crc, h.key.as_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(h.key.as_bytes());
    out
}

/// Decodes the start of an object file. `Truncated { need }` asks for more
/// bytes (at most `56 + MAX_KEY_LEN`).
pub fn decode_object_header(bytes: &[u8]) -> Result<ObjectHeader, FormatError> {
    if bytes.len() < 8 {
        return Err(FormatError::Truncated { need: 8 });
    }
    if bytes[..8] != OBJECT_FILE_MAGIC {
        return Err(FormatError::BadMagic);
    }
    let mut r = Reader { buf: bytes, pos: 8 };
    let version = r.u16()?;
    if version != FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion(version));
    }
    let _flags = r.u16()?;
    let key_len = r.u32()? as usize;
    if key_len > MAX_KEY_LEN {
        return Err(FormatError::Invalid("key too long"));
    }
    let value_len = r.u64()?;
    let tag = r.u64()?;
    let seq = r.u64()?;
    let value_offset = r.u32()? as u64;
    let value_crc = r.u32()?;
    let header_crc = r.u32()?;
    let _reserved = r.u32()?;
    let key = r.take(key_len)?;
    let mut crc = crc32c::crc32c(&bytes[..48]);
    crc = crc32c::crc32c_append(crc, key);
    if crc != header_crc {
        return Err(FormatError::Checksum);
    }
    if value_offset != ObjectHeader::value_offset_for(key_len) {
        return Err(FormatError::Invalid("value offset does not follow the key"));
    }
    Ok(ObjectHeader {
        key: key_from(key)?,
        value_len,
        tag,
        seq,
        value_offset,
        value_crc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_meta() -> BucketMeta {
        BucketMeta {
            bucket_id: 7,
            data_len: 3 * DIO_ALIGN as u64,
            entries: vec![
                MetaEntry {
                    key: "a".into(),
                    offset: 0,
                    len: 10,
                    crc: 1,
                    tag: 9,
                },
                MetaEntry {
                    key: "ключ".into(),
                    offset: 16,
                    len: 0,
                    crc: 0,
                    tag: 0,
                },
                MetaEntry {
                    key: String::new(),
                    offset: 4096,
                    len: 8192,
                    crc: 0xdead_beef,
                    tag: u64::MAX,
                },
            ],
        }
    }

    #[test]
    fn bucket_meta_round_trips() {
        let m = sample_meta();
        assert_eq!(decode_bucket_meta(&encode_bucket_meta(&m)).unwrap(), m);
        let empty = BucketMeta {
            bucket_id: 1,
            data_len: 0,
            entries: vec![],
        };
        assert_eq!(
            decode_bucket_meta(&encode_bucket_meta(&empty)).unwrap(),
            empty
        );
    }

    #[test]
    fn bucket_meta_rejects_damage() {
        let bytes = encode_bucket_meta(&sample_meta());
        for cut in 0..bytes.len() {
            assert!(decode_bucket_meta(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert!(decode_bucket_meta(&b).is_err(), "flip at {i}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_bucket_meta(&longer).is_err());
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert_eq!(
            decode_bucket_meta(&v2),
            Err(FormatError::UnsupportedVersion(2))
        );
    }

    /// Re-seals the checksum so only the structural checks can reject.
    fn reseal(mut b: Vec<u8>) -> Vec<u8> {
        let n = b.len() - 4;
        let crc = crc32c::crc32c(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn bucket_meta_structural_checks_hold_with_a_valid_checksum() {
        let bytes = encode_bucket_meta(&sample_meta());
        // entry_count claims more entries than the body can hold.
        let mut b = bytes.clone();
        b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_bucket_meta(&reseal(b)).is_err());
        // data_len smaller than the last entry's end.
        let mut b = bytes.clone();
        b[24..32].copy_from_slice(&(4096u64).to_le_bytes());
        assert!(decode_bucket_meta(&reseal(b)).is_err());
        // First entry's offset moved past the second's.
        let mut b = bytes.clone();
        b[48..56].copy_from_slice(&(100u64).to_le_bytes());
        assert!(decode_bucket_meta(&reseal(b)).is_err());
        // Offset + len overflows.
        let mut b = bytes;
        b[56..64].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_bucket_meta(&reseal(b)).is_err());
    }

    #[test]
    fn object_header_round_trips_and_rejects_damage() {
        let h = ObjectHeader {
            key: "some/key".into(),
            value_len: 12345,
            tag: 3,
            seq: 44,
            value_offset: ObjectHeader::value_offset_for(8),
            value_crc: 0x1234_5678,
        };
        let bytes = encode_object_header(&h);
        assert_eq!(decode_object_header(&bytes).unwrap(), h);
        for cut in 0..bytes.len() {
            assert!(decode_object_header(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            decode_object_header(&bytes[..20]),
            Err(FormatError::Truncated { need: 24 })
        );
        for i in 0..bytes.len() {
            if (52..56).contains(&i) {
                continue; // reserved
            }
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert!(decode_object_header(&b).is_err(), "flip at {i}");
        }
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_bucket_meta(&bytes);
            let _ = decode_object_header(&bytes);
            let mut with_magic = BUCKET_META_MAGIC.to_vec();
            with_magic.extend_from_slice(&bytes);
            let _ = decode_bucket_meta(&with_magic);
            let mut with_magic = OBJECT_FILE_MAGIC.to_vec();
            with_magic.extend_from_slice(&bytes);
            let _ = decode_object_header(&with_magic);
        }

        #[test]
        fn meta_round_trips(keys in proptest::collection::vec("[a-z0-9/_-]{0,40}", 0..20),
                            lens in proptest::collection::vec(0u64..200_000, 20)) {
            let mut end = 0;
            let entries: Vec<MetaEntry> = keys.iter().zip(&lens).map(|(k, &len)| {
                let offset = value_start(end, len);
                end = offset + len;
                MetaEntry { key: k.clone(), offset, len, crc: len as u32, tag: len }
            }).collect();
            let m = BucketMeta { bucket_id: 5, data_len: align_up(end, DIO_ALIGN as u64), entries };
            prop_assert_eq!(decode_bucket_meta(&encode_bucket_meta(&m)).unwrap(), m);
        }
    }
}
