//! Segments mounted and unmounted while the store runs. Answers as the
//! reference's: dicts with `ret` (0 or -1) and the segment ids, ints 0 or
//! -1; the reason of a -1 goes to the log.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use mooncake_common::Error;
use mooncake_store::client::Client;

use super::PyStore;
use crate::args::Unsigned;

/// Our engine moves bytes over TCP from host memory only.
fn check_transport(protocol: &str, location: &str) -> Result<(), String> {
    if !matches!(protocol, "" | "tcp") {
        return Err(format!(
            "protocol {protocol:?}: this build moves bytes over tcp only"
        ));
    }
    if !(location.is_empty() || location.starts_with("cpu")) {
        return Err(format!(
            "location {location:?}: only host memory (cpu) is supported"
        ));
    }
    Ok(())
}

impl PyStore {
    /// Runs `f` on the set-up client without the GIL; its error as text.
    fn on_client<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Client) -> Result<T, Error> + Send,
    ) -> Result<T, String> {
        self.live
            .with(py, Err("the store is not set up".to_owned()), |live| {
                f(&live.client).map_err(|e| e.to_string())
            })
    }
}

fn ret<T>(what: &str, r: Result<T, String>) -> (i32, Option<T>) {
    match r {
        Ok(v) => (0, Some(v)),
        Err(e) => {
            tracing::error!("{what}: {e}");
            (-1, None)
        }
    }
}

#[pymethods]
impl PyStore {
    /// Maps `size` bytes of the file at `path` from `offset` and mounts
    /// them: `{"ret", "segment_ids"}`.
    #[pyo3(signature = (path, size, offset = Unsigned(0), protocol = "tcp".to_owned(), location = String::new()))]
    fn mount_segment<'py>(
        &self,
        py: Python<'py>,
        path: String,
        size: Unsigned,
        offset: Unsigned,
        protocol: String,
        location: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let r = check_transport(&protocol, &location)
            .and_then(|()| self.on_client(py, |c| c.mount_segment(&path, offset.0, size.0)));
        let (code, ids) = ret("mount_segment", r);
        let d = PyDict::new(py);
        d.set_item("ret", code)?;
        d.set_item("segment_ids", ids.unwrap_or_default())?;
        Ok(d)
    }

    /// Allocates `size` bytes and mounts them:
    /// `{"ret", "segment_ids", "allocated_size"}`.
    #[pyo3(signature = (size, protocol = "tcp".to_owned(), location = String::new()))]
    fn allocate_and_mount_segment<'py>(
        &self,
        py: Python<'py>,
        size: Unsigned,
        protocol: String,
        location: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let r = check_transport(&protocol, &location)
            .and_then(|()| self.on_client(py, |c| c.allocate_and_mount_segment(size.0)));
        let (code, got) = ret("allocate_and_mount_segment", r);
        let (ids, allocated) = got.unwrap_or_default();
        let d = PyDict::new(py);
        d.set_item("ret", code)?;
        d.set_item("segment_ids", ids)?;
        d.set_item("allocated_size", allocated)?;
        Ok(d)
    }

    /// Unmounts segments mounted at run time; their memory goes after
    /// `grace_period_seconds`: 0 or -1.
    #[pyo3(signature = (segment_ids, grace_period_seconds = Unsigned(0)))]
    fn unmount_segment(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: Unsigned,
    ) -> i32 {
        let r = self.on_client(py, |c| {
            c.unmount_segment(&segment_ids, grace_period_seconds.0)
        });
        ret("unmount_segment", r).0
    }

    /// [`Self::unmount_segment`] for allocated segments only: 0 or -1.
    #[pyo3(signature = (segment_ids, grace_period_seconds = Unsigned(0)))]
    fn unmount_and_free_segment(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: Unsigned,
    ) -> i32 {
        let r = self.on_client(py, |c| {
            c.unmount_and_free_segment(&segment_ids, grace_period_seconds.0)
        });
        ret("unmount_and_free_segment", r).0
    }

    /// Withdraws this store's SSD tier from the master (no more offload
    /// work; objects held only there leave the cluster), then waits
    /// `grace_period_seconds` for reads in flight: 0 (also without a
    /// tier) or -1.
    #[pyo3(signature = (grace_period_seconds = Unsigned(0)))]
    fn unmount_local_disk_segment(&self, py: Python<'_>, grace_period_seconds: Unsigned) -> i32 {
        let r = self.on_client(py, |c| c.unmount_local_disk_segment(grace_period_seconds.0));
        ret("unmount_local_disk_segment", r).0
    }

    /// Reads of disk-only objects sent to other clients' SSD tiers.
    fn get_offload_rpc_read_count(&self) -> i64 {
        self.live
            .get()
            .map_or(0, |live| live.client.offload_rpc_read_count() as i64)
    }
}
