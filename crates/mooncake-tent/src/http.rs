//! TENT's metrics over HTTP (`/metrics`, `/metrics/summary`,
//! `/metrics/json`, `/health`) on `metrics.http_host:http_port`, served by
//! the workspace's HTTP server on a runtime of `http_server_threads`
//! threads, and the periodic summary log line. A port that cannot be bound
//! leaves the metrics recorded and logged only, as the reference does.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::http_serve::{serve, HttpLimits};
use tokio::sync::oneshot;

use crate::config::MetricsConfig;
use crate::metrics::Metrics;

/// The running server (and reporter); dropping it stops both.
pub struct MetricsServer {
    port: u16,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds and starts serving; the port (0 in the config: any free one)
    /// is [`Self::port`].
    pub fn start(config: &MetricsConfig, metrics: Arc<Metrics>) -> Result<MetricsServer> {
        let io = |e: std::io::Error| Error::new(ErrorCode::ERR_SOCKET, e.to_string());
        let listener = std::net::TcpListener::bind((config.http_host.as_str(), config.http_port))
            .map_err(|e| {
            io(e).with_context(format!(
                "TENT metrics on {}:{}",
                config.http_host, config.http_port
            ))
        })?;
        listener.set_nonblocking(true).map_err(io)?;
        let port = listener.local_addr().map_err(io)?.port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.http_server_threads.max(1))
            .thread_name("tent-metrics")
            .enable_all()
            .build()
            .map_err(io)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let app = router(metrics.clone());
        let every = config.report_interval_seconds;
        let thread = std::thread::Builder::new()
            .name("tent-metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!("TENT metrics listener: {e}");
                            return;
                        }
                    };
                    if every > 0 {
                        tokio::spawn(async move {
                            let mut tick = tokio::time::interval(Duration::from_secs(every));
                            tick.tick().await;
                            loop {
                                tick.tick().await;
                                tracing::info!("TENT metrics: {}", metrics.summary());
                            }
                        });
                    }
                    let shutdown = async {
                        let _ = stopped.await;
                    };
                    if let Err(e) = serve(
                        "tent-metrics",
                        listener,
                        app,
                        HttpLimits::default(),
                        shutdown,
                    )
                    .await
                    {
                        tracing::error!("TENT metrics server: {e}");
                    }
                });
            })
            .map_err(io)?;
        tracing::info!("TENT metrics on http://{}:{port}/metrics", config.http_host);
        Ok(MetricsServer {
            port,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn router(metrics: Arc<Metrics>) -> Router {
    let (m1, m2, m3, m4) = (metrics.clone(), metrics.clone(), metrics.clone(), metrics);
    Router::new()
        .route(
            "/metrics",
            get(move || async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    m1.prometheus(),
                )
            }),
        )
        .route(
            "/metrics/summary",
            get(move || async move { m2.summary() + "\n" }),
        )
        .route("/metrics/json", get(move || async move { Json(m3.json()) }))
        .route(
            "/health",
            get(move || async move {
                let paths = m4.paths();
                let up = paths.iter().filter(|p| p.up).count();
                let body = serde_json::json!({
                    "status": "ok",
                    "metrics_enabled": m4.is_enabled(),
                    "paths_up": up,
                    "paths_down": paths.len() - up,
                });
                (StatusCode::OK, Json(body)).into_response()
            }),
        )
}
