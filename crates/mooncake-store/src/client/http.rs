//! The client's HTTP server (`--enable_http_server`, Python
//! `enable_client_http_server`): `/metrics` in the Prometheus text format
//! and `/health`, with the reference's bodies. It runs on its own thread, so
//! it serves from a Python process as from `mooncake_client`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::http_serve::{self, HttpLimits};
use tokio::sync::oneshot;

use super::metrics::ClientMetrics;

/// The reference client's default `--http_port`.
pub const DEFAULT_CLIENT_HTTP_PORT: u16 = 9300;

/// What `/health` asks: whether the client is usable.
pub type HealthCheck = Arc<dyn Fn() -> bool + Send + Sync>;

#[derive(Clone)]
struct Served {
    metrics: Arc<ClientMetrics>,
    health: HealthCheck,
}

/// A running client HTTP server; stops when dropped.
pub struct ClientHttpServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, format!("{what}: {e}"))
}

impl ClientHttpServer {
    /// Binds `host:port` (port 0: any) and starts serving.
    pub fn start(
        host: &str,
        port: u16,
        metrics: Arc<ClientMetrics>,
        health: HealthCheck,
    ) -> Result<ClientHttpServer> {
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        let bind = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let listener = std::net::TcpListener::bind(&bind)
            .map_err(|e| io_err(&format!("client HTTP server on {bind}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io_err("client HTTP server", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io_err("client HTTP server", e))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let app = Router::new()
            .route("/metrics", get(metrics_page))
            .route("/health", get(health_page))
            .with_state(Served { metrics, health });
        let thread = std::thread::Builder::new()
            .name("mc-client-http".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return tracing::error!("client HTTP server: {e}"),
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return tracing::error!("client HTTP server: {e}"),
                    };
                    let stopped = async {
                        let _ = stopped.await;
                    };
                    let limits = HttpLimits::default();
                    let serve = http_serve::serve("client-http", listener, app, limits, stopped);
                    if let Err(e) = serve.await {
                        tracing::error!("client HTTP server: {e}");
                    }
                });
            })
            .map_err(|e| io_err("client HTTP server thread", e))?;
        tracing::info!(%addr, "client HTTP server serving /metrics and /health");
        Ok(ClientHttpServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ClientHttpServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn metrics_page(State(s): State<Served>) -> Response {
    let body = tokio::task::spawn_blocking(move || s.metrics.render())
        .await
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn health_page(State(s): State<Served>) -> Response {
    let healthy = tokio::task::spawn_blocking(move || (s.health)())
        .await
        .unwrap_or(false);
    let (status, body) = if healthy {
        (StatusCode::OK, r#"{"status":"healthy","code":0}"#)
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"status":"unhealthy","code":-1}"#,
        )
    };
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
