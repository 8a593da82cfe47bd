//! A master of a replicated HA cluster (`--enable_ha --enable_oplog`),
//! from start to exit:
//!
//! 1. it serves its admin HTTP at once (standbys answer `/health`,
//!    `/role`, `/ha_status`, `/leader`; data endpoints answer 503);
//! 2. it follows the leader as a hot standby (`follower`)
//!    and campaigns; a leader whose process it finds gone is deposed in
//!    the coordination service, so that the election moves on now;
//! 3. on winning, it checks that the replication record names it (only a
//!    member of the in-sync set holds every committed entry; a master
//!    that is not one steps aside, and takes over anyway only once no
//!    member has come forward for [`TAKEOVER_AFTER`]); without a record
//!    only a new cluster's master takes over (`takeover`);
//! 4. it records itself as leader of its term (a win that does not hold
//!    is found out here, and it steps aside), applies everything it
//!    received, takes over the volatile state cautiously
//!    (`MasterService::take_over`), binds the RPC port and serves; a task
//!    keeps the in-sync set recorded as standbys come and go;
//! 5. on SIGTERM it resigns; on losing the election it stops committing
//!    at once and exits with an error: its state may hold entries nobody
//!    committed, so it rejoins, restarted, as a fresh standby.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use tokio::sync::{mpsc, watch};

use super::compaction::{restore_newest, Snapshotter};
use super::follower::Follower;
use super::recovery;
use super::takeover::{Gate, Verdict, Win};
use crate::ha::{LeaderElection, Leadership};
use crate::master::config::MasterConfig;
use crate::master::durable::snapshot::Stores;
use crate::master::replication::disk::{self, DiskLog};
use crate::master::replication::in_sync::Record;
use crate::master::replication::{Options, Replication};
use crate::master::serve::server::{bind_http, serve_http, MasterServer};
use crate::master::serve::shared::Shared;

/// Pause before campaigning again after a failed campaign.
pub(crate) const CAMPAIGN_RETRY: Duration = Duration::from_secs(1);

/// How often the leader reconsiders its in-sync set.
const RECORD_EVERY: Duration = Duration::from_millis(20);
/// Bound on one record write.
const RECORD_TIMEOUT: Duration = Duration::from_secs(3);
/// A master outside the in-sync set takes over only after it has won,
/// and stepped aside, for this long without a member taking over.
pub(crate) const TAKEOVER_AFTER: Duration = Duration::from_secs(10);
/// Longest a stopping leader waits for its last entries to commit.
const SETTLE: Duration = Duration::from_millis(200);
/// Pause after stepping aside, so that members of the set get their turn.
const STEP_ASIDE: Duration = Duration::from_millis(300);

