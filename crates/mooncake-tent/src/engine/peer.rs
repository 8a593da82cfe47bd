//! An opened peer: its paths (one per endpoint it advertises, each carried
//! by one of our local engines), their scheduler and health, and probes
//! that bring a path back.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{Opcode, SegmentDesc, SegmentHandle, TransferEngine, TransferRequest};
use parking_lot::{Mutex, RwLock};

use super::worker::{self, Job};
use super::Inner;
use crate::health::{PathHealth, PathState};
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;

/// One path to a peer, as [`super::TentEngine::path_info`] reports it.
#[derive(Clone, Debug)]
pub struct PathInfo {
    /// The peer endpoint's segment name.
    pub endpoint: String,
    pub state: PathState,
    /// Estimated throughput, bytes/s.
    pub bandwidth: f64,
    pub inflight_slices: usize,
    pub completed_slices: u64,
    pub trips: u64,
}

pub(super) struct Path {
    pub(super) endpoint: String,
    pub(super) engine: TransferEngine,
    /// Opened lazily: an endpoint down when the peer was opened is opened by its probe.
    pub(super) handle: Mutex<Option<SegmentHandle>>,
    pub(super) queue: Sender<Job>,
}

pub(super) struct PathsState {
    pub(super) sched: Scheduler,
    pub(super) health: Vec<PathHealth>,
}

pub(super) struct Peer {
    pub(super) name: String,
    pub(super) same_host: bool,
    /// The peer's segment on our first engine (shared-memory copies).
    pub(super) primary: SegmentHandle,
    pub(super) desc: RwLock<Arc<SegmentDesc>>,
    pub(super) paths: Vec<Path>,
    pub(super) state: Mutex<PathsState>,
    metrics: Arc<Metrics>,
}

impl Peer {
    pub(super) fn open(inner: &Inner, name: &str) -> Result<Peer> {
        let first = &inner.locals[0];
        let primary = first.open_segment(name)?;
        let desc = first.segment_descriptor(primary)?;
        let mut endpoints: Vec<String> = desc
            .devices
            .iter()
            .filter(|d| d.get("transport").and_then(|t| t.as_str()) == Some("tcp"))
            .filter_map(|d| {
                d.get("segment")
                    .and_then(|s| s.as_str())
                    .map(str::to_string)
            })
            .collect();
        if endpoints.is_empty() {
            // A classic engine: its one endpoint.
            endpoints.push(name.to_string());
        }
        let c = &inner.config;
        let mut health = Vec::new();
        let mut paths = Vec::new();
        let now = Instant::now();
        for (j, endpoint) in endpoints.into_iter().enumerate() {
            let engine = inner.locals[j % inner.locals.len()].clone();
            let handle = if j == 0 && endpoint == name {
                Ok(primary)
            } else {
                engine.open_segment(&endpoint)
            };
            let mut h = PathHealth::new(c.health);
            let handle = match handle {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!("TENT: endpoint {endpoint} of {name} unreachable: {e}");
                    h.stalled(now);
                    None
                }
            };
            inner.metrics.path_state(name, &endpoint, h.usable());
            health.push(h);
            paths.push(Path {
                queue: worker::spawn(c.max_inflight_slices, &endpoint)?,
                endpoint,
                engine,
                handle: Mutex::new(handle),
            });
        }
        // An initial estimate of 1 GB/s: only the ratio between paths matters.
        let sched = Scheduler::new(
            paths.len(),
            c.bandwidth_learning_rate,
            c.max_inflight_slices,
            1e9,
        )
        .with_horizon(c.stall_timeout.as_secs_f64() / 2.0);
        Ok(Peer {
            name: name.to_string(),
            same_host: inner.own_host.is_some() && desc.host_id == inner.own_host,
            primary,
            desc: RwLock::new(desc),
            paths,
            state: Mutex::new(PathsState { sched, health }),
            metrics: inner.metrics.clone(),
        })
    }

    pub(super) fn info(&self) -> Vec<PathInfo> {
        let st = self.state.lock();
        self.paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let load = &st.sched.paths()[i];
                PathInfo {
                    endpoint: p.endpoint.clone(),
                    state: st.health[i].state(),
                    bandwidth: load.bandwidth,
                    inflight_slices: load.inflight_slices,
                    completed_slices: load.completed_slices,
                    trips: st.health[i].trips,
                }
            })
            .collect()
    }

    /// The buffer holding `[addr, addr+len)` of the peer, re-reading its
    /// descriptor once when it is not there (it may have registered since).
    pub(super) fn find_buffer(&self, inner: &Inner, addr: u64, len: u64) -> Result<bool> {
        let lookup = |d: &SegmentDesc| {
            d.buffers
                .iter()
                .find(|b| {
                    addr >= b.addr
                        && addr
                            .checked_add(len)
                            .is_some_and(|end| end <= b.addr.saturating_add(b.length))
                })
                .map(|b| b.shm.is_some())
        };
        if let Some(shared) = lookup(&self.desc.read()) {
            return Ok(shared);
        }
        let fresh = inner.locals[0].refresh_segment(self.primary)?;
        *self.desc.write() = fresh.clone();
        lookup(&fresh).ok_or_else(|| {
            Error::new(
                ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                format!("{addr:#x}+{len} is outside segment {}", self.name),
            )
        })
    }

    /// Records a path's new state in the metrics.
    pub(super) fn report(&self, path: usize, up: bool) {
        self.metrics
            .path_state(&self.name, &self.paths[path].endpoint, up);
    }

    /// Starts a probe of every path whose cooldown is over. A probe opens
    /// the endpoint if needed and reads a few bytes of the peer's first
    /// buffer over that path (or, with no buffer, fetches its descriptor).
    pub(super) fn probe_due(self: &Arc<Self>, inner: &Inner, now: Instant) {
        let due: Vec<usize> = {
            let mut st = self.state.lock();
            (0..self.paths.len())
                .filter(|&i| st.health[i].start_probe(now))
                .collect()
        };
        for i in due {
            let peer = self.clone();
            let scratch = inner.probe_buf.addr(i);
            let target = self.desc.read().first_buffer_address();
            std::thread::spawn(move || {
                let ok = peer.probe(i, scratch, target);
                let mut st = peer.state.lock();
                if ok {
                    tracing::info!(
                        "TENT: path {} of {} recovered (probe)",
                        peer.paths[i].endpoint,
                        peer.name
                    );
                    st.health[i].success();
                    st.sched.restore(i);
                } else {
                    st.health[i].probe_failed(Instant::now());
                }
                let up = st.health[i].usable();
                drop(st);
                peer.report(i, up);
            });
        }
    }

    fn probe(&self, i: usize, scratch: usize, target: u64) -> bool {
        let path = &self.paths[i];
        let handle = {
            let mut h = path.handle.lock();
            match *h {
                Some(h) => h,
                None => match path.engine.open_segment(&path.endpoint) {
                    Ok(opened) => *h.insert(opened),
                    Err(_) => return false,
                },
            }
        };
        if target == 0 {
            return path.engine.refresh_segment(handle).is_ok();
        }
        path.engine
            .transfer_sync(&[TransferRequest {
                opcode: Opcode::Read,
                source: scratch,
                target_id: handle,
                target_offset: target,
                length: 1,
            }])
            .is_ok()
    }
}
