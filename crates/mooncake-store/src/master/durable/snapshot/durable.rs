//! Opening a durable master (restore, then the log and the snapshot
//! thread) and the snapshot rounds themselves.

use std::sync::{Arc, Weak};
use std::time::Instant;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

use super::format::{self, SnapshotMeta};
use super::{replay_log, restore, start_history, RestoreProgress, SnapshotReport, Stores};
use crate::master::config::MasterConfig;
use crate::master::durable::oplog::wal::{self, Wal, WalSink};
use crate::master::state::service::MasterService;

/// A master's durability: its log (when written) and snapshot thread.
pub(crate) struct Durability {
    pub(crate) wal: Option<Arc<Wal>>,
    /// What the snapshot thread needs besides the live state, until
    /// [`Durability::start_snapshots`] starts it.
    pending: Mutex<Option<(MasterConfig, Arc<Stores>)>>,
    snapshots: Mutex<Option<Snapshotter>>,
}

/// The live master a snapshot round cuts: its state machine and clock.
pub(crate) trait LiveState: Send + Sync {
    fn service(&self) -> &MasterService;
    /// The master clock (ms).
    fn now_ms(&self) -> u64;
}

/// The state machine a master starts with.
pub(crate) struct Opened {
    pub(crate) service: MasterService,
    /// Where the master clock resumes (ms): after every restored time.
    pub(crate) clock_base: u64,
    pub(crate) durability: Durability,
}

/// Builds the state machine `config` asks for: restored from snapshots
/// and the log when restore or the local log is on, logging every
/// mutation when the log or snapshots are on. (In HA mode replication
/// owns all of this.) A restore reports how far it got in `progress`.
pub(crate) fn open(config: &MasterConfig, progress: &RestoreProgress) -> Result<Opened> {
    let writes_log = config.local_wal() || (config.enable_snapshot && !config.enable_ha);
    let restores = !config.enable_ha && (config.enable_snapshot_restore || config.local_wal());
    let none = Durability {
        wal: None,
        pending: Mutex::new(None),
        snapshots: Mutex::new(None),
    };
    if !writes_log && !restores {
        return Ok(Opened {
            service: MasterService::new(config),
            clock_base: 0,
            durability: none,
        });
    }
    let uses_snapshots = config.enable_snapshot || config.enable_snapshot_restore;
    let stores = if uses_snapshots {
        Some(Arc::new(Stores::from_config(config)?))
    } else {
        None
    };
    let dir = config.log_dir();
    if writes_log && dir.is_none() {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "the write-ahead log needs --wal_dir (or MOONCAKE_SNAPSHOT_LOCAL_PATH)",
        ));
    }
    let (service, now, next_seq, report) = if restores {
        let make = || MasterService::new(config);
        let r = restore(&make, stores.as_deref(), dir.as_deref(), None, progress)?;
        tracing::info!(report = ?r.report, "restored master state");
        // The snapshot's bytes and the log entries replayed are gone.
        let t = Instant::now();
        super::release_heap();
        tracing::info!(ms = t.elapsed().as_millis() as u64, "restore: heap trimmed");
        let next = r.report.last_seq + 1;
        (r.service, r.now, next, Some(r.report))
    } else {
        // A fresh history: past the positions of every snapshot and log
        // there, so none of them is taken for part of it.
        let dir = dir.as_deref().expect("checked above");
        let mut base = stores
            .as_deref()
            .and_then(|s| s.list().first().copied())
            .unwrap_or(0);
        if let Some((first, _)) = wal::list_files(dir).ok().and_then(|f| f.last().cloned()) {
            base = base.max(
                wal::recover_each(dir, first.saturating_sub(1), None, &mut |_| Ok(()))?.last_seq,
            );
        }
        start_history(dir, base)?;
        (MasterService::new(config), 0, base + 1, None)
    };
    let clock_base = if report.is_some() { now + 1 } else { 0 };
    let t = Instant::now();
    if report.is_some() {
        service.await_owners(clock_base);
    }
    if !writes_log {
        return Ok(Opened {
            service,
            clock_base,
            durability: none,
        });
    }
    let dir = dir.expect("checked above");
    let wal = Wal::start(&dir, next_seq, config.local_wal())?;
    // A put is answered once its reservation is durable, its own entry
    // with its PutEnd's. Space reserved before a restart may hold puts
    // answered whose entries never reached the disk: retired for the put
    // release timeout (`segments::space`).
    let service = service
        .with_sink(Box::new(WalSink(wal.clone())))
        .with_put_fence();
    service.retire_reserved(clock_base);
    if report.is_some() {
        tracing::info!(
            ms = t.elapsed().as_millis() as u64,
            "restore: owners awaited, log opened"
        );
    }
    let pending = match (stores, config.enable_snapshot) {
        (Some(stores), true) => Some((config.clone(), stores)),
        _ => None,
    };
    Ok(Opened {
        service,
        clock_base,
        durability: Durability {
            wal: Some(wal),
            pending: Mutex::new(pending),
            snapshots: Mutex::new(None),
        },
    })
}