/// Stops the log's syncer when the master ends.
struct StopOnDrop(Arc<DiskLog>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// This process's member id: its RPC address and a random incarnation.
fn member_id(address: &str) -> String {
    format!("{address}#{:016x}", rand::random::<u64>())
}

pub(crate) async fn serve_replicated<B>(
    config: MasterConfig,
    election: Arc<dyn LeaderElection>,
    me: String,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    mut on_bound: B,
) -> Result<()>
where
    B: FnMut(&MasterServer),
{
    // With a log directory, a master brought back from it is the same
    // member of the in-sync set.
    let log_dir = config.log_dir();
    let recovered = log_dir.as_deref().map(disk::recover).transpose()?;
    let member = recovered
        .as_ref()
        .and_then(|r| r.member.clone())
        .unwrap_or_else(|| member_id(&me));
    let repl = Arc::new(Replication::new(member, Options::from_config(&config)));
    let shared = Arc::new(Shared::replicated(config.clone(), repl.clone())?);
    // Snapshots of the committed state: late standbys start from them, the
    // log is compacted behind them, and the leader stores them.
    let stores = if config.enable_snapshot || config.enable_snapshot_restore {
        Some(Arc::new(Stores::from_config(&config)?))
    } else {
        None
    };
    // Served from the start, as a standby's: a restore below shows its
    // progress on /metrics while it runs.
    let http = bind_http(&config).await?;
    let http_addr = http
        .local_addr()
        .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, format!("metrics service: {e}")))?;
    let (stop_http, http_stopped) = watch::channel(false);
    let http_task = tokio::spawn(serve_http(http, shared.clone(), async move {
        let mut rx = http_stopped;
        let _ = rx.wait_for(|s| *s).await;
    }));
    // Off the runtime's threads: the HTTP service answers meanwhile.
    let (s, st, sync_ack) = (shared.clone(), stores.clone(), config.ha_wal_sync_ack);
    let restore_snapshot = config.enable_snapshot_restore;
    let restored = tokio::task::spawn_blocking(move || -> Result<Option<StopOnDrop>> {
        let disk_log = if let (Some(dir), Some(rec)) = (&log_dir, recovered) {
            // The newest snapshot and this master's log after it.
            // A fresh directory is a new master: it starts empty and catches
            // up from its leader, unless asked to restore.
            let from = (rec.files > 0 || restore_snapshot)
                .then_some(st.as_deref())
                .flatten();
            let (log, report) = recovery::restore(&s, from, dir, rec, sync_ack)?;
            disk::keep_member(dir, s.replication.as_ref().expect("replicated").member())?;
            tracing::info!(
                dir = %dir.display(),
                snapshot = ?report.snapshot,
                applied = report.applied,
                kept = report.kept,
                "restored from the local replicated log"
            );
            Some(StopOnDrop(log))
        } else {
            None
        };
        if let (Some(stores), true, None) = (&st, restore_snapshot, &disk_log) {
            // After the loss of every master: the last snapshot their leader
            // stored. A running leader's log then continues from it.
            match restore_newest(&s, stores)? {
                Some(seq) => tracing::info!(seq, "restored the newest snapshot"),
                None => tracing::info!("no snapshot to restore"),
            }
        }
        Ok(disk_log)
    })
    .await
    .map_err(|e| {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("restore thread failed: {e}"),
        )
    })
    .and_then(|r| r);
    let _disk_log = match restored {
        Ok(log) => log,
        Err(e) => {
            let _ = stop(stop_http, http_task).await;
            return Err(e);
        }
    };
    let _snapshots = match (&stores, config.enable_snapshot) {
        (Some(stores), true) => Some(Snapshotter::start(shared.clone(), Some(stores.clone()))?),
        _ => None,
    };
    tracing::info!(member = %repl.member(), http = %http_addr, cluster = %config.cluster_id, "standby: following the leader and campaigning");

    let leader = loop {
        tokio::select! {
            r = election.observe() => match r {
                Ok(rx) => break rx,
                Err(e) => {
                    tracing::warn!("cannot follow the election: {e}; retrying");
                    tokio::time::sleep(CAMPAIGN_RETRY).await;
                }
            },
            _ = &mut shutdown => return stop(stop_http, http_task).await,
        }
    };
    let (gone_tx, gone_rx) = mpsc::unbounded_channel();
    let deposer = tokio::spawn(depose_gone(election.clone(), gone_rx));
    let mut follower = Some(Follower::spawn(
        shared.clone(),
        me.clone(),
        leader,
        gone_tx,
        stores.clone(),
    )?);
    let mut gate = Gate::new(
        repl.member(),
        config.ha_allow_takeover_without_record,
        TAKEOVER_AFTER,
    );

    let outcome = loop {
        let next = {
            let ended = async {
                match follower.as_mut() {
                    Some(f) => f.ended().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                l = election.campaign(&me) => Some(l),
                _ = ended => None,
                _ = &mut shutdown => break Ok(()),
            }
        };
        let Some(campaign) = next else {
            // A standby that no longer follows holds nothing new and
            // answers nothing: exit with why, to be restarted (on its
            // log, it rejoins) rather than linger as a member in name.
            let why = follower.take().map_or(Ok(()), Follower::stop);
            break Err(why.err().unwrap_or_else(|| {
                Error::new(ErrorCode::INTERNAL_ERROR, "the follower stopped by itself")
            }));
        };
        let leadership = match campaign {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("campaign failed: {e}; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(CAMPAIGN_RETRY) => continue,
                    _ = &mut shutdown => break Ok(()),
                }
            }
        };
        let record = match election.in_sync().await {
            Ok(r) => r.as_deref().and_then(Record::parse),
            Err(e) => {
                tracing::warn!("cannot read the replication record: {e}; stepping aside");
                let _ = leadership.resign().await;
                tokio::time::sleep(STEP_ASIDE).await;
                continue;
            }
        };
        let seen = repl.status();
        let win = Win {
            record: record.as_ref(),
            term: leadership.term(),
            seen_term: seen.term,
            last_seq: seen.last_seq,
        };
        let verdict = gate.decide(&win, Instant::now());
        match &verdict {
            Verdict::Take => {}
            Verdict::Unclean(why) => tracing::warn!(
                term = leadership.term(),
                "{why}: taking over with this master's state; entries only others held are lost"
            ),
            Verdict::Aside(why) | Verdict::Refuse(why) => {
                if matches!(verdict, Verdict::Refuse(_)) {
                    tracing::warn!(term = leadership.term(), "elected, but {why}");
                } else {
                    tracing::info!(term = leadership.term(), "elected, but {why}");
                }
                let _ = leadership.resign().await;
                tokio::select! {
                    _ = tokio::time::sleep(STEP_ASIDE) => continue,
                    _ = &mut shutdown => break Ok(()),
                }
            }
        }
        // Recorded as leader before anything changes here: a win that does
        // not hold (a candidacy whose lease ran out while this process was
        // stopped, say) is found out while this master is still a plain
        // standby, which steps aside and campaigns again.
        let first = Record {
            term: leadership.term(),
            leader: repl.member().to_string(),
            standbys: record
                .as_ref()
                .map(|r| {
                    r.standbys
                        .iter()
                        .filter(|m| m.as_str() != repl.member())
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
        };
        if let Err(e) = election.record_in_sync(&leadership, &first.encode()).await {
            tracing::warn!("elected, but cannot record this master as leader: {e}; stepping aside");
            let _ = leadership.resign().await;
            tokio::select! {
                _ = tokio::time::sleep(STEP_ASIDE) => continue,
                _ = &mut shutdown => break Ok(()),
            }
        }
        if let Some(f) = follower.take() {
            if let Err(e) = f.stop() {
                let _ = leadership.resign().await;
                break Err(e);
            }
        }
        break lead(
            &shared,
            &*election,
            leadership,
            record,
            http_addr,
            &mut shutdown,
            &mut on_bound,
        )
        .await;
    };
    drop(follower);
    deposer.abort();
    let stopped = stop(stop_http, http_task).await;
    outcome.and(stopped)
}

async fn stop(stop_http: watch::Sender<bool>, task: tokio::task::JoinHandle<()>) -> Result<()> {
    let _ = stop_http.send(true);
    let _ = task.await;
    Ok(())
}

/// Ends, in the coordination service, the leadership of leaders found gone.
async fn depose_gone(election: Arc<dyn LeaderElection>, mut gone: mpsc::UnboundedReceiver<String>) {
    while let Some(leader) = gone.recv().await {
        match election.depose(&leader).await {
            Ok(true) => tracing::warn!(%leader, "deposed the leader whose process is gone"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%leader, "cannot depose the leader whose process is gone: {e}")
            }
        }
    }
}

