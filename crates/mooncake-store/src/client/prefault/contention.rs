//! When the populating thread stays off the cores: every core busy and one
//! of this process's other threads runnable, so that taking a core would
//! make it wait. The decision is pure ([`Contention::decide`]); reading the
//! kernel's numbers is kept apart.
//!
//! The kernel does not say whether a runnable thread is on a core or queued
//! for one; with every core busy, a runnable thread of ours is one that a
//! populating thread on a core would make wait. Past waits (the run-queue
//! delay in `schedstat`) were tried first and held population back much of
//! the time on a loaded machine (one run of three had populated 323 MiB of
//! a 1 GiB segment 20 s after setup): every wake-up of any thread there
//! waits a little, so the delay of an idle client's threads keeps growing.

use crate::rpc::poll::others_running;
#[cfg(test)]
use crate::rpc::poll::parse_running;

/// What the kernel says right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sample {
    /// Runnable threads on the machine other than the caller (`None`:
    /// unknown).
    pub others_running: Option<u64>,
    /// Runnable threads of this process other than the caller (`None`:
    /// unknown, or not read because a core was free).
    pub own_runnable: Option<u64>,
}

/// What one populating thread needs to look.
pub(super) struct Contention {
    cpus: u64,
    /// The caller's thread id, left out of the own threads.
    tid: u32,
}

impl Contention {
    /// For the calling thread, on this machine's online CPUs.
    pub(super) fn of_this_thread() -> Contention {
        // SAFETY: plain syscalls; no memory is passed.
        let (cpus, tid) = unsafe {
            (
                libc::sysconf(libc::_SC_NPROCESSORS_ONLN),
                libc::syscall(libc::SYS_gettid),
            )
        };
        Contention::new(cpus.max(1) as u64, tid as u32)
    }

    fn new(cpus: u64, tid: u32) -> Contention {
        Contention { cpus, tid }
    }

    /// Whether to sleep before the next chunk (reads the kernel's numbers;
    /// the per-thread ones only when every core is busy).
    pub(super) fn back_off(&self) -> bool {
        let others_running = others_running();
        let own_runnable = if self.cores_busy(others_running) {
            own_runnable(self.tid)
        } else {
            None
        };
        self.decide(Sample {
            others_running,
            own_runnable,
        })
    }

    /// An unknown machine load counts as busy cores.
    fn cores_busy(&self, others_running: Option<u64>) -> bool {
        others_running.is_none_or(|n| n >= self.cpus)
    }

    /// The decision on one sample: back off when every core is busy and an
    /// own thread is runnable, or its threads cannot be read (never compete
    /// blindly).
    pub(super) fn decide(&self, s: Sample) -> bool {
        self.cores_busy(s.others_running) && s.own_runnable.is_none_or(|n| n > 0)
    }
}

/// Runnable threads (state `R`) of this process but `except`; `None` when
/// no thread's state can be read.
fn own_runnable(except: u32) -> Option<u64> {
    let mut total = None;
    for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let name = entry.file_name();
        if name.to_str().and_then(|n| n.parse::<u32>().ok()) == Some(except) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(state) = parse_state(&text) {
            total = Some(total.unwrap_or(0) + u64::from(state == 'R'));
        }
    }
    total
}

/// The state letter of a thread's `stat` line: the field after the
/// parenthesised name (which may hold spaces and parentheses itself).
fn parse_state(stat: &str) -> Option<char> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(others: Option<u64>, own: Option<u64>) -> Sample {
        Sample {
            others_running: others,
            own_runnable: own,
        }
    }

    #[test]
    fn a_free_core_never_holds_it_back() {
        let c = Contention::new(2, 1);
        assert!(!c.decide(sample(Some(0), Some(3))));
        assert!(!c.decide(sample(Some(1), Some(1))), "a core is free");
        assert!(!c.decide(sample(Some(1), None)));
    }

    #[test]
    fn busy_cores_hold_it_back_only_for_own_runnable_threads() {
        let c = Contention::new(2, 1);
        // Other processes fill both cores, ours sleep: share the cores.
        assert!(!c.decide(sample(Some(2), Some(0))));
        assert!(!c.decide(sample(Some(13), Some(0))));
        // One of ours wants a core too: leave it the core.
        assert!(c.decide(sample(Some(2), Some(1))));
        assert!(c.decide(sample(Some(9), Some(4))));
        let c4 = Contention::new(4, 1);
        assert!(
            !c4.decide(sample(Some(3), Some(3))),
            "a fourth core is free"
        );
    }

    #[test]
    fn unknowns_count_against_populating() {
        let c = Contention::new(2, 1);
        assert!(c.decide(sample(Some(2), None)), "busy, own threads unknown");
        assert!(!c.decide(sample(None, Some(0))), "load unknown, ours idle");
        assert!(c.decide(sample(None, Some(1))));
        assert!(c.decide(sample(None, None)));
    }

    #[test]
    fn kernel_numbers_parse() {
        assert_eq!(parse_running("14.88 15.00 11.69 15/224 5161\n"), Some(15));
        assert_eq!(parse_running("0.00 0.01 0.05 1/80 42"), Some(1));
        assert_eq!(parse_running("0.00 0.01"), None);
        assert_eq!(parse_running(""), None);
        assert_eq!(parse_state("4242 (python3) R 1 2 3"), Some('R'));
        assert_eq!(parse_state("7 (a) b) (c) S 1 2"), Some('S'));
        assert_eq!(parse_state("7 (no end"), None);
        assert_eq!(parse_state("7 (x)"), None);
    }

    #[test]
    fn reads_this_machine() {
        let c = Contention::of_this_thread();
        assert!(c.cpus >= 1 && c.tid > 0);
        assert!(others_running().is_some());
        // A second thread that keeps running is counted.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let spinner = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let seen = (0..1000).any(|_| own_runnable(c.tid).is_some_and(|n| n >= 1));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().unwrap();
        assert!(seen, "a spinning thread reads as runnable");
    }
}
