//! Zero-copy writes: objects stored from raw addresses. Registered and pool
//! memory is read in place; other valid memory through a copy (see
//! [`super::memory`]).

use pyo3::prelude::*;

use super::memory::{view, Mem};
use super::{pick, scatter, MultiBuffers, PyStore, SameNode};
use crate::args::{self, usizes, Key, Unsigned};
use crate::codes::{per_key, status, INVALID};
use crate::config::ReplicateConfig;
use crate::mem::Access;

impl PyStore {
    fn write_from(
        &self,
        py: Python<'_>,
        key: Key,
        buffer_ptr: Unsigned,
        size: Unsigned,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> i32 {
        let (key, addr, size) = (key.0.as_str(), buffer_ptr.usize(), size.usize());
        let (live, opts) = match self.writer(cfg, true, upsert, SameNode::Refused) {
            Ok(w) => w,
            Err(c) => return c,
        };
        if size == 0 && addr != 0 {
            return 0;
        }
        py.allow_threads(|| match live.memory.classify(addr, size, Access::Read) {
            Mem::Direct => status(live.client.put_from(key, addr, size, opts.clone())),
            Mem::Copy => {
                // SAFETY: `classify` just answered `Copy` for this range.
                let v = unsafe { view(addr, size) };
                status(live.client.put_parts(key, &[v], opts.clone()))
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
        upsert: bool,
    ) -> Vec<i32> {
        let (keys, addrs, sizes) = (args::keys(keys), usizes(&addrs), usizes(&sizes));
        let n = keys.len();
        let (live, opts) = match self.writer(
            cfg,
            addrs.len() == n && sizes.len() == n,
            upsert,
            SameNode::Refused,
        ) {
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
                let r = live.client.batch_put_from(&k, &a, &s, opts.clone());
                scatter(&mut out, &direct, per_key(direct.len(), r));
            }
            if !copied.is_empty() {
                let k = pick(&keys, &copied);
                let v: Vec<&[u8]> = copied
                    .iter()
                    // SAFETY: `classify` answered `Copy` for each copied range above.
                    .map(|&i| unsafe { view(addrs[i], sizes[i]) })
                    .collect();
                let r = live.client.put_batch(&k, &v, opts.clone());
                scatter(&mut out, &copied, per_key(copied.len(), r));
            }
            out
        })
    }
}

put_and_upsert! {
    /// Stores `size` bytes at `buffer_ptr` under `key`.
    #[pyo3(signature = (key, buffer_ptr, size, config = None))]
    put_from / upsert_from(
        key: Key,
        buffer_ptr: Unsigned,
        size: Unsigned,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 => write_from
}

put_and_upsert! {
    /// Stores `sizes[i]` bytes at `buffer_ptrs[i]` under `keys[i]`; a code
    /// per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
    batch_put_from / batch_upsert_from(
        keys: Vec<Key>,
        buffer_ptrs: Vec<Unsigned>,
        sizes: Vec<Unsigned>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> => batch_write_from
}

#[pymethods]
impl PyStore {
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
        let (live, opts) = match self.writer(config, true, false, SameNode::Refused) {
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
                (Mem::Direct, Mem::Direct) => status(live.client.put_from_with_metadata(
                    &key.0,
                    d.0,
                    m.0,
                    d.1,
                    m.1,
                    opts.clone(),
                )),
                _ => {
                    // SAFETY: `classify` answered `Direct` or `Copy` for both
                    // ranges just above.
                    let (mv, dv) = unsafe { (view(m.0, m.1), view(d.0, d.1)) };
                    status(live.client.put_parts(&key.0, &[mv, dv], opts.clone()))
                }
            }
        })
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
        let mb = MultiBuffers::new(keys, &all_buffer_ptrs, &all_sizes);
        let n = mb.keys.len();
        let (live, opts) = match self.writer(config, mb.shape_ok(), false, SameNode::OneReplica) {
            Ok(w) => w,
            Err(c) => return vec![c; n],
        };
        py.allow_threads(|| {
            (0..n)
                .map(|i| {
                    if !mb.parts_ok(i) {
                        return INVALID;
                    }
                    let (addrs, sizes) = (&mb.addrs[i], &mb.sizes[i]);
                    match live.memory.classify_all(addrs, sizes, Access::Read) {
                        Mem::Bad => INVALID,
                        Mem::Direct => {
                            let r = live.client.batch_put_from_multi_buffers(
                                &mb.keys[i..=i],
                                &mb.addrs[i..=i],
                                &mb.sizes[i..=i],
                                opts.clone(),
                            );
                            per_key(1, r).pop().unwrap_or(INVALID)
                        }
                        Mem::Copy => {
                            let parts: Vec<&[u8]> = addrs
                                .iter()
                                .zip(sizes)
                                // SAFETY: `classify_all` answered `Copy`: every
                                // part is `Direct` or `Copy`.
                                .map(|(&a, &s)| unsafe { view(a, s) })
                                .collect();
                            status(live.client.put_parts(&mb.keys[i], &parts, opts.clone()))
                        }
                    }
                })
                .collect()
        })
    }
}
