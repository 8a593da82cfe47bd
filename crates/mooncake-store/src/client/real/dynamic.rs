//! Segments mounted and unmounted while the client runs: memory the engine
//! allocates (`allocate_and_mount_segment`) or a file mapped from a path
//! (`mount_segment`, e.g. a `/dev/shm` file or a DAX device), each
//! registered with the engine before the master may place a replica in it,
//! and unregistered (which waits for peers' transfers in flight) before its
//! memory goes.
//!
//! They stay out of the client's own-memory fast paths (the `Site`): bytes
//! move to and from them through the engine, so no local copy can race an
//! unmount.

use std::fs::OpenOptions;
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use super::RealClient;
use crate::types::SegmentInfo;

/// Largest single buffer one mounted segment uses; bigger contributions are
/// mounted as several segments so each stays one shared-memory mapping of
/// bounded size.
pub(super) const MAX_SEGMENT_CHUNK: u64 = 16 << 30;

/// The memory behind a segment mounted at run time.
enum Backing {
    /// From the engine's `allocate_managed_buffer`.
    Managed { addr: usize, len: usize },
    /// A shared mapping of a file, registered with the engine.
    File(memmap2::MmapMut),
}

struct DynamicSegment {
    info: SegmentInfo,
    backing: Backing,
}

/// The segments mounted at run time, and the infos of every segment this
/// client has mounted (the heartbeat mounts them again on a master that
/// forgot this client).
pub(super) struct DynamicSegments {
    list: Mutex<Vec<DynamicSegment>>,
    pub(super) mounted: Arc<Mutex<Vec<SegmentInfo>>>,
    next_index: Mutex<usize>,
}

impl DynamicSegments {
    pub(super) fn new(setup: Vec<SegmentInfo>) -> Self {
        DynamicSegments {
            next_index: Mutex::new(setup.len().max(1)),
            list: Mutex::new(Vec::new()),
            mounted: Arc::new(Mutex::new(setup)),
        }
    }
}

fn invalid(what: String) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, what)
}

impl RealClient {
    fn next_segment_name(&self) -> String {
        let mut n = self.dynamic.next_index.lock();
        let name = format!("{}#{}", self.site.endpoint, *n);
        *n += 1;
        name
    }

    /// Registers nothing itself: mounts `info` (memory already registered)
    /// at the master and records it, or releases `backing` on failure.
    fn mount_backed(&self, info: SegmentInfo, backing: Backing) -> Result<String> {
        let mut mounted = self.dynamic.mounted.lock();
        if let Err(e) = self.master.mount_segment(self.id, &info) {
            drop(mounted);
            self.release(&info.name, backing);
            return Err(e.with_context(format!("mounting segment {}", info.name)));
        }
        mounted.push(info.clone());
        let name = info.name.clone();
        self.dynamic
            .list
            .lock()
            .push(DynamicSegment { info, backing });
        Ok(name)
    }

    fn release(&self, name: &str, backing: Backing) {
        release_with(&self.engine, name, backing);
    }

    /// Allocates `size` bytes (in segments of at most 16 GiB) and mounts
    /// them: the new segments' ids and the bytes allocated.
    pub(crate) fn allocate_and_mount_segment(&self, size: u64) -> Result<(Vec<String>, u64)> {
        self.check_open()?;
        if size == 0 {
            return Err(invalid("segment size is 0".into()));
        }
        // Shared memory is reserved lazily: without this bound a huge size
        // would mount thousands of segments no page can back.
        let physical = physical_memory();
        if size > physical {
            return Err(invalid(format!(
                "{size} bytes: more than this host's {physical} bytes of memory"
            )));
        }
        let mut ids = Vec::new();
        let mut left = size;
        while left > 0 {
            let len = left.min(MAX_SEGMENT_CHUNK);
            let step = usize::try_from(len)
                .map_err(|_| invalid(format!("{len} bytes")))
                .and_then(|n| self.engine.allocate_managed_buffer(n).map(|a| (a, n)))
                .and_then(|(addr, n)| {
                    let info = SegmentInfo {
                        name: self.next_segment_name(),
                        base: addr as u64,
                        size: len,
                        transport_endpoint: self.site.endpoint.clone(),
                    };
                    self.mount_backed(info, Backing::Managed { addr, len: n })
                });
            match step {
                Ok(id) => ids.push(id),
                Err(e) => {
                    let _ = self.unmount_dynamic(&ids, false, 0);
                    return Err(e.with_context(format!("allocating a {size} byte segment")));
                }
            }
            left -= len;
        }
        Ok((ids, size))
    }

