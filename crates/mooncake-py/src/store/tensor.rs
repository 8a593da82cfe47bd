//! What `mooncake/store.py` builds the tensor calls on: objects in memory
//! the returned handle owns (a tensor keeps it as its storage), and batch
//! puts of `[header, data...]` parts.

use mooncake_store::Client;
use pyo3::prelude::*;

use super::{PyStore, SameNode};
use crate::args::{self, Key};
use crate::buffer::Exported;
use crate::codes::status;
use crate::config::ReplicateConfig;
use crate::handle::BufferHandle;

#[pymethods]
impl PyStore {
    /// The object's bytes in memory owned by the handle; `None` when missing.
    fn _get_owned(&self, py: Python<'_>, key: Key) -> Option<BufferHandle> {
        self.handle(py, &key.0, Client::get, BufferHandle::heap)
    }

    fn _batch_get_owned(&self, py: Python<'_>, keys: Vec<Key>) -> Vec<Option<BufferHandle>> {
        self.handles(py, keys, Client::get_batch, BufferHandle::heap)
    }

    /// Stores one object per key from lists of parts; a code per key.
    #[pyo3(signature = (keys, parts, config = None, upsert = false))]
    fn _batch_put_parts(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        parts: Vec<Vec<Bound<'_, PyAny>>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<Vec<i32>> {
        let n = keys.len();
        let exported = parts
            .iter()
            .map(|p| p.iter().map(Exported::get).collect::<PyResult<Vec<_>>>())
            .collect::<PyResult<Vec<_>>>()?;
        let (live, opts) =
            match self.writer(config, exported.len() == n, upsert, SameNode::Accepted) {
                Ok(w) => w,
                Err(c) => return Ok(vec![c; n]),
            };
        let keys = args::keys(keys);
        Ok(py.allow_threads(|| {
            keys.iter()
                .zip(&exported)
                .map(|(k, p)| {
                    let slices: Vec<&[u8]> = p.iter().map(Exported::as_slice).collect();
                    status(live.client.put_parts(k, &slices, opts.clone()))
                })
                .collect()
        }))
    }
}