impl Durability {
    /// Starts the snapshot rounds over `live` (the master serving the
    /// state `open` gave), when snapshots are on; once.
    pub(crate) fn start_snapshots(&self, live: Weak<dyn LiveState>) -> Result<()> {
        let (Some((config, stores)), Some(wal)) = (self.pending.lock().take(), &self.wal) else {
            return Ok(());
        };
        *self.snapshots.lock() = Some(Snapshotter::start(config, stores, wal.clone(), live)?);
        Ok(())
    }

    /// Stops the snapshot thread and the log writer, once what was
    /// logged is written.
    pub(crate) fn stop(&self) {
        if let Some(s) = &*self.snapshots.lock() {
            s.stop();
        }
        if let Some(w) = &self.wal {
            let _ = w.flush();
            w.stop();
        }
    }
}

#[derive(Default)]
struct Control {
    stop: bool,
}

struct Snapshotter {
    ctl: Arc<(Mutex<Control>, Condvar)>,
}

impl Snapshotter {
    fn start(
        config: MasterConfig,
        stores: Arc<Stores>,
        wal: Arc<Wal>,
        live: Weak<dyn LiveState>,
    ) -> Result<Snapshotter> {
        let ctl = Arc::new((Mutex::new(Control::default()), Condvar::new()));
        let c = ctl.clone();
        std::thread::Builder::new()
            .name("mc-snapshot".into())
            .spawn(move || snapshot_loop(config, stores, wal, live, c))
            .map_err(|e| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("cannot start the snapshot thread: {e}"),
                )
            })?;
        Ok(Snapshotter { ctl })
    }

    fn stop(&self) {
        let (lock, cv) = &*self.ctl;
        lock.lock().stop = true;
        cv.notify_all();
    }
}

/// The shadow copy of the state machine a snapshot is encoded from (`None`
/// to start: [`round`] builds it from the store and the log), for a log
/// with no live master beside it (the master's own loop cuts its live
/// state, `live_round`); a caller may keep it to save the rebuild at the
/// price of a second copy of the state.
pub struct Shadow {
    service: MasterService,
    seq: u64,
    now: u64,
}

fn snapshot_loop(
    config: MasterConfig,
    stores: Arc<Stores>,
    wal: Arc<Wal>,
    live: Weak<dyn LiveState>,
    ctl: Arc<(Mutex<Control>, Condvar)>,
) {
    let interval = config.snapshot_interval;
    let mut next_due = Instant::now() + interval;
    loop {
        let (lock, cv) = &*ctl;
        let mut c = lock.lock();
        while !c.stop && Instant::now() < next_due {
            cv.wait_until(&mut c, next_due);
        }
        if c.stop {
            return;
        }
        drop(c);
        let Some(live) = live.upgrade() else {
            return;
        };
        let keep = config.snapshot_retention_count;
        let result = super::live_round(live.service(), &|| live.now_ms(), keep, &stores, &wal);
        drop(live);
        // The chunks copied during the round are gone.
        super::release_heap();
        match &result {
            Ok(r) => tracing::info!(report = ?r, "snapshot taken"),
            Err(e) => tracing::error!("snapshot failed: {e}"),
        }
        next_due = Instant::now() + interval;
    }
}

/// One snapshot: cut the log, bring the shadow to the cut, encode, store,
/// apply retention and truncate the log behind the oldest snapshot kept.
pub fn round(
    make: &dyn Fn() -> MasterService,
    keep: usize,
    stores: &Stores,
    wal: &Wal,
    shadow: &mut Option<Shadow>,
) -> Result<SnapshotReport> {
    let t = Instant::now();
    let seq = wal.rotate()?;
    let cut = t.elapsed();
    let t = Instant::now();
    let s = match shadow.take() {
        Some(mut s) => {
            let (_, last) = replay_log(&s.service, wal.dir(), s.seq, Some(seq), &mut s.now)?;
            s.seq = last.max(s.seq);
            s
        }
        None => {
            // The shadow's first build: not the start's restore, whose
            // progress the metrics show.
            let progress = RestoreProgress::default();
            let r = restore(make, Some(stores), Some(wal.dir()), Some(seq), &progress)?;
            Shadow {
                seq: r.report.last_seq,
                service: r.service,
                now: r.now,
            }
        }
    };
    let s = shadow.insert(s);
    let apply = t.elapsed();
    let mut report = SnapshotReport {
        seq: s.seq,
        cut,
        apply,
        ..SnapshotReport::default()
    };
    if stores.list().first() == Some(&s.seq) {
        // Nothing new since the last snapshot.
        return Ok(report);
    }
    let t = Instant::now();
    let meta = SnapshotMeta {
        seq: s.seq,
        term: 0,
        now: s.now,
    };
    let bytes = format::encode(&s.service, meta);
    report.encode = t.elapsed();
    report.bytes = bytes.len() as u64;
    report.objects = s.service.stats(s.now).key_count;
    let t = Instant::now();
    stores.put(s.seq, &bytes)?;
    report.store = t.elapsed();
    stores.retire(keep, wal, &mut report)?;
    Ok(report)
}
