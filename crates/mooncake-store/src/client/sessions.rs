//! Put and get sessions on the public client (see `real::sessions` for
//! what they do): the caller's per-key lists checked and zipped into
//! ranges. Only an embedded client keeps sessions; through a dummy client
//! every call answers `INVALID_PARAMS`, as the reference's dummy does.

use mooncake_common::{Error, ErrorCode, Result};

use super::real::SessionRange;
use super::Client;
use crate::types::WriteOptions;

fn no_sessions<T: Clone>(n: usize) -> Vec<Result<T>> {
    vec![
        Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "put and get sessions need an embedded client (a dummy client keeps none)",
        ));
        n
    ]
}

/// Each key's ranges `(buffer, size, offset)`; `INVALID_PARAMS` for a key
/// whose three lists differ in length, and for every key when the outer
/// lists do.
fn ranges(
    n: usize,
    buffers: &[Vec<usize>],
    sizes: &[Vec<usize>],
    offsets: &[Vec<u64>],
) -> Vec<Result<Vec<SessionRange>>> {
    let shape = |what: &str| Error::new(ErrorCode::INVALID_PARAMS, what.to_owned());
    if buffers.len() != n || sizes.len() != n || offsets.len() != n {
        return vec![Err(shape("one buffer, size and offset list per key")); n];
    }
    (0..n)
        .map(|i| {
            let (b, s, o) = (&buffers[i], &sizes[i], &offsets[i]);
            if b.len() != s.len() || b.len() != o.len() {
                return Err(shape("buffer, size and offset lists differ in length"));
            }
            Ok((0..b.len()).map(|j| (b[j], s[j], o[j])).collect())
        })
        .collect()
}

impl Client {
    /// Looks `keys` up once; later ranged reads of them ask the master
    /// nothing while the lease lasts. `INVALID_REPLICA` for a key with no
    /// complete memory replica.
    pub fn batch_get_session_start(&self, keys: &[String]) -> Vec<Result<()>> {
        match self.inner.as_real() {
            Some(real) => real.get_session_start(keys),
            None => no_sessions(keys.len()),
        }
    }

    /// Reads `all_sizes[i][j]` bytes at `all_src_offsets[i][j]` of key `i`
    /// into registered memory at `all_buffers[i][j]`, through its get
    /// session: the bytes read per key. `LEASE_EXPIRED` once the session's
    /// lease has run out (the session is dropped).
    pub fn batch_get_into_multi_buffer_ranges(
        &self,
        keys: &[String],
        all_buffers: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        all_src_offsets: &[Vec<u64>],
    ) -> Vec<Result<u64>> {
        let Some(real) = self.inner.as_real() else {
            return no_sessions(keys.len());
        };
        let items = ranges(keys.len(), all_buffers, all_sizes, all_src_offsets);
        super::run_valid(keys, items, |keys, rs| real.get_session_ranges(keys, &rs))
    }

    /// Drops the get sessions of `keys` (those without one are ignored).
    pub fn batch_get_session_end(&self, keys: &[String]) -> Result<()> {
        match self.inner.as_real() {
            Some(real) => {
                real.get_session_end(keys);
                Ok(())
            }
            None => no_sessions(1).pop().unwrap_or(Ok(())),
        }
    }

    /// Reserves each object's replicas (`sizes[i]` bytes) without moving a
    /// byte; `INVALID_PARAMS` for a key that already has a put session.
    pub fn batch_put_session_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        opts: impl Into<WriteOptions>,
    ) -> Vec<Result<()>> {
        match self.inner.as_real() {
            Some(real) => real.put_session_start(keys, sizes, &opts.into()),
            None => no_sessions(keys.len()),
        }
    }

    /// Writes `all_sizes[i][j]` bytes of registered memory at
    /// `all_buffers[i][j]` to offset `all_dst_offsets[i][j]` of key `i`'s
    /// reserved object: the bytes written per key.
    pub fn batch_put_from_multi_buffer_ranges(
        &self,
        keys: &[String],
        all_buffers: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        all_dst_offsets: &[Vec<u64>],
    ) -> Vec<Result<u64>> {
        let Some(real) = self.inner.as_real() else {
            return no_sessions(keys.len());
        };
        let items = ranges(keys.len(), all_buffers, all_sizes, all_dst_offsets);
        super::run_valid(keys, items, |keys, rs| real.put_session_ranges(keys, &rs))
    }

    /// Publishes each session's object once its running range writes end.
    pub fn batch_put_session_end(&self, keys: &[String]) -> Vec<Result<()>> {
        match self.inner.as_real() {
            Some(real) => real.put_session_end(keys),
            None => no_sessions(keys.len()),
        }
    }

    /// Frees each session's reservation once its running range writes end.
    pub fn batch_put_session_revoke(&self, keys: &[String]) -> Vec<Result<()>> {
        match self.inner.as_real() {
            Some(real) => real.put_session_revoke(keys),
            None => no_sessions(keys.len()),
        }
    }
}
