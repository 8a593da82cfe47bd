//! The shared-filesystem tier (`mooncake_master --root_fs_dir`): one file
//! per object under a directory every client mounts at the same path.
//!
//! Paths are the reference's: `<root_fs_dir>/<cluster_id>/<d1>/<d2>/<name>`,
//! `d1`/`d2` the letters `a` + the low two nibbles of libstdc++'s
//! `std::hash<std::string>` of the key. The name is the key, except that the
//! characters the reference replaces with `_` (`/\:*?"<>|` and NUL) and `%`
//! are percent-escaped (so `a/b` and `a_b` never share a file), `.` and `..`
//! are escaped whole, and a name longer than a file name may be is a hash.
//!
//! A file is the SSD tier's object format (`format::ObjectHeader`: key,
//! length, crc32c, then the value on a 4 KiB boundary), written in groups
//! by `fs_group::GroupWriter`: a file exists under its name only
//! once durable. Reads check the header's key and
//! length against what the master said and the value's checksum, so a file
//! of another key or version is never served.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::format::{decode_object_header, FormatError, ObjectHeader};
use super::io::temp_path;
use super::{Result, TierError};

/// Longest file name most filesystems take (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// libstdc++'s `std::hash<std::string>` on 64-bit targets (`_Hash_bytes`,
/// a MurmurHash2 variant, seed `0xc70f6907`): the reference derives its
/// directories from it.
pub fn std_hash(bytes: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4_a793u64 << 32) + 0x5bd1_e995;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut hash = 0xc70f_6907u64 ^ (bytes.len() as u64).wrapping_mul(MUL);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let data = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        hash ^= shift_mix(data.wrapping_mul(MUL)).wrapping_mul(MUL);
        hash = hash.wrapping_mul(MUL);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let data = rest
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) + b as u64);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

fn file_name(key: &str) -> String {
    if key.is_empty() {
        return "%".into(); // no escaped key is a lone `%`
    }
    if key == "." || key == ".." {
        return key.bytes().map(|b| format!("%{b:02X}")).collect();
    }
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|' | '\0' | '%' => {
                out.push_str(&format!("%{:02X}", c as u32))
            }
            c => out.push(c),
        }
    }
    if out.len() > NAME_MAX {
        let h = std_hash(key.as_bytes());
        return format!("~{h:016x}{:08x}", crc32c::crc32c(key.as_bytes()));
    }
    out
}

/// The directory letter of a hash nibble.
fn dir_letter(nibble: u64) -> char {
    (b'a' + (nibble & 0xf) as u8) as char
}

/// The file holding `key` under `fsdir` (`<root_fs_dir>/<cluster_id>`).
pub fn object_file(fsdir: &str, key: &str) -> String {
    let h = std_hash(key.as_bytes());
    let (d1, d2) = (dir_letter(h), dir_letter(h >> 4));
    format!(
        "{}/{d1}/{d2}/{}",
        fsdir.trim_end_matches('/'),
        file_name(key)
    )
}

/// Reads `key`'s value from `path` into `dst` (exactly its length),
/// verified: the header names `key` and `dst.len()` bytes, the checksum
/// holds. A missing file is `NotFound`.
pub fn read_object(path: &Path, key: &str, dst: &mut [u8]) -> Result<()> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(TierError::NotFound),
        Err(e) => return Err(TierError::io("open", path, e)),
    };
    let corrupt = |what: String| TierError::Corrupt {
        what: format!("{}: {what}", path.display()),
    };
    let value_offset = ObjectHeader::value_offset_for(key.len());
    let mut head = vec![0u8; value_offset as usize];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| corrupt(format!("header: {e}")))?;
    let header = decode_object_header(&head).map_err(|e: FormatError| corrupt(e.to_string()))?;
    if header.key != key {
        return Err(corrupt(format!("holds {:?}, not {key:?}", header.key)));
    }
    if header.value_len != dst.len() as u64 {
        return Err(TierError::BufferSize {
            want: header.value_len,
            got: dst.len() as u64,
        });
    }
    f.read_exact_at(dst, header.value_offset)
        .map_err(|e| corrupt(format!("value: {e}")))?;
    if crc32c::crc32c(dst) != header.value_crc {
        return Err(corrupt("value checksum mismatch".into()));
    }
    Ok(())
}

