//! Transfer Engine: moves bytes between registered memory in different
//! processes and hosts.
//!
//! The public API is what this file re-exports, plus [`metadata`] (the
//! metadata backends and the HTTP metadata server, which the store and the
//! CLI use directly); everything else is `pub(crate)` (`unreachable_pub`
//! keeps it so).
//!
//! Layout:
//! - `engine/`: [`TransferEngine`] (registration, segments, batches and
//!   submission, notifies, one file each) and the routing of requests to
//!   transports;
//! - `transport/`: one file per transport (`local`, `shm`, `tcp`);
//! - `frame` (wire format, no I/O), `conn` (socket helpers), `rpc` (the
//!   engine's listening port: data frames, P2P handshake, notifies);
//! - `memory` (registered ranges), `batch` (request status), `segment`
//!   (descriptors in the reference's JSON shape), [`metadata`] (KV backends);
//! - `rawmem`: the only module that dereferences raw addresses or maps memory;
//! - `fuzzing` (feature `fuzzing`): entry points for the fuzz targets.

#![warn(unreachable_pub)]

mod batch;
mod config;
mod conn;
mod engine;
mod frame;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod http_serve;
mod idle;
mod listener;
pub mod memcopy;
mod memory;
pub mod metadata;
mod rawmem;
mod rpc;
mod segment;
mod transport;

pub use batch::{TransferState, TransferStatus};
pub use config::EngineConfig;
pub use engine::{
    BatchId, Notify, Opcode, SegmentHandle, TransferEngine, TransferRequest, TransportStats,
};
pub use listener::ListenerLimits;
pub use rawmem::HUGE_PAGE_SIZES;
pub use segment::{BufferDesc, SegmentDesc};
