//! Sizes, existence and removal of objects.

use pyo3::prelude::*;

use super::PyStore;
use crate::args::{self, Flag, Key};
use crate::codes::{self, count, per_key, status, NOT_FOUND, NOT_READY};

#[pymethods]
impl PyStore {
    /// Size in bytes, or a negative code (-704 when missing).
    fn get_size(&self, py: Python<'_>, key: Key) -> i64 {
        self.live.with(py, NOT_READY as i64, |live| {
            if key.0.is_empty() {
                return NOT_FOUND as i64;
            }
            count(live.client.get_size(&key.0))
        })
    }

    /// 1 exists, 0 missing, -1 error.
    fn is_exist(&self, py: Python<'_>, key: Key) -> i32 {
        self.live.with(py, -1, |live| {
            if key.0.is_empty() {
                return 0;
            }
            codes::exist(live.client.is_exist(&key.0))
        })
    }

    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<Key>) -> Vec<i32> {
        let keys = args::keys(keys);
        self.per_key(py, &keys, -1, |live| {
            match live.client.batch_is_exist(&keys) {
                Ok(v) => v
                    .into_iter()
                    .zip(&keys)
                    .map(|(r, k)| if k.is_empty() { 0 } else { codes::exist(r) })
                    .collect(),
                Err(_) => vec![-1; keys.len()],
            }
        })
    }

    /// 0, or -704 missing, -706 leased (unless `force`).
    #[pyo3(signature = (key, force = Flag(false)))]
    fn remove(&self, py: Python<'_>, key: Key, force: Flag) -> i32 {
        self.live.with(py, NOT_READY, |live| {
            if key.0.is_empty() {
                return NOT_FOUND;
            }
            status(live.client.remove(&key.0, force.0))
        })
    }

    #[pyo3(signature = (keys, force = Flag(false)))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<Key>, force: Flag) -> Vec<i32> {
        let keys = args::keys(keys);
        self.per_key(py, &keys, NOT_READY, |live| {
            per_key(keys.len(), live.client.batch_remove(&keys, force.0))
        })
    }

    /// Number of objects removed, or a negative code (-600 for a bad regex).
    #[pyo3(signature = (regex_pattern, force = Flag(false)))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: String, force: Flag) -> i64 {
        self.live.with(py, NOT_READY as i64, |live| {
            count(live.client.remove_by_regex(&regex_pattern, force.0))
        })
    }

    #[pyo3(signature = (force = Flag(false)))]
    fn remove_all(&self, py: Python<'_>, force: Flag) -> i64 {
        self.live.with(py, NOT_READY as i64, |live| {
            count(live.client.remove_all(force.0))
        })
    }
}
