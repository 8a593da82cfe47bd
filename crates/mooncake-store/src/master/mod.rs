//! The master: metadata and space allocation for the store; object bytes
//! never pass through it.
//!
//! - [`service::MasterService`] is the state machine (no I/O, no clock:
//!   time is an argument), built from [`segments`] (mounted segments and
//!   replica placement), [`allocator`] (offset allocator per segment),
//!   [`objects`] (sharded object map), [`leases`] (leases and pins),
//!   [`eviction`] (watermark eviction), [`clients`] (heartbeats, expiry)
//!   and [`tasks`] (copy and move tasks);
//! - [`config::MasterConfig`] holds the flags;
//! - [`server`] is the async shell: RPC listener, timers; [`http`] the HTTP
//!   service (metrics and admin queries, [`metrics`]); both hold the
//!   `shared` state; [`ha`] serves only while this master leads its
//!   cluster; `run` picks HA or plain serving and owns the runtime.

pub mod allocator;
pub mod clients;
pub mod config;
pub mod eviction;
pub mod ha;
mod http;
pub mod leases;
pub mod metrics;
pub mod objects;
mod run;
pub mod segments;
pub mod server;
pub mod service;
mod shared;
pub mod tasks;

pub use config::{AllocationStrategy, MasterConfig};
pub use run::{run, serve, MasterHandle};
pub use server::MasterServer;
pub use service::{MasterService, MasterStats, Policy, SegmentSummary, TickReport};

#[cfg(test)]
mod tests;
