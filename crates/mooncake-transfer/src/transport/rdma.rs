//! RDMA transport seam (cargo feature `rdma`).
//!
//! Where verbs plug in. An implementation provides a `Transport` that:
//! - opens `device_name` (ibverbs context, protection domain, completion queue);
//! - registers every local buffer as a memory region when the engine registers
//!   it, and publishes each buffer's `rkey`s and the device `lid`/`gid` in the
//!   segment descriptor's `devices` and `buffers[].rkey` fields (already part
//!   of `SegmentDesc`, in the reference's shape);
//! - exchanges queue-pair numbers with peers over the engine RPC port (a new
//!   frame kind next to `DescReq`), then posts one RDMA READ/WRITE work request
//!   per slice and reports completions through `Task::slice_done`.
//!
//! Until then, asking for `rdma` is a clear error rather than a silent TCP fallback.

use mooncake_common::{Error, ErrorCode, Result};

/// Opens the RDMA device. No verbs provider is linked into this build yet.
pub(crate) fn open(device_name: &str) -> Result<std::convert::Infallible> {
    Err(Error::new(
        ErrorCode::ERR_DEVICE_NOT_FOUND,
        format!("rdma device {device_name:?}: no verbs provider is linked into this build"),
    ))
}
