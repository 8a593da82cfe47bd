//! A leader's calls and pulls that wait, with no thread blocked on each.
//!
//! A call that changed state is answered once its entries are committed,
//! a standby's pull once there are entries past what it holds. Instead of
//! blocking the connection's thread until then (to be woken by the thread
//! that made the answer possible, then write it), the answer is parked
//! here, the connection's thread goes back to its socket, and the thread
//! that makes the answer possible writes it:
//!
//! - a call's thread, once its mutations are appended (after the call,
//!   outside the service's locks), answers the parked pulls with them;
//! - the thread that reads a standby's pull, which acknowledges entries,
//!   answers the calls the acknowledgement commits.
//!
//! A commit then costs one wake-up per hop (the standby reading its
//! answer, the leader reading the acknowledgement, the caller reading its
//! answer) instead of two. Nothing is answered earlier than before: only
//! who writes the answer changes.
//!
//! One timer thread answers what runs out of time: an idle pull after the
//! poll interval (one that has only a new commit point to tell after
//! [`COMMIT_ONLY_DELAY`]), a call not committed within [`COMMIT_WAIT`];
//! and the parked pulls when entries are appended outside a call (timers,
//! promotion), which no call's thread sends.

use std::cell::Cell;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::MutexGuard;

use super::{not_leader, spin_until, spin_window, Replication, Role, State};
use super::{COMMIT_ONLY_DELAY, COMMIT_WAIT, PULL_BUDGET};
use crate::proto::{Frames, Response};

/// Writes a parked pull's answer.
pub(crate) type PullAnswer = Box<dyn FnOnce(Response) + Send>;
/// Writes a call's answer once its entries are committed (or cannot be).
pub(crate) type CallAnswer = Box<dyn FnOnce(Result<()>) + Send>;

/// Longest the timer thread sleeps with nothing due.
const TIMER_IDLE: Duration = Duration::from_millis(100);

struct Parked {
    /// The standby has the entries up to here.
    after: u64,
    max: usize,
    deadline: Instant,
    /// The leader's clock (ms) when it parked, and when that was: its
    /// answer carries the clock at the time it is sent.
    clock_ms: u64,
    at: Instant,
    answer: PullAnswer,
}

struct Pending {
    seq: u64,
    deadline: Instant,
    answer: CallAnswer,
}

/// What waits, kept in the replication state (under its lock).
#[derive(Default)]
pub(super) struct Waiting {
    pulls: Vec<Parked>,
    calls: Vec<Pending>,
    /// When the timer thread wakes next, while it sleeps.
    timer_at: Option<Instant>,
}

impl Waiting {
    pub(super) fn has_calls(&self) -> bool {
        !self.calls.is_empty()
    }

    fn next_deadline(&self) -> Option<Instant> {
        let pulls = self.pulls.iter().map(|p| p.deadline);
        pulls.chain(self.calls.iter().map(|c| c.deadline)).min()
    }

    /// Whether a new deadline `at` comes before the timer thread wakes.
    fn sooner(&self, at: Instant) -> bool {
        self.timer_at.is_none_or(|t| at < t)
    }
}

/// Answers taken out under the lock, to write once it is released.
#[derive(Default)]
pub(super) struct Due {
    pulls: Vec<(PullAnswer, Response)>,
    calls: Vec<(CallAnswer, Result<()>)>,
}

impl Due {
    pub(super) fn is_empty(&self) -> bool {
        self.pulls.is_empty() && self.calls.is_empty()
    }

    /// Writes the answers: callers first, they wait longest.
    pub(super) fn give(self) {
        for (answer, result) in self.calls {
            answer(result);
        }
        for (answer, resp) in self.pulls {
            answer(resp);
        }
    }
}

