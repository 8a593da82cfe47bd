//! Copy and move tasks: queued on the master, run by a client.

use pyo3::prelude::*;

use super::descriptors::QueryTaskResponse;
use super::PyStore;
use crate::args::Key;
use crate::codes::{self, code, join_uuid, NOT_READY};

#[pymethods]
impl PyStore {
    /// `((hi, lo), 0)` for a queued copy of `key` onto each of `targets`
    /// (segment names); `((0, 0), code)` on failure.
    fn create_copy_task(
        &self,
        py: Python<'_>,
        key: Key,
        targets: Vec<String>,
    ) -> ((u64, u64), i32) {
        self.live.with(py, ((0, 0), NOT_READY), |live| {
            codes::task(live.client.create_copy_task(&key.0, &targets))
        })
    }

    /// `((hi, lo), 0)` for a queued move of `key`'s replica on `source` to
    /// `target`; `((0, 0), code)` on failure.
    fn create_move_task(
        &self,
        py: Python<'_>,
        key: Key,
        source: String,
        target: String,
    ) -> ((u64, u64), i32) {
        self.live.with(py, ((0, 0), NOT_READY), |live| {
            codes::task(live.client.create_move_task(&key.0, &source, &target))
        })
    }

    /// `(QueryTaskResponse, 0)`, or `(None, code)` (-1400 for an unknown task).
    fn query_task(&self, py: Python<'_>, task_id: (u64, u64)) -> (Option<QueryTaskResponse>, i32) {
        let id = join_uuid(task_id);
        self.live.with(py, (None, NOT_READY), |live| {
            match live.client.query_task(id) {
                Ok(info) => (Some(QueryTaskResponse::from(info)), 0),
                Err(e) => (None, code(&e)),
            }
        })
    }
}
