//! `mooncake.store.EngramStore`: Engram embedding tables kept in the store,
//! one `float32` table `[N_h, D]` per head under `engram:l{layer}:h{head}`,
//! read back row by row as `[B, L, H, D]` for precomputed row ids `[B, L, H]`.
//!
//! The layout and the ranges a lookup reads are pure ([`Layout`]); the
//! Python class only moves buffers: a populate registers each table and
//! writes all of them in one `batch_put_from`, a lookup registers the output
//! array and fills it with one ranged read (every row a fragment), so the
//! bytes never pass through Python.

use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::{write_options, Live, PyStore};
use crate::buffer::Exported;
use crate::codes;
use mooncake_common::ErrorCode;

const ROW_ITEM: usize = std::mem::size_of::<f32>();

/// The physical layout of one layer: table sizes per head and row width.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Layout {
    vocab: Vec<i64>,
    dim: usize,
    keys: Vec<String>,
}

/// Per-head fragments of a lookup: destination offsets, source offsets and
/// the row size, in the order `get_into_ranges` takes them.
#[derive(Debug, PartialEq)]
pub(crate) struct Fragments {
    pub(crate) dst: Vec<Vec<u64>>,
    pub(crate) src: Vec<Vec<u64>>,
    pub(crate) sizes: Vec<Vec<u64>>,
    /// Bytes of the whole `[B, L, H, D]` output.
    pub(crate) out_bytes: usize,
}

impl Layout {
    pub(crate) fn new(layer_id: i64, vocab: Vec<i64>, dim: i64) -> Result<Layout, String> {
        if vocab.is_empty() {
            return Err("EngramStoreConfig.table_vocab_sizes must not be empty".into());
        }
        if dim <= 0 {
            return Err("EngramStoreConfig.embedding_dim must be positive".into());
        }
        if vocab.iter().any(|&n| n <= 0) {
            return Err(
                "EngramStoreConfig.table_vocab_sizes must contain only positive values".into(),
            );
        }
        let keys = (0..vocab.len())
            .map(|h| format!("engram:l{layer_id}:h{h}"))
            .collect();
        Ok(Layout {
            vocab,
            dim: dim as usize,
            keys,
        })
    }

    pub(crate) fn heads(&self) -> usize {
        self.vocab.len()
    }

    fn row_bytes(&self) -> usize {
        self.dim * ROW_ITEM
    }

    /// The fragments that read `row_ids` (flattened `[b, l, h]`, `tokens`
    /// = B × L entries of `heads()` ids each) into a `[B, L, H, D]` output.
    pub(crate) fn fragments(&self, row_ids: &[i64], tokens: usize) -> Result<Fragments, String> {
        let heads = self.heads();
        let row = self.row_bytes();
        if tokens == 0 {
            return Err("row_ids must not be empty".into());
        }
        let cells = tokens
            .checked_mul(heads)
            .filter(|&c| c == row_ids.len())
            .ok_or("row_ids must have shape [B, L, H] with H == num_heads")?;
        let out_bytes = cells
            .checked_mul(row)
            .ok_or("the lookup's output does not fit in memory")?;
        let mut f = Fragments {
            dst: vec![Vec::with_capacity(tokens); heads],
            src: vec![Vec::with_capacity(tokens); heads],
            sizes: vec![Vec::with_capacity(tokens); heads],
            out_bytes,
        };
        for (cell, &id) in row_ids.iter().enumerate() {
            let h = cell % heads;
            if id < 0 || id >= self.vocab[h] {
                return Err(format!(
                    "row id {id} for head {h} is outside [0, {})",
                    self.vocab[h]
                ));
            }
            f.dst[h].push((cell * row) as u64);
            f.src[h].push(id as u64 * row as u64);
            f.sizes[h].push(row as u64);
        }
        Ok(f)
    }
}

/// `mooncake.store.EngramStoreConfig`.
#[pyclass(module = "mooncake.store", name = "EngramStoreConfig")]
#[derive(Clone)]
pub(crate) struct EngramStoreConfig {
    #[pyo3(get, set)]
    table_vocab_sizes: Vec<i64>,
    #[pyo3(get, set)]
    embedding_dim: i64,
}

