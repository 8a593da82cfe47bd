//! Zero-copy writes: objects stored from raw addresses. Registered and pool
//! memory is read in place; other valid memory through a copy (see
//! [`super::memory`]).

use pyo3::prelude::*;

use super::memory::{view, Mem};
use super::{pick, scatter, PyStore, Write};
use crate::args::{self, usizes, Key, Unsigned};
use crate::codes::{per_key, status, INVALID};
use crate::config::ReplicateConfig;
use crate::mem::Access;

impl PyStore {
    fn write_from(
        &self,
        py: Python<'_>,
        key: &str,
        addr: usize,
        size: usize,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        write: Write,
    ) -> i32 {
        let (live, cfg) = match self.writer(cfg, true) {
            Ok(w) => w,
            Err(c) => return c,
        };
        if size == 0 && addr != 0 {
            return 0;
        }
        py.allow_threads(|| match live.memory.classify(addr, size, Access::Read) {
            Mem::Direct => status(write.from(&live.client, key, addr, size, &cfg)),
            Mem::Copy => {
                // SAFETY: `classify` just answered `Copy` for this range.
                let v = unsafe { view(addr, size) };
                status(write.parts(&live.client, key, &[v], &cfg))
            }
            Mem::Bad => INVALID,
        })
    }

    fn batch_write_from(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        addrs: Vec<Unsigned>,
        sizes: Vec<Unsigned>,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        write: Write,
    ) -> Vec<i32> {
        let (keys, addrs, sizes) = (args::keys(keys), usizes(&addrs), usizes(&sizes));
        let n = keys.len();
        let (live, cfg) = match self.writer(cfg, addrs.len() == n && sizes.len() == n) {
            Ok(w) => w,
            Err(c) => return vec![c; n],
        };
        py.allow_threads(|| {
            let mut out = vec![0; n];
            let (mut direct, mut copied) = (Vec::new(), Vec::new());
            for i in 0..n {
                if sizes[i] == 0 && addrs[i] != 0 {
                    continue;
                }
                match live.memory.classify(addrs[i], sizes[i], Access::Read) {
                    Mem::Direct => direct.push(i),
                    Mem::Copy => copied.push(i),
                    Mem::Bad => out[i] = INVALID,
                }
            }
            if !direct.is_empty() {
                let (k, a, s) = (
                    pick(&keys, &direct),
                    pick(&addrs, &direct),
                    pick(&sizes, &direct),
                );
                let r = write.batch_from(&live.client, &k, &a, &s, &cfg);
                scatter(&mut out, &direct, per_key(direct.len(), r));
            }
            if !copied.is_empty() {
                let k = pick(&keys, &copied);
                let v: Vec<&[u8]> = copied
                    .iter()
                    // SAFETY: `classify` answered `Copy` for each copied range above.
                    .map(|&i| unsafe { view(addrs[i], sizes[i]) })
                    .collect();
                let r = write.values(&live.client, &k, &v, &cfg);
                scatter(&mut out, &copied, per_key(copied.len(), r));
            }
            out
        })
    }
}

#[pymethods]
impl PyStore {
    #[pyo3(signature = (key, buffer_ptr, size, config = None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: Key,
        buffer_ptr: Unsigned,
        size: Unsigned,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        let (addr, size) = (buffer_ptr.usize(), size.usize());
        self.write_from(py, &key.0, addr, size, config, Write::Put)
    }

    #[pyo3(signature = (key, buffer_ptr, size, config = None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: Key,
        buffer_ptr: Unsigned,
        size: Unsigned,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        let (addr, size) = (buffer_ptr.usize(), size.usize());
        self.write_from(py, &key.0, addr, size, config, Write::Upsert)
    }

    /// Stores `[metadata][data]` as one object.
    #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_from_with_metadata(
        &self,
        py: Python<'_>,
        key: Key,
        buffer_ptr: Unsigned,
        metadata_buffer_ptr: Unsigned,
        size: Unsigned,
        metadata_size: Unsigned,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        let (live, cfg) = match self.writer(config, true) {
            Ok(w) => w,
            Err(c) => return c,
        };
        let (d, m) = (
            (buffer_ptr.usize(), size.usize()),
            (metadata_buffer_ptr.usize(), metadata_size.usize()),
        );
        py.allow_threads(|| {
            let dm = live.memory.classify(d.0, d.1, Access::Read);
            let mm = live.memory.classify(m.0, m.1, Access::Read);
            match (dm, mm) {
                (Mem::Bad, _) | (_, Mem::Bad) => INVALID,
                (Mem::Direct, Mem::Direct) => status(
                    live.client
                        .put_from_with_metadata(&key.0, d.0, m.0, d.1, m.1, &cfg),
                ),
                _ => {
                    // SAFETY: `classify` answered `Direct` or `Copy` for both
                    // ranges just above.
                    let (mv, dv) = unsafe { (view(m.0, m.1), view(d.0, d.1)) };
                    status(live.client.put_parts(&key.0, &[mv, dv], &cfg))
                }
            }
        })
    }

    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        buffer_ptrs: Vec<Unsigned>,
        sizes: Vec<Unsigned>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        self.batch_write_from(py, keys, buffer_ptrs, sizes, config, Write::Put)
    }

    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        buffer_ptrs: Vec<Unsigned>,
        sizes: Vec<Unsigned>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        self.batch_write_from(py, keys, buffer_ptrs, sizes, config, Write::Upsert)
    }

    /// Each key's value is the concatenation of its buffers.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config = None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        all_buffer_ptrs: Vec<Vec<Unsigned>>,
        all_sizes: Vec<Vec<Unsigned>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        let keys = args::keys(keys);
        let n = keys.len();
        let shape_ok = all_buffer_ptrs.len() == n && all_sizes.len() == n;
        let (live, cfg) = match self.writer(config, shape_ok) {
            Ok(w) => w,
            Err(c) => return vec![c; n],
        };
        let (addrs, sizes) = (
            args::usize_lists(&all_buffer_ptrs),
            args::usize_lists(&all_sizes),
        );
        py.allow_threads(|| {
            (0..n)
                .map(|i| {
                    if addrs[i].len() != sizes[i].len() {
                        return INVALID;
                    }
                    match live.memory.classify_all(&addrs[i], &sizes[i], Access::Read) {
                        Mem::Bad => INVALID,
                        Mem::Direct => {
                            let r = live.client.batch_put_from_multi_buffers(
                                &keys[i..=i],
                                &addrs[i..=i],
                                &sizes[i..=i],
                                &cfg,
                            );
                            per_key(1, r).pop().unwrap_or(INVALID)
                        }
                        Mem::Copy => {
                            let parts: Vec<&[u8]> = addrs[i]
                                .iter()
                                .zip(&sizes[i])
                                // SAFETY: `classify_all` answered `Copy`: every
                                // part is `Direct` or `Copy`.
                                .map(|(&a, &s)| unsafe { view(a, s) })
                                .collect();
                            status(live.client.put_parts(&keys[i], &parts, &cfg))
                        }
                    }
                })
                .collect()
        })
    }
}
