//! Replicated metadata (`--enable_ha --enable_oplog`): the leader's
//! mutations travel to its standbys as log entries, and a call is
//! answered only once its entries are held by the in-sync replica set.
//!
//! - The leader's state machine hands every mutation to [`Replication`]
//!   (its `MutationSink`), which cuts it into an entry (`oplog` codec:
//!   sequence number, the election's term, the mutation) and appends it
//!   to the in-memory [`log`]. The RPC server then waits, before it
//!   answers, until the call's last entry is committed
//!   ([`Replication::wait_committed`]). A PutStart in reserved space
//!   waits only for its reservation (`segments::space`): where its writer
//!   writes is replicated before it learns where, and its own entry is
//!   committed with its PutEnd.
//! - Standbys pull: each keeps one `ReplicationPull` call outstanding on
//!   the leader's RPC port (a long poll, answered as soon as there is
//!   more). Asking for the entries after `n` acknowledges those up to
//!   `n`; under load one answer carries many entries (up to
//!   `--oplog_batch_max_entries`), which is the group commit. An idle
//!   standby asks again every `--oplog_poll_interval_ms`.
//! - [`in_sync`] decides commits and who may be promoted: the required
//!   set and its record in the coordination service, written only while
//!   the writer holds the election (a deposed leader can neither commit
//!   nor shrink the set).
//! - [`standby`] is a standby's bookkeeping: what to pull next, the
//!   entries kept, the next to apply. The follower thread that drives it
//!   and applies entries to the state machine is `master::ha::follower`.

pub(crate) mod catch_up;
pub(crate) mod disk;
pub(crate) mod in_sync;
mod log;
mod standby;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

use self::in_sync::{InSync, Record};
use self::log::Log;
use super::config::MasterConfig;
use super::durable::oplog::{OwnedEntry, OwnedMutation};
use super::metrics::tiers::StandbyState;
use super::metrics::MasterMetrics;
use super::state::mutation::{Mutation, MutationSink, Release};
use crate::proto::{Frames, Response};

/// Most frame bytes in one answer to a pull (past its first entry).
const PULL_BUDGET: usize = 8 << 20;
/// Longest a pull that has only a new commit point to tell waits for an
/// entry to carry it.
const COMMIT_ONLY_DELAY: Duration = Duration::from_millis(5);
/// Longest a call waits for its entries to be committed.
const COMMIT_WAIT: Duration = Duration::from_secs(15);

/// How long each side of a commit polls before it blocks: the leader's
/// pull for a new entry, the standby for the answer, the call for its
/// commit. A commit is a chain of such hand-offs; a blocked thread that
/// has to be woken costs tens of microseconds on a VM (see `rpc::poll`),
/// a polling one a few, but only while the pollers have cores of their
/// own: on an oversubscribed machine they take the CPU the thread they
/// wait for needs (measured: 4-5x the plain put's p50 with 200 us, 2.5x
/// without). So the default is to block at once; `MC_REPL_SPIN_US` sets
/// a window for masters with cores to spare.
pub fn spin_window() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        std::env::var("MC_REPL_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_SPIN, |us| Duration::from_micros(us.min(10_000)))
    })
}

const DEFAULT_SPIN: Duration = Duration::ZERO;

/// Polls `ready` (yielding the CPU now and then) for at most `window`.
fn spin_until(window: Duration, ready: impl Fn() -> bool) -> bool {
    if window.is_zero() {
        return ready();
    }
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if ready() {
            return true;
        }
        if start.elapsed() >= window {
            return false;
        }
        spins += 1;
        if spins.is_multiple_of(16) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// How replication runs, from the flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    /// Most entries in one answer to a pull (`--oplog_batch_max_entries`).
    pub(crate) batch_max: usize,
    /// Longest an idle pull waits (`--oplog_poll_interval_ms`).
    pub(crate) poll: Duration,
    /// A required standby silent this long leaves the in-sync set.
    pub(crate) lag_limit: Duration,
    /// Recorded members, the leader included, needed for a commit
    /// (`--ha_min_in_sync`).
    pub(crate) min_in_sync: usize,
}

impl Options {
    pub(crate) fn from_config(c: &MasterConfig) -> Options {
        let poll = c
            .oplog_poll_interval
            .clamp(Duration::from_millis(1), Duration::from_secs(60));
        Options {
            batch_max: c.oplog_batch_max_entries.clamp(1, 1 << 20),
            poll,
            // A killed standby is noticed at once (its connection closes);
            // this is for one that hangs, not one that is slow for a moment.
            lag_limit: (poll * 2).max(Duration::from_secs(2)),
            min_in_sync: c.ha_min_in_sync.max(1),
        }
    }
}

