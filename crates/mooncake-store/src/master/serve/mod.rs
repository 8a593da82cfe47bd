//! Serving one master: [`server`] is the async shell (RPC listener,
//! timers), `http` the HTTP service (metrics, admin queries, the `status`
//! page, the `drain_routes` over `drain_jobs`); both hold the `shared`
//! state. `access` checks tokens, `published` checks mounts against what
//! engines published, `room_wait` holds puts while copies free memory,
//! `startup` answers the HTTP port while a restore runs.

pub(in crate::master) mod access;
pub(in crate::master) mod drain_jobs;
pub(in crate::master) mod drain_routes;
pub(in crate::master) mod http;
pub(in crate::master) mod published;
mod room_wait;
pub mod server;
pub(in crate::master) mod shared;
pub(in crate::master) mod startup;
pub(in crate::master) mod status;
pub(in crate::master) mod tenant_routes;
