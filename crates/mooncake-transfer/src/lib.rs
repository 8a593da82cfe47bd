//! Transfer Engine: moves bytes between registered memory in different
//! processes and hosts.
//!
//! Layout:
//! - [`engine`]: [`TransferEngine`], the public API (registration, segments,
//!   batches, notifies) and the routing of requests to transports;
//! - `transport/`: one file per transport (`local`, `shm`, `tcp`, `rdma`);
//! - `frame` (wire format, no I/O), `conn` (socket helpers), `rpc` (the
//!   engine's listening port: data frames, P2P handshake, notifies);
//! - `memory` (registered ranges), `batch` (request status), [`segment`]
//!   (descriptors in the reference's JSON shape), [`metadata`] (KV backends);
//! - `rawmem`: the only module that dereferences raw addresses or maps memory.

pub mod batch;
pub mod config;
mod conn;
pub mod engine;
mod frame;
#[doc(hidden)]
pub mod fuzzing;
mod memory;
pub mod metadata;
mod rawmem;
mod rpc;
pub mod segment;
mod transport;

pub use batch::{TransferState, TransferStatus};
pub use config::EngineConfig;
pub use engine::{
    BatchId, Notify, Opcode, SegmentHandle, TransferEngine, TransferRequest, TransportStats,
};
pub use segment::{BufferDesc, RpcMeta, SegmentDesc};