/// Where this master stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Following a leader (or waiting for one).
    Standby,
    /// Leading: appends and commits.
    Leader,
    /// Was leader and lost the election: commits nothing any more, and
    /// its state may hold entries nobody else has.
    Deposed,
}

struct State {
    log: Log,
    role: Role,
    /// Term of the leader being followed, or of this master as leader.
    term: u64,
    /// Entries applied to this master's state machine.
    applied: u64,
    /// The leader's commit point, as last heard (standby) or decided.
    committed: u64,
    in_sync: Option<InSync>,
    /// Who leads, as far as this master knows (its RPC address).
    leader: Option<String>,
    /// A standby is connected to the leader it follows (or kept an
    /// answer of it).
    following: bool,
    /// Standby: entries past this point may not be in the leader's log
    /// (it is new, or refused the log). The next pull asks for what
    /// follows it; entries resent with the term held here are kept (the
    /// same entries), the first that differs replaces the rest.
    verify: Option<u64>,
}

/// The replicated log of one master, leader or standby.
pub(crate) struct Replication {
    /// This master's member id: its RPC address and an incarnation, so a
    /// restarted master (which lost its state) is a new member.
    me: String,
    opts: Options,
    /// The sink's fast path: standbys ignore their own replays.
    leading: AtomicBool,
    /// The log's last entry and the commit point, readable without the
    /// lock, for the threads that poll for them.
    last_hint: AtomicU64,
    committed_hint: AtomicU64,
    state: Mutex<State>,
    /// New entries, or a new commit point: what pulls wait for.
    appended: Condvar,
    /// A new commit point (or a lost election): what calls wait for.
    committed: Condvar,
    /// The latest snapshot of this master's committed state, if snapshots
    /// are on (`catch_up`).
    image: Mutex<Option<std::sync::Arc<catch_up::Image>>>,
    /// This master's log on disk, with a log directory (`disk`).
    disk: OnceLock<std::sync::Arc<disk::DiskLog>>,
}

/// The replication status, for `/ha_status` and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Status {
    pub(crate) member: String,
    pub(crate) role: Role,
    pub(crate) term: u64,
    pub(crate) leader: Option<String>,
    pub(crate) last_seq: u64,
    pub(crate) applied_seq: u64,
    pub(crate) committed_seq: u64,
    pub(crate) log_bytes: usize,
    /// The entry the in-memory log starts after (compacted into a snapshot).
    pub(crate) log_base: u64,
    /// The entry this master's latest snapshot stands at (0: none).
    pub(crate) snapshot_seq: u64,
    /// Leader: the in-sync standbys as recorded, and every standby's lag.
    pub(crate) in_sync: Vec<String>,
    pub(crate) standbys: Vec<(String, u64)>,
    /// Standby: it is connected to the leader it follows.
    pub(crate) following: bool,
}

impl Replication {
    pub(crate) fn new(me: String, opts: Options) -> Replication {
        Replication {
            me,
            opts,
            leading: AtomicBool::new(false),
            last_hint: AtomicU64::new(0),
            committed_hint: AtomicU64::new(0),
            state: Mutex::new(State {
                log: Log::default(),
                role: Role::Standby,
                term: 0,
                applied: 0,
                committed: 0,
                in_sync: None,
                leader: None,
                following: false,
                verify: None,
            }),
            appended: Condvar::new(),
            committed: Condvar::new(),
            image: Mutex::new(None),
            disk: OnceLock::new(),
        }
    }

    /// From now on every entry this master holds also goes to `disk`.
    pub(crate) fn set_disk(&self, disk: std::sync::Arc<disk::DiskLog>) {
        let _ = self.disk.set(disk);
    }

    pub(crate) fn disk(&self) -> Option<&std::sync::Arc<disk::DiskLog>> {
        self.disk.get()
    }

    pub(crate) fn member(&self) -> &str {
        &self.me
    }

    pub(crate) fn options(&self) -> Options {
        self.opts
    }

    pub(crate) fn role(&self) -> Role {
        self.state.lock().role
    }

