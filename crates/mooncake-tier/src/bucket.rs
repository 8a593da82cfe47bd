//! The bucket layout's writer: objects are staged into an open bucket whose
//! data file is written in large aligned sequential chunks as it fills; a
//! seal pads the last chunk, `fdatasync`s the data and commits the metadata
//! file atomically. Only then are the bucket's objects durable.
//!
//! A bucket is sealed when the next object would pass the size or key limit,
//! or whenever the caller asks ([`BucketWriter::seal`]): a partly filled bucket
//! is as good as a full one, so an acknowledged object never waits for
//! strangers to fill its bucket. Callers group-commit by staging everything
//! pending and sealing once.

use super::format::{
    align_up, encode_bucket_meta, value_start, BucketMeta, MetaEntry, DIO_ALIGN, MAX_KEY_LEN,
};
use super::io::{commit_file, on_disk, temp_path, AlignedBuf, DiskFile, IoEngine, SeqWriter};
use super::{Result, TierError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes staged in memory before they go to the data file in one write.
pub const DEFAULT_CHUNK: usize = 8 << 20;
/// Chunk buffers per open bucket: one fills while the others are written.
pub const DEFAULT_DEPTH: usize = 3;

/// What a file in the tier directory is, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Data,
    Meta,
    /// A metadata commit that never reached its rename.
    MetaTemp,
}

pub fn data_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("b{id:016x}.bucket"))
}

pub fn meta_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("b{id:016x}.meta"))
}

/// `b<16 hex>.bucket`, `.meta` or `.meta.tmp`; anything else is not ours.
pub fn parse_name(name: &str) -> Option<(u64, FileKind)> {
    let rest = name.strip_prefix('b')?;
    let (hex, suffix) = rest.split_at_checked(16)?;
    if !hex
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return None;
    }
    let id = u64::from_str_radix(hex, 16).ok()?;
    let kind = match suffix {
        ".bucket" => FileKind::Data,
        ".meta" => FileKind::Meta,
        ".meta.tmp" => FileKind::MetaTemp,
        _ => return None,
    };
    Some((id, kind))
}

/// A bucket whose data and metadata are durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedBucket {
    pub id: u64,
    pub data_len: u64,
    pub meta_len: u64,
    pub entries: Vec<MetaEntry>,
}

impl SealedBucket {
    /// Bytes its two files occupy.
    pub fn disk_bytes(&self) -> u64 {
        self.data_len + on_disk(self.meta_len)
    }
}

struct OpenBucket {
    id: u64,
    out: SeqWriter,
    entries: Vec<MetaEntry>,
}

/// Writes buckets into one directory; one writer per directory.
pub struct BucketWriter {
    dir: PathBuf,
    engine: Arc<dyn IoEngine>,
    size_limit: u64,
    keys_limit: usize,
    chunk: usize,
    depth: usize,
    /// Chunk buffers between buckets: allocated (and faulted in) once.
    spare: Vec<AlignedBuf>,
    next_id: u64,
    open: Option<OpenBucket>,
}

impl BucketWriter {
    /// `next_id` must exceed every bucket id already in `dir` (the scan says so).
    pub fn new(
        dir: &Path,
        engine: Arc<dyn IoEngine>,
        size_limit: u64,
        keys_limit: u64,
        next_id: u64,
    ) -> Self {
        BucketWriter {
            dir: dir.to_path_buf(),
            engine,
            size_limit: size_limit.max(1),
            keys_limit: keys_limit.clamp(1, u32::MAX as u64) as usize,
            chunk: DEFAULT_CHUNK,
            depth: DEFAULT_DEPTH,
            spare: Vec::new(),
            next_id,
            open: None,
        }
    }

    /// Sets the write size (a multiple of the `O_DIRECT` alignment).
    pub fn with_chunk(mut self, chunk: usize) -> Self {
        self.chunk = align_up(chunk.max(1) as u64, DIO_ALIGN as u64) as usize;
        self.spare.clear();
        self
    }

    /// Sets how many chunk buffers a bucket writes through (1: every write
    /// inline; n: up to n - 1 in flight while the next fills).
    pub fn with_depth(mut self, depth: usize) -> Self {
        self.depth = depth.max(1);
        self.spare.clear();
        self
    }

