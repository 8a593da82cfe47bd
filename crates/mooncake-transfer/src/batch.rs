//! Batches and per-request status.
//!
//! A submitted request is a [`Task`], cut into one or more slices by its
//! transport. Each slice reports back exactly once through
//! [`Task::slice_done`]; the last one settles the task. A task settles once
//! (`Completed`, `Failed` or, past its deadline, `Timeout`), and the batch
//! counts settled tasks so [`Batch::wait`] sleeps on a condvar instead of
//! polling.
//!
//! A transport writing a response into local memory holds a [`Landing`] on
//! the task. A task that times out meanwhile is reported `Timeout` only once
//! its landings ended, so no byte reaches local memory after the application
//! saw the timeout (and may have released that memory).

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use mooncake_common::{Error, ErrorCode, Result};

/// State of one request, as the reference reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferState {
    Waiting,
    Pending,
    Invalid,
    Canceled,
    Completed,
    Timeout,
    Failed,
}

/// Status of one request, or the aggregate of a batch.
#[derive(Clone, Debug)]
pub struct TransferStatus {
    pub state: TransferState,
    /// Bytes moved so far (a lower bound while running).
    pub transferred_bytes: u64,
    /// Why it failed (or timed out).
    pub error: Option<ErrorCode>,
}

const WAITING: u8 = 0;
const COMPLETED: u8 = 1;
const FAILED: u8 = 2;
const TIMEOUT: u8 = 3;
const CANCELED: u8 = 4;

/// Stops whatever carries a task's slices, so that a task past its deadline
/// stops touching local memory promptly (e.g. shuts a peer's connections).
pub(crate) trait Abort: Send + Sync {
    fn abort(&self);
}

/// Runs once when a batch's submitted tasks have all settled; the argument
/// says whether all of them completed.
pub(crate) type IdleHook = Box<dyn FnOnce(bool) + Send>;

/// Counters shared by a batch's tasks.
struct Shared {
    /// Submitted tasks not yet settled.
    unsettled: AtomicUsize,
    /// Tasks that still have slices in flight (settled or not).
    busy: AtomicUsize,
    lock: Mutex<()>,
    changed: Condvar,
    /// Runs once when every submitted task has settled (notify after transfer).
    on_idle: Mutex<Option<IdleHook>>,
    all_ok: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn wake(&self) {
        let _g = self.lock.lock();
        self.changed.notify_all();
    }
}

/// One request of a batch.
pub(crate) struct Task {
    state: AtomicU8,
    error: AtomicI32,
    slices_left: AtomicUsize,
    transferred: AtomicU64,
    /// Responses being written into local memory right now.
    landing: AtomicUsize,
    deadline: Instant,
    abort: Mutex<Option<Arc<dyn Abort>>>,
    shared: Arc<Shared>,
}

