//! The files of one unit (a bucket, or one file-per-key object) and the
//! handles readers hold on them.
//!
//! Space goes back in two ways, both only once no reader can be using it:
//! a doomed unit's files are deleted when the last `Arc` drops; an evicted
//! or removed object inside a live bucket has its blocks punched out
//! ([`super::io::holes`]) as soon as no [`ReadHandle`] of the unit is open.
//! A reader that looked the object up before it left the index holds such a
//! handle, so it never reads a hole.

use super::io::holes::punch_hole;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Buckets and file-per-key objects are both "units", numbered in write
/// order (ids only grow).
pub type UnitId = u64;

#[derive(Debug, Default)]
struct FileState {
    /// Bytes to give back when the files are deleted (`Some` once doomed).
    doomed: Option<u64>,
    /// Ranges waiting for the readers to finish before they are punched.
    punches: Vec<(u64, u64)>,
    readers: usize,
}

/// The files of one unit.
#[derive(Debug)]
pub struct UnitFiles {
    pub id: UnitId,
    /// The file the values are read from.
    pub data: PathBuf,
    /// A bucket's metadata file.
    pub meta: Option<PathBuf>,
    state: Mutex<FileState>,
    /// The tier's count of bytes freed in the index but still on disk.
    doomed_bytes: Arc<AtomicU64>,
}

impl UnitFiles {
    pub(super) fn new(
        id: UnitId,
        data: PathBuf,
        meta: Option<PathBuf>,
        doomed_bytes: Arc<AtomicU64>,
    ) -> UnitFiles {
        UnitFiles {
            id,
            data,
            meta,
            state: Mutex::new(FileState::default()),
            doomed_bytes,
        }
    }

    /// A reader's handle: punches wait until it is dropped.
    pub(super) fn reader(self: &Arc<Self>) -> ReadHandle {
        self.state.lock().readers += 1;
        ReadHandle(self.clone())
    }

    /// The files go when the last `Arc` drops, giving back `bytes`.
    pub(super) fn doom(&self, bytes: u64) {
        let mut st = self.state.lock();
        if st.doomed.is_none() {
            st.doomed = Some(bytes);
            self.doomed_bytes.fetch_add(bytes, Ordering::AcqRel);
        }
    }

    /// Frees `[offset, offset + len)` once no reader holds the unit.
    pub(super) fn punch_later(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        self.doomed_bytes.fetch_add(len, Ordering::AcqRel);
        let mut st = self.state.lock();
        st.punches.push((offset, len));
        if st.readers == 0 {
            self.apply_punches(&mut st);
        }
    }

    fn apply_punches(&self, st: &mut FileState) {
        if st.doomed.is_some() {
            return; // the whole file goes; its drop gives the bytes back
        }
        for (offset, len) in st.punches.drain(..) {
            if let Err(e) = punch_hole(&self.data, offset, len) {
                tracing::warn!(file = %self.data.display(), offset, len, error = %e,
                    "freeing an evicted object's blocks failed");
            }
            self.doomed_bytes.fetch_sub(len, Ordering::AcqRel);
        }
    }
}

impl Drop for UnitFiles {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        if let Some(bytes) = st.doomed {
            // Metadata first: a crash between the two leaves an orphan data
            // file (removed by the next scan), never metadata without data.
            if let Some(meta) = &self.meta {
                let _ = std::fs::remove_file(meta);
            }
            let _ = std::fs::remove_file(&self.data);
            let punched: u64 = st.punches.iter().map(|&(_, n)| n).sum();
            self.doomed_bytes
                .fetch_sub(bytes + punched, Ordering::AcqRel);
        }
    }
}

/// What a reader holds while it reads from a unit's files.
#[derive(Debug)]
pub struct ReadHandle(Arc<UnitFiles>);

impl std::ops::Deref for ReadHandle {
    type Target = UnitFiles;
    fn deref(&self) -> &UnitFiles {
        &self.0
    }
}

impl Drop for ReadHandle {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.readers -= 1;
        if st.readers == 0 && !st.punches.is_empty() {
            self.0.apply_punches(&mut st);
        }
    }
}
