//! Clean shutdown on SIGINT/SIGTERM for every long-running program.

use tokio::signal::unix::{signal, SignalKind};

/// Resolves on the first SIGINT or SIGTERM received after the call.
///
/// Installing the handlers replaces the default dispositions (which would kill
/// the process without cleanup); handlers already present, such as the Python
/// interpreter's, are chained and still run. If a handler cannot be installed
/// the future never resolves, and the signal keeps its previous disposition.
pub async fn shutdown_signal() {
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(int), Ok(term)) => (int, term),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!("cannot install SIGINT/SIGTERM handlers: {e}");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}
