//! Ways to run a master: [`run`] builds a runtime and serves, as a leader
//! of its cluster in HA mode ([`super::ha`]) or plainly; [`serve`] serves
//! plainly on the caller's runtime; [`MasterHandle::spawn`] runs a master on
//! threads of its own (tests, `mooncake up`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};
use tokio::sync::oneshot;

use super::config::MasterConfig;
use super::serve::server::MasterServer;
use super::serve::shared::Shared;
use super::state::service::MasterService;

/// Binds and serves on the current runtime until `shutdown`.
pub async fn serve(config: MasterConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    MasterServer::bind(config).await?.serve(shutdown).await
}

/// Builds a runtime with `rpc_thread_num` workers and serves until
/// `shutdown` resolves (blocking). `on_bound` sees the bound server first
/// (to print its addresses); in HA mode, at the start of each term as leader.
pub fn run<F, B>(config: MasterConfig, shutdown: F, mut on_bound: B) -> Result<()>
where
    F: Future<Output = ()> + Send + 'static,
    B: FnMut(&MasterServer),
{
    runtime(config.worker_threads())?.block_on(async move {
        if config.enable_ha {
            return super::ha::serve_ha(config, shutdown, on_bound).await;
        }
        let server = MasterServer::bind(config).await?;
        on_bound(&server);
        server.serve(shutdown).await
    })
}

/// The master's runtime: `threads` workers (`rpc_thread_num`).
fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("mc-master")
        .enable_all()
        .build()
        .map_err(|e| {
            Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("cannot start runtime: {e}"),
            )
        })
}

/// A master running on threads of its own; stops when dropped.
pub struct MasterHandle {
    rpc_addr: SocketAddr,
    http_addr: SocketAddr,
    metadata_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl MasterHandle {
    /// Binds and starts serving; returns once the listeners are bound.
    pub fn spawn(config: MasterConfig) -> Result<MasterHandle> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let threads = config.worker_threads();
        let thread = std::thread::Builder::new()
            .name("mc-master".into())
            .spawn(move || -> Result<()> {
                runtime(threads)?.block_on(async move {
                    let server = match MasterServer::bind(config).await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.clone()));
                            return Err(e);
                        }
                    };
                    let addrs = (
                        server.rpc_addr(),
                        server.http_addr(),
                        server.metadata_addr(),
                        server.shared().clone(),
                    );
                    let _ = ready_tx.send(Ok(addrs));
                    server
                        .serve(async move {
                            let _ = stopped.await;
                        })
                        .await
                })
            })
            .map_err(|e| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("cannot start master thread: {e}"),
                )
            })?;
        match ready_rx.recv() {
            Ok(Ok((rpc_addr, http_addr, metadata_addr, shared))) => Ok(MasterHandle {
                rpc_addr,
                http_addr,
                metadata_addr,
                shared,
                stop: Some(stop),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let joined = thread.join();
                Err(match joined {
                    Ok(Err(e)) => e,
                    _ => Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        "master thread exited before binding",
                    ),
                })
            }
        }
    }

    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc_addr
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn metadata_addr(&self) -> Option<SocketAddr> {
        self.metadata_addr
    }

    /// The running state machine (for in-process inspection).
    pub fn service(&self) -> &MasterService {
        &self.shared.service
    }

    /// Stops the master and waits for it.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        self.stop.take();
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    "master thread panicked",
                ))
            }),
            None => Ok(()),
        }
    }
}

impl Drop for MasterHandle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}
