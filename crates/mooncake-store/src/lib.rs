//! Mooncake Store: a metadata-only master and clients that move object bytes
//! directly between their buffers and segments with the transfer engine.
//!
//! Layout:
//! - [`types`]: replicas, segments and configs shared by everyone;
//! - [`proto`]: the master RPC messages, their binary encoding and framing;
//! - [`master_client`]: the blocking, pooled client of the master.

pub mod ha;
pub mod master_client;
pub mod proto;
pub mod types;

pub use master_client::MasterClient;
