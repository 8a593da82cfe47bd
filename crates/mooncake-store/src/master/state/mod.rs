//! The state machine and its tables (no I/O, no clock: time is an
//! argument). [`MasterService`](service::MasterService) decides mutations
//! (`mutation`) and applies them; the docs of `service` describe the
//! split, the lock order and the hook where an operation log records them.
//! Its tables: `segments` (mounted segments and replica placement, over
//! [`allocator`]), `objects` (sharded object map; `leases` for leases and
//! pins), `clients` (liveness), `tasks` (copy and move tasks), `retired`
//! (space freed later), `ssd_tier` (SSD tiers and copies) and `fs_tier`
//! (the shared filesystem's writers and writes in flight); `eviction`
//! ranks victims.

pub mod allocator;
pub(in crate::master) mod clients;
pub(in crate::master) mod eviction;
pub(in crate::master) mod fs_tier;
pub(in crate::master) mod leases;
pub(in crate::master) mod mutation;
pub(in crate::master) mod objects;
pub(in crate::master) mod retired;
pub(in crate::master) mod segments;
pub(in crate::master) mod service;
pub(in crate::master) mod ssd_tier;
pub(in crate::master) mod tasks;

#[cfg(test)]
mod tests;