/// Deletes the file at `path` (and a leftover `.tmp`); a missing file is fine.
pub fn remove_object(path: &Path) -> Result<()> {
    let _ = std::fs::remove_file(temp_path(path));
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(TierError::io("remove", path, e)),
    }
}

/// Every directory [`object_file`] puts files in under `fsdir` (256 of
/// them, `<fsdir>/<d1>/<d2>`), so a writer can create them all at once.
pub fn object_dirs(fsdir: &str) -> Vec<PathBuf> {
    let base = Path::new(fsdir.trim_end_matches('/'));
    (0..16)
        .flat_map(|d1| (0..16).map(move |d2| (d1, d2)))
        .map(|(d1, d2)| {
            base.join(dir_letter(d1).to_string())
                .join(dir_letter(d2).to_string())
        })
        .collect()
}

/// `path` as a `PathBuf` (descriptors carry strings).
pub fn path_of(file: &str) -> PathBuf {
    PathBuf::from(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs_group::{GroupObject, GroupWriter};

    #[test]
    fn hash_matches_libstdcxx() {
        // Printed by `std::hash<std::string>{}(k)` from g++ 14 (x86-64).
        for (k, h) in [
            ("", 0x553e_9390_1e46_2a6e),
            ("a", 0x454d_dee4_88c1_ed6b),
            ("hello", 0x2655_3298_fdbe_39c8),
            ("key-0001", 0xdc5e_0483_1d97_fab9),
            ("abcdefgh", 0x783d_b3e3_8db8_98bb),
            ("abcdefghi", 0xb4ec_9257_851c_8aaf),
            ("mooncake/object:7", 0x5745_94da_f933_d07b),
        ] {
            assert_eq!(std_hash(k.as_bytes()), h, "{k:?}");
        }
    }

    #[test]
    fn paths_follow_the_reference_and_never_collide() {
        assert_eq!(object_file("/mnt/fs/c/", "hello"), "/mnt/fs/c/i/m/hello");
        assert_eq!(object_file("/d", "key-0001"), "/d/j/l/key-0001");
        let slash = object_file("/d", "a/b");
        let under = object_file("/d", "a_b");
        assert!(slash.ends_with("/a%2Fb"), "{slash}");
        assert!(under.ends_with("/a_b"), "{under}");
        assert_ne!(object_file("/d", "a%2Fb"), slash);
        for k in [".", "..", ""] {
            let p = object_file("/d", k);
            let name = p.rsplit('/').next().unwrap();
            assert!(name != "." && name != ".." && !name.is_empty(), "{p}");
        }
        let dirs = object_dirs("/d/");
        assert_eq!(dirs.len(), 256);
        for k in ["hello", "key-0001", "a/b", ""] {
            let p = path_of(&object_file("/d", k));
            assert!(dirs.iter().any(|d| p.parent() == Some(d)), "{k:?}");
        }
        let long = "k".repeat(300);
        let name_len = object_file("/d", &long).rsplit('/').next().unwrap().len();
        assert!(name_len <= NAME_MAX);
    }

    #[test]
    fn objects_round_trip_and_wrong_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fsdir = dir.path().to_str().unwrap();
        let value: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let path = path_of(&object_file(fsdir, "k1"));
        let put = GroupObject {
            key: "k1",
            path: path.clone(),
            value: &value,
        };
        let [r] = GroupWriter::default()
            .write_group(&[put])
            .try_into()
            .unwrap();
        r.unwrap();
        assert!(!temp_path(&path).exists());
        let mut out = vec![0u8; value.len()];
        read_object(&path, "k1", &mut out).unwrap();
        assert_eq!(out, value);

        // Another key's file, a wrong length, a flipped byte, no file.
        assert!(matches!(
            read_object(&path, "k2", &mut out),
            Err(TierError::Corrupt { .. })
        ));
        let mut short = vec![0u8; 10];
        assert!(matches!(
            read_object(&path, "k1", &mut short),
            Err(TierError::BufferSize { .. })
        ));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = read_object(&path, "k1", &mut out).unwrap_err();
        assert_eq!(e.code(), mooncake_common::ErrorCode::FILE_READ_FAIL);
        remove_object(&path).unwrap();
        remove_object(&path).unwrap();
        assert!(matches!(
            read_object(&path, "k1", &mut out),
            Err(TierError::NotFound)
        ));
    }
}
