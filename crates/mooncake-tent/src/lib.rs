//! TENT (Transfer Engine NEXT) on this build's transports: several paths
//! per peer, a transport selector, slices sprayed over the paths by
//! observed completion time and queue depth, and failover inside the
//! engine. See `docs/tent.md`.
//!
//! Layout:
//! - `scheduler`, `health`, `selector`: the pure policies (no sockets, no clock);
//! - `engine`: [`TentEngine`], one classic
//!   [`mooncake_transfer::TransferEngine`] per local address (a path's
//!   connections and listener), the spraying loop and the probes.

pub mod health;
pub mod scheduler;
pub mod selector;

pub mod bench;
mod config;
mod engine;
mod http;
pub mod metrics;
pub mod tebench;

pub use config::{MetricsConfig, TentConfig};
pub use engine::{PathInfo, TentEngine};
pub use http::MetricsServer;
