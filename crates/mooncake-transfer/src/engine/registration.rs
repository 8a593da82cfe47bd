//! Registered memory: caller buffers and engine-managed shared buffers,
//! published in this engine's segment descriptor, and retired only once no
//! peer's frame still uses them.

use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};

use super::{invalid, Inner, TransferEngine};
use crate::memory::Region;
use crate::metadata::{rpc_meta_key, segment_key};
use crate::rawmem::SharedRegion;
use crate::segment::ShmDesc;

/// How long past a frame's cut-off unregistering waits for peers' frames
/// (only a stalled thread needs it).
const RETIRE_SLACK: Duration = Duration::from_secs(5);

impl TransferEngine {
    /// Registers `[addr, addr+length)` so requests may use it (and, when
    /// `remote_accessible`, peers may read and write it).
    ///
    /// The caller promises the memory stays valid until it is unregistered
    /// (the same contract as the reference's `void*` API).
    pub fn register_local_memory(
        &self,
        addr: usize,
        length: usize,
        location: &str,
        remote_accessible: bool,
    ) -> Result<()> {
        self.inner
            .register(&[(addr, length)], location, remote_accessible, None)
    }

    pub fn unregister_local_memory(&self, addr: usize) -> Result<()> {
        self.inner.unregister(&[addr])
    }

    pub fn register_local_memory_batch(
        &self,
        buffers: &[(usize, usize)],
        location: &str,
    ) -> Result<()> {
        self.inner.register(buffers, location, true, None)
    }

    pub fn unregister_local_memory_batch(&self, addrs: &[usize]) -> Result<()> {
        self.inner.unregister(addrs)
    }

    /// Engine-owned memory backed by shared memory (so same-host peers can
    /// map it), zeroed, page-aligned, already registered and published.
    pub fn allocate_managed_buffer(&self, length: usize) -> Result<usize> {
        self.allocate_managed_buffer_on(length, None)
    }

    /// [`Self::allocate_managed_buffer`] on huge pages of `huge_page` bytes
    /// (2 MiB or 1 GiB, from the host's HugeTLB pool) when given; a pool
    /// without enough pages is an error, not small pages.
    pub fn allocate_managed_buffer_on(
        &self,
        length: usize,
        huge_page: Option<usize>,
    ) -> Result<usize> {
        if length == 0 {
            return Err(invalid("managed buffer of zero bytes"));
        }
        let region = SharedRegion::create("mooncake-segment", length, huge_page).map_err(|e| {
            let pages = match huge_page {
                Some(h) => format!(
                    " on {} MiB huge pages (is the HugeTLB pool large enough?)",
                    h >> 20
                ),
                None => String::new(),
            };
            Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("allocate {length} bytes of shared memory{pages}: {e}"),
            )
        })?;
        let id = region.file_id();
        let shm = ShmDesc {
            pid: std::process::id(),
            fd: region.raw_fd(),
            dev: id.dev,
            ino: id.ino,
        };
        let addr = region.addr();
        self.inner
            .register(&[(addr, length)], "cpu:0", true, Some(shm))?;
        self.inner.managed.lock().insert(addr, region);
        Ok(addr)
    }

    /// Unregisters and releases a buffer from [`Self::allocate_managed_buffer`].
    pub fn free_managed_buffer(&self, addr: usize, length: usize) -> Result<()> {
        {
            let managed = self.inner.managed.lock();
            if !managed.contains_key(&addr) {
                return Err(Error::new(
                    ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                    format!("{addr:#x} is not a managed buffer"),
                ));
            }
            let registered = self
                .inner
                .local
                .registry
                .read()
                .find(addr, 0)
                .map(|r| r.len);
            if length != 0 && registered.is_some_and(|l| l != length) {
                return Err(invalid(format!(
                    "managed buffer {addr:#x} has length {registered:?}, not {length}"
                )));
            }
            // Same-host peers that mapped it stop using it now.
            managed[&addr].mark_freed();
        }
        // Unregistering waits for peers' frames in flight; then unmap.
        let unregistered = self.inner.unregister_inner(&[addr]);
        if let Err(e) = &unregistered {
            if e.code == ErrorCode::ERR_ADDRESS_NOT_REGISTERED {
                return unregistered; // a concurrent free got there first
            }
        }
        let region = self.inner.managed.lock().remove(&addr);
        if let Err(e) = &unregistered {
            if e.code == ErrorCode::ERR_BATCH_BUSY {
                // A peer's frame may still touch it: never unmap (leak instead).
                tracing::warn!("managed buffer {addr:#x} leaked: {e}");
                std::mem::forget(region);
            }
        }
        unregistered
    }
}

