//! Zero-copy reads: objects read into raw addresses. Registered and pool
//! memory is filled in place; other valid memory through a copy (see
//! [`super::memory`]).

use mooncake_common::{Error, ErrorCode};
use pyo3::prelude::*;

use super::memory::{copy_out, Mem};
use super::{pick, scatter, Live, MultiBuffers, PyStore};
use crate::args::{self, usizes, Flag, Key, Unsigned};
use crate::codes::{code, count, INVALID, NOT_READY};
use crate::mem::Access;

/// Copies a fetched object into the `len` bytes at `addr`: its size, or
/// INVALID_PARAMS when it does not fit (or the fetch's code).
///
/// # Safety
/// `classify(addr, len, Access::Write)` must have answered `Direct` or
/// `Copy` during the current call.
unsafe fn copy_into(got: Result<Vec<u8>, Error>, addr: usize, len: usize) -> i64 {
    match got {
        Ok(v) if v.len() <= len => {
            // SAFETY: guaranteed by the caller, `len >= v.len()`.
            unsafe { copy_out(addr, &v) };
            v.len() as i64
        }
        Ok(_) => INVALID as i64,
        Err(e) => code(&e) as i64,
    }
}

impl Live {
    /// Object `i` of `mb` scattered over its buffers in order: the object's
    /// size, or a negative code.
    fn get_into_parts(&self, mb: &MultiBuffers, i: usize, same_node: bool) -> i64 {
        let (key, addrs, sizes) = (&mb.keys[i], &mb.addrs[i], &mb.sizes[i]);
        match self.memory.classify_all(addrs, sizes, Access::Write) {
            Mem::Bad => INVALID as i64,
            Mem::Direct => {
                let r = self.client.batch_get_into_multi_buffers(
                    &mb.keys[i..=i],
                    &mb.addrs[i..=i],
                    &mb.sizes[i..=i],
                    same_node,
                );
                match r {
                    Ok(mut v) => v.pop().map_or(INVALID as i64, count),
                    Err(e) => code(&e) as i64,
                }
            }
            Mem::Copy => match self.client.get(key) {
                Ok(v) if v.len() <= sizes.iter().sum::<usize>() => {
                    let mut rest: &[u8] = &v;
                    for (&a, &s) in addrs.iter().zip(sizes) {
                        let take = s.min(rest.len());
                        // SAFETY: `classify_all` answered `Copy`: every part,
                        // `s >= take` bytes at `a`, is `Direct` or `Copy`.
                        unsafe { copy_out(a, &rest[..take]) };
                        rest = &rest[take..];
                    }
                    v.len() as i64
                }
                Ok(_) => INVALID as i64,
                Err(e) => code(&e) as i64,
            },
        }
    }
}

