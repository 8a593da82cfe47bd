//! Same-host shared memory: a peer's engine-managed buffers are memfds that
//! this process maps once (through `/proc/<pid>/fd/<fd>`) and then copies to
//! and from directly. Used only when both descriptors carry the same host id,
//! the buffer is shm-backed and mapping succeeded; otherwise TCP serves it.
//!
//! A buffer its owner freed stays mapped here (the mapping keeps the memory
//! alive), so each copy checks the owner's verdict before and after
//! ([`PeerMapping::is_live`]): requests for a freed buffer go to TCP, which
//! asks the owner (and fails them as not registered, or finds a buffer
//! registered there since); a buffer freed during a copy fails the request.
//! Freed buffers' mappings are dropped at the next submission to the segment.

use std::collections::HashMap;
use std::sync::Arc;

use mooncake_common::ErrorCode;
use parking_lot::Mutex;

use crate::memcopy;
use crate::rawmem::{self, FileId, PeerMapping, ProcessWatch};
use crate::segment::{BufferDesc, SegmentDesc};
use crate::transport::{OpenSegment, Route, Transport, Work};
use crate::{Opcode, SegmentHandle};

/// (segment, buffer address, inode): a re-allocated buffer is a new key.
type MapKey = (SegmentHandle, u64, u64);

pub(crate) struct ShmTransport {
    enabled: bool,
    host_id: String,
    /// `None` remembers a failed attempt so we do not retry on every submit.
    maps: Mutex<HashMap<MapKey, Option<Arc<PeerMapping>>>>,
    /// Per segment: its mapped buffers, for the descriptor they came from.
    views: Mutex<HashMap<SegmentHandle, Arc<View>>>,
}

/// A segment's shared buffers as mapped here.
struct View {
    desc: Arc<SegmentDesc>,
    /// The owner process; once it exits the view is dropped and requests go
    /// to TCP, which fails them, as for any dead peer.
    owner: Option<Arc<ProcessWatch>>,
    /// `(remote address, mapping)` of each buffer we could map.
    bufs: Vec<(u64, Arc<PeerMapping>)>,
}

impl View {
    /// Local address of `[remote, remote+len)` and its mapping, if a
    /// mapped buffer holds it.
    fn resolve(&self, remote: u64, len: usize) -> Option<(usize, &PeerMapping)> {
        self.bufs.iter().find_map(|(base, map)| {
            let off = usize::try_from(remote.checked_sub(*base)?).ok()?;
            Some((map.range(off, len)?, &**map))
        })
    }

    /// Copies between `local` and `[remote, remote+len)` of a live mapped
    /// buffer. `None` when no live buffer holds the range (nothing copied);
    /// `Some(Err)` when the owner freed the buffer during the copy (the
    /// bytes went, or came from, nowhere).
    ///
    /// # Safety
    /// `local..local+len` must be valid for writes (`Read`) or reads
    /// (`Write`) for the duration of the call.
    unsafe fn copy(
        &self,
        opcode: Opcode,
        local: usize,
        remote: u64,
        len: usize,
    ) -> Option<Result<(), ErrorCode>> {
        let (mapped, map) = self.resolve(remote, len).filter(|(_, map)| map.is_live())?;
        // SAFETY: `mapped..mapped+len` is inside our mapping (bounds-checked
        // by `PeerMapping::range`); the caller vouches for `local`.
        unsafe {
            match opcode {
                Opcode::Read => rawmem::copy(local, mapped, len),
                Opcode::Write => {
                    memcopy::copy_to_segment(mapped as *mut u8, local as *const u8, len)
                }
            }
        };
        Some(if map.is_live() {
            Ok(())
        } else {
            Err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED)
        })
    }
}

impl ShmTransport {
    pub(crate) fn new(enabled: bool, host_id: String) -> ShmTransport {
        ShmTransport {
            enabled,
            host_id,
            maps: Mutex::default(),
            views: Mutex::default(),
        }
    }

    fn mapping(&self, segment: &OpenSegment, buf: &BufferDesc) -> Option<Arc<PeerMapping>> {
        let shm = buf.shm.as_ref()?;
        let key = (segment.handle, buf.addr, shm.ino);
        let mut maps = self.maps.lock();
        if let Some(m) = maps.get(&key) {
            return m.clone();
        }
        // What the published descriptor says; the page is read from the
        // file itself when it is opened.
        let id = FileId {
            dev: shm.dev,
            ino: shm.ino,
            size: buf.length,
            page: 0,
        };
        let mapped = usize::try_from(buf.length).ok().and_then(|len| {
            match PeerMapping::open(shm.pid, shm.fd, id, len) {
                Ok(m) => Some(Arc::new(m)),
                Err(e) => {
                    tracing::info!(
                        "segment {}: cannot map shared buffer ({e}); using tcp",
                        segment.name
                    );
                    None
                }
            }
        });
        maps.insert(key, mapped.clone());
        mapped
    }

