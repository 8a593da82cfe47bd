//! A tokio runtime on a thread of its own, for backends whose client library
//! is async (etcd). [`MetadataStore`](super::MetadataStore) calls block; doing
//! that with `Runtime::block_on` panics inside an async context, so instead
//! the future is spawned on this private runtime and the caller waits on a
//! plain std channel, which is legal on any thread.

use std::future::Future;
use std::sync::mpsc;

use mooncake_common::{Error, ErrorCode, Result};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

pub struct Driver {
    handle: Handle,
    /// Dropping this sender ends the runtime thread (and cancels its tasks).
    _stop: oneshot::Sender<()>,
}

impl Driver {
    /// Starts the runtime thread, named `name`.
    pub fn start(name: &str) -> Result<Driver> {
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (handle_tx, handle_rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                // Runs spawned tasks until the owner goes away.
                let _ = rt.block_on(stop_rx);
            })
            .map_err(|e| {
                Error::new(
                    ErrorCode::ERR_METADATA,
                    format!("cannot start {name} thread: {e}"),
                )
            })?;
        let handle = handle_rx
            .recv()
            .map_err(|_| Error::new(ErrorCode::ERR_METADATA, format!("{name} thread died")))?
            .map_err(|e| {
                Error::new(
                    ErrorCode::ERR_METADATA,
                    format!("cannot build {name} runtime: {e}"),
                )
            })?;
        Ok(Driver {
            handle,
            _stop: stop_tx,
        })
    }

    /// Runs `fut` on the driver's runtime and blocks the calling thread until
    /// it finishes. Callable from any thread, async context or not.
    pub fn run<F, T>(&self, fut: F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| Error::new(ErrorCode::ERR_METADATA, "metadata runtime stopped"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_futures_from_a_plain_thread() {
        let d = Driver::start("test-driver").unwrap();
        assert_eq!(d.run(async { Ok(7) }).unwrap(), 7);
        let e = d
            .run::<_, ()>(async { Err(Error::new(ErrorCode::ERR_METADATA, "x")) })
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::ERR_METADATA);
    }

    #[test]
    fn runs_futures_from_inside_another_runtime() {
        let d = std::sync::Arc::new(Driver::start("test-driver").unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // Directly on an async task: blocks that task's thread, but must not panic.
        let d2 = d.clone();
        let v = rt.block_on(async move { d2.run(async { Ok(1) }).unwrap() });
        assert_eq!(v, 1);
        // Dropping the driver inside an async context must not panic either.
        let v = rt.block_on(async move {
            let v = d.run(async { Ok(2) }).unwrap();
            drop(d);
            v
        });
        assert_eq!(v, 2);
    }
}
