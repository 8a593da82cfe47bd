//! `mooncake.store.MooncakeDistributedStore` over the Rust store
//! [`Client`](mooncake_store::Client).
//!
//! Return conventions are the reference's (see [`crate::codes`]): ints are 0
//! or a negative store error code, missing objects read as `b""` or `None`,
//! wrong argument types raise `TypeError`. Every call that talks to the
//! cluster releases the GIL.
//!
//! The methods are grouped by family, one `#[pymethods]` block per file:
//! - `setup`: joining and leaving, health, registering memory;
//! - `bytes`: single-object puts and gets of Python bytes-like values;
//! - `batch`: the same for lists of keys;
//! - `put_from`, `get_into`: zero-copy writes from and reads into raw
//!   addresses, which [`memory`] classifies;
//! - `objects`: sizes, existence and removal;
//! - `tensor`: the helpers `mooncake/store.py` builds the tensor calls on;
//! - `replica`, `tasks`: replica descriptors, copy and move tasks, with the
//!   classes they return in `descriptors`.

use std::sync::Arc;

use mooncake_common::Error;
use mooncake_store::types;
use mooncake_store::Client;
use parking_lot::RwLock;
use pyo3::prelude::*;

use crate::codes::{INVALID, NOT_READY};
use crate::config::ReplicateConfig;
use crate::handle::BufferHandle;
use memory::KnownMemory;

mod batch;
mod bytes;
mod descriptors;
mod get_into;
mod memory;
mod objects;
mod put_from;
mod replica;
mod setup;
mod tasks;
mod tensor;

/// A set-up client and the memory this binding vouches for.
struct Live {
    client: Client,
    memory: KnownMemory,
}

/// `mooncake.store.MooncakeDistributedStore`.
#[pyclass(
    subclass,
    frozen,
    module = "mooncake.store",
    name = "MooncakeDistributedStore"
)]
pub(crate) struct PyStore {
    state: RwLock<Option<Arc<Live>>>,
}

impl Drop for PyStore {
    /// A store collected while set up leaves the cluster without holding the
    /// GIL (its engine may wait on a metadata server served by Python).
    fn drop(&mut self) {
        if let Some(live) = self.state.get_mut().take() {
            Python::with_gil(|py| py.allow_threads(move || drop(live)));
        }
    }
}

impl PyStore {
    fn live(&self) -> Option<Arc<Live>> {
        self.state.read().clone()
    }

    /// `f` on the set-up store with the GIL released; `idle` when the store
    /// is not set up.
    fn with_live<T: Send>(&self, py: Python<'_>, idle: T, f: impl FnOnce(&Live) -> T + Send) -> T {
        match self.live() {
            Some(live) => py.allow_threads(|| f(&live)),
            None => idle,
        }
    }

    /// The set-up store and the placement of a write, or what the call
    /// answers: NOT_READY when not set up, INVALID_PARAMS when the arguments
    /// do not match (`!shape_ok`) or the config asks for no replica.
    fn writer(
        &self,
        cfg: Option<PyRef<'_, ReplicateConfig>>,
        shape_ok: bool,
    ) -> Result<(Arc<Live>, types::ReplicateConfig), i32> {
        let live = self.live().ok_or(NOT_READY)?;
        if !shape_ok {
            return Err(INVALID);
        }
        Ok((live, placement(cfg)?))
    }

    /// [`with_live`](Self::with_live) for a call with one answer per key:
    /// `idle` for each key when not set up, `[]` for no keys.
    fn per_key<T: Clone + Send>(
        &self,
        py: Python<'_>,
        keys: &[String],
        idle: T,
        f: impl FnOnce(&Live) -> Vec<T> + Send,
    ) -> Vec<T> {
        let n = keys.len();
        self.with_live(
            py,
            vec![idle; n],
            |live| {
                if n == 0 {
                    Vec::new()
                } else {
                    f(live)
                }
            },
        )
    }
}

/// Whether a write may replace an existing object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    /// First write wins: an existing key keeps its value.
    Put,
    /// The new value replaces the old.
    Upsert,
}

impl Write {
    fn of(upsert: bool) -> Write {
        if upsert {
            Write::Upsert
        } else {
            Write::Put
        }
    }

    fn parts(
        self,
        c: &Client,
        key: &str,
        parts: &[&[u8]],
        cfg: &types::ReplicateConfig,
    ) -> Written {
        match self {
            Write::Put => c.put_parts(key, parts, cfg),
            Write::Upsert => c.upsert_parts(key, parts, cfg),
        }
    }

    fn values(
        self,
        c: &Client,
        keys: &[String],
        values: &[&[u8]],
        cfg: &types::ReplicateConfig,
    ) -> WrittenEach {
        match self {
            Write::Put => c.put_batch(keys, values, cfg),
            Write::Upsert => c.upsert_batch(keys, values, cfg),
        }
    }

    fn from(
        self,
        c: &Client,
        key: &str,
        addr: usize,
        size: usize,
        cfg: &types::ReplicateConfig,
    ) -> Written {
        match self {
            Write::Put => c.put_from(key, addr, size, cfg),
            Write::Upsert => c.upsert_from(key, addr, size, cfg),
        }
    }

    fn batch_from(
        self,
        c: &Client,
        keys: &[String],
        addrs: &[usize],
        sizes: &[usize],
        cfg: &types::ReplicateConfig,
    ) -> WrittenEach {
        match self {
            Write::Put => c.batch_put_from(keys, addrs, sizes, cfg),
            Write::Upsert => c.batch_upsert_from(keys, addrs, sizes, cfg),
        }
    }
}

/// What a write of one object answers.
type Written = Result<(), Error>;
/// What a batch write answers: per key, or a failure of the whole batch.
type WrittenEach = Result<Vec<Written>, Error>;

/// The store's placement settings for a put (`None`: one replica anywhere);
/// a config asking for no replica at all is INVALID_PARAMS.
fn placement(cfg: Option<PyRef<'_, ReplicateConfig>>) -> Result<types::ReplicateConfig, i32> {
    let Some(c) = cfg else {
        return Ok(types::ReplicateConfig {
            replica_num: 1,
            ..Default::default()
        });
    };
    if c.replica_num == 0 {
        return Err(INVALID);
    }
    Ok(types::ReplicateConfig {
        replica_num: c.replica_num as usize,
        with_soft_pin: c.soft_pin_action == crate::enums::SoftPinAction::ENABLE,
        with_hard_pin: c.with_hard_pin,
        preferred_segment: c.preferred_segment.clone(),
        preferred_segments: c.preferred_segments.clone(),
        prefer_alloc_in_same_node: c.prefer_alloc_in_same_node,
    })
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
    descriptors::register(m)
}