    /// The segment's view, rebuilt when its descriptor changed; `None` when
    /// shared memory cannot serve the segment (other host, owner gone, …).
    fn view(&self, segment: &OpenSegment) -> Option<Arc<View>> {
        if !self.enabled || segment.is_local {
            return None;
        }
        let desc = segment.desc();
        if desc.host_id.as_deref() != Some(self.host_id.as_str()) {
            return None;
        }
        {
            let mut views = self.views.lock();
            if let Some(v) = views.get(&segment.handle) {
                if Arc::ptr_eq(&v.desc, &desc) {
                    let alive = v.owner.as_ref().is_some_and(|o| o.is_alive());
                    if alive && v.bufs.iter().all(|(_, m)| m.is_live()) {
                        return Some(v.clone());
                    }
                    if alive {
                        // The owner freed some buffers: forget their mappings.
                        let bufs: Vec<_> = v
                            .bufs
                            .iter()
                            .filter(|(_, m)| m.is_live())
                            .cloned()
                            .collect();
                        let mut maps = self.maps.lock();
                        maps.retain(|k, m| {
                            k.0 != segment.handle || m.as_ref().is_none_or(|m| m.is_live())
                        });
                        drop(maps);
                        let view = Arc::new(View {
                            desc: v.desc.clone(),
                            owner: v.owner.clone(),
                            bufs,
                        });
                        views.insert(segment.handle, view.clone());
                        return Some(view);
                    }
                    if !v.bufs.is_empty() {
                        // The owner died: unmap its memory, remember the verdict.
                        let dead = View {
                            desc: v.desc.clone(),
                            owner: None,
                            bufs: Vec::new(),
                        };
                        views.insert(segment.handle, Arc::new(dead));
                        self.maps.lock().retain(|k, _| k.0 != segment.handle);
                    }
                    return None;
                }
            }
        }
        let bufs: Vec<_> = desc
            .buffers
            .iter()
            .filter_map(|b| Some((b.addr, self.mapping(segment, b)?)))
            .filter(|(_, m)| m.is_live())
            .collect();
        // Forget mappings of buffers no longer published (or freed).
        self.maps.lock().retain(|k, m| {
            k.0 != segment.handle
                || (desc
                    .buffers
                    .iter()
                    .any(|b| b.addr == k.1 && b.shm.as_ref().is_some_and(|s| s.ino == k.2))
                    && m.as_ref().is_none_or(|m| m.is_live()))
        });
        let pid = desc
            .buffers
            .iter()
            .find_map(|b| b.shm.as_ref().map(|s| s.pid));
        let owner = pid.and_then(|pid| ProcessWatch::open(pid).ok().map(Arc::new));
        let view = Arc::new(View { desc, owner, bufs });
        self.views.lock().insert(segment.handle, view.clone());
        view.owner
            .as_ref()
            .is_some_and(|o| o.is_alive())
            .then_some(view)
    }
}

impl ShmTransport {
    /// Copies between `local` and `[remote, remote+len)` of a same-host
    /// peer's shared buffer, in the calling thread. `Ok(false)` (nothing
    /// copied) when shared memory does not serve that range, or the owner
    /// freed the buffer (TCP then asks the owner); an error when the owner
    /// freed it during the copy.
    ///
    /// # Safety
    /// `local..local+len` must be valid for writes (`Read`) or reads
    /// (`Write`) for the duration of the call.
    pub(crate) unsafe fn copy_direct(
        &self,
        segment: &OpenSegment,
        opcode: Opcode,
        local: usize,
        remote: u64,
        len: usize,
    ) -> Result<bool, ErrorCode> {
        let Some(view) = self.view(segment) else {
            return Ok(false);
        };
        // SAFETY: forwarded from the caller.
        match unsafe { view.copy(opcode, local, remote, len) } {
            None => Ok(false),
            Some(r) => r.map(|()| true),
        }
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn route(&self, segment: &OpenSegment) -> Option<Box<dyn Route>> {
        let view = self.view(segment)?;
        (!view.bufs.is_empty()).then(|| Box::new(ShmRoute { view }) as Box<dyn Route>)
    }

    fn close_segment(&self, segment: &OpenSegment) {
        self.views.lock().remove(&segment.handle);
        self.maps.lock().retain(|k, _| k.0 != segment.handle);
    }
}

struct ShmRoute {
    view: Arc<View>,
}

impl Route for ShmRoute {
    /// Not a freed buffer: TCP asks the owner about those.
    fn serves(&self, remote: u64, len: usize) -> bool {
        self.view
            .resolve(remote, len)
            .is_some_and(|(_, map)| map.is_live())
    }

    fn submit(&self, work: Vec<Work>) {
        for w in work {
            w.task.expect_slices(1);
            // SAFETY: `local` was checked against the registry.
            let result = match unsafe { self.view.copy(w.opcode, w.local, w.remote, w.len) } {
                // Not (or no longer) a live buffer.
                None => Err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED),
                Some(r) => r.map(|()| w.len),
            };
            w.task.slice_done(result);
        }
    }
}