#[pymethods]
impl EngramStoreConfig {
    #[new]
    fn new() -> Self {
        EngramStoreConfig {
            table_vocab_sizes: vec![1024],
            embedding_dim: 64,
        }
    }
}

/// `mooncake.store.EngramStore(layer_id, config, store=None)`.
#[pyclass(module = "mooncake.store", name = "EngramStore", frozen)]
pub(crate) struct EngramStore {
    layout: Layout,
    store: Option<Py<PyStore>>,
}

impl EngramStore {
    fn live(&self, what: &str) -> PyResult<Arc<Live>> {
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err(format!("{what}: EngramStore has no store")))?;
        store
            .get()
            .live
            .get()
            .ok_or_else(|| PyRuntimeError::new_err(format!("{what}: the store is not set up")))
    }

    /// Row ids as a flat `[B, L, H]` vector, with B and L.
    fn row_ids(
        &self,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
    ) -> PyResult<(Vec<i64>, usize, usize)> {
        let np = py.import("numpy")?;
        if ids.is_instance(&np.getattr("ndarray")?)? {
            let arr = np.call_method1("ascontiguousarray", (ids, "int64"))?;
            let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
            if shape.len() != 3 {
                return Err(PyRuntimeError::new_err(
                    "row_ids array must have shape [B, L, H]",
                ));
            }
            if shape[2] != self.layout.heads() {
                return Err(PyRuntimeError::new_err(
                    "row_ids last dimension must match num_heads",
                ));
            }
            let buf = Exported::get(&arr)?;
            let ids = buf
                .as_slice()
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes")))
                .collect();
            return Ok((ids, shape[0], shape[1]));
        }
        // Nested sequences: B lists of L lists of H ints, rectangular.
        let batch: Vec<Vec<Vec<i64>>> = ids.extract().map_err(|_| {
            PyRuntimeError::new_err("row_ids must be an int64 array or nested lists [B, L, H]")
        })?;
        let l = batch.first().map_or(0, Vec::len);
        if l == 0 {
            return Err(PyRuntimeError::new_err("row_ids must not be empty"));
        }
        let heads = self.layout.heads();
        let mut flat = Vec::with_capacity(batch.len() * l * heads);
        for tokens in &batch {
            if tokens.len() != l || tokens.iter().any(|t| t.len() != heads) {
                return Err(PyRuntimeError::new_err(
                    "row_ids must have shape [B, L, H] with H == num_heads",
                ));
            }
            tokens.iter().for_each(|t| flat.extend_from_slice(t));
        }
        Ok((flat, batch.len(), l))
    }
}

#[pymethods]
impl EngramStore {
    #[new]
    #[pyo3(signature = (layer_id, config, store = None))]
    fn new(
        layer_id: i64,
        config: PyRef<'_, EngramStoreConfig>,
        store: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let layout = Layout::new(
            layer_id,
            config.table_vocab_sizes.clone(),
            config.embedding_dim,
        )
        .map_err(PyValueError::new_err)?;
        let store = match store {
            Some(s) if !s.is_none() => Some(
                s.downcast::<PyStore>()
                    .map_err(|_| {
                        PyRuntimeError::new_err(
                            "EngramStore store must be a MooncakeDistributedStore or None",
                        )
                    })?
                    .clone()
                    .unbind(),
            ),
            _ => None,
        };
        Ok(EngramStore { layout, store })
    }

    fn get_table_vocab_sizes(&self) -> Vec<i64> {
        self.layout.vocab.clone()
    }

    fn get_store_keys(&self) -> Vec<String> {
        self.layout.keys.clone()
    }

    fn get_num_heads(&self) -> usize {
        self.layout.heads()
    }

    fn get_embedding_dim(&self) -> usize {
        self.layout.dim
    }

