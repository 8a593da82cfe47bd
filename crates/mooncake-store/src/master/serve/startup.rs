//! Opening a plain master with its HTTP port already answering: a restore
//! of a large snapshot takes a while, and an operator watches it on
//! `/metrics` (the `master_snapshot_restore_*` gauges) while it runs.
//! Until the state is open, `/health` says the master is not ready and
//! every other path answers 503; then the full service takes the port.

use std::future::Future;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::http_serve::{self, HttpLimits};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::shared::Shared;
use crate::master::config::MasterConfig;
use crate::master::durable::snapshot::RestoreProgress;
use crate::master::metrics::MasterMetrics;

/// Opens the state machine for `config` (restoring it when the flags ask)
/// off the runtime's workers, while `listener` answers with the restore's
/// progress. The listener is left to the caller, with nothing serving it.
pub(crate) async fn open_while_serving(
    config: MasterConfig,
    listener: &TcpListener,
) -> Result<Shared> {
    let metrics = MasterMetrics::new();
    let progress = metrics.restore.clone();
    let (stop_tx, mut stop_rx) = watch::channel(false);
    // A second handle on the same socket: the caller keeps its own.
    let early = clone_listener(listener)?;
    let server = tokio::spawn(serve_http_router(early, router(progress), async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    let opened = tokio::task::spawn_blocking(move || Shared::open(config, metrics)).await;
    let _ = stop_tx.send(true);
    let _ = server.await;
    opened.map_err(|e| {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("opening the master state failed: {e}"),
        )
    })?
}

/// Serves `router` on the HTTP service's listener until `stop` (the
/// service while opening here, the full one in `super::server`).
pub(crate) async fn serve_http_router(
    listener: TcpListener,
    router: Router,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let limits = HttpLimits::default();
    if let Err(e) = http_serve::serve("metrics", listener, router, limits, stop).await {
        tracing::error!("metrics service failed: {e}");
    }
}

fn clone_listener(listener: &TcpListener) -> Result<TcpListener> {
    let fail = |e: std::io::Error| {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("metrics service: cannot share the listener: {e}"),
        )
    };
    // `TcpListener` has no `try_clone`: duplicate the descriptor through
    // a borrowed std view of it.
    use std::os::fd::AsFd;
    let fd = listener.as_fd().try_clone_to_owned().map_err(fail)?;
    let std = std::net::TcpListener::from(fd);
    std.set_nonblocking(true).map_err(fail)?;
    TcpListener::from_std(std).map_err(fail)
}

/// The HTTP service while the state is being opened.
fn router(progress: RestoreProgress) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .fallback(not_ready)
        .with_state(progress)
}

async fn metrics(State(p): State<RestoreProgress>) -> Response {
    let mut registry = Registry::default();
    p.register(&mut registry);
    let mut body = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut body, &registry);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn health(State(p): State<RestoreProgress>) -> Response {
    let (restored, expected) = p.objects();
    let body = serde_json::json!({
        "status": "restoring",
        "role": "leader",
        "ha_state": "restoring",
        "service_ready": false,
        "restored_objects": restored,
        "objects_expected": expected,
    });
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Every other path: the reference's 503 of a master that does not serve.
async fn not_ready() -> Response {
    let body = format!(
        r#"{{"success":false,"error_code":{},"error_message":"the master is restoring its state"}}"#,
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS.code()
    );
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}