/// Leads one term, until shutdown (resigning) or loss (an error).
async fn lead<B>(
    shared: &Arc<Shared>,
    election: &dyn LeaderElection,
    leadership: Leadership,
    record: Option<Record>,
    http_addr: std::net::SocketAddr,
    shutdown: &mut Pin<&mut impl Future<Output = ()>>,
    on_bound: &mut B,
) -> Result<()>
where
    B: FnMut(&MasterServer),
{
    let repl = shared.replication.clone().expect("replicated");
    let now = shared.clock.now_ms();
    shared.service.take_over(now);
    shared.service.reload_tenant_policies(&shared.config);
    let epoch_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    shared
        .service
        .set_epoch_offset(epoch_ms.saturating_sub(now));
    // Already recorded (`serve_replicated`): the same set.
    let first = repl.promote(
        leadership.term(),
        leadership.candidate(),
        record.as_ref(),
        now,
    );
    repl.record_done(first, true);
    // Before any put: space the last leader reserved may hold puts it
    // answered and never committed.
    let retired = shared.service.retire_reserved(now);
    let status = repl.status();
    tracing::info!(
        term = leadership.term(),
        entries = status.last_seq,
        retired_reservations = retired,
        "elected leader: serving the replicated state"
    );
    let server = match MasterServer::bind_serving(shared.clone(), http_addr).await {
        Ok(s) => s,
        Err(e) => {
            repl.depose();
            let _ = leadership.resign().await;
            return Err(e);
        }
    };
    server.lead(leadership.term(), leadership.held_until());
    on_bound(&server);

    let mut lost_rx = leadership.lost_watch();
    let (deposed_tx, mut deposed_rx) = watch::channel(false);
    let mut lost = false;
    let serving = server.serve(async {
        tokio::select! {
            _ = lost_rx.wait_for(|l| *l) => lost = true,
            _ = deposed_rx.wait_for(|d| *d) => lost = true,
            _ = shutdown.as_mut() => {}
        }
        if !lost {
            // Stopping (SIGTERM): calls in flight get their answers, then
            // pulls and waits end so the drain and the handover are quick.
            let repl = repl.clone();
            let _ = tokio::task::spawn_blocking(move || repl.settle(SETTLE)).await;
        }
        // Calls waiting for their entries fail now, not after the drain.
        repl.depose();
    });
    let recording = async {
        keep_recorded(shared, election, &leadership).await;
        let _ = deposed_tx.send(true);
        std::future::pending::<()>().await
    };
    let served = tokio::select! {
        r = serving => r,
        _ = recording => unreachable!("recording never ends"),
    };
    if lost {
        let _ = leadership.resign().await;
        served?;
        return Err(Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
            "leadership lost: this master stopped serving; restart it to rejoin as a standby",
        ));
    }
    served?;
    // Hand over at once rather than after the lease runs out.
    if let Err(e) = leadership.resign().await {
        tracing::warn!("could not resign ({e}); a standby takes over once the lease expires");
    }
    Ok(())
}