    /// Maps `size` bytes of the file at `path` from `offset` and mounts
    /// them: the new segment's id.
    pub(crate) fn mount_file_segment(&self, path: &str, offset: u64, size: u64) -> Result<String> {
        self.check_open()?;
        if size == 0 {
            return Err(invalid("segment size is 0".into()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| invalid(format!("{path}: {e}")))?;
        let file_len = file
            .metadata()
            .map_err(|e| invalid(format!("{path}: {e}")))?
            .len();
        if offset.checked_add(size).is_none_or(|end| end > file_len) {
            return Err(invalid(format!(
                "{path}: [{offset}, +{size}) runs past its {file_len} bytes"
            )));
        }
        let len = usize::try_from(size).map_err(|_| invalid(format!("{size} bytes")))?;
        // SAFETY (of the mapping's use): the map is shared, so other
        // processes may change the file under us; the store hands its bytes
        // out as they are, like any segment a peer writes into.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map_mut(&file)
        }
        .map_err(|e| invalid(format!("mapping {path}: {e}")))?;
        let addr = map.as_ptr() as usize;
        self.engine
            .register_local_memory(addr, len, "cpu:0", true)?;
        let info = SegmentInfo {
            name: self.next_segment_name(),
            base: addr as u64,
            size,
            transport_endpoint: self.site.endpoint.clone(),
        };
        self.mount_backed(info, Backing::File(map))
    }

    /// Unmounts the run-time segments `ids` (all must be known, and with
    /// `allocated_only` all allocated ones) and releases their memory,
    /// after `grace_secs` in the background when it is not 0 (transfers
    /// that already hold a descriptor of it finish meanwhile).
    pub(crate) fn unmount_dynamic(
        &self,
        ids: &[String],
        allocated_only: bool,
        grace_secs: u64,
    ) -> Result<()> {
        let taken: Vec<DynamicSegment> = {
            let mut list = self.dynamic.list.lock();
            for id in ids {
                match list.iter().find(|s| &s.info.name == id) {
                    None => return Err(invalid(format!("{id}: no segment mounted at run time"))),
                    Some(s) if allocated_only && matches!(s.backing, Backing::File(_)) => {
                        return Err(invalid(format!("{id}: mounted from a file, not allocated")))
                    }
                    Some(_) => {}
                }
            }
            let (out, keep): (Vec<_>, Vec<_>) =
                list.drain(..).partition(|s| ids.contains(&s.info.name));
            *list = keep;
            out
        };
        let mut first_err = None;
        let mut released = Vec::new();
        for seg in taken {
            let mut mounted = self.dynamic.mounted.lock();
            match self.master.unmount_segment(self.id, &seg.info.name) {
                Ok(()) => {
                    mounted.retain(|m| m.name != seg.info.name);
                    released.push(seg);
                }
                Err(e) => {
                    // Still mounted: keep its memory and record.
                    first_err.get_or_insert(e);
                    self.dynamic.list.lock().push(seg);
                }
            }
        }
        if grace_secs == 0 {
            for seg in released {
                self.release(&seg.info.name, seg.backing);
            }
        } else {
            let engine = self.engine.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(grace_secs));
                for seg in released {
                    release_with(&engine, &seg.info.name, seg.backing);
                }
            });
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Unmounts and releases every run-time segment (at close).
    pub(super) fn unmount_all_dynamic(&self) {
        let ids: Vec<String> = self
            .dynamic
            .list
            .lock()
            .iter()
            .map(|s| s.info.name.clone())
            .collect();
        if !ids.is_empty() {
            let _ = self.unmount_dynamic(&ids, false, 0);
        }
    }
}

/// Unregisters (waiting for peers' transfers in flight) and frees or
/// unmaps a segment's memory; memory a transfer may still touch is kept.
fn release_with(engine: &mooncake_transfer::TransferEngine, name: &str, backing: Backing) {
    match backing {
        Backing::Managed { addr, len } => {
            if let Err(e) = engine.free_managed_buffer(addr, len) {
                tracing::warn!(segment = %name, error = %e, "freeing segment");
            }
        }
        Backing::File(map) => match engine.unregister_local_memory(map.as_ptr() as usize) {
            Ok(()) => drop(map),
            Err(e) => {
                tracing::warn!(segment = %name, error = %e, "segment mapping kept");
                std::mem::forget(map);
            }
        },
    }
}

/// This host's physical memory in bytes (0 when unknown).
fn physical_memory() -> u64 {
    // SAFETY: sysconf reads a system constant; no memory is touched.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(u64::try_from(page).unwrap_or(0))
}

impl RealClient {
    /// Withdraws this client's SSD tier from the master (a pre-stop hook),
    /// then waits `grace_secs` for reads already handed out to finish. A
    /// client without a tier has nothing to withdraw.
    pub(crate) fn unmount_local_disk(&self, grace_secs: u64) -> Result<()> {
        self.check_open()?;
        match self.offload.lock().as_mut() {
            Some(tier) => tier.withdraw()?,
            None => {
                tracing::warn!("unmount_local_disk_segment: this client has no SSD tier");
                return Ok(());
            }
        }
        tracing::info!(grace_secs, "SSD tier withdrawn");
        if grace_secs > 0 {
            std::thread::sleep(Duration::from_secs(grace_secs));
        }
        Ok(())
    }
}