#[pymethods]
impl PyStore {
    /// Reads the whole object into `buffer_ptr`; its size, or a negative
    /// code (-600 when the buffer is too small, -704 when missing).
    fn get_into(&self, py: Python<'_>, key: Key, buffer_ptr: Unsigned, size: Unsigned) -> i64 {
        let addr = buffer_ptr.usize();
        self.live.with(py, NOT_READY as i64, |live| {
            let len = live.memory.clamp(addr, size.usize());
            match live.memory.classify(addr, len, Access::Write) {
                Mem::Direct => count(live.client.get_into(&key.0, addr, len)),
                // SAFETY: `classify` answered `Copy` for `len` bytes at `addr`.
                Mem::Copy => unsafe { copy_into(live.client.get(&key.0), addr, len) },
                Mem::Bad => INVALID as i64,
            }
        })
    }

    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        buffer_ptrs: Vec<Unsigned>,
        sizes: Vec<Unsigned>,
    ) -> Vec<i64> {
        let keys = args::keys(keys);
        let n = keys.len();
        let (addrs, sizes) = (usizes(&buffer_ptrs), usizes(&sizes));
        self.live.with(py, vec![NOT_READY as i64; n], |live| {
            if addrs.len() != n || sizes.len() != n {
                return vec![INVALID as i64; n];
            }
            let lens: Vec<usize> = (0..n)
                .map(|i| live.memory.clamp(addrs[i], sizes[i]))
                .collect();
            let mut out = vec![INVALID as i64; n];
            let (mut direct, mut copied) = (Vec::new(), Vec::new());
            for i in 0..n {
                match live.memory.classify(addrs[i], lens[i], Access::Write) {
                    Mem::Direct => direct.push(i),
                    Mem::Copy => copied.push(i),
                    Mem::Bad => {}
                }
            }
            if !direct.is_empty() {
                let (k, a, l) = (
                    pick(&keys, &direct),
                    pick(&addrs, &direct),
                    pick(&lens, &direct),
                );
                match live.client.batch_get_into(&k, &a, &l) {
                    Ok(v) => scatter(&mut out, &direct, v.into_iter().map(count)),
                    Err(e) => {
                        let c = code(&e) as i64;
                        direct.iter().for_each(|&i| out[i] = c);
                    }
                }
            }
            if !copied.is_empty() {
                let got = live.client.get_batch(&pick(&keys, &copied));
                let read = got.into_iter().zip(&copied).map(|(r, &i)| {
                    // SAFETY: `classify` answered `Copy` for `lens[i]` bytes at `addrs[i]`.
                    unsafe { copy_into(r, addrs[i], lens[i]) }
                });
                scatter(&mut out, &copied, read);
            }
            out
        })
    }

    /// Scatters each object over its buffers, in order; bytes read per key.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node = Flag(false)))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        all_buffer_ptrs: Vec<Vec<Unsigned>>,
        all_sizes: Vec<Vec<Unsigned>>,
        prefer_alloc_in_same_node: Flag,
    ) -> Vec<i64> {
        let mb = MultiBuffers::new(keys, &all_buffer_ptrs, &all_sizes);
        let n = mb.keys.len();
        self.live.with(py, vec![NOT_READY as i64; n], |live| {
            if !mb.shape_ok() {
                return vec![INVALID as i64; n];
            }
            (0..n)
                .map(|i| {
                    if !mb.parts_ok(i) {
                        return INVALID as i64;
                    }
                    live.get_into_parts(&mb, i, prefer_alloc_in_same_node.0)
                })
                .collect()
        })
    }

    /// Buffer-major ranged reads into registered buffers:
    /// `result[i][j][k]` is the byte count (or a negative code) of fragment
    /// `k` of key `all_keys[i][j]` into `buffer_ptrs[i]`.
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: Vec<Unsigned>,
        all_keys: Vec<Vec<Key>>,
        all_dst_offsets: Vec<Vec<Vec<Unsigned>>>,
        all_src_offsets: Vec<Vec<Vec<Unsigned>>>,
        all_sizes: Vec<Vec<Vec<Unsigned>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let u3 = |v: Vec<Vec<Vec<Unsigned>>>| -> Vec<Vec<Vec<u64>>> {
            v.into_iter()
                .map(|a| a.iter().map(|b| args::u64s(b)).collect())
                .collect()
        };
        let ptrs = usizes(&buffer_ptrs);
        let keys: Vec<Vec<String>> = all_keys.into_iter().map(args::keys).collect();
        let (dst, src, sizes) = (u3(all_dst_offsets), u3(all_src_offsets), u3(all_sizes));
        let Some(live) = self.live.get() else {
            return keys
                .iter()
                .map(|k| k.iter().map(|_| vec![NOT_READY as i64]).collect())
                .collect();
        };
        let res = py.allow_threads(|| {
            live.client
                .get_into_ranges(&ptrs, &keys, &dst, &src, &sizes)
        });
        let shape_ok = [keys.len(), dst.len(), src.len(), sizes.len()]
            .iter()
            .all(|&n| n == ptrs.len());
        res.into_iter()
            // With mismatched top-level lists every buffer reports the error,
            // even one that has no key list.
            .map(|b| {
                if b.is_empty() && !shape_ok {
                    vec![vec![Err(Error::from(ErrorCode::INVALID_PARAMS))]]
                } else {
                    b
                }
            })
            .map(|b| {
                b.into_iter()
                    .map(|k| k.into_iter().map(count).collect())
                    .collect()
            })
            .collect()
    }
}