    /// Uploads one `float32` table `[N_h, D]` per head. Create-only: a
    /// layer whose keys exist must be removed first. A failed upload removes
    /// what it wrote.
    fn populate(&self, py: Python<'_>, embedding_buffers: &Bound<'_, PyList>) -> PyResult<()> {
        let heads = self.layout.heads();
        if embedding_buffers.len() != heads {
            return Err(PyRuntimeError::new_err(
                "embedding_buffers size must match num_heads",
            ));
        }
        let np = py.import("numpy")?;
        let ndarray = np.getattr("ndarray")?;
        let mut tables = Vec::with_capacity(heads);
        for (h, buf) in embedding_buffers.iter().enumerate() {
            if !buf.is_instance(&ndarray)? {
                return Err(PyRuntimeError::new_err(
                    "embedding_buffers must be NumPy arrays",
                ));
            }
            let arr = np.call_method1("ascontiguousarray", (buf, "float32"))?;
            let shape: Vec<i64> = arr.getattr("shape")?.extract()?;
            if shape != [self.layout.vocab[h], self.layout.dim as i64] {
                return Err(PyRuntimeError::new_err(format!(
                    "embedding buffer {h} has shape {shape:?}, not [{}, {}] \
                     (get_table_vocab_sizes()/get_embedding_dim())",
                    self.layout.vocab[h], self.layout.dim
                )));
            }
            tables.push(Exported::get(&arr)?);
        }
        let live = self.live("populate failed")?;
        let keys = self.layout.keys.clone();
        let opts = write_options(None, false, super::SameNode::Accepted).map_err(|c| {
            PyRuntimeError::new_err(format!("populate failed: write options rc={c}"))
        })?;
        py.allow_threads(move || populate(&live, &keys, &tables, opts))
            .map_err(|e| PyRuntimeError::new_err(format!("populate failed: {e}")))
    }

