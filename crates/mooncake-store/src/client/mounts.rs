//! Segments mounted and unmounted while the client runs (see
//! `real::dynamic`). Only an embedded client holds memory to mount; a dummy
//! client answers `INVALID_PARAMS`.

use mooncake_common::{Error, ErrorCode, Result};

use super::real::RealClient;
use super::Client;

fn embedded(c: &Client) -> Result<&RealClient> {
    c.inner.as_real().ok_or_else(|| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            "mounting segments needs an embedded client (a dummy client holds no memory)",
        )
    })
}

impl Client {
    /// Allocates `size` bytes of shared memory and mounts them as segments
    /// (one per 16 GiB): their ids and the bytes allocated.
    pub fn allocate_and_mount_segment(&self, size: u64) -> Result<(Vec<String>, u64)> {
        embedded(self)?.allocate_and_mount_segment(size)
    }

    /// Maps `size` bytes of the file at `path` from `offset` (shared, so
    /// the file keeps what is written) and mounts them: the segment's ids.
    pub fn mount_segment(&self, path: &str, offset: u64, size: u64) -> Result<Vec<String>> {
        embedded(self)?
            .mount_file_segment(path, offset, size)
            .map(|id| vec![id])
    }

    /// Unmounts segments mounted at run time: their objects leave the
    /// cluster at once; the memory goes after `grace_secs`.
    pub fn unmount_segment(&self, ids: &[String], grace_secs: u64) -> Result<()> {
        embedded(self)?.unmount_dynamic(ids, false, grace_secs)
    }

    /// [`Self::unmount_segment`] for segments from
    /// [`Self::allocate_and_mount_segment`] only.
    pub fn unmount_and_free_segment(&self, ids: &[String], grace_secs: u64) -> Result<()> {
        embedded(self)?.unmount_dynamic(ids, true, grace_secs)
    }

    /// Withdraws this client's SSD tier from the master (no more offload
    /// work; the objects held only there leave the cluster), then waits
    /// `grace_secs` for reads in flight. Without a tier: nothing to do.
    pub fn unmount_local_disk_segment(&self, grace_secs: u64) -> Result<()> {
        embedded(self)?.unmount_local_disk(grace_secs)
    }

    /// Reads of disk-only objects this client sent to other clients' SSD
    /// tiers (0 for a dummy client, as the reference's).
    pub fn offload_rpc_read_count(&self) -> u64 {
        self.inner
            .as_real()
            .map_or(0, RealClient::offload_rpc_read_count)
    }

    /// Storage peers (engine endpoints) this client passes over for now
    /// because a read from them did not answer within its hedge delay
    /// (`MC_STORE_HEDGE_READ_MS`); a peer leaves once a read from it
    /// completes. Empty for a dummy client.
    pub fn slow_peers(&self) -> Vec<String> {
        self.inner
            .as_real()
            .map_or_else(Vec::new, RealClient::slow_peers)
    }
}
