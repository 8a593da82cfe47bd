//! Transports move the bytes of submitted requests. One file per transport:
//!
//! - `local`: the target is this engine's own segment, so a memcpy;
//! - `shm`: the target lives on the same host and its buffer is engine-managed
//!   shared memory, mapped once and then memcpy'd;
//! - `tcp`: everything else, pipelined over a few long-lived connections.
//!
//! The engine asks each transport in that order whether it [`Transport::serves`]
//! a request and hands the request to the first that does.
//!
//! A new transport (RDMA, say) is one more [`Transport`]: it registers local
//! buffers with its device when the engine registers them, publishes what
//! peers need (keys, device addresses) in the segment descriptor's `devices`
//! and `buffers[].rkey` fields, exchanges connection details over the engine
//! RPC port (a frame kind next to `DescReq`), and reports each slice through
//! `Task::slice_done`. Until one exists, `protocol=rdma` is refused.

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::batch::Task;
use crate::segment::SegmentDesc;
use crate::{Opcode, SegmentHandle};

pub(crate) mod local;
pub(crate) mod shm;
pub(crate) mod tcp;

/// One request, already validated by the engine: `local` lies in registered
/// memory and `[remote, remote+len)` in a buffer of the target's descriptor.
pub(crate) struct Work {
    pub(crate) task: Arc<Task>,
    pub(crate) opcode: Opcode,
    pub(crate) local: usize,
    pub(crate) remote: u64,
    pub(crate) len: usize,
}

/// An opened segment as the transports see it.
pub(crate) struct OpenSegment {
    pub(crate) handle: SegmentHandle,
    pub(crate) name: String,
    /// This engine's own segment.
    pub(crate) is_local: bool,
    /// Where the owner's RPC/data port listens (None for the local segment).
    pub(crate) rpc_addr: Option<SocketAddr>,
    pub(crate) desc: RwLock<Arc<SegmentDesc>>,
}

impl OpenSegment {
    pub(crate) fn desc(&self) -> Arc<SegmentDesc> {
        self.desc.read().clone()
    }
}

pub(crate) trait Transport: Send + Sync {
    fn name(&self) -> &'static str;

    /// Prepares to carry requests to `segment` for one submission, or `None`
    /// when this transport never serves that segment. Per-segment work
    /// (descriptor snapshot, mappings, connections) happens here once, so
    /// per-request routing stays cheap.
    fn route(&self, segment: &OpenSegment) -> Option<Box<dyn Route>>;

    /// Forgets per-segment state (mappings) when the segment is closed.
    fn close_segment(&self, _segment: &OpenSegment) {}
}

/// One transport's way to one segment, for one submission.
pub(crate) trait Route {
    /// Whether this route carries `[remote, remote+len)`.
    fn serves(&self, remote: u64, len: usize) -> bool;

    /// Starts the work (all of it `serves`). Each task reports through
    /// `expect_slices` / `slice_done` (or `fail`), possibly before this returns.
    fn submit(&self, work: Vec<Work>);
}
