//! The state machine and its tables (no I/O, no clock: time is an
//! argument). [`MasterService`](service::MasterService) decides mutations
//! (`mutation`) and applies them, its own or a log's (`owned`, their owned
//! form, replayed next to `apply`); the docs of `service` describe the
//! split, the lock order and the hook where an operation log records them.
//! Its tables, private to this folder: `segments` (mounted segments and
//! replica placement, over [`allocator`]), `objects` (sharded object map;
//! `leases` for leases and pins; `groups` for object groups), `clients` (liveness), `tasks` (copy and
//! move tasks), `retired` (space freed later), `room` (puts waiting for
//! copies to land), `ssd_tier` (SSD tiers and
//! copies) and `fs_tier` (the shared filesystem's writers and writes in
//! flight), `hotkeys` (hot keys' heat and extra replicas); `eviction`
//! ranks victims (`frequency` weighs reads in). Other layers see the tables only
//! through the state machine's calls and its `image` (snapshots, catch-up).

pub mod allocator;
mod clients;
mod eviction;
mod frequency;
mod fs_tier;
mod groups;
mod hotkeys;
pub(in crate::master) mod image;
mod image_objects;
mod leases;
pub(in crate::master) mod mutation;
mod objects;
pub(in crate::master) mod owned;
mod promotion;
mod retired;
pub(in crate::master) mod room;
mod segments;
pub(in crate::master) mod service;
mod ssd_tier;
mod tasks;
pub(in crate::master) mod tenants;
pub(in crate::master) mod view;

/// What drain jobs read of a segment.
pub(in crate::master) use segments::SegmentStatus;

#[cfg(test)]
mod tests;
