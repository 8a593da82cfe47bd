//! What a `TransferEngine` or `MooncakeDistributedStore` object holds once
//! set up: the running engine or client, shared with the calls in flight.

use std::sync::Arc;

use parking_lot::RwLock;
use pyo3::prelude::*;

/// Empty until set up; a new setup replaces the value, `close` takes it. The
/// value is dropped without the GIL: stopping an engine or a client talks to
/// the network (metadata keys, the master), maybe to a server run by Python.
pub(crate) struct Running<T: Send + Sync> {
    slot: RwLock<Option<Arc<T>>>,
}

impl<T: Send + Sync> Running<T> {
    pub(crate) fn new() -> Self {
        Running {
            slot: RwLock::new(None),
        }
    }

    pub(crate) fn get(&self) -> Option<Arc<T>> {
        self.slot.read().clone()
    }

    /// Empties the slot; calls in flight keep their `Arc` until they return.
    pub(crate) fn take(&self) -> Option<Arc<T>> {
        self.slot.write().take()
    }

    pub(crate) fn set(&self, value: T) {
        *self.slot.write() = Some(Arc::new(value));
    }

    /// `f` on the value with the GIL released; `idle` when not set up.
    pub(crate) fn with<R: Send>(
        &self,
        py: Python<'_>,
        idle: R,
        f: impl FnOnce(&T) -> R + Send,
    ) -> R {
        match self.get() {
            Some(v) => py.allow_threads(|| f(&v)),
            None => idle,
        }
    }
}

impl<T: Send + Sync> Drop for Running<T> {
    fn drop(&mut self) {
        if let Some(v) = self.slot.get_mut().take() {
            Python::with_gil(|py| py.allow_threads(move || drop(v)));
        }
    }
}
