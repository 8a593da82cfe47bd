//! Waiting on a peer's control word: a short spin (a peer that is about to
//! post costs no system call), then a short while yielding the core (on a
//! host with more ranks than cores, the peer waited for gets it), then
//! futex sleeps, so a rank blocked in a collective or an idle receive
//! burns no CPU. Between sleeps the waiter checks its deadline and whether
//! the peers are still alive. A word counts its sleepers, so posting it
//! makes a system call only when someone sleeps on it.

use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The longest a waiter sleeps before it checks its peers' processes
/// again: a dead rank fails its peers' operations within about this long.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(20);

/// Spins before the first sleep: a few microseconds, enough for a peer
/// that is already running to post, short enough that oversubscribed
/// cores are not burnt.
const SPINS: u32 = 200;

/// How long a waiter yields its core before it sleeps: a peer a few
/// microseconds from posting is not put through a futex wake (a system
/// call and a context switch on each side), yet an idle rank still sleeps.
const YIELD_FOR: Duration = Duration::from_micros(100);

/// A control word alone on its 64-byte line, next to the number of
/// waiters asleep on it.
#[repr(C, align(64))]
pub struct Line {
    word: AtomicU32,
    sleepers: AtomicU32,
}

impl Line {
    pub const fn new(value: u32) -> Line {
        Line {
            word: AtomicU32::new(value),
            sleepers: AtomicU32::new(0),
        }
    }

    /// Stores `value` and wakes the waiters asleep on the word, if any.
    pub fn publish(&self, value: u32) {
        // SeqCst on both sides: either a waiter about to sleep sees the
        // value, or this sees its sleeper count.
        self.word.store(value, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.word);
        }
    }

    /// Sleeps while the word holds `expected` (at most `timeout`),
    /// counted as a sleeper.
    fn sleep(&self, expected: u32, timeout: Duration) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.word.load(Ordering::SeqCst) == expected {
            futex_wait(&self.word, expected, timeout);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Deref for Line {
    type Target = AtomicU32;

    fn deref(&self) -> &AtomicU32 {
        &self.word
    }
}

/// Whether a wrapping counter at `cur` has reached `target` (counters are
/// compared by their wrapping difference, so they may run past u32::MAX).
pub fn reached(cur: u32, target: u32) -> bool {
    (cur.wrapping_sub(target) as i32) >= 0
}

/// Sleeps while `word` holds `expected`, at most `timeout`. Spurious
/// returns are fine: callers re-check.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the word is a live, aligned u32 for the call's duration; the
    // shared (non-private) futex works across the processes mapping it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every sleeper on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in futex_wait; waking touches no memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Why a wait ended without its condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitError {
    /// These ranks' processes are gone.
    Dead(Vec<usize>),
    /// The deadline passed with every peer alive.
    Timeout,
}

/// Waits until `done(word)` holds. `dead()` lists the peers found dead;
/// it runs once per [`LIVENESS_PERIOD`] of waiting.
pub fn wait_word(
    word: &Line,
    done: impl Fn(u32) -> bool,
    deadline: Instant,
    dead: &dyn Fn() -> Vec<usize>,
) -> Result<(), WaitError> {
    for _ in 0..SPINS {
        if done(word.load(Ordering::Acquire)) {
            return Ok(());
        }
        std::hint::spin_loop();
    }
    let yield_until = Instant::now() + YIELD_FOR;
    while Instant::now() < yield_until.min(deadline) {
        if done(word.load(Ordering::Acquire)) {
            return Ok(());
        }
        // SAFETY: no arguments, no memory touched.
        unsafe { libc::sched_yield() };
    }
    let mut next_check = Instant::now() + LIVENESS_PERIOD;
    loop {
        let v = word.load(Ordering::Acquire);
        if done(v) {
            return Ok(());
        }
        let now = Instant::now();
        if now >= next_check {
            let gone = dead();
            if !gone.is_empty() {
                // A peer may have posted and then exited after the load
                // above; once it is dead its word can no longer change.
                if done(word.load(Ordering::Acquire)) {
                    return Ok(());
                }
                return Err(WaitError::Dead(gone));
            }
            next_check = now + LIVENESS_PERIOD;
        }
        if now >= deadline {
            return Err(WaitError::Timeout);
        }
        word.sleep(v, (next_check - now).min(deadline - now));
    }
}

/// A handle on a peer process that tells when it has exited, even before
/// its parent reaps it and whatever pid is reused later.
pub struct ProcessWatch {
    pid: i32,
    fd: Option<OwnedFd>,
}

impl ProcessWatch {
    /// Watches `pid`; without pidfds (Linux < 5.3) falls back to `/proc`.
    pub fn new(pid: i32) -> ProcessWatch {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let fd = (fd >= 0).then(|| {
            // SAFETY: the syscall just returned this fd and nothing else owns it.
            unsafe { OwnedFd::from_raw_fd(fd as i32) }
        });
        ProcessWatch { pid, fd }
    }

    /// Whether the process still runs (a zombie counts as dead).
    pub fn alive(&self) -> bool {
        match &self.fd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, zero timeout.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                n == 0
            }
            None => match std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
                Ok(stat) => !matches!(
                    stat.rsplit(')')
                        .next()
                        .and_then(|s| s.trim_start().chars().next()),
                    Some('Z') | Some('X')
                ),
                Err(_) => false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn wrapping_counters_compare_by_difference() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(reached(2, u32::MAX - 1));
        assert!(!reached(u32::MAX - 1, 2));
    }

    #[test]
    fn a_post_from_another_thread_wakes_the_waiter() {
        let word = Arc::new(Line::new(0));
        let w = word.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w.publish(3);
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        wait_word(&word, |v| reached(v, 3), deadline, &Vec::new).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_wait_ends_at_its_deadline_or_on_a_dead_peer() {
        let word = Line::new(0);
        let deadline = Instant::now() + Duration::from_millis(60);
        assert_eq!(
            wait_word(&word, |v| v == 1, deadline, &Vec::new),
            Err(WaitError::Timeout)
        );
        let far = Instant::now() + Duration::from_secs(30);
        assert_eq!(
            wait_word(&word, |v| v == 1, far, &|| vec![3]),
            Err(WaitError::Dead(vec![3]))
        );
    }

    #[test]
    fn an_exited_child_is_seen_dead() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let watch = ProcessWatch::new(child.id() as i32);
        assert!(watch.alive());
        child.kill().unwrap();
        // Not reaped yet: a zombie still counts as dead.
        let deadline = Instant::now() + Duration::from_secs(30);
        while watch.alive() {
            assert!(Instant::now() < deadline, "killed child still seen alive");
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait().unwrap();
        assert!(!watch.alive());
    }
}
