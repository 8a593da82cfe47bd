//! How every HTTP server of mooncake-rs serves its routes (the master's
//! metrics and admin service, the client's metrics service, the metadata
//! server): HTTP/1.1 over hyper, with the limits that keep slow or idle
//! clients from holding the server.
//!
//! - A request's header must arrive within
//!   [`HttpLimits::header_read_timeout`]. The clock also runs while a
//!   kept-alive connection waits for its next request, so idle connections
//!   are closed after it too.
//! - A request's body must arrive within [`HttpLimits::body_read_timeout`]
//!   of its header, however its bytes trickle in (a body still arriving at
//!   the deadline fails to read, and the connection closes).
//! - At most [`HttpLimits::max_connections`] connections are served at
//!   once; past it the server stops accepting (new clients wait in the
//!   kernel's accept queue) until one closes. That wait is logged at most
//!   once per [`REFUSAL_LOG_EVERY`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use mooncake_common::LogLimit;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Sleep;

/// What clients may cost an HTTP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Longest a request's header may take to arrive, and a kept-alive
    /// connection may wait for its next request.
    pub header_read_timeout: Duration,
    /// Longest a request's body may take to arrive.
    pub body_read_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
        }
    }
}

/// A full server logs that new connections wait at most this often.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);
/// Pause after a failed accept (out of descriptors and the like).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `app` on `listener` until `shutdown` resolves; then stops
/// accepting and lets the requests in flight finish. `name` names the
/// server in log lines.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let body_limit = limits.body_read_timeout;
    let app = app.layer(axum::middleware::map_request(
        move |req: Request| async move {
            req.map(|body| Body::new(DeadlineBody::new(body, body_limit)))
        },
    ));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let refusals = LogLimit::new(REFUSAL_LOG_EVERY);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Backpressure: accept only with a free slot.
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if let Some(suppressed) = refusals.should_log() {
                    tracing::warn!(
                        server = name,
                        max = limits.max_connections,
                        suppressed,
                        "too many HTTP connections; new ones wait for a slot"
                    );
                }
                tokio::select! {
                    p = permits.clone().acquire_owned() => p.expect("never closed"),
                    () = &mut shutdown => break,
                }
            }
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if let Some(suppressed) = refusals.should_log() {
                        tracing::warn!(server = name, suppressed, "accept failed: {e}");
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Replies are small; don't let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(server = name, "HTTP connection closed: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A request body that fails once its deadline passes, however its bytes
/// trickle in (tower-http's body timeout restarts with every frame).
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
}

impl DeadlineBody {
    fn new(inner: Body, within: Duration) -> DeadlineBody {
        DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(within)),
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(io::Error::new(
                io::ErrorKind::TimedOut,
                "request body not received within the deadline",
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
