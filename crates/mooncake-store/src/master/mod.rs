//! The master: metadata and space allocation for the store; object bytes
//! never pass through it.
//!
//! Its folders are layers; each imports only the ones above it:
//!
//! - `config`: the flags ([`MasterConfig`], declared once, one module of
//!   rows per concern) and the rules they set ([`Policy`]);
//! - `events`: the KV-event publisher (it imports no other layer);
//! - [`state`]: the state machine [`MasterService`] and its tables;
//! - [`durable`]: the operation log and snapshots of the state machine;
//! - [`metrics`]: what `/metrics` shows;
//! - `replication`: carries log entries to standbys;
//! - [`serve`](mod@serve): the RPC server, timers and HTTP service of one master;
//! - [`ha`]: serving only while this master leads its cluster; following,
//!   failover, recovery from the log directory, compaction;
//! - `run` picks HA or plain serving and owns the runtime.

mod config;
pub mod durable;
pub mod events;
pub mod ha;
pub mod metrics;
mod replication;
mod run;
pub mod serve;
pub mod state;

pub use config::policy::{
    AllocationStrategy, EvictionPolicy, FilePolicy, LeasePolicy, OffloadPolicy, Policy, TaskPolicy,
};
pub use config::{bool_flag_names, Flag, FlagKind, MasterConfig, Support, FLAGS};
pub use run::{run, serve, MasterHandle};
pub use serve::server::MasterServer;
pub use state::mutation::Release;
pub use state::service::{Answer, MasterService, MasterStats, SegmentSummary, TickReport};
