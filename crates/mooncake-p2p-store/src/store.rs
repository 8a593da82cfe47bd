//! `P2PStore`: the reference's operations (`core.go`) over a transfer
//! engine and the etcd catalog.
//!
//! Buffers are `(address, length)` pairs of this process's memory. As with
//! the engine's `register_local_memory`, the caller promises that a
//! registered or replicated buffer stays mapped, and unchanged, until
//! `unregister` / `delete_replica` returns (peers read it until then).

use std::collections::HashMap;
use std::sync::Arc;

use mooncake_transfer::{EngineConfig, TransferEngine};
use parking_lot::Mutex;

use crate::catalog::{modify, Catalog, EtcdCatalog};
use crate::error::{P2pError, Result};
use crate::fetch::{Fetch, FetchReport};
use crate::memory::Registered;
use crate::record::{check_buffers, payload_key, Payload, PayloadInfo};

/// Shards read at once by one `get_replica`.
pub const DEFAULT_PARALLEL_FETCHES: usize = 4;

/// Memory location given to the engine for replicas (the reference's).
const REPLICA_LOCATION: &str = "cpu:0";

/// A payload this store holds.
#[derive(Debug, Clone)]
struct Held {
    buffers: Vec<(u64, u64)>,
    /// Still being registered or replicated: the name is taken, nothing
    /// to release yet.
    pending: bool,
    /// Registered here (gold), not replicated.
    gold: bool,
}

pub struct P2PStore {
    engine: TransferEngine,
    catalog: Arc<dyn Catalog>,
    me: String,
    memory: Registered,
    held: Mutex<HashMap<String, Held>>,
    parallel_fetches: usize,
}

impl P2PStore {
    /// Starts a transfer engine named `local_server_name` (`host:port`)
    /// with `metadata_server` (etcd: `h:p` or `etcd://h:p`) for both the
    /// engine's segments and the catalog. The engine reads the usual `MC_*`
    /// variables.
    pub fn new(metadata_server: &str, local_server_name: &str) -> Result<P2PStore> {
        P2PStore::with_config(
            metadata_server,
            EngineConfig::new(metadata_server, local_server_name),
        )
    }

    /// [`Self::new`] with the engine's settings given (`config` names the
    /// same metadata server).
    pub fn with_config(metadata_server: &str, config: EngineConfig) -> Result<P2PStore> {
        let catalog = Arc::new(EtcdCatalog::connect(metadata_server)?);
        let engine = TransferEngine::new(config)?;
        Ok(P2PStore::with_parts(engine, catalog))
    }

    /// A store over an engine and catalog built elsewhere.
    pub fn with_parts(engine: TransferEngine, catalog: Arc<dyn Catalog>) -> P2PStore {
        P2PStore {
            me: engine.local_server_name(),
            engine,
            catalog,
            memory: Registered::default(),
            held: Mutex::new(HashMap::new()),
            parallel_fetches: DEFAULT_PARALLEL_FETCHES,
        }
    }

    /// How many shards one `get_replica` reads at once (at least 1).
    pub fn set_parallel_fetches(&mut self, n: usize) {
        self.parallel_fetches = n.max(1);
    }

    /// The segment name peers read this store's buffers under.
    pub fn local_server_name(&self) -> &str {
        &self.me
    }

    pub fn engine(&self) -> &TransferEngine {
        &self.engine
    }

    /// Publishes `buffers` (in order, one object) as `name`, cut into
    /// shards of `max_shard_size` bytes (a power of two, at most 4 GiB; 64
    /// MiB recommended). Moves no data. Without `force_create`, a name
    /// already in the catalog is refused.
    pub fn register(
        &self,
        name: &str,
        buffers: &[(u64, u64)],
        max_shard_size: u64,
        location: &str,
        force_create: bool,
    ) -> Result<()> {
        check_name(name)?;
        check_buffers(buffers, max_shard_size)?;
        self.take_name(name)?;
        let result = self.do_register(name, buffers, max_shard_size, location, force_create);
        self.settle(name, buffers, result.is_ok(), true);
        result
    }

