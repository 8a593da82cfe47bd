//! P2P Store: large immutable objects (checkpoints, model weights) shared
//! between many nodes without a central copy, as the reference's Go
//! `mooncake-p2p-store`.
//!
//! A publisher [`P2PStore::register`]s named buffers: a record in etcd says
//! which segment holds each shard; no byte moves. A consumer
//! [`P2PStore::get_replica`]s them: it reads every shard from some holder
//! with the transfer engine and adds itself as a holder of each shard as
//! soon as it has it, so later readers spread over the consumers and the
//! publisher sends each shard about once. [`P2PStore::unregister`] and
//! [`P2PStore::delete_replica`] withdraw a copy; [`P2PStore::list`] lists
//! the records. See `docs/p2p-store.md`.
//!
//! Layout, top-down (each module imports only those below it):
//! - `example` (the `p2p-store-example` program's `run`);
//! - `store` (the operations), over `fetch` (a replica's reads, in threads);
//! - `catalog` (the records in etcd, compare-and-swap updates), `memory`
//!   (buffers registered with the engine, counted);
//! - `plan` (which shard next, from whom; pure), `record` (the records'
//!   JSON, shards; pure), `error`.

mod catalog;
mod error;
pub mod example;
mod fetch;
mod memory;
mod plan;
mod record;
mod store;

pub use catalog::{modify, Catalog, EtcdCatalog, Versioned};
pub use error::{P2pError, Result};
pub use fetch::FetchReport;
pub use plan::{gold_cap, pick, seed_for, Pick, PickState};
pub use record::{
    check_buffers, payload_key, shard_spans, Location, Payload, PayloadInfo, Shard, Span,
    DEFAULT_SHARD_SIZE, KEY_PREFIX, MAX_CHUNK_SIZE,
};
pub use store::{P2PStore, DEFAULT_PARALLEL_FETCHES};