    fn buffers(&mut self) -> Vec<AlignedBuf> {
        let mut bufs = std::mem::take(&mut self.spare);
        bufs.truncate(self.depth);
        while bufs.len() < self.depth {
            bufs.push(AlignedBuf::new(self.chunk));
        }
        bufs
    }

    /// Keys and value bytes staged since the last seal.
    pub fn staged(&self) -> (usize, u64) {
        self.open.as_ref().map_or((0, 0), |o| {
            (o.entries.len(), o.entries.iter().map(|e| e.len).sum())
        })
    }

    /// The keys an error would discard: everything staged since the last seal.
    pub fn staged_keys(&self) -> Vec<String> {
        self.open.as_ref().map_or_else(Vec::new, |o| {
            o.entries.iter().map(|e| e.key.clone()).collect()
        })
    }

    /// Whether staging a value of `len` bytes seals the open bucket first.
    pub fn would_seal(&self, len: u64) -> bool {
        self.open.as_ref().is_some_and(|o| {
            !o.entries.is_empty()
                && (o.entries.len() >= self.keys_limit
                    || value_start(o.out.end(), len) + len > self.size_limit)
        })
    }

    /// Stages one object (its value given as parts, written back to back).
    /// Returns the bucket that had to be sealed first to make room, if any.
    /// On error, every object staged since the last seal is discarded.
    pub fn stage(&mut self, key: &str, tag: u64, parts: &[&[u8]]) -> Result<Option<SealedBucket>> {
        if key.len() > MAX_KEY_LEN {
            return Err(TierError::Invalid(format!(
                "key of {} bytes exceeds {MAX_KEY_LEN}",
                key.len()
            )));
        }
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let sealed = if self.would_seal(len) {
            self.seal()?
        } else {
            None
        };
        if self.open.is_none() {
            let id = self.next_id;
            let path = data_path(&self.dir, id);
            let file = DiskFile::create(&path)?;
            self.next_id += 1;
            let bufs = self.buffers();
            self.open = Some(OpenBucket {
                id,
                out: SeqWriter::with_buffers(file, self.engine.clone(), bufs),
                entries: Vec::new(),
            });
        }
        let open = self.open.as_mut().expect("opened above");
        let offset = value_start(open.out.end(), len);
        let mut crc = 0;
        let written = (|| {
            open.out.append(&[], (offset - open.out.end()) as usize)?;
            for part in parts {
                open.out.append_crc(part, &mut crc)?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            self.abort();
            return Err(e);
        }
        open.entries.push(MetaEntry {
            key: key.to_string(),
            offset,
            len,
            crc,
            tag,
        });
        Ok(sealed)
    }

    /// Makes everything staged durable as one bucket (partly filled or not).
    /// `None` when nothing was staged. On error the staged objects are
    /// discarded and their files removed.
    pub fn seal(&mut self) -> Result<Option<SealedBucket>> {
        let Some(mut open) = self.open.take() else {
            return Ok(None);
        };
        let data = data_path(&self.dir, open.id);
        if open.entries.is_empty() {
            self.recycle(open.out);
            let _ = std::fs::remove_file(&data);
            return Ok(None);
        }
        let finished = open.out.finish();
        let (file, bufs) = open.out.into_parts();
        self.spare = bufs;
        let result = (|| {
            let data_len = finished?;
            self.engine
                .sync_data(&file)
                .map_err(|e| TierError::io("fdatasync", &data, e))?;
            let entries = std::mem::take(&mut open.entries);
            let meta = BucketMeta {
                bucket_id: open.id,
                data_len,
                entries,
            };
            let bytes = encode_bucket_meta(&meta);
            commit_file(&meta_path(&self.dir, open.id), &bytes)?;
            Ok(SealedBucket {
                id: open.id,
                data_len,
                meta_len: bytes.len() as u64,
                entries: meta.entries,
            })
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&data);
            let _ = std::fs::remove_file(temp_path(&meta_path(&self.dir, open.id)));
        }
        result.map(Some)
    }

    /// Discards the open bucket and its data file.
    pub fn abort(&mut self) {
        if let Some(open) = self.open.take() {
            self.recycle(open.out);
            let _ = std::fs::remove_file(data_path(&self.dir, open.id));
        }
    }

    /// Keeps a bucket's buffers for the next one (waiting for its writes).
    fn recycle(&mut self, out: SeqWriter) {
        self.spare = out.into_parts().1;
    }
}

impl Drop for BucketWriter {
    fn drop(&mut self) {
        // Objects staged but never sealed were never acknowledged.
        self.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::decode_bucket_meta;
    use crate::io::psync::PsyncEngine;

    fn writer(dir: &Path, size_limit: u64, keys: u64) -> BucketWriter {
        BucketWriter::new(dir, Arc::new(PsyncEngine), size_limit, keys, 1).with_chunk(8192)
    }

    fn value(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
    }

    #[test]
    fn names_round_trip() {
        let d = Path::new("/x");
        let data = data_path(d, 0xab);
        let name = data.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_name(name), Some((0xab, FileKind::Data)));
        assert_eq!(
            parse_name("b00000000000000ab.meta"),
            Some((0xab, FileKind::Meta))
        );
        assert_eq!(
            parse_name("b00000000000000ab.meta.tmp"),
            Some((0xab, FileKind::MetaTemp))
        );
        for other in [
            "12345.bucket",
            "b00000000000000AB.meta",
            "b0ab.meta",
            "b00000000000000ab.metax",
            "x",
        ] {
            assert_eq!(parse_name(other), None, "{other}");
        }
    }

    #[test]
    fn seal_writes_a_partly_filled_bucket_that_decodes() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), 1 << 30, 500);
        let sizes = [
            0usize, 1, 7, 4095, 4096, 4097, 65536, 65537, 100_000, 20_000,
        ];
        for (i, &n) in sizes.iter().enumerate() {
            assert!(w
                .stage(&format!("k{i}"), i as u64, &[&value(i, n)])
                .unwrap()
                .is_none());
        }
        assert_eq!(w.staged().0, sizes.len());
        let sealed = w.seal().unwrap().unwrap();
        assert_eq!(sealed.entries.len(), sizes.len());
        assert!(w.seal().unwrap().is_none());
        let meta =
            decode_bucket_meta(&std::fs::read(meta_path(dir.path(), sealed.id)).unwrap()).unwrap();
        assert_eq!(meta.entries, sealed.entries);
        let data = std::fs::read(data_path(dir.path(), sealed.id)).unwrap();
        assert_eq!(data.len() as u64, meta.data_len);
        assert!(data.len().is_multiple_of(DIO_ALIGN));
        for (i, e) in meta.entries.iter().enumerate() {
            let got = &data[e.offset as usize..(e.offset + e.len) as usize];
            assert_eq!(got, &value(i, sizes[i])[..]);
            assert_eq!(crc32c::crc32c(got), e.crc);
            assert_eq!(e.tag, i as u64);
            if e.len >= crate::format::VALUE_ALIGN_MIN {
                assert!(e.offset.is_multiple_of(DIO_ALIGN as u64));
            }
        }
        assert!(!temp_path(&meta_path(dir.path(), sealed.id)).exists());
    }

    #[test]
    fn parts_are_concatenated() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), 1 << 30, 500);
        w.stage("k", 0, &[b"abc", b"", b"defgh"]).unwrap();
        let s = w.seal().unwrap().unwrap();
        let data = std::fs::read(data_path(dir.path(), s.id)).unwrap();
        assert_eq!(&data[..8], b"abcdefgh");
        assert_eq!(s.entries[0].crc, crc32c::crc32c(b"abcdefgh"));
    }

    #[test]
    fn limits_seal_the_bucket_before_it_overflows() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), 3 * 4096, 2);
        let a = w.stage("a", 0, &[&value(0, 100)]).unwrap();
        let b = w.stage("b", 0, &[&value(1, 100)]).unwrap();
        assert!(a.is_none() && b.is_none());
        // Third key: the key limit seals {a, b}.
        let sealed = w.stage("c", 0, &[&value(2, 100)]).unwrap().unwrap();
        assert_eq!(
            sealed
                .entries
                .iter()
                .map(|e| e.key.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        // A value larger than the size limit: seals {c}, then gets a bucket of its own.
        let sealed = w.stage("big", 0, &[&value(3, 5 * 4096)]).unwrap().unwrap();
        assert_eq!(sealed.entries[0].key, "c");
        let last = w.seal().unwrap().unwrap();
        assert_eq!(last.entries[0].key, "big");
        assert!(last.id > sealed.id);
    }

    #[test]
    fn dropping_an_unsealed_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut w = writer(dir.path(), 1 << 30, 500);
            w.stage("a", 0, &[&value(0, 50_000)]).unwrap();
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