    /// Rows for `row_ids` `[B, L, H]` (nested lists or an int64 array) as
    /// a `float32` array `[B, L, H, D]`.
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        row_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (ids, b, l) = self.row_ids(py, row_ids)?;
        let frags = self
            .layout
            .fragments(&ids, b * l)
            .map_err(PyRuntimeError::new_err)?;
        let live = self.live("EngramStore lookup failed")?;
        let shape = PyTuple::new(py, [b, l, self.layout.heads(), self.layout.dim])?;
        let out = py
            .import("numpy")?
            .call_method1("empty", (shape, "float32"))?;
        let view = Exported::get(&out)?;
        // The array was made above, C-contiguous and writable; its buffer
        // stays put while `view` holds the export.
        let addr = view.as_slice().as_ptr() as usize;
        let keys = self.layout.keys.clone();
        py.allow_threads(|| read_rows(&live, addr, &keys, &frags))
            .map_err(|e| PyRuntimeError::new_err(format!("EngramStore lookup failed: {e}")))?;
        drop(view);
        Ok(out)
    }

    /// Removes this layer's tables; missing ones are skipped. Returns how
    /// many were removed.
    #[pyo3(signature = (force = false))]
    fn remove_from_store(&self, py: Python<'_>, force: bool) -> PyResult<usize> {
        let live = self.live("remove_from_store failed")?;
        let keys = self.layout.keys.clone();
        py.allow_threads(|| {
            let mut removed = 0;
            for key in &keys {
                match live.client.remove(key, force) {
                    Ok(()) => removed += 1,
                    Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(removed)
        })
        .map_err(|e| {
            PyRuntimeError::new_err(format!("remove_from_store failed, rc={}", codes::code(&e)))
        })
    }
}

fn populate(
    live: &Live,
    keys: &[String],
    tables: &[Exported],
    opts: mooncake_store::types::WriteOptions,
) -> Result<(), String> {
    let exist = live
        .client
        .batch_is_exist(keys)
        .map_err(|e| e.to_string())?;
    for (key, e) in keys.iter().zip(exist) {
        match e {
            Ok(false) => {}
            Ok(true) => {
                return Err(format!(
                    "key '{key}' exists: remove the layer first (remove_from_store)"
                ))
            }
            Err(e) => return Err(format!("cannot check key '{key}': {e}")),
        }
    }
    let addrs: Vec<usize> = tables
        .iter()
        .map(|t| t.as_slice().as_ptr() as usize)
        .collect();
    let sizes: Vec<usize> = tables.iter().map(|t| t.as_slice().len()).collect();
    let mut registered = Vec::new();
    let mut result = Ok(());
    for (&a, &n) in addrs.iter().zip(&sizes) {
        if let Err(e) = live.client.register_buffer(a, n) {
            result = Err(format!("cannot register a table buffer: {e}"));
            break;
        }
        registered.push(a);
    }
    let mut written = vec![false; keys.len()];
    if result.is_ok() {
        match live.client.batch_put_from(keys, &addrs, &sizes, opts) {
            Ok(rs) => {
                for (i, r) in rs.into_iter().enumerate() {
                    match r {
                        Ok(()) => written[i] = true,
                        Err(e) if result.is_ok() => {
                            result = Err(format!("put of '{}' failed: {e}", keys[i]))
                        }
                        Err(_) => {}
                    }
                }
            }
            Err(e) => result = Err(format!("batch put failed: {e}")),
        }
    }
    for a in registered {
        if let Err(e) = live.client.unregister_buffer(a) {
            result = result.and(Err(format!("cannot unregister a table buffer: {e}")));
        }
    }
    if result.is_err() {
        // Create-only: leave no half-written layer behind.
        for (key, _) in keys.iter().zip(&written).filter(|(_, &w)| w) {
            let _ = live.client.remove(key, true);
        }
    }
    result
}

fn read_rows(live: &Live, addr: usize, keys: &[String], f: &Fragments) -> Result<(), String> {
    if f.out_bytes == 0 {
        return Ok(());
    }
    live.client
        .register_buffer(addr, f.out_bytes)
        .map_err(|e| format!("cannot register the output: {e}"))?;
    let res = live.client.get_into_ranges(
        &[addr],
        &[keys.to_vec()],
        std::slice::from_ref(&f.dst),
        std::slice::from_ref(&f.src),
        std::slice::from_ref(&f.sizes),
    );
    let unreg = live.client.unregister_buffer(addr);
    let heads = res.into_iter().next().unwrap_or_default();
    if heads.len() != keys.len() {
        return Err("the ranged read answered for the wrong number of tables".into());
    }
    for ((key, rows), want) in keys.iter().zip(heads).zip(&f.sizes) {
        if rows.len() != want.len() {
            return Err(format!("table '{key}': wrong number of rows read"));
        }
        for (r, &w) in rows.into_iter().zip(want) {
            match r {
                Ok(n) if n == w => {}
                Ok(n) => return Err(format!("table '{key}': read {n} of {w} bytes of a row")),
                Err(e) => return Err(format!("table '{key}': {e}")),
            }
        }
    }
    unreg.map_err(|e| format!("cannot unregister the output: {e}"))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<EngramStoreConfig>()?;
    m.add_class::<EngramStore>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(7, vec![3, 5], 2).unwrap()
    }

    #[test]
    fn keys_name_the_layer_and_head() {
        assert_eq!(layout().keys, ["engram:l7:h0", "engram:l7:h1"]);
    }

    #[test]
    fn bad_layouts_are_refused() {
        assert!(Layout::new(1, vec![], 2).is_err());
        assert!(Layout::new(1, vec![3, 0], 2).is_err());
        assert!(Layout::new(1, vec![3, -1], 2).is_err());
        assert!(Layout::new(1, vec![3], 0).is_err());
    }

    #[test]
    fn fragments_place_each_row_at_its_cell() {
        // B × L = 2 tokens, H = 2: ids [[2, 4], [0, 1]], rows of 8 bytes.
        let f = layout().fragments(&[2, 4, 0, 1], 2).unwrap();
        assert_eq!(f.out_bytes, 4 * 8);
        assert_eq!(f.dst, [vec![0, 16], vec![8, 24]]);
        assert_eq!(f.src, [vec![16, 0], vec![32, 8]]);
        assert_eq!(f.sizes, [vec![8, 8], vec![8, 8]]);
    }

    #[test]
    fn ids_outside_their_table_are_refused() {
        let l = layout();
        assert!(l.fragments(&[3, 0], 1).is_err(), "head 0 has 3 rows");
        assert!(l.fragments(&[0, 5], 1).is_err(), "head 1 has 5 rows");
        assert!(l.fragments(&[-1, 0], 1).is_err());
        assert!(l.fragments(&[2, 4], 1).is_ok());
    }

    #[test]
    fn shapes_that_do_not_match_are_refused() {
        let l = layout();
        assert!(l.fragments(&[], 0).is_err());
        assert!(l.fragments(&[0, 0, 0], 1).is_err());
        assert!(l.fragments(&[0, 0], 2).is_err());
    }
}