thread_local! {
    /// The thread serves a call: the entries its mutations append are
    /// sent to parked pulls at the call's end ([`Replication::end_call`]).
    static IN_CALL: Cell<bool> = const { Cell::new(false) };
    /// The thread's call appended entries.
    static APPENDED: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread serves a call (see [`Replication::begin_call`]).
pub(super) fn in_call() -> bool {
    IN_CALL.with(Cell::get)
}

pub(super) fn note_appended() {
    APPENDED.with(|c| c.set(true));
}

impl Replication {
    /// The calling thread starts a call: entries it appends wait for
    /// [`Replication::end_call`] to reach the parked pulls.
    pub(crate) fn begin_call() {
        IN_CALL.with(|c| c.set(true));
        APPENDED.with(|c| c.set(false));
    }

    /// The call's mutations are done (no service lock is held): the
    /// parked pulls get its entries, from this thread.
    pub(crate) fn end_call(&self) {
        IN_CALL.with(|c| c.set(false));
        if !APPENDED.with(|c| c.replace(false)) {
            return;
        }
        let mut st = self.state.lock();
        if st.waiting.pulls.is_empty() {
            return;
        }
        let mut due = Due::default();
        self.due_pulls(&mut st, Instant::now(), &mut due);
        drop(st);
        due.give();
    }

    /// Entry `seq` is committed already (or no call waits for it).
    pub(crate) fn committed_through(&self, seq: u64) -> bool {
        self.committed_hint
            .load(std::sync::atomic::Ordering::Acquire)
            >= seq
    }

    /// Answers through `answer` once entry `seq` is committed: at once if
    /// it is (or cannot be), else from the thread that commits it. Like
    /// [`Replication::wait_committed`], without blocking the caller.
    pub(crate) fn answer_when_committed(self: &Arc<Self>, seq: u64, answer: CallAnswer) {
        if let Some(d) = self.disk.get() {
            // On this master's disk too before it is answered (as in
            // `wait_committed`).
            if let Err(e) = d.write_through(seq) {
                answer(Err(e));
                return;
            }
        }
        spin_until(spin_window(), || self.committed_through(seq));
        let mut st = self.state.lock();
        let now = match st.role {
            Role::Leader if st.committed >= seq => Some(Ok(())),
            Role::Leader => None,
            _ => Some(Err(not_leader())),
        };
        if let Some(result) = now {
            drop(st);
            answer(result);
            return;
        }
        let deadline = Instant::now() + COMMIT_WAIT;
        st.waiting.calls.push(Pending {
            seq,
            deadline,
            answer,
        });
        self.park_done(st, deadline);
    }

    /// Answers a standby's pull (leader, on the connection's thread), as
    /// [`Replication::serve_pull`] does, except that a pull with nothing
    /// new to carry is parked: `park` gives what answers it later, and
    /// none is returned.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn serve_pull_or_park(
        self: &Arc<Self>,
        standby: &str,
        after: u64,
        after_term: u64,
        applied: u64,
        max: u32,
        wait: Duration,
        now: u64,
        park: impl FnOnce() -> PullAnswer,
    ) -> Option<Response> {
        let mut st = match self.acknowledge(standby, after, after_term, now) {
            Ok(st) => st,
            Err(resp) => return Some(resp),
        };
        let start = Instant::now();
        let mut due = Due::default();
        self.due_calls(&mut st, start, &mut due);
        let max = (max as usize).clamp(1, self.opts.batch_max);
        let deadline = start + wait.min(self.opts.poll);
        // As in `serve_pull`: only a new commit point to tell waits a
        // little for an entry to carry it.
        let deadline = if st.committed > applied {
            deadline.min(start + COMMIT_ONLY_DELAY)
        } else {
            deadline
        };
        if !spin_window().is_zero() && st.log.last() <= after {
            drop(st);
            spin_until(spin_window(), || {
                self.last_hint.load(std::sync::atomic::Ordering::Acquire) > after
                    || !self.leading.load(std::sync::atomic::Ordering::Acquire)
            });
            st = self.state.lock();
        }
        if st.role != Role::Leader || st.log.last() > after || deadline <= start {
            let resp = match st.role {
                Role::Leader => entries(&st, after, max, now),
                _ => Response::Failed {
                    error: not_leader(),
                },
            };
            drop(st);
            due.give();
            return Some(resp);
        }
        st.waiting.pulls.push(Parked {
            after,
            max,
            deadline,
            clock_ms: now,
            at: start,
            answer: park(),
        });
        self.park_done(st, deadline);
        due.give();
        None
    }

    /// Something was parked with `deadline`: the timer thread runs and
    /// wakes by then.
    fn park_done(self: &Arc<Self>, st: MutexGuard<'_, State>, deadline: Instant) {
        let sooner = st.waiting.sooner(deadline);
        drop(st);
        if sooner {
            self.start_timer();
            self.timer.notify_one();
        }
    }

    /// The commit point moved (under the lock `st`): wakes the blocked
    /// waiters and answers the parked calls it commits.
    pub(super) fn committed_moved(&self, mut st: MutexGuard<'_, State>) {
        let mut due = Due::default();
        self.due_calls(&mut st, Instant::now(), &mut due);
        drop(st);
        self.committed.notify_all();
        due.give();
    }

    /// Takes the parked pulls that can be answered: entries past theirs,
    /// out of time, or no longer leading.
    fn due_pulls(&self, st: &mut State, now: Instant, due: &mut Due) {
        let last = st.log.last();
        let leading = st.role == Role::Leader;
        let mut i = 0;
        while i < st.waiting.pulls.len() {
            let p = &st.waiting.pulls[i];
            if leading && last <= p.after && now < p.deadline {
                i += 1;
                continue;
            }
            let p = st.waiting.pulls.swap_remove(i);
            let resp = if !leading {
                Response::Failed {
                    error: not_leader(),
                }
            } else if p.after < st.log.base() {
                // Compacted since (it cannot be, but the next pull would
                // say so): an empty answer makes the standby ask again.
                entries(st, last, 0, 0)
            } else {
                let clock = p.clock_ms + p.at.elapsed().as_millis() as u64;
                entries(st, p.after, p.max, clock)
            };
            due.pulls.push((p.answer, resp));
        }
    }

    /// Takes the parked calls that can be answered: committed, out of
    /// time, or no longer leading.
    fn due_calls(&self, st: &mut State, now: Instant, due: &mut Due) {
        let (committed, leading) = (st.committed, st.role == Role::Leader);
        let mut i = 0;
        while i < st.waiting.calls.len() {
            let c = &st.waiting.calls[i];
            let result = if !leading {
                Err(not_leader())
            } else if c.seq <= committed {
                Ok(())
            } else if now >= c.deadline {
                Err(Error::new(
                    ErrorCode::RPC_FAIL,
                    format!("entry {} not replicated within {COMMIT_WAIT:?}", c.seq),
                ))
            } else {
                i += 1;
                continue;
            };
            let c = st.waiting.calls.swap_remove(i);
            due.calls.push((c.answer, result));
        }
    }

    /// The parked calls the commit point (or a lost lead) answers.
    pub(super) fn answer_committed(&self, st: &mut State) -> Due {
        let mut due = Due::default();
        self.due_calls(st, Instant::now(), &mut due);
        due
    }

    /// Everything parked, answered (no longer leading).
    pub(super) fn answer_all(&self, st: &mut State) -> Due {
        let mut due = Due::default();
        let now = Instant::now();
        self.due_pulls(st, now, &mut due);
        self.due_calls(st, now, &mut due);
        due
    }

    /// Entries were appended outside a call, or a commit moved under the
    /// service's locks: the timer thread answers what that makes due.
    pub(super) fn kick_timer(&self, st: &State) {
        if !st.waiting.pulls.is_empty() || !st.waiting.calls.is_empty() {
            self.timer.notify_one();
        }
    }

    fn start_timer(self: &Arc<Self>) {
        self.timer_thread.get_or_init(|| {
            let weak = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("mc-repl-timer".into())
                .spawn(move || timer_loop(weak));
            if let Err(e) = spawned {
                tracing::error!("cannot start the replication timer: {e}");
            }
        });
    }
}

/// The timer thread: answers what is due, sleeps until the next deadline.
/// It ends once the replication is dropped.
fn timer_loop(weak: Weak<Replication>) {
    while let Some(r) = weak.upgrade() {
        let mut st = r.state.lock();
        let now = Instant::now();
        let mut due = Due::default();
        r.due_pulls(&mut st, now, &mut due);
        r.due_calls(&mut st, now, &mut due);
        if due.is_empty() {
            let next = st
                .waiting
                .next_deadline()
                .map_or(now + TIMER_IDLE, |d| d.min(now + TIMER_IDLE));
            st.waiting.timer_at = Some(next);
            let _ = r.timer.wait_until(&mut st, next);
            st.waiting.timer_at = None;
        } else {
            drop(st);
            due.give();
        }
    }
}

/// The answer to a pull: the entries after `after` (at most `max`).
pub(super) fn entries(st: &State, after: u64, max: usize, clock_ms: u64) -> Response {
    let mut frames = Vec::new();
    if max > 0 {
        st.log.copy_after(after, max, PULL_BUDGET, &mut frames);
    }
    Response::Entries {
        term: st.term,
        committed: st.committed,
        leader_now: clock_ms,
        frames: Frames(frames),
    }
}
