//! A snapshot round over the live state: cut it at a log position
//! (`state::view`), stream the view to a file, store it, and drop the
//! view. No second copy of the state is built: the objects are written
//! out of the live tables, and a write to one the round has not reached
//! yet saves its encoded form first (`state::objects::walk`), so the
//! round holds those bytes until written and one encoding buffer, besides
//! the small tables.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use mooncake_common::{Error, ErrorCode, Result};

use super::format::{SnapshotMeta, HEADER_LEN, MAGIC, VERSION};
use super::{SnapshotReport, Stores};
use crate::master::durable::oplog::wal::Wal;
use crate::master::state::service::MasterService;
use crate::master::state::view::View;
use crate::proto::wire::Encode;

/// Bytes encoded before they go to the file.
const CHUNK: usize = 1 << 20;

/// Writes the snapshot of `view` at `meta` to `path` (the frame of
/// `format`), encoding as it writes; returns its length and how many
/// objects it holds.
pub(crate) fn write_view(view: View<'_>, meta: SnapshotMeta, path: &Path) -> Result<(u64, u64)> {
    let io = |what: &str, e: std::io::Error| {
        Error::new(
            ErrorCode::FILE_WRITE_FAIL,
            format!("snapshot {what} {}: {e}", path.display()),
        )
    };
    let mut f = File::create(path).map_err(|e| io("create", e))?;
    f.write_all(&[0; HEADER_LEN]).map_err(|e| io("write", e))?;
    let (mut crc, mut len) = (0u32, 0u64);
    let mut flush = |out: &mut Vec<u8>| -> Result<()> {
        crc = crc32c::crc32c_append(crc, out);
        len += out.len() as u64;
        f.write_all(out).map_err(|e| io("write", e))?;
        out.clear();
        Ok(())
    };
    let mut out = Vec::with_capacity(CHUNK + (64 << 10));
    meta.seq.encode(&mut out);
    meta.term.encode(&mut out);
    meta.now.encode(&mut out);
    let objects = view.encode(&mut out, CHUNK, &mut flush)?;
    flush(&mut out)?;
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&MAGIC);
    header[4] = VERSION;
    header[8..16].copy_from_slice(&len.to_le_bytes());
    // The checksum covers bytes 4..16, then the payload.
    let len_usize = usize::try_from(len).expect("a snapshot fits the address space");
    let crc = crc32c::crc32c_combine(crc32c::crc32c(&header[4..16]), crc, len_usize);
    header[16..20].copy_from_slice(&crc.to_le_bytes());
    f.seek(SeekFrom::Start(0)).map_err(|e| io("seek", e))?;
    f.write_all(&header).map_err(|e| io("write", e))?;
    f.sync_all().map_err(|e| io("sync", e))?;
    Ok((len + HEADER_LEN as u64, objects))
}

/// Removes the file it names when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One snapshot of the live state `s`: cut it where the log stands, cut
/// the log there too, write the view beside the log and store it, apply
/// retention and truncate the log behind the oldest snapshot kept. `now`
/// is the master clock (ms), read at the cut: no mutation before it is
/// later.
pub fn live_round(
    s: &MasterService,
    now: &dyn Fn() -> u64,
    keep: usize,
    stores: &Stores,
    wal: &Wal,
) -> Result<SnapshotReport> {
    let t = Instant::now();
    // Every mutation logged before the mark is applied and none after it;
    // the log ends an entry at the mark.
    let (view, (mark, now)) = s.cut_view(|| (wal.mark(), now()))?;
    let cut = t.elapsed();
    let seq = mark.recv().unwrap_or_else(|_| {
        Err(Error::new(
            ErrorCode::INTERNAL_ERROR,
            "write-ahead log writer stopped",
        ))
    })?;
    let mut report = SnapshotReport {
        seq,
        cut,
        ..SnapshotReport::default()
    };
    if seq == 0 || stores.list().first() == Some(&seq) {
        // Nothing logged, or nothing new since the last snapshot.
        return Ok(report);
    }
    // The entries it covers are durable, and later ones go to a new
    // file, so the files it covers can be truncated once it is kept.
    wal.rotate()?;
    let t = Instant::now();
    let meta = SnapshotMeta { seq, term: 0, now };
    let scratch = Scratch(wal.dir().join(format!(".snapshot-{seq}.tmp")));
    (report.bytes, report.objects) = write_view(view, meta, &scratch.0)?;
    report.encode = t.elapsed();
    let t = Instant::now();
    stores.put_file(seq, &scratch.0)?;
    report.store = t.elapsed();
    stores.retire(keep, wal, &mut report)?;
    Ok(report)
}
