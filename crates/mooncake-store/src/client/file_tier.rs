//! A storage client's part in the shared-filesystem tier (`mooncake_master
//! --root_fs_dir`): when the master announces the tier and its directory
//! is reachable here, the client mounts it and runs a writer thread. Each
//! round takes the master's tasks (objects of this client's segments that
//! eviction wants out of memory), writes them as one group of files at the
//! paths derived from their keys (`tier::fs_group::GroupWriter`: direct
//! I/O from reused buffers, each file synced and renamed as it is written,
//! each directory fsynced once per group), deletes the
//! files the master no longer wants (first, so the group's files take over
//! their inodes: `tier::fs_spare`), and reports both. The master
//! keeps the memory copy until it hears.
//!
//! Reading needs no writer: any client reads a file copy straight from the
//! path in its `DISK` replica (`real/read.rs`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use mooncake_common::{Error, ErrorCode, Result};

use super::offload::poll::{poll_until_stopped, MAX_IDLE};
use crate::master_client::MasterClient;
use crate::tier::{fs_group, shared_fs};
use crate::types::{ClientId, OffloadTask};

const TASKS_PER_ROUND: u32 = 64;

struct Shared {
    id: ClientId,
    master: MasterClient,
    fsdir: String,
    /// This client's own segments `(addr, len)`: tasks read only there.
    segments: Vec<(usize, usize)>,
    stop: AtomicBool,
}

impl Shared {
    fn own_range(&self, addr: u64, len: u64) -> Option<&'static [u8]> {
        let (addr, len) = (usize::try_from(addr).ok()?, usize::try_from(len).ok()?);
        let end = addr.checked_add(len)?;
        self.segments
            .iter()
            .any(|&(a, l)| addr >= a && end <= a + l)
            // SAFETY: the range lies in a segment this client allocated and
            // keeps mapped while the writer runs (it is stopped before the
            // segments go); the master leased the object for the copy.
            .then(|| unsafe { std::slice::from_raw_parts(addr as *const u8, len) })
    }
}

/// The running writer.
pub(crate) struct FileWriter {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl FileWriter {
    /// Mounts this client on the tier at `fsdir` and starts the writer.
    pub(crate) fn start(
        id: ClientId,
        master: MasterClient,
        fsdir: String,
        segments: Vec<(usize, usize)>,
    ) -> Result<FileWriter> {
        // Every directory of the tier exists, its entry durable, before the
        // first group: groups then sync only the directories they rename into.
        let mut writer = fs_group::GroupWriter::default();
        writer.prepare(&fsdir).map_err(|e| {
            Error::new(
                ErrorCode::FILE_OPEN_FAIL,
                format!("shared-filesystem tier {fsdir}: {e}"),
            )
        })?;
        master.mount_shared_fs(id)?;
        let shared = Arc::new(Shared {
            id,
            master,
            fsdir,
            segments,
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("mooncake-fs-tier".into())
            .spawn(move || run(&s, &mut writer))
            .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, format!("fs tier thread: {e}")))?;
        tracing::info!(dir = %shared.fsdir, "shared-filesystem tier mounted");
        Ok(FileWriter {
            shared,
            thread: Some(thread),
        })
    }

    /// Stops the writer after the round in progress (its files reported).
    pub(crate) fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(s: &Shared, writer: &mut fs_group::GroupWriter) {
    let poll = || {
        let batch = s.master.fetch_file_tasks(s.id, TASKS_PER_ROUND)?;
        let any = !batch.tasks.is_empty() || !batch.removes.is_empty();
        if any {
            round(s, writer, &batch.tasks, batch.removes);
        } else {
            // Spares serve the next writes; with none coming, delete them.
            writer.release_spares();
        }
        Ok(any)
    };
    poll_until_stopped(&s.stop, "shared-fs", poll, || {
        s.master.mount_shared_fs(s.id)
    });
}

/// Deletes `removes`, writes `tasks` as one group, reports everything.
fn round(
    s: &Shared,
    writer: &mut fs_group::GroupWriter,
    tasks: &[OffloadTask],
    removes: Vec<String>,
) {
    for key in &removes {
        let path = shared_fs::object_file(&s.fsdir, key);
        // The file's inode is kept for this group's files (a spare).
        if let Err(e) = writer.remove(Path::new(&path)) {
            tracing::warn!(key, error = %e, "deleting a shared-filesystem file failed");
        }
    }
    let mut failed = Vec::new();
    let mut group = Vec::with_capacity(tasks.len());
    for t in tasks {
        match s.own_range(t.address, t.size) {
            Some(value) => group.push((
                t,
                fs_group::GroupObject {
                    key: &t.key,
                    path: shared_fs::path_of(&shared_fs::object_file(&s.fsdir, &t.key)),
                    value,
                },
            )),
            None => {
                tracing::warn!(key = %t.key, "file task outside this client's segments");
                failed.push(t.key.clone());
            }
        }
    }
    let (group_tasks, objects): (Vec<&OffloadTask>, Vec<_>) = group.into_iter().unzip();
    let mut copied = Vec::with_capacity(objects.len());
    for (t, r) in group_tasks.iter().zip(writer.write_group(&objects)) {
        match r {
            Ok(()) => copied.push((t.key.clone(), t.size)),
            Err(e) => {
                tracing::warn!(key = %t.key, error = %e, "shared-filesystem write failed");
                failed.push(t.key.clone());
            }
        }
    }
    let mut report = s
        .master
        .notify_file_copies(s.id, &copied, &failed, &removes);
    for _ in 0..3 {
        if report.is_ok() || s.stop.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(MAX_IDLE);
        report = s
            .master
            .notify_file_copies(s.id, &copied, &failed, &removes);
    }
    match report {
        Ok(results) => {
            for ((key, _), r) in copied.iter().zip(results) {
                if let Err(e) = r {
                    // The master queued the file for deletion.
                    tracing::debug!(key, error = %e, "file copy refused");
                }
            }
        }
        // Not reported, so not relied on: the objects stay in memory (a
        // new leader queues them again; the files are rewritten in place).
        Err(e) => tracing::warn!(error = %e, "reporting file copies failed"),
    }
}
