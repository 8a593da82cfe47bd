//! Put and get sessions: an object reserved once and written in ranges,
//! or looked up once and read in ranges, from and into registered memory
//! (see `mooncake_store::client::sessions`). Ints per key: bytes moved or
//! a negative code; a start or end that fails answers the master's code
//! as is (an existing key is -705 here, not the success a put reports).

use mooncake_common::Error;
use pyo3::prelude::*;

use super::{PyStore, SameNode};
use crate::args::{self, u64s, Key, Unsigned};
use crate::codes::{code, count, NOT_READY};
use crate::config::ReplicateConfig;

fn codes(v: Vec<Result<(), Error>>) -> Vec<i32> {
    v.into_iter()
        .map(|r| r.map_or_else(|e| code(&e), |()| 0))
        .collect()
}

fn counts(v: Vec<Result<u64, Error>>) -> Vec<i64> {
    v.into_iter().map(count).collect()
}

fn offsets(v: &[Vec<Unsigned>]) -> Vec<Vec<u64>> {
    v.iter().map(|l| u64s(l)).collect()
}

#[pymethods]
impl PyStore {
    /// Looks each key up once for later ranged reads: 0 or a code per key.
    fn batch_get_session_start(&self, py: Python<'_>, keys: Vec<Key>) -> Vec<i32> {
        let keys = args::keys(keys);
        self.per_key(py, &keys, NOT_READY, |live| {
            codes(live.client.batch_get_session_start(&keys))
        })
    }

    /// Reads `all_sizes[i][j]` bytes at `all_src_offsets[i][j]` of key `i`
    /// into `all_buffer_ptrs[i][j]`: the bytes read per key, or a code.
    fn batch_get_into_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        all_buffer_ptrs: Vec<Vec<Unsigned>>,
        all_sizes: Vec<Vec<Unsigned>>,
        all_src_offsets: Vec<Vec<Unsigned>>,
    ) -> Vec<i64> {
        let keys = args::keys(keys);
        let (bufs, sizes) = (
            args::usize_lists(&all_buffer_ptrs),
            args::usize_lists(&all_sizes),
        );
        let offs = offsets(&all_src_offsets);
        self.per_key(py, &keys, NOT_READY as i64, |live| {
            counts(
                live.client
                    .batch_get_into_multi_buffer_ranges(&keys, &bufs, &sizes, &offs),
            )
        })
    }

    /// Drops the get sessions of `keys`: 0.
    fn batch_get_session_end(&self, py: Python<'_>, keys: Vec<Key>) -> i32 {
        let keys = args::keys(keys);
        self.live.with(py, NOT_READY, |live| {
            live.client
                .batch_get_session_end(&keys)
                .map_or_else(|e| code(&e), |()| 0)
        })
    }

    /// Reserves each object (`sizes[i]` bytes) without writing it: 0 or a
    /// code per key.
    #[pyo3(signature = (keys, sizes, config = None))]
    fn batch_put_session_start(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        sizes: Vec<Unsigned>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        let (keys, sizes) = (args::keys(keys), u64s(&sizes));
        let n = keys.len();
        let (live, opts) = match self.writer(config, sizes.len() == n, false, SameNode::Accepted) {
            Ok(w) => w,
            Err(c) => return vec![c; n],
        };
        if n == 0 {
            return Vec::new();
        }
        py.allow_threads(|| codes(live.client.batch_put_session_start(&keys, &sizes, opts)))
    }

    /// Writes `all_sizes[i][j]` bytes at `all_buffer_ptrs[i][j]` to offset
    /// `all_dst_offsets[i][j]` of key `i`: the bytes written per key, or a
    /// code.
    fn batch_put_from_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<Key>,
        all_buffer_ptrs: Vec<Vec<Unsigned>>,
        all_sizes: Vec<Vec<Unsigned>>,
        all_dst_offsets: Vec<Vec<Unsigned>>,
    ) -> Vec<i64> {
        let keys = args::keys(keys);
        let (bufs, sizes) = (
            args::usize_lists(&all_buffer_ptrs),
            args::usize_lists(&all_sizes),
        );
        let offs = offsets(&all_dst_offsets);
        self.per_key(py, &keys, NOT_READY as i64, |live| {
            counts(
                live.client
                    .batch_put_from_multi_buffer_ranges(&keys, &bufs, &sizes, &offs),
            )
        })
    }

    /// Publishes each session's object: 0 or a code per key.
    fn batch_put_session_end(&self, py: Python<'_>, keys: Vec<Key>) -> Vec<i32> {
        let keys = args::keys(keys);
        self.per_key(py, &keys, NOT_READY, |live| {
            codes(live.client.batch_put_session_end(&keys))
        })
    }

    /// Frees each session's reservation: 0 or a code per key.
    fn batch_put_session_revoke(&self, py: Python<'_>, keys: Vec<Key>) -> Vec<i32> {
        let keys = args::keys(keys);
        self.per_key(py, &keys, NOT_READY, |live| {
            codes(live.client.batch_put_session_revoke(&keys))
        })
    }
}
