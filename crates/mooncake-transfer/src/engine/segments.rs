//! Segments: this engine's own and peers', opened by name, located through
//! the metadata store (or a P2P handshake), their descriptors refreshed on
//! demand.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::RwLock;

use super::{invalid, Inner, SegmentHandle, TransferEngine};
use crate::metadata::{rpc_meta_key, segment_key};
use crate::rpc;
use crate::segment::{RpcMeta, SegmentDesc};
use crate::transport::{OpenSegment, Transport};

/// The opened segments, by handle and by name.
pub(super) struct SegmentTable {
    by_handle: HashMap<SegmentHandle, Arc<OpenSegment>>,
    by_name: HashMap<String, SegmentHandle>,
    next: SegmentHandle,
}

impl SegmentTable {
    pub(super) fn new() -> SegmentTable {
        SegmentTable {
            by_handle: HashMap::new(),
            by_name: HashMap::new(),
            next: 1,
        }
    }
}

/// Splits `host[:port]` (IPv6 hosts in brackets).
pub(super) fn split_host_port(name: &str) -> (String, Option<u16>) {
    if let Some(rest) = name.strip_prefix('[') {
        if let Some((host, tail)) = rest.split_once(']') {
            return (
                host.to_string(),
                tail.strip_prefix(':').and_then(|p| p.parse().ok()),
            );
        }
    }
    match name.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(p) => (host.to_string(), Some(p)),
            Err(_) => (name.to_string(), None),
        },
        _ => (name.to_string(), None),
    }
}

impl TransferEngine {
    /// Opens a segment by name (this engine's own name works too).
    pub fn open_segment(&self, name: &str) -> Result<SegmentHandle> {
        self.inner.open_segment(name)
    }

    pub fn close_segment(&self, handle: SegmentHandle) -> Result<()> {
        let seg = {
            let mut t = self.inner.segments.write();
            let seg = t
                .by_handle
                .remove(&handle)
                .ok_or_else(|| invalid(format!("no segment handle {handle}")))?;
            t.by_name.remove(&seg.name);
            seg
        };
        self.inner.shm.close_segment(&seg);
        Ok(())
    }

    /// The descriptor of an opened segment (fresh for this engine's own).
    pub fn segment_descriptor(&self, handle: SegmentHandle) -> Result<Arc<SegmentDesc>> {
        let seg = self.inner.segment(handle)?;
        if seg.is_local {
            return Ok(Arc::new(self.inner.local.descriptor()));
        }
        Ok(seg.desc())
    }

    /// Re-reads an opened segment's descriptor (new buffers of the peer).
    pub fn refresh_segment(&self, handle: SegmentHandle) -> Result<Arc<SegmentDesc>> {
        let seg = self.inner.segment(handle)?;
        self.inner.refresh(&seg)?;
        self.segment_descriptor(handle)
    }

    /// Address of the segment's first buffer, 0 when it has none.
    pub fn first_buffer_address(&self, segment_name: &str) -> Result<u64> {
        let handle = self.open_segment(segment_name)?;
        Ok(self.refresh_segment(handle)?.first_buffer_address())
    }
}

impl Inner {
    pub(super) fn segment(&self, handle: SegmentHandle) -> Result<Arc<OpenSegment>> {
        self.segments
            .read()
            .by_handle
            .get(&handle)
            .cloned()
            .ok_or_else(|| invalid(format!("no segment handle {handle}")))
    }

    /// Where segment `name` listens, and its descriptor.
    fn locate(&self, name: &str) -> Result<(SocketAddr, SegmentDesc)> {
        let timeout = self.config.transfer_timeout.min(Duration::from_secs(10));
        match &self.metadata {
            None => {
                let (host, port) = split_host_port(name);
                let port = port.ok_or_else(|| {
                    Error::new(
                        ErrorCode::ERR_INVALID_ARGUMENT,
                        format!("P2P segment name {name:?} is not host:port"),
                    )
                })?;
                let addr = rpc::resolve(&host, port)?;
                let desc = rpc::fetch_descriptor(addr, name, timeout, &self.local)?;
                Ok((addr, desc))
            }
            Some(store) => {
                let missing = || {
                    Error::new(
                        ErrorCode::ERR_METADATA,
                        format!("segment {name:?} is not published"),
                    )
                };
                let meta = store.get(&rpc_meta_key(name))?.ok_or_else(missing)?;
                let meta = RpcMeta::from_json(&meta)?;
                let desc = store.get(&segment_key(name))?.ok_or_else(missing)?;
                let desc = SegmentDesc::from_json(&desc)?;
                Ok((rpc::resolve(&meta.ip_or_host_name, meta.rpc_port)?, desc))
            }
        }
    }

    fn open_segment(&self, name: &str) -> Result<SegmentHandle> {
        let name = name.trim();
        if name.is_empty() {
            return Err(invalid("empty segment name"));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(ErrorCode::INTERNAL_ERROR, "engine is shut down"));
        }
        if let Some(&h) = self.segments.read().by_name.get(name) {
            return Ok(h);
        }
        let (is_local, rpc_addr, desc) = if name == self.name {
            (true, None, self.local.descriptor())
        } else {
            let (addr, desc) = self.locate(name)?;
            (false, Some(addr), desc)
        };
        let mut t = self.segments.write();
        if let Some(&h) = t.by_name.get(name) {
            return Ok(h);
        }
        let handle = t.next;
        t.next += 1;
        let seg = OpenSegment {
            handle,
            name: name.to_string(),
            is_local,
            rpc_addr,
            desc: RwLock::new(Arc::new(desc)),
        };
        t.by_handle.insert(handle, Arc::new(seg));
        t.by_name.insert(name.to_string(), handle);
        Ok(handle)
    }

    pub(super) fn refresh(&self, seg: &OpenSegment) -> Result<()> {
        let desc = if seg.is_local {
            self.local.descriptor()
        } else {
            self.locate(&seg.name)?.1
        };
        *seg.desc.write() = Arc::new(desc);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_names() {
        assert_eq!(split_host_port("node1"), ("node1".into(), None));
        assert_eq!(split_host_port("node1:1234"), ("node1".into(), Some(1234)));
        assert_eq!(
            split_host_port("127.0.0.1:80"),
            ("127.0.0.1".into(), Some(80))
        );
        assert_eq!(split_host_port("[::1]:80"), ("::1".into(), Some(80)));
        assert_eq!(split_host_port("::1"), ("::1".into(), None));
        assert_eq!(split_host_port("h:notaport"), ("h:notaport".into(), None));
    }
}