impl Task {
    /// Sets how many slices will report; called once by the transport before
    /// any slice can finish. Zero settles the task as completed.
    pub(crate) fn expect_slices(&self, n: usize) {
        if n == 0 {
            self.settle(COMPLETED);
            return;
        }
        self.slices_left.store(n, Ordering::Release);
        self.shared.busy.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn set_abort(&self, abort: Arc<dyn Abort>) {
        *self.abort.lock() = Some(abort);
    }

    /// Fails the whole task before any slice was issued.
    pub(crate) fn fail(&self, code: ErrorCode) {
        let _ = self
            .error
            .compare_exchange(0, code.wire(), Ordering::AcqRel, Ordering::Acquire);
        self.settle(FAILED);
    }

    /// Reports one slice: `Ok(bytes)` or the error code.
    pub(crate) fn slice_done(&self, result: Result<usize, ErrorCode>) {
        match result {
            Ok(n) => {
                self.transferred.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(code) => {
                let _ = self.error.compare_exchange(
                    0,
                    code.wire(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
        }
        if self.slices_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            // No longer busy before settling, so a waiter woken by the
            // settlement already sees it.
            let last_busy = self.shared.busy.fetch_sub(1, Ordering::AcqRel) == 1;
            let failed = self.error.load(Ordering::Acquire) != 0;
            let settled_now = self.settle(if failed { FAILED } else { COMPLETED });
            if !settled_now && last_busy {
                // A timed-out task drained: wake `Batch::prepare_free` waiters.
                self.shared.wake();
            }
        }
    }

    /// True while the task's result still matters (not settled).
    pub(crate) fn is_live(&self) -> bool {
        self.state.load(Ordering::Acquire) == WAITING
    }

    /// Permission to write a response's bytes into the task's local memory,
    /// held while writing; `None` once the task has settled (timed out), and
    /// the bytes must be discarded. A timeout is reported only after every
    /// landing ended, so whoever lands must not block indefinitely: the TCP
    /// transport's abort shuts the socket down, which ends a blocked read.
    pub(crate) fn begin_landing(&self) -> Option<Landing<'_>> {
        // SeqCst pairs with `settle` and `wait_landed` (store-then-load on
        // both sides): either this sees the task settled, or the reporter
        // sees this landing and waits for it.
        self.landing.fetch_add(1, Ordering::SeqCst);
        if self.state.load(Ordering::SeqCst) != WAITING {
            self.end_landing();
            return None;
        }
        Some(Landing(self))
    }

    fn end_landing(&self) {
        if self.landing.fetch_sub(1, Ordering::SeqCst) == 1
            && self.state.load(Ordering::SeqCst) != WAITING
        {
            self.shared.wake();
        }
    }

    /// [`Self::wait_landed`] for at most `limit`; whether the landings ended.
    fn wait_landed_for(&self, limit: Duration) -> bool {
        let give_up = Instant::now() + limit;
        let mut g = self.shared.lock.lock();
        while self.landing.load(Ordering::SeqCst) != 0 {
            if self.shared.changed.wait_until(&mut g, give_up).timed_out() {
                return self.landing.load(Ordering::SeqCst) == 0;
            }
        }
        true
    }

    /// Blocks until no response is being written into the task's memory.
    /// Only called once the task has settled, so no new landing starts.
    fn wait_landed(&self) {
        if self.landing.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut g = self.shared.lock.lock();
        while self.landing.load(Ordering::SeqCst) != 0 {
            self.shared.changed.wait(&mut g);
        }
    }

    fn settle(&self, to: u8) -> bool {
        if self
            .state
            .compare_exchange(WAITING, to, Ordering::SeqCst, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        if to != COMPLETED {
            self.shared.all_ok.store(false, Ordering::Release);
        }
        // Waiters only care about the whole batch: wake them once, at the end.
        if self.shared.unsettled.fetch_sub(1, Ordering::AcqRel) == 1 {
            let hook = self.shared.on_idle.lock().take();
            if let Some(hook) = hook {
                hook(self.shared.all_ok.load(Ordering::Acquire));
            }
            self.shared.wake();
        }
        true
    }

    /// Settles the task as timed out if its deadline has passed, returning
    /// what to abort. The caller aborts only after expiring every due task,
    /// so that closing a shared connection cannot turn a due task's timeout
    /// into a socket failure.
    fn expire_if_due(&self, now: Instant) -> Option<Arc<dyn Abort>> {
        if now >= self.deadline && self.settle(TIMEOUT) {
            let _ = self.error.compare_exchange(
                0,
                ErrorCode::TRANSFER_FAIL.wire(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return self.abort.lock().take();
        }
        None
    }

    /// The task's status; a timeout is reported once its landings ended.
    fn status(&self) -> TransferStatus {
        if matches!(self.state.load(Ordering::Acquire), TIMEOUT | CANCELED) {
            self.wait_landed();
        }
        self.status_now()
    }

    /// The task's status, without waiting for landings.
    fn status_now(&self) -> TransferStatus {
        let state = match self.state.load(Ordering::Acquire) {
            WAITING => TransferState::Waiting,
            COMPLETED => TransferState::Completed,
            FAILED => TransferState::Failed,
            CANCELED => TransferState::Canceled,
            _ => TransferState::Timeout,
        };
        let code = self.error.load(Ordering::Acquire);
        TransferStatus {
            state,
            transferred_bytes: self.transferred.load(Ordering::Relaxed),
            error: (code != 0 && state != TransferState::Completed)
                .then(|| ErrorCode::from_wire(code).unwrap_or(ErrorCode::INTERNAL_ERROR)),
        }
    }
}

/// A response being written into a task's local memory (see [`Task::begin_landing`]).
pub(crate) struct Landing<'a>(&'a Task);

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        self.0.end_landing();
    }
}

/// A group of requests submitted and waited on together.
pub(crate) struct Batch {
    capacity: usize,
    timeout: Duration,
    /// How long `prepare_free` waits for timed-out requests to drain.
    drain_wait: Duration,
    tasks: Mutex<Vec<Arc<Task>>>,
    shared: Arc<Shared>,
}

impl Batch {
    pub(crate) fn new(capacity: usize, timeout: Duration) -> Batch {
        Batch {
            capacity,
            timeout,
            drain_wait: Duration::from_secs(5),
            tasks: Mutex::new(Vec::new()),
            shared: Arc::new(Shared {
                unsettled: AtomicUsize::new(0),
                busy: AtomicUsize::new(0),
                lock: Mutex::new(()),
                changed: Condvar::new(),
                on_idle: Mutex::new(None),
                all_ok: std::sync::atomic::AtomicBool::new(true),
            }),
        }
    }

    /// Creates `n` new waiting tasks (refused past the batch's capacity) and
    /// installs `on_idle` to run once all of the batch's tasks have settled.
    pub(crate) fn add_tasks(
        &self,
        n: usize,
        now: Instant,
        on_idle: Option<IdleHook>,
    ) -> Result<Vec<Arc<Task>>> {
        let mut tasks = self.tasks.lock();
        if tasks.len() + n > self.capacity {
            return Err(Error::new(
                ErrorCode::ERR_TOO_MANY_REQUESTS,
                format!(
                    "batch of {} already holds {}; cannot add {n}",
                    self.capacity,
                    tasks.len()
                ),
            ));
        }
        let deadline = now + self.timeout;
        let new: Vec<Arc<Task>> = (0..n)
            .map(|_| {
                Arc::new(Task {
                    state: AtomicU8::new(WAITING),
                    error: AtomicI32::new(0),
                    slices_left: AtomicUsize::new(0),
                    transferred: AtomicU64::new(0),
                    landing: AtomicUsize::new(0),
                    deadline,
                    abort: Mutex::new(None),
                    shared: self.shared.clone(),
                })
            })
            .collect();
        self.shared.unsettled.fetch_add(n, Ordering::AcqRel);
        if let Some(hook) = on_idle {
            if n == 0 && self.shared.unsettled.load(Ordering::Acquire) == 0 {
                drop(tasks);
                hook(true);
                return Ok(new);
            }
            *self.shared.on_idle.lock() = Some(hook);
        }
        tasks.extend(new.iter().cloned());
        Ok(new)
    }

    /// Status of request `task_id` (its index in submission order).
    pub(crate) fn task_status(&self, task_id: usize, now: Instant) -> Result<TransferStatus> {
        let task = self.tasks.lock().get(task_id).cloned().ok_or_else(|| {
            Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                format!("no request {task_id} in this batch"),
            )
        })?;
        if let Some(abort) = task.expire_if_due(now) {
            abort.abort();
        }
        Ok(task.status())
    }

    /// Aggregate: `Failed` if any failed, else `Timeout` if any timed out,
    /// else `Waiting` while any runs, else `Completed`.
    pub(crate) fn status(&self, now: Instant) -> TransferStatus {
        let mut agg = TransferStatus {
            state: TransferState::Completed,
            transferred_bytes: 0,
            error: None,
        };
        let rank = |s: TransferState| match s {
            TransferState::Failed => 3,
            TransferState::Timeout | TransferState::Canceled => 2,
            TransferState::Waiting => 1,
            _ => 0,
        };
        // Expire what is due outside the tasks lock: settling wakes waiters,
        // and `wait` takes the tasks lock while holding the wake lock.
        let due: Vec<Arc<Task>> = self
            .tasks
            .lock()
            .iter()
            .filter(|t| t.is_live() && now >= t.deadline)
            .cloned()
            .collect();
        let aborts: Vec<_> = due.iter().filter_map(|t| t.expire_if_due(now)).collect();
        let mut timed_out = Vec::new();
        for t in self.tasks.lock().iter() {
            let s = t.status_now();
            if s.state == TransferState::Timeout {
                timed_out.push(t.clone());
            }
            agg.transferred_bytes += s.transferred_bytes;
            if rank(s.state) > rank(agg.state) {
                agg.state = s.state;
                agg.error = s.error;
            }
        }
        // Outside the lock: aborting fails in-flight slices, which report
        // back, and ends their landings.
        for a in aborts {
            a.abort();
        }
        for t in timed_out {
            t.wait_landed();
        }
        agg
    }

    /// Settles request `task_id` as `Canceled` if it still runs. On return
    /// no response is being written into its memory, and none will be (a
    /// response arriving later is discarded); a landing still going after
    /// `grace` (a peer stalled mid-response) has its route aborted.
    pub(crate) fn cancel_task(&self, task_id: usize, grace: Duration) -> Result<TransferStatus> {
        let task = self.tasks.lock().get(task_id).cloned().ok_or_else(|| {
            Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                format!("no request {task_id} in this batch"),
            )
        })?;
        if task.settle(CANCELED) && !task.wait_landed_for(grace) {
            let abort = task.abort.lock().take();
            if let Some(a) = abort {
                a.abort();
            }
        }
        Ok(task.status())
    }

    /// Blocks until every submitted task has settled (deadlines included).
    pub(crate) fn wait(&self) -> TransferStatus {
        self.wait_until(None)
    }

    /// [`Self::wait`], returning at `until` at the latest (the aggregate is
    /// then `Waiting` if a task still runs).
    pub(crate) fn wait_until(&self, until: Option<Instant>) -> TransferStatus {
        let mut guard = self.shared.lock.lock();
        while self.shared.unsettled.load(Ordering::Acquire) != 0 {
            let now = Instant::now();
            if until.is_some_and(|u| now >= u) {
                break;
            }
            let next = self
                .tasks
                .lock()
                .iter()
                .filter(|t| t.is_live())
                .map(|t| t.deadline)
                .min();
            match next {
                Some(deadline) if deadline <= now => {
                    drop(guard);
                    self.status(now); // expires what is due
                    guard = self.shared.lock.lock();
                }
                Some(deadline) => {
                    let wake = until.map_or(deadline, |u| u.min(deadline));
                    self.shared.changed.wait_until(&mut guard, wake);
                }
                // Counted but not yet visible in `tasks`: a concurrent submit.
                None => {
                    self.shared
                        .changed
                        .wait_for(&mut guard, Duration::from_millis(1));
                }
            }
        }
        drop(guard);
        self.status(Instant::now())
    }

    /// Sets how long [`Self::prepare_free`] waits for timed-out requests.
    #[cfg(test)]
    pub(crate) fn with_drain_wait(mut self, wait: Duration) -> Batch {
        self.drain_wait = wait;
        self
    }

    /// Every submitted task has settled (some may still drain).
    pub(crate) fn all_settled(&self) -> bool {
        self.shared.unsettled.load(Ordering::Acquire) == 0
    }

    /// Nothing runs or drains: freeing would not wait.
    pub(crate) fn is_idle(&self) -> bool {
        self.shared.unsettled.load(Ordering::Acquire) == 0
            && self.shared.busy.load(Ordering::Acquire) == 0
    }

    /// Readies the batch for freeing: refused while a request runs; after a
    /// timeout, waits (bounded) until aborted slices stop touching memory.
    pub(crate) fn prepare_free(&self) -> Result<()> {
        if self.shared.unsettled.load(Ordering::Acquire) != 0 {
            return Err(Error::new(
                ErrorCode::ERR_BATCH_BUSY,
                "batch still has running requests",
            ));
        }
        let give_up = Instant::now() + self.drain_wait;
        let mut guard = self.shared.lock.lock();
        while self.shared.busy.load(Ordering::Acquire) != 0 {
            if self
                .shared
                .changed
                .wait_until(&mut guard, give_up)
                .timed_out()
            {
                return Err(Error::new(
                    ErrorCode::ERR_BATCH_BUSY,
                    "timed-out requests still draining",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn slices_settle_tasks_and_batch() {
        let b = Batch::new(4, Duration::from_secs(30));
        let now = Instant::now();
        let t = b.add_tasks(2, now, None).unwrap();
        t[0].expect_slices(2);
        t[1].expect_slices(1);
        assert_eq!(b.status(now).state, TransferState::Waiting);
        t[0].slice_done(Ok(10));
        assert_eq!(b.task_status(0, now).unwrap().state, TransferState::Waiting);
        t[0].slice_done(Ok(5));
        let s = b.task_status(0, now).unwrap();
        assert_eq!(
            (s.state, s.transferred_bytes, s.error),
            (TransferState::Completed, 15, None)
        );
        t[1].slice_done(Err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED));
        let agg = b.wait();
        assert_eq!(agg.state, TransferState::Failed);
        assert_eq!(agg.error, Some(ErrorCode::ERR_ADDRESS_NOT_REGISTERED));
        assert_eq!(agg.transferred_bytes, 15);
        b.prepare_free().unwrap();
    }

    #[test]
    fn capacity_and_bad_task_ids() {
        let b = Batch::new(2, Duration::from_secs(30));
        let now = Instant::now();
        b.add_tasks(2, now, None).unwrap();
        assert_eq!(
            b.add_tasks(1, now, None).err().unwrap().code,
            ErrorCode::ERR_TOO_MANY_REQUESTS
        );
        assert_eq!(
            b.task_status(2, now).unwrap_err().code,
            ErrorCode::ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            b.prepare_free().unwrap_err().code,
            ErrorCode::ERR_BATCH_BUSY
        );
    }

    #[test]
    fn deadline_times_out_and_aborts() {
        struct Flag(AtomicBool);
        impl Abort for Flag {
            fn abort(&self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let b = Batch::new(1, Duration::from_secs(5));
        let start = Instant::now();
        let t = b.add_tasks(1, start, None).unwrap();
        t[0].expect_slices(1);
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        t[0].set_abort(flag.clone());
        assert_eq!(
            b.task_status(0, start).unwrap().state,
            TransferState::Waiting
        );
        // The clock is an argument: no sleeping in tests.
        let later = start + Duration::from_secs(6);
        assert_eq!(
            b.task_status(0, later).unwrap().state,
            TransferState::Timeout
        );
        assert!(flag.0.load(Ordering::SeqCst));
        // The slice still reports later; the task stays timed out.
        t[0].slice_done(Ok(1));
        assert_eq!(b.status(later).state, TransferState::Timeout);
        b.prepare_free().unwrap();
    }

    /// A canceled task settles at once, refuses later landings, and a
    /// landing stuck past the grace has the task's route aborted; the rest
    /// of the batch runs on.
    #[test]
    fn cancel_settles_one_task_and_aborts_a_stuck_landing() {
        struct Unstick(Arc<Task>, AtomicBool);
        impl Abort for Unstick {
            fn abort(&self) {
                // As the TCP transport's: shutting the socket ends the read.
                self.1.store(true, Ordering::SeqCst);
            }
        }
        let b = Batch::new(2, Duration::from_secs(30));
        let now = Instant::now();
        let t = b.add_tasks(2, now, None).unwrap();
        t[0].expect_slices(1);
        t[1].expect_slices(1);
        // Nothing landing: canceled without an abort.
        let untouched = Arc::new(Unstick(t[1].clone(), AtomicBool::new(false)));
        t[1].set_abort(untouched.clone());
        let s = b.cancel_task(1, Duration::ZERO).unwrap();
        assert_eq!(s.state, TransferState::Canceled);
        assert!(!untouched.1.load(Ordering::SeqCst));
        assert!(t[1].begin_landing().is_none(), "late bytes are discarded");
        b.wait_until(Some(now));
        assert!(!b.all_settled(), "the other still runs");
        // A landing that never ends: aborted after the grace, and the
        // report waits for the landing to end.
        let stuck = Arc::new(Unstick(t[0].clone(), AtomicBool::new(false)));
        t[0].set_abort(stuck.clone());
        let (landed, started) = std::sync::mpsc::channel();
        let ender = {
            let stuck = stuck.clone();
            std::thread::spawn(move || {
                let landing = stuck.0.begin_landing().expect("live task");
                landed.send(()).unwrap();
                while !stuck.1.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                drop(landing);
                stuck.0.slice_done(Err(ErrorCode::ERR_SOCKET));
            })
        };
        started.recv().unwrap();
        let s = b.cancel_task(0, Duration::from_millis(10)).unwrap();
        assert_eq!(s.state, TransferState::Canceled);
        assert!(
            stuck.1.load(Ordering::SeqCst),
            "the stuck route was aborted"
        );
        ender.join().unwrap();
        assert_eq!(b.wait().state, TransferState::Canceled);
        t[1].slice_done(Ok(1));
        b.prepare_free().unwrap();
        assert_eq!(
            b.cancel_task(2, Duration::ZERO).unwrap_err().code,
            ErrorCode::ERR_INVALID_ARGUMENT
        );
    }

    /// A timeout is reported only after a response being written into local
    /// memory is done; later responses are refused a landing.
    #[test]
    fn timeout_is_reported_after_landings_end() {
        let b = Arc::new(Batch::new(1, Duration::from_secs(5)));
        let start = Instant::now();
        let t = b.add_tasks(1, start, None).unwrap();
        t[0].expect_slices(2);
        let landing = t[0].begin_landing().expect("live task");
        let landed = Arc::new(AtomicBool::new(false));
        let later = start + Duration::from_secs(6);
        let reporters: Vec<_> = (0..2)
            .map(|i| {
                let (b, landed) = (b.clone(), landed.clone());
                std::thread::spawn(move || {
                    let s = if i == 0 {
                        b.task_status(0, later).unwrap()
                    } else {
                        b.status(later)
                    };
                    // Whoever reports the timeout does so after the landing.
                    assert!(
                        landed.load(Ordering::SeqCst),
                        "timeout reported mid-landing"
                    );
                    s.state
                })
            })
            .collect();
        // Give the reporters a chance to get ahead of the landing (the
        // assertion holds whatever the interleaving).
        std::thread::sleep(Duration::from_millis(50));
        landed.store(true, Ordering::SeqCst);
        drop(landing);
        for r in reporters {
            assert_eq!(r.join().unwrap(), TransferState::Timeout);
        }
        assert!(t[0].begin_landing().is_none(), "no landing after a timeout");
        t[0].slice_done(Ok(1));
        t[0].slice_done(Ok(1));
        assert_eq!(b.wait().state, TransferState::Timeout);
        b.prepare_free().unwrap();
    }

    #[test]
    fn idle_hook_runs_once_after_all_tasks() {
        let b = Batch::new(3, Duration::from_secs(30));
        let now = Instant::now();
        let fired = Arc::new(Mutex::new(Vec::new()));
        let f = fired.clone();
        let t = b
            .add_tasks(2, now, Some(Box::new(move |ok| f.lock().push(ok))))
            .unwrap();
        t[0].expect_slices(0);
        assert!(fired.lock().is_empty());
        t[1].expect_slices(1);
        t[1].slice_done(Ok(3));
        assert_eq!(*fired.lock(), vec![true]);
        // An empty submit with a hook fires at once.
        let f = fired.clone();
        b.add_tasks(0, now, Some(Box::new(move |ok| f.lock().push(ok))))
            .unwrap();
        assert_eq!(*fired.lock(), vec![true, true]);
    }

    /// `wait` and a status poller race to expire the same deadline; neither
    /// may block the other (regression: lock-order inversion).
    #[test]
    fn waiting_and_polling_through_a_timeout_do_not_deadlock() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for _ in 0..200 {
                let b = Arc::new(Batch::new(2, Duration::from_micros(200)));
                let tasks = b.add_tasks(2, Instant::now(), None).unwrap();
                for t in &tasks {
                    t.expect_slices(1);
                }
                let poller = {
                    let b = b.clone();
                    std::thread::spawn(move || {
                        while b.status(Instant::now()).state == TransferState::Waiting {}
                    })
                };
                assert_eq!(b.wait().state, TransferState::Timeout);
                poller.join().unwrap();
                for t in tasks {
                    t.slice_done(Ok(1));
                }
                b.prepare_free().unwrap();
            }
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(120))
            .expect("no deadlock");
    }

    #[test]
    fn wait_returns_when_other_threads_finish() {
        let b = Arc::new(Batch::new(8, Duration::from_secs(30)));
        let tasks = b.add_tasks(8, Instant::now(), None).unwrap();
        for t in &tasks {
            t.expect_slices(1);
        }
        let h = std::thread::spawn(move || {
            for t in tasks {
                t.slice_done(Ok(1));
            }
        });
        let s = b.wait();
        h.join().unwrap();
        assert_eq!(
            (s.state, s.transferred_bytes),
            (TransferState::Completed, 8)
        );
    }
}