    pub(crate) fn status(&self) -> Status {
        let st = self.state.lock();
        let (in_sync, standbys) = match &st.in_sync {
            Some(s) => (
                s.recorded().iter().cloned().collect(),
                s.lags().map(|(id, lag)| (id.to_string(), lag)).collect(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        Status {
            member: self.me.clone(),
            role: st.role,
            term: st.term,
            leader: st.leader.clone(),
            last_seq: st.log.last(),
            applied_seq: st.applied,
            committed_seq: st.committed,
            log_bytes: st.log.bytes(),
            log_base: st.log.base(),
            snapshot_seq: self.image.lock().as_ref().map_or(0, |i| i.seq),
            in_sync,
            standbys,
            following: st.following,
        }
    }

    /// Notes who leads (a standby's view of the election).
    pub(crate) fn set_leader(&self, leader: Option<String>) {
        self.state.lock().leader = leader;
    }

    /// Makes this master the leader of `term`: every entry it holds is
    /// applied (the caller saw to it); `record` is the one it inherits.
    /// Its tail past the commit point it heard of is not known committed:
    /// it appends an empty entry of its own term, which commits once the
    /// required standbys hold its whole log, the tail included, and every
    /// answer waits for it (a call logging nothing waits for the last entry,
    /// `MutationSink::read_index`). Returns the record to write before serving.
    pub(crate) fn promote(
        &self,
        term: u64,
        address: &str,
        record: Option<&Record>,
        now: u64,
    ) -> Record {
        let mut st = self.state.lock();
        let last = st.log.last();
        debug_assert_eq!(st.applied, last, "promoted with entries not applied");
        let inherited: BTreeSet<String> = record
            .map(|r| {
                r.standbys
                    .iter()
                    .filter(|m| **m != self.me)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let heard = st.committed.min(last);
        let in_sync = InSync::new(last, inherited, self.opts.lag_limit.as_millis() as u64, now)
            .min_members(self.opts.min_in_sync)
            .committed_at(heard);
        let first = in_sync.required().clone();
        st.role = Role::Leader;
        st.term = term;
        st.committed = in_sync.committed();
        self.last_hint.store(last, Ordering::Release);
        self.committed_hint.store(st.committed, Ordering::Release);
        st.leader = Some(address.to_string());
        st.in_sync = Some(in_sync);
        self.append(&mut st, Vec::new());
        self.leading.store(true, Ordering::Release);
        Record {
            term,
            leader: self.me.clone(),
            standbys: first,
        }
    }

    /// A leader stopping: waits (at most `within`) until every entry it
    /// appended is committed, so that calls in flight are answered.
    pub(crate) fn settle(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let mut st = self.state.lock();
        while st.role == Role::Leader && st.committed < st.log.last() {
            if self.committed.wait_until(&mut st, deadline).timed_out() {
                return;
            }
        }
    }

    /// The leader lost the election, or stops: nothing commits any more,
    /// and every waiting call and pull is answered now.
    pub(crate) fn depose(&self) {
        let mut st = self.state.lock();
        if st.role == Role::Leader {
            st.role = Role::Deposed;
        }
        self.leading.store(false, Ordering::Release);
        drop(st);
        self.appended.notify_all();
        self.committed.notify_all();
    }

    /// The record to write next, if it should change (leader only).
    pub(crate) fn next_record(&self, now: u64) -> Option<Record> {
        let mut st = self.state.lock();
        let term = st.term;
        let set = st.in_sync.as_mut()?.next_record(now)?;
        let moved = self.recommit(&mut st);
        drop(st);
        if moved {
            self.wake_committed();
        }
        Some(Record {
            term,
            leader: self.me.clone(),
            standbys: set,
        })
    }

    /// `record` is written (`ok`) or could not be.
    pub(crate) fn record_done(&self, record: Record, ok: bool) {
        let mut st = self.state.lock();
        let Some(s) = st.in_sync.as_mut() else {
            return;
        };
        if ok {
            s.written(record.standbys);
            if !s.enough() {
                tracing::warn!(
                    min_in_sync = self.opts.min_in_sync,
                    "the in-sync set is below --ha_min_in_sync: writes wait for a standby to catch up"
                );
            }
        } else {
            s.write_failed();
        }
        let moved = self.recommit(&mut st);
        drop(st);
        if moved {
            self.wake_committed();
        }
    }

    /// Takes the in-sync set's commit point into `st.committed`; whether it moved.
    fn recommit(&self, st: &mut State) -> bool {
        let c = st.in_sync.as_ref().map_or(st.committed, InSync::committed);
        let moved = c > st.committed;
        st.committed = st.committed.max(c);
        if moved {
            self.committed_hint.store(st.committed, Ordering::Release);
            if let Some(d) = self.disk.get() {
                d.note_committed(st.committed);
            }
        }
        moved
    }

    /// Wakes the calls waiting for a commit. Pulls are not woken: the
    /// commit point travels with the next entries (or, idle, after
    /// [`COMMIT_ONLY_DELAY`] or the poll interval).
    fn wake_committed(&self) {
        self.committed.notify_all();
    }

    /// Forgets standbys gone for long (leader).
    pub(crate) fn forget_silent(&self, now: u64) {
        if let Some(s) = self.state.lock().in_sync.as_mut() {
            s.forget_silent(now);
        }
    }

    /// Waits until entry `seq` is committed. Fails once this master no
    /// longer leads, or after [`COMMIT_WAIT`]; the call's outcome is then
    /// unknown to its caller (as after a timeout).
    pub(crate) fn wait_committed(&self, seq: u64) -> Result<()> {
        let deadline = Instant::now() + COMMIT_WAIT;
        if let Some(d) = self.disk.get() {
            // Written here while the standbys receive it: a call is
            // answered only once its entries are in this master's log
            // too, so the loss of every master loses nothing answered.
            d.write_through(seq)?;
        }
        spin_until(spin_window(), || {
            self.committed_hint.load(Ordering::Acquire) >= seq
                || !self.leading.load(Ordering::Acquire)
        });
        let mut st = self.state.lock();
        loop {
            if st.role != Role::Leader {
                return Err(not_leader());
            }
            if st.committed >= seq {
                return Ok(());
            }
            if self.committed.wait_until(&mut st, deadline).timed_out() {
                return Err(Error::new(
                    ErrorCode::RPC_FAIL,
                    format!("entry {seq} not replicated within {COMMIT_WAIT:?}"),
                ));
            }
        }
    }

    /// Answers a standby's pull (leader, on the connection's thread):
    /// acknowledges what it has, then waits until there is something new
    /// for it or `wait` runs out.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn serve_pull(
        &self,
        standby: &str,
        after: u64,
        after_term: u64,
        applied: u64,
        max: u32,
        wait: Duration,
        now: u64,
    ) -> Response {
        let failed = |error| Response::Failed { error };
        let mut st = self.state.lock();
        if st.role != Role::Leader {
            return failed(not_leader());
        }
        if after < st.log.base() {
            // Compacted away: the standby starts from the snapshot.
            if let Some(s) = st.in_sync.as_mut() {
                s.acked(standby, after, now);
            }
            drop(st);
            return self.snapshot_chunk(None, 0, now);
        }
        if st.log.term_at(after) != Some(after_term) {
            return failed(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("standby log does not match: entry {after} of term {after_term}"),
            ));
        }
        let moved = match st.in_sync.as_mut() {
            Some(s) => s.acked(standby, after, now),
            None => false,
        };
        if moved && self.recommit(&mut st) {
            self.wake_committed();
        }
        let start = Instant::now();
        let deadline = start + wait.min(self.opts.poll);
        // A pull that would only tell the standby of a new commit point
        // waits a little for an entry to carry it: answered at once, every
        // entry would cost a second round trip per standby (the answer,
        // then the next pull) competing for the CPU with the next call.
        let commit_only_at = start + COMMIT_ONLY_DELAY;
        let news = |st: &State| st.role != Role::Leader || st.log.last() > after;
        if !news(&st) {
            // Under load the next entry comes within microseconds.
            drop(st);
            spin_until(spin_window(), || {
                self.last_hint.load(Ordering::Acquire) > after
                    || !self.leading.load(Ordering::Acquire)
            });
            st = self.state.lock();
        }
        while !news(&st) {
            let now = Instant::now();
            let commit_news = st.committed > applied;
            if now >= deadline || (commit_news && now >= commit_only_at) {
                break;
            }
            let until = if commit_news {
                commit_only_at.min(deadline)
            } else {
                deadline
            };
            let _ = self.appended.wait_until(&mut st, until);
        }
        if st.role != Role::Leader {
            return failed(not_leader());
        }
        let max = (max as usize).clamp(1, self.opts.batch_max);
        let mut frames = Vec::new();
        st.log.copy_after(after, max, PULL_BUDGET, &mut frames);
        Response::Entries {
            term: st.term,
            committed: st.committed,
            leader_now: now,
            frames: Frames(frames),
        }
    }

    /// A standby's connection closed: it counts as silent from now.
    pub(crate) fn standby_gone(&self, standby: &str) {
        if let Some(s) = self.state.lock().in_sync.as_mut() {
            s.gone(standby);
        }
    }
}

impl MutationSink for std::sync::Arc<Replication> {
    fn applied(&self, m: &Mutation<'_>) -> Release {
        if !self.leading.load(Ordering::Acquire) {
            return Release::Now;
        }
        let owned = OwnedMutation::from_mutation(m);
        let mut st = self.state.lock();
        if st.role != Role::Leader {
            return Release::Now;
        }
        let seq = self.append(&mut st, vec![owned]);
        Release::Committed(seq)
    }

    /// Two loads on the fast path: with every entry committed a read is
    /// answered at once, as without replication.
    fn read_index(&self) -> Release {
        if !self.leading.load(Ordering::Acquire) {
            return Release::Now;
        }
        // The last entry first: the commit point only grows, so a commit
        // point read after it that covers it covers what the call read.
        let last = self.last_hint.load(Ordering::Acquire);
        if self.committed_hint.load(Ordering::Acquire) >= last {
            Release::Now
        } else {
            Release::Committed(last)
        }
    }
}

impl Replication {
    /// Appends an entry of `mutations` in the leader's term (with `st`
    /// held, as leader); returns its sequence number.
    fn append(
        &self,
        st: &mut parking_lot::MutexGuard<'_, State>,
        mutations: Vec<OwnedMutation>,
    ) -> u64 {
        let entry = OwnedEntry {
            seq: st.log.last() + 1,
            term: st.term,
            mutations,
        };
        let frame = entry.to_frame();
        if let Some(d) = self.disk.get() {
            d.append(entry.seq, &frame);
        }
        let seq = st.log.push(entry.term, frame);
        self.last_hint.store(seq, Ordering::Release);
        st.applied = seq;
        if let Some(s) = st.in_sync.as_mut() {
            s.appended(seq);
        }
        let moved = self.recommit(st);
        self.appended.notify_all();
        if moved {
            self.committed.notify_all();
        }
        seq
    }
}

fn not_leader() -> Error {
    Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        "this master no longer leads its cluster",
    )
}

impl Replication {
    /// Sets the `ha_*` families and `master_is_leader` of `m` from the
    /// current status (called before the metrics are read).
    pub(crate) fn publish_metrics(&self, m: &MasterMetrics) {
        let st = self.status();
        let ha = &m.ha;
        // The leader's last entry as far as this master knows: a standby
        // may have heard of a commit point past what it received.
        let last = st.last_seq.max(st.committed_seq);
        ha.set_oplog_last_sequence_id(last);
        let lag = match st.role {
            // A leader's lag is its furthest-behind standby's.
            Role::Leader => st.standbys.iter().map(|(_, lag)| *lag).max().unwrap_or(0),
            _ => last.saturating_sub(st.applied_seq),
        };
        ha.set_oplog_applied_sequence_id(st.applied_seq, st.applied_seq + lag);
        ha.set_oplog_pending_entries(st.last_seq.saturating_sub(st.applied_seq));
        ha.set_pending_mutation_queue_size(st.last_seq.saturating_sub(st.committed_seq));
        ha.set_standby_state(standby_state(&st, lag));
        m.set_leader(st.role == Role::Leader);
    }
}

/// The reference's standby states, from where replication stands: a
/// standby not connected to a leader is connecting, one that is behind is
/// syncing, one caught up is watching.
fn standby_state(st: &Status, lag: u64) -> StandbyState {
    match st.role {
        Role::Standby if !st.following => StandbyState::Connecting,
        Role::Standby if lag > 0 => StandbyState::Syncing,
        Role::Standby => StandbyState::Watching,
        Role::Leader => StandbyState::Promoted,
        Role::Deposed => StandbyState::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_in_sync_is_read_from_its_flag() {
        let mut c = MasterConfig::default();
        assert_eq!(Options::from_config(&c).min_in_sync, 1, "default");
        c.set("ha_min_in_sync", "2").unwrap();
        assert_eq!(Options::from_config(&c).min_in_sync, 2);
        for bad in ["0", "-1", "two"] {
            assert_eq!(
                c.set("ha_min_in_sync", bad).unwrap_err().code,
                ErrorCode::INVALID_PARAMS,
                "{bad}"
            );
        }
    }
}