impl Inner {
    pub(super) fn republish_if_lost(&self) -> Result<bool> {
        let Some(store) = &self.metadata else {
            return Ok(false);
        };
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(false);
        }
        let (meta_key, segment) = (rpc_meta_key(&self.name), segment_key(&self.name));
        let mut published = false;
        if store.get(&meta_key)?.is_none() {
            store.put(&meta_key, &self.rpc_meta.to_json())?;
            published = true;
        }
        if store.get(&segment)?.is_none() {
            self.publish()?;
            published = true;
        }
        Ok(published)
    }

    pub(super) fn publish(&self) -> Result<()> {
        if let Some(store) = &self.metadata {
            store.put(&segment_key(&self.name), &self.local.descriptor().to_json())?;
        }
        Ok(())
    }

    fn register(
        &self,
        buffers: &[(usize, usize)],
        location: &str,
        remote: bool,
        shm: Option<ShmDesc>,
    ) -> Result<()> {
        let location = match location.trim() {
            "" | "*" => "cpu:0",
            l => l,
        };
        {
            let mut reg = self.local.registry.write();
            for (i, &(addr, len)) in buffers.iter().enumerate() {
                let region = Region::new(addr, len, location.to_string(), remote, shm.clone());
                if let Err(e) = reg.insert(region) {
                    let undone: Vec<_> = buffers[..i]
                        .iter()
                        .filter_map(|&(a, _)| reg.remove(a).ok())
                        .collect();
                    drop(reg);
                    self.retire(undone)?;
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.publish() {
            let undone: Vec<_> = {
                let mut reg = self.local.registry.write();
                buffers
                    .iter()
                    .filter_map(|&(a, _)| reg.remove(a).ok())
                    .collect()
            };
            self.retire(undone)?;
            return Err(e);
        }
        Ok(())
    }

    /// Waits until no peer frame uses the memory of `regions`, which have
    /// left the registry (so no new frame can start on them). Frames are
    /// bounded by the I/O timeout, so this normally returns well within it;
    /// `ERR_BATCH_BUSY` says a frame still holds the memory past that bound
    /// (the caller must then keep the memory alive).
    fn retire(&self, regions: Vec<Region>) -> Result<()> {
        // A frame is cut off after twice the I/O timeout (rpc.rs).
        let give_up = Instant::now() + self.local.io_timeout * 2 + RETIRE_SLACK;
        for r in regions {
            if !r.pin.retire(give_up) {
                return Err(Error::new(
                    ErrorCode::ERR_BATCH_BUSY,
                    format!(
                        "{:#x}: a peer's frame still uses this memory; keep it alive",
                        r.addr
                    ),
                ));
            }
        }
        Ok(())
    }

    fn unregister(&self, addrs: &[usize]) -> Result<()> {
        let managed = self.managed.lock();
        if let Some(a) = addrs.iter().find(|a| managed.contains_key(a)) {
            return Err(invalid(format!(
                "{a:#x} is a managed buffer; use free_managed_buffer"
            )));
        }
        drop(managed);
        self.unregister_inner(addrs)
    }

    /// Removes `addrs` from the registry (peers' new frames are refused at
    /// once), republishes, then waits for peers' frames still using them.
    fn unregister_inner(&self, addrs: &[usize]) -> Result<()> {
        let removed: Vec<Region> = {
            let mut reg = self.local.registry.write();
            if let Some(a) = addrs
                .iter()
                .find(|&&a| reg.find(a, 0).is_none_or(|r| r.addr != a))
            {
                return Err(Error::new(
                    ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                    format!("{a:#x} is not registered"),
                ));
            }
            addrs.iter().filter_map(|&a| reg.remove(a).ok()).collect()
        };
        let published = self.publish();
        self.retire(removed)?;
        published
    }
}
