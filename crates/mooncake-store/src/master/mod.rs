//! The master: metadata and space allocation for the store; object bytes
//! never pass through it.
//!
//! - [`MasterService`] is the state machine (no I/O, no clock: time is an
//!   argument). Its calls decide mutations (`mutation`) and apply them; the
//!   docs of `service` describe the split, the lock order and the hook
//!   where an operation log records them. Its tables: `segments` (mounted
//!   segments and replica placement, over [`allocator`]), `objects`
//!   (sharded object map; `leases` for leases and pins), `clients`
//!   (liveness), `tasks` (copy and move tasks), `retired` (space freed
//!   later), `disk` (SSD tiers and copies) and `file_tier` (the shared
//!   filesystem's writers and writes in flight); `eviction` ranks victims;
//!   `policy` holds the rules;
//! - [`MasterConfig`] holds the flags, declared once in `config` (one
//!   module of rows per concern);
//! - [`server`] is the async shell: RPC listener, timers; [`http`] the HTTP
//!   service (metrics and admin queries, `metrics`); both hold the
//!   `shared` state; [`oplog`] turns mutations into durable entries,
//!   [`snapshot`] restores and snapshots them, `replication` carries them
//!   to standbys and `follower` applies them there, `ha_snapshot` keeps
//!   their log short and catches late standbys up; [`ha`] serves only
//!   while this master leads its cluster (`failover`: standby, then
//!   leader); `run` picks HA or plain serving and owns the runtime.

mod access;
pub mod allocator;
mod clients;
mod config;
mod disk;
mod drain;
mod drain_http;
mod eviction;
mod failover;
mod file_tier;
pub mod floor;
mod follower;
pub mod ha;
mod ha_durable;
mod ha_snapshot;
mod http;
mod leader_label;
mod leases;
pub mod metrics;
mod mutation;
mod objects;
pub mod oplog;
mod policy;
mod published;
mod replication;
mod retired;
mod run;
mod segments;
pub mod server;
mod service;
mod shared;
pub mod snapshot;
mod startup;
mod status;
mod tasks;

pub use config::{bool_flag_names, Flag, FlagKind, MasterConfig, Support, FLAGS};
pub use policy::{AllocationStrategy, FilePolicy, LeasePolicy, OffloadPolicy, Policy, TaskPolicy};
pub use run::{run, serve, MasterHandle};
pub use server::MasterServer;
pub use service::{MasterService, MasterStats, SegmentSummary, TickReport};

#[cfg(test)]
mod tests;
