//! `mooncake.store.MooncakeDistributedStore` over the Rust store
//! [`Client`](mooncake_store::Client).
//!
//! Return conventions are the reference's (see [`crate::codes`]): ints are 0
//! or a negative store error code, missing objects read as `b""` or `None`,
//! wrong argument types raise `TypeError`. Every call that talks to the
//! cluster releases the GIL.
//!
//! The methods are grouped by family, each file with its own `#[pymethods]`
//! blocks (pyo3's `multiple-pymethods`):
//! - `setup`: joining and leaving, health, registering memory;
//! - `bytes`: single-object puts and gets of Python bytes-like values;
//! - `batch`: the same for lists of keys;
//! - `put_from`, `get_into`: zero-copy writes from and reads into raw
//!   addresses, which `memory` classifies;
//! - `objects`: sizes, existence and removal;
//! - `tensor`: the helpers `mooncake/store.py` builds the tensor calls on;
//! - `pool_memory`: the memory `mooncake.BufferPool` leases out;
//! - `replica`, `tasks`: replica descriptors, copy and move tasks, with the
//!   classes they return in `descriptors`;
//! - `mounts`: segments mounted and unmounted while the store runs;
//! - `sessions`: objects reserved once and written in ranges, or looked up
//!   once and read in ranges;
//! - `engram`: `EngramStore`, embedding tables per head read row by row.
//!
//! `write` makes the write command (placement, upsert) every write passes
//! to the store.

use std::sync::Arc;

use mooncake_store::types::WriteOptions;
use mooncake_store::Client;
use pyo3::prelude::*;

use crate::args::{self, Key, Unsigned};
use crate::codes::{INVALID, NOT_READY};
use crate::config::ReplicateConfig;
use crate::handle::BufferHandle;
use crate::running::Running;
use memory::KnownMemory;

/// A set-up client and the memory this binding vouches for.
struct Live {
    client: Client,
    memory: KnownMemory,
    /// `enable_client_http_server`: serves the client's `/metrics`.
    _http: Option<mooncake_store::client::ClientHttpServer>,
}

/// `mooncake.store.MooncakeDistributedStore`.
#[pyclass(
    subclass,
    frozen,
    module = "mooncake.store",
    name = "MooncakeDistributedStore"
)]
pub(crate) struct PyStore {
    live: Running<Live>,
}

impl PyStore {
    /// The set-up store and the write command of a put (`upsert` false)
    /// or an upsert, or what the call answers: NOT_READY when not set up,
    /// INVALID_PARAMS when the arguments do not match (`!shape_ok`) or the
    /// config asks for no replica.
    fn writer(
        &self,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        shape_ok: bool,
        upsert: bool,
        same_node: SameNode,
    ) -> Result<(Arc<Live>, WriteOptions), i32> {
        let live = self.live.get().ok_or(NOT_READY)?;
        if !shape_ok {
            return Err(INVALID);
        }
        Ok((live, write_options(cfg, upsert, same_node)?))
    }

    /// [`Running::with`] for a call with one answer per key:
    /// `idle` for each key when not set up, `[]` for no keys.
    fn per_key<T: Clone + Send>(
        &self,
        py: Python<'_>,
        keys: &[String],
        idle: T,
        f: impl FnOnce(&Live) -> Vec<T> + Send,
    ) -> Vec<T> {
        if keys.is_empty() {
            return Vec::new();
        }
        self.live.with(py, vec![idle; keys.len()], f)
    }
}

/// The `put_*` and `upsert_*` twins of one call: the same arguments, handed
/// with `upsert` false or true to one implementation.
macro_rules! put_and_upsert {
    (
        $(#[$attr:meta])*
        $put:ident / $upsert:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty => $imp:ident
    ) => {
        #[pymethods]
        impl PyStore {
            $(#[$attr])*
            fn $put(&self, py: Python<'_>, $($arg: $ty),*) -> $ret {
                self.$imp(py, $($arg,)* false)
            }

            $(#[$attr])*
            fn $upsert(&self, py: Python<'_>, $($arg: $ty),*) -> $ret {
                self.$imp(py, $($arg,)* true)
            }
        }
    };
}

mod batch;
mod bytes;
mod descriptors;
mod engram;
mod get_into;
mod memory;
mod mounts;
mod objects;
mod pool_memory;
mod put_from;
mod replica;
mod sessions;
mod setup;
mod tasks;
mod tensor;
mod write;

use write::{write_options, SameNode};

/// The arguments of the multi-buffer calls: the value of `keys[i]` is the
/// concatenation of the buffers `addrs[i][j]` of `sizes[i][j]` bytes.
struct MultiBuffers {
    keys: Vec<String>,
    addrs: Vec<Vec<usize>>,
    sizes: Vec<Vec<usize>>,
}

impl MultiBuffers {
    fn new(keys: Vec<Key>, all_buffer_ptrs: &[Vec<Unsigned>], all_sizes: &[Vec<Unsigned>]) -> Self {
        MultiBuffers {
            keys: args::keys(keys),
            addrs: args::usize_lists(all_buffer_ptrs),
            sizes: args::usize_lists(all_sizes),
        }
    }

    /// Whether there is one list of buffers and one of sizes per key.
    fn shape_ok(&self) -> bool {
        self.addrs.len() == self.keys.len() && self.sizes.len() == self.keys.len()
    }

    /// Whether key `i` has as many sizes as buffers.
    fn parts_ok(&self, i: usize) -> bool {
        self.addrs[i].len() == self.sizes[i].len()
    }
}

/// The items of `v` at `idx`, in that order.
fn pick<T: Clone>(v: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| v[i].clone()).collect()
}

/// Writes `vals` to `out` at `idx`, in order.
fn scatter<T>(out: &mut [T], idx: &[usize], vals: impl IntoIterator<Item = T>) {
    for (v, &i) in vals.into_iter().zip(idx) {
        out[i] = v;
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStore>()?;
    m.add_class::<BufferHandle>()?;
    m.add_class::<pool_memory::PoolMemory>()?;
    engram::register(m)?;
    descriptors::register(m)
}
