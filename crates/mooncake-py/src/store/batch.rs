//! Puts and gets of many objects as Python bytes-like values.

use mooncake_common::Error;
use mooncake_store::Client;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::bytes::uninit_bytes;
use super::{PyStore, SameNode};
use crate::args::{self, Key};
use crate::buffer::Exported;
use crate::codes::first_error;
use crate::config::ReplicateConfig;
use crate::handle::BufferHandle;

impl PyStore {
    fn write_values(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        values: &Bound<'_, PyAny>,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<i32> {
        let values: Vec<Bound<'_, PyAny>> = values.extract()?;
        let values = values
            .iter()
            .map(Exported::get)
            .collect::<PyResult<Vec<_>>>()?;
        let (live, opts) =
            match self.writer(cfg, keys.len() == values.len(), upsert, SameNode::Refused) {
                Ok(w) => w,
                Err(c) => return Ok(c),
            };
        let keys = args::keys(keys);
        let slices: Vec<&[u8]> = values.iter().map(Exported::as_slice).collect();
        Ok(py.allow_threads(|| {
            if keys.is_empty() {
                return 0;
            }
            first_error(live.client.put_batch(&keys, &slices, opts.clone()))
        }))
    }

    /// A `BufferHandle` per key from `fetch`, `None` for a missing one.
    pub(super) fn handles<T: Send>(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        fetch: impl FnOnce(&Client, &[String]) -> Vec<Result<T, Error>> + Send,
        wrap: fn(T) -> BufferHandle,
    ) -> Vec<Option<BufferHandle>> {
        let keys = args::keys(keys);
        let Some(live) = self.live.get() else {
            return keys.iter().map(|_| None).collect();
        };
        if keys.is_empty() {
            return Vec::new();
        }
        py.allow_threads(|| fetch(&live.client, &keys))
            .into_iter()
            .map(|r| r.ok().map(wrap))
            .collect()
    }
}

put_and_upsert! {
    /// Stores `values[i]` under `keys[i]`; one int for the whole batch: 0,
    /// or the first failure's code.
    #[pyo3(signature = (keys, values, config = None))]
    put_batch / upsert_batch(
        keys: Vec<Key>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> => write_values
}

#[pymethods]
impl PyStore {
    /// Values in key order, `b""` for missing ones. Like the reference, an
    /// empty key list gives `[b""]`.
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<Key>) -> Vec<Bound<'py, PyBytes>> {
        let keys = args::keys(keys);
        let Some(live) = self.live.get() else {
            return vec![PyBytes::new(py, b""); keys.len().max(1)];
        };
        if keys.is_empty() {
            return vec![PyBytes::new(py, b"")];
        }
        // As in `get`: every bytes object is allocated (uninitialised) once
        // the sizes are known, in one GIL round, and filled without the GIL.
        let mut made: Vec<Option<Py<PyBytes>>> = Vec::with_capacity(keys.len());
        let got = py.allow_threads(|| {
            live.client.get_batch_with(&keys, |sizes| {
                Python::with_gil(|py| {
                    let mut bufs = Vec::with_capacity(sizes.len());
                    for size in sizes {
                        match size {
                            Some(n) => {
                                let (obj, buf) = uninit_bytes(py, *n)?;
                                made.push(Some(obj));
                                bufs.push(Some(buf));
                            }
                            None => {
                                made.push(None);
                                bufs.push(None);
                            }
                        }
                    }
                    Ok(bufs)
                })
            })
        });
        got.into_iter()
            .zip(made.into_iter().chain(std::iter::repeat_with(|| None)))
            .map(|(r, obj)| match (r, obj) {
                (Ok(_), Some(b)) => b.into_bound(py),
                _ => PyBytes::new(py, b""),
            })
            .collect()
    }

    fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<Key>) -> Vec<Option<BufferHandle>> {
        self.handles(py, keys, Client::batch_get_buffer, BufferHandle::staged)
    }
}
