//! Clean shutdown on SIGINT/SIGTERM for every long-running program.

use std::future::Future;

use tokio::signal::unix::{signal, Signal, SignalKind};

fn install() -> std::io::Result<(Signal, Signal)> {
    Ok((
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
    ))
}

/// Resolves on the first SIGINT or SIGTERM.
///
/// Called inside a tokio runtime, the handlers are installed right away, so a
/// program that calls this before announcing readiness cannot be killed by a
/// signal sent just after the announcement; outside a runtime they are
/// installed when the future is first polled. Installing them replaces the
/// default dispositions (which kill the process without cleanup); handlers
/// already present, such as the Python interpreter's, are chained and still
/// run. If a handler cannot be installed the future never resolves, and the
/// signal keeps its previous disposition.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send {
    let early = tokio::runtime::Handle::try_current()
        .ok()
        .map(|_| install());
    async move {
        match early.unwrap_or_else(install) {
            Ok((mut int, mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!("cannot install SIGINT/SIGTERM handlers: {e}");
                std::future::pending::<()>().await
            }
        }
    }
}
