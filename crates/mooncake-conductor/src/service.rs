//! The Conductor: the index, its subscriptions and their threads. The HTTP
//! layer (`http.rs`) calls it; it knows nothing of HTTP.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde_json::{json, Value};

use crate::config::Registration;
use crate::index::{Index, Kind, SubId};
use crate::ingest::{self, Shared, SubStatus, Subscription};
use crate::metrics::Metrics;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0} is already registered")]
    Duplicate(String),
}

struct Handle {
    id: SubId,
    reg: Registration,
    kind: Kind,
    name: String,
    stop: Arc<AtomicBool>,
    status: Arc<SubStatus>,
}

pub struct Conductor {
    pub shared: Arc<Shared>,
    ctx: zmq::Context,
    subs: Mutex<Vec<Handle>>,
    replay_timeout: Duration,
}

/// The name a subscription goes by in answers and metrics:
/// `instance|tenant|dp_rank`.
pub fn sub_name(instance: &str, tenant: &str, dp_rank: u32) -> String {
    format!("{instance}|{tenant}|{dp_rank}")
}

impl Conductor {
    pub fn new(hash_seed: u64, replay_timeout: Duration) -> Arc<Conductor> {
        Arc::new(Conductor {
            shared: Arc::new(Shared {
                index: RwLock::new(Index::new(hash_seed)),
                metrics: Metrics::default(),
            }),
            ctx: zmq::Context::new(),
            subs: Mutex::new(Vec::new()),
            replay_timeout,
        })
    }

    /// Subscribes to a publisher. One subscription per (instance, tenant,
    /// dp_rank, type): an engine and the pool serving the same instance
    /// register under the same instance with their own types.
    pub fn register(&self, reg: Registration) -> Result<SubId, RegisterError> {
        let info = reg.sub_info().map_err(RegisterError::Invalid)?;
        let name = sub_name(&reg.instance_id, reg.tenant(), reg.dp_rank);
        let mut subs = self.subs.lock();
        if subs.iter().any(|h| {
            h.kind == info.kind
                && h.reg.instance_id == reg.instance_id
                && h.reg.tenant() == reg.tenant()
                && h.reg.dp_rank == reg.dp_rank
        }) {
            return Err(RegisterError::Duplicate(format!(
                "{name} ({})",
                info.kind.label()
            )));
        }
        let kind = info.kind;
        let id = self.shared.index.write().register(info);
        let stop = Arc::new(AtomicBool::new(false));
        let status = Arc::new(SubStatus::default());
        let label = format!("{name}|{}", kind.label());
        let sub = Subscription {
            id,
            kind,
            name: label,
            endpoint: reg.endpoint.clone(),
            replay_endpoint: reg.replay_endpoint.clone(),
            replay_timeout: self.replay_timeout,
        };
        if let Err(e) = ingest::spawn(
            &self.ctx,
            self.shared.clone(),
            sub,
            stop.clone(),
            status.clone(),
        ) {
            self.shared.index.write().unregister(id);
            return Err(RegisterError::Invalid(e));
        }
        tracing::info!("registered {name} ({}) at {}", kind.label(), reg.endpoint);
        subs.push(Handle {
            id,
            reg,
            kind,
            name,
            stop,
            status,
        });
        Ok(id)
    }

    /// Drops the subscriptions of `instance` under `tenant` (of one rank and
    /// type when given) and their blocks, at once; their names.
    pub fn unregister(
        &self,
        instance: &str,
        tenant: &str,
        dp_rank: Option<u32>,
        kind: Option<Kind>,
    ) -> Vec<String> {
        let mut subs = self.subs.lock();
        let mut removed = Vec::new();
        subs.retain(|h| {
            let hit = h.reg.instance_id == instance
                && h.reg.tenant() == tenant
                && dp_rank.is_none_or(|d| d == h.reg.dp_rank)
                && kind.is_none_or(|k| k == h.kind);
            if hit {
                h.stop.store(true, Ordering::Relaxed);
                self.shared.index.write().unregister(h.id);
                if !removed.contains(&h.name) {
                    removed.push(h.name.clone());
                }
            }
            !hit
        });
        removed
    }

    /// Every subscription and how its stream is going.
    pub fn instances(&self) -> Value {
        let subs = self.subs.lock();
        Value::Array(
            subs.iter()
                .map(|h| {
                    let s = &h.status;
                    json!({
                        "instance_id": h.reg.instance_id,
                        "tenant_id": h.reg.tenant(),
                        "dp_rank": h.reg.dp_rank,
                        "type": h.kind.label(),
                        "modelname": h.reg.modelname,
                        "block_size": h.reg.block_size,
                        "endpoint": h.reg.endpoint,
                        "replay_endpoint": h.reg.replay_endpoint,
                        "last_seq": *s.last_seq.lock(),
                        "batches": s.batches.load(Ordering::Relaxed),
                        "gaps": s.gaps.load(Ordering::Relaxed),
                        "replays_recovered": s.replays_recovered.load(Ordering::Relaxed),
                        "replays_failed": s.replays_failed.load(Ordering::Relaxed),
                        "stale": s.stale.load(Ordering::Relaxed),
                    })
                })
                .collect(),
        )
    }

    /// Stops every subscription's thread.
    pub fn shutdown(&self) {
        for h in self.subs.lock().iter() {
            h.stop.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for Conductor {
    fn drop(&mut self) {
        self.shutdown();
    }
}