    fn do_register(
        &self,
        name: &str,
        buffers: &[(u64, u64)],
        max_shard_size: u64,
        location: &str,
        force_create: bool,
    ) -> Result<()> {
        self.memory.add_all(&self.engine, buffers, location)?;
        let payload = Payload::published(name, &self.me, buffers, max_shard_size);
        let written = if force_create {
            self.catalog.put(&payload).map(|()| true)
        } else {
            self.catalog.create(&payload)
        };
        match written {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.memory.remove_all(&self.engine, buffers);
                Err(P2pError::AlreadyExists(payload_key(name)))
            }
            Err(e) => {
                self.memory.remove_all(&self.engine, buffers);
                Err(e)
            }
        }
    }

    /// Withdraws this store's published copy of `name` (one it
    /// registered, else `PayloadNotOpened`); the buffers are the caller's
    /// again once it returns. The record goes when no holder is left.
    pub fn unregister(&self, name: &str) -> Result<()> {
        let me = self.me.clone();
        self.release(name, true, move |p| {
            for shard in &mut p.shards {
                shard.gold.retain(|l| l.segment_name != me);
            }
        })
    }

    /// Copies `name` into `buffers` (whose sizes must cut into the same
    /// shards as the published ones), reading each shard from any holder,
    /// and serves it to other consumers from there on, shard by shard.
    pub fn get_replica(&self, name: &str, buffers: &[(u64, u64)]) -> Result<FetchReport> {
        check_name(name)?;
        if buffers.is_empty() {
            return Err(P2pError::invalid("no buffers given"));
        }
        self.take_name(name)?;
        let result = self.do_get_replica(name, buffers);
        self.settle(name, buffers, result.is_ok(), false);
        result
    }

    fn do_get_replica(&self, name: &str, buffers: &[(u64, u64)]) -> Result<FetchReport> {
        let (payload, _) = self.catalog.get(name)?.ok_or(P2pError::PayloadNotFound)?;
        let spans = payload.spans_for(buffers)?;
        self.memory
            .add_all(&self.engine, buffers, REPLICA_LOCATION)?;
        let fetch = Fetch {
            engine: &self.engine,
            catalog: &*self.catalog,
            name,
            me: &self.me,
            spans: &spans,
            threads: self.parallel_fetches,
        };
        let result = fetch.run();
        if result.is_err() {
            // Shards already published here must not be read any more.
            let me = self.me.clone();
            if let Err(e) = modify(&*self.catalog, name, |p| {
                p.remove_replicas_of(&me);
                true
            }) {
                tracing::warn!("withdrawing the partial replica of {name:?}: {e}");
            }
            self.memory.remove_all(&self.engine, buffers);
        }
        result
    }

    /// Stops serving this store's replica of `name` (one it replicated,
    /// else `PayloadNotOpened`); the buffers are the caller's again once it
    /// returns.
    pub fn delete_replica(&self, name: &str) -> Result<()> {
        let me = self.me.clone();
        self.release(name, false, move |p| p.remove_replicas_of(&me))
    }

    /// The payloads in the catalog whose names start with `prefix`.
    pub fn list(&self, prefix: &str) -> Result<Vec<PayloadInfo>> {
        Ok(self
            .catalog
            .list(prefix)?
            .iter()
            .map(Payload::info)
            .collect())
    }

    /// Shuts the engine down (its listener and metadata keys).
    pub fn close(&self) {
        self.engine.shutdown();
    }

    /// Marks `name` as held (pending) here, or refuses a second hold.
    fn take_name(&self, name: &str) -> Result<()> {
        let mut held = self.held.lock();
        if held.contains_key(name) {
            return Err(P2pError::PayloadOpened);
        }
        held.insert(
            name.to_string(),
            Held {
                buffers: Vec::new(),
                pending: true,
                gold: false,
            },
        );
        Ok(())
    }

    /// Ends a pending hold: kept with its buffers, or dropped.
    fn settle(&self, name: &str, buffers: &[(u64, u64)], kept: bool, gold: bool) {
        let mut held = self.held.lock();
        if kept {
            held.insert(
                name.to_string(),
                Held {
                    buffers: buffers.to_vec(),
                    pending: false,
                    gold,
                },
            );
        } else {
            held.remove(name);
        }
    }

    /// Removes this store's entries from `name`'s record, then lets go of
    /// its buffers. A record already gone is `PayloadNotFound`, and the
    /// buffers are let go of all the same.
    fn release(
        &self,
        name: &str,
        gold: bool,
        mut drop_mine: impl FnMut(&mut Payload),
    ) -> Result<()> {
        let held = match self.held.lock().get(name) {
            Some(h) if !h.pending && h.gold == gold => h.clone(),
            _ => return Err(P2pError::PayloadNotOpened),
        };
        let record = modify(&*self.catalog, name, |p| {
            drop_mine(p);
            true
        })?;
        self.held.lock().remove(name);
        self.memory.remove_all(&self.engine, &held.buffers);
        match record {
            Some(_) => Ok(()),
            None => Err(P2pError::PayloadNotFound),
        }
    }
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(P2pError::invalid("empty payload name"));
    }
    Ok(())
}