/// Keeps the in-sync set recorded while leading; returns once a write
/// finds this master deposed.
async fn keep_recorded(shared: &Shared, election: &dyn LeaderElection, leadership: &Leadership) {
    let repl = shared.replication.as_ref().expect("replicated");
    let mut tick = tokio::time::interval(RECORD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Some(why) = repl.disk().and_then(|d| d.failure()) {
            // It answers every write with an error from now on: a standby
            // whose log works leads instead (it holds every committed
            // entry), and this master, restarted, rejoins on its log.
            tracing::error!("{why}: giving up leadership");
            return;
        }
        let now = shared.clock.now_ms();
        repl.forget_silent(now);
        let Some(record) = repl.next_record(now) else {
            continue;
        };
        let written = tokio::time::timeout(
            RECORD_TIMEOUT,
            election.record_in_sync(leadership, &record.encode()),
        )
        .await;
        match written {
            Ok(Ok(())) => {
                tracing::info!(in_sync = ?record.standbys, "in-sync set recorded");
                repl.record_done(record, true);
            }
            Ok(Err(e)) => {
                repl.record_done(record, false);
                tracing::warn!("cannot record the in-sync set: {e}");
                if !leadership.is_held() {
                    return;
                }
            }
            Err(_) => {
                repl.record_done(record, false);
                tracing::warn!("recording the in-sync set timed out");
            }
        }
    }
}
