//! Same-host shared memory: a peer's engine-managed buffers are memfds that
//! this process maps once (through `/proc/<pid>/fd/<fd>`) and then copies to
//! and from directly. Used only when both descriptors carry the same host id,
//! the buffer is shm-backed and mapping succeeded; otherwise TCP serves it.

use std::collections::HashMap;
use std::sync::Arc;

use mooncake_common::ErrorCode;
use parking_lot::Mutex;

use crate::rawmem::{self, FileId, PeerMapping};
use crate::segment::BufferDesc;
use crate::transport::{OpenSegment, Transport, Work};
use crate::{Opcode, SegmentHandle};

/// (segment, buffer address, inode): a re-allocated buffer is a new key.
type MapKey = (SegmentHandle, u64, u64);

pub(crate) struct ShmTransport {
    enabled: bool,
    host_id: String,
    /// `None` remembers a failed attempt so we do not retry on every request.
    maps: Mutex<HashMap<MapKey, Option<Arc<PeerMapping>>>>,
}

impl ShmTransport {
    pub(crate) fn new(enabled: bool, host_id: String) -> ShmTransport {
        ShmTransport {
            enabled,
            host_id,
            maps: Mutex::new(HashMap::new()),
        }
    }

    fn mapping(&self, segment: &OpenSegment, buf: &BufferDesc) -> Option<Arc<PeerMapping>> {
        let shm = buf.shm.as_ref()?;
        let key = (segment.handle, buf.addr, shm.ino);
        let mut maps = self.maps.lock();
        if let Some(m) = maps.get(&key) {
            return m.clone();
        }
        let id = FileId {
            dev: shm.dev,
            ino: shm.ino,
            size: buf.length,
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

    /// Local address of `[remote, remote+len)` in our mapping of the peer's buffer.
    fn resolve(&self, segment: &OpenSegment, remote: u64, len: usize) -> Option<usize> {
        if !self.enabled || segment.is_local {
            return None;
        }
        let desc = segment.desc();
        if desc.host_id.as_deref() != Some(self.host_id.as_str()) {
            return None;
        }
        let buf = desc.find_buffer(remote, len as u64)?;
        let map = self.mapping(segment, buf)?;
        map.range((remote - buf.addr) as usize, len)
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn serves(&self, segment: &OpenSegment, remote: u64, len: usize) -> bool {
        self.resolve(segment, remote, len).is_some()
    }

    fn submit(&self, segment: &OpenSegment, work: Vec<Work>) {
        for w in work {
            w.task.expect_slices(1);
            let Some(mapped) = self.resolve(segment, w.remote, w.len) else {
                w.task
                    .slice_done(Err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED));
                continue;
            };
            let (dst, src) = match w.opcode {
                Opcode::Read => (w.local, mapped),
                Opcode::Write => (mapped, w.local),
            };
            // SAFETY: `mapped..mapped+len` is inside our mapping (bounds-checked
            // by `PeerMapping::range`); `local` was checked against the registry.
            unsafe { rawmem::copy(dst, src, w.len) };
            w.task.slice_done(Ok(w.len));
        }
    }

    fn close_segment(&self, segment: &OpenSegment) {
        self.maps.lock().retain(|k, _| k.0 != segment.handle);
    }
}
