//! Where an object's replicas are, and dropping them.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::descriptors::ReplicaDescriptor;
use super::PyStore;
use crate::args::{self, Key};

#[pymethods]
impl PyStore {
    /// The object's replicas; `[]` when it is missing.
    fn get_replica_desc(&self, py: Python<'_>, key: Key) -> Vec<ReplicaDescriptor> {
        self.live.with(py, Vec::new(), |live| {
            live.client
                .get_replica_desc(&key.0)
                .map(|v| v.into_iter().map(ReplicaDescriptor::from).collect())
                .unwrap_or_default()
        })
    }

    /// `{key: [ReplicaDescriptor]}` for the keys that exist.
    fn batch_get_replica_desc<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<Key>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let keys = args::keys(keys);
        let found = self.per_key(py, &keys, None, |live| {
            match live.client.batch_get_replica_desc(&keys) {
                Ok(v) => v.into_iter().map(Result::ok).collect(),
                Err(_) => Vec::new(),
            }
        });
        let d = PyDict::new(py);
        for (k, reps) in keys.iter().zip(found) {
            if let Some(reps) = reps {
                let list: Vec<ReplicaDescriptor> =
                    reps.into_iter().map(ReplicaDescriptor::from).collect();
                d.set_item(k, list)?;
            }
        }
        Ok(d)
    }

    /// Keys whose replicas on `segment_name` (all replicas when empty) were
    /// dropped; objects still leased are kept. Any failure is `[]`.
    #[pyo3(signature = (keys, segment_name = String::new()))]
    fn batch_replica_clear(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        segment_name: String,
    ) -> Vec<String> {
        let keys = args::keys(keys);
        self.live.with(py, Vec::new(), |live| {
            if keys.is_empty() {
                return Vec::new();
            }
            live.client
                .batch_replica_clear(&keys, &segment_name)
                .unwrap_or_default()
        })
    }
}
