//! Mooncake Store: a metadata-only master and clients that move object bytes
//! directly between their buffers and segments with the transfer engine.
//!
//! Layout:
//! - [`types`]: replicas, segments and configs shared by everyone;
//! - [`proto`]: the master RPC messages, their binary encoding and framing;
//! - [`master`]: the master's state machine, config and server;
//! - [`master_client`]: the blocking, pooled client of the master;
//! - `rpc`: the framed-RPC client pool and server loop both protocols run on;
//! - [`client`]: the store client (put/get over the transfer engine), dummy
//!   clients and the standalone store service;
//! - [`tier`]: the SSD tier's storage core (on-disk layouts, verified reads,
//!   the restart scan, disk eviction), the crate `mooncake-tier`, named here
//!   so that `crate::tier::...` reads as before.

#![warn(unreachable_pub)]

mod allocator;
pub mod client;
pub mod ha;
pub mod master;
pub mod master_client;
pub mod proto;
pub mod rpc;
pub mod tenant;
pub mod types;

pub use mooncake_tier as tier;

pub use client::rust_api::ReplicateConfig;
pub use client::{Client, ClientConfig, MooncakeStore, StoreError};
pub use master_client::MasterClient;
