//! When the populating thread stays off the cores: every core busy and one
//! of this process's other threads waiting to run. The decision is pure
//! ([`Contention::decide`]); reading the kernel's numbers is kept apart.

/// What the kernel says right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sample {
    /// Runnable threads on the machine other than the caller (`None`:
    /// unknown).
    pub others_running: Option<u64>,
    /// Run-queue delay of this process's other threads, summed, in ns
    /// (`None`: unknown).
    pub own_run_delay: Option<u64>,
}

/// The state one populating thread keeps between looks.
pub(super) struct Contention {
    cpus: u64,
    /// Own threads' run-queue delay at the last look while cores were
    /// busy; `None` after a look that found a core free.
    last_delay: Option<u64>,
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
        Contention {
            cpus,
            last_delay: None,
            tid,
        }
    }

    /// Whether to sleep before the next chunk (reads the kernel's numbers;
    /// the per-thread ones only when every core is busy).
    pub(super) fn back_off(&mut self) -> bool {
        let others_running = others_running();
        let busy = others_running.is_none_or(|n| n >= self.cpus);
        let own_run_delay = if busy { own_run_delay(self.tid) } else { None };
        self.decide(Sample {
            others_running,
            own_run_delay,
        })
    }

    /// The decision on one sample. Busy cores and an own thread whose
    /// run-queue delay grew since the last busy look: back off. The first
    /// busy look only takes the baseline (and lets the chunk go), so waits
    /// from before the cores filled up do not count. Busy cores with the
    /// own delays unknown: back off (never compete blindly); an unknown
    /// machine load: go on only if the own threads did not wait.
    pub(super) fn decide(&mut self, s: Sample) -> bool {
        let busy = s.others_running.is_none_or(|n| n >= self.cpus);
        if !busy {
            self.last_delay = None;
            return false;
        }
        let Some(now) = s.own_run_delay else {
            self.last_delay = None;
            return true;
        };
        let waited = self.last_delay.is_some_and(|before| now > before);
        self.last_delay = Some(now);
        waited
    }
}

/// Runnable threads on the machine other than the caller (the fourth
/// field of `/proc/loadavg`, `running/total`, counts the reader too).
fn others_running() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_running(&text).map(|n| n.saturating_sub(1))
}

fn parse_running(loadavg: &str) -> Option<u64> {
    let field = loadavg.split_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// The run-queue delay (ns) of this process's threads but `except`,
/// summed; `None` when no thread's statistics can be read (a kernel
/// without scheduler statistics).
fn own_run_delay(except: u32) -> Option<u64> {
    let mut total = None;
    for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let name = entry.file_name();
        if name.to_str().and_then(|n| n.parse::<u32>().ok()) == Some(except) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        if let Some(d) = parse_run_delay(&text) {
            total = Some(total.unwrap_or(0) + d);
        }
    }
    total
}

/// The second field of a thread's `schedstat`: `cpu_ns run_delay_ns slices`.
fn parse_run_delay(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(others: Option<u64>, delay: Option<u64>) -> Sample {
        Sample {
            others_running: others,
            own_run_delay: delay,
        }
    }

    #[test]
    fn free_cores_never_hold_it_back() {
        let mut c = Contention::new(2, 1);
        assert!(!c.decide(sample(Some(0), Some(5))));
        assert!(!c.decide(sample(Some(1), Some(500))), "a core is free");
        assert!(!c.decide(sample(Some(1), None)));
    }

    #[test]
    fn busy_cores_hold_it_back_only_while_own_threads_wait() {
        let mut c = Contention::new(2, 1);
        // Other processes fill both cores; our threads do not wait: go on.
        assert!(!c.decide(sample(Some(2), Some(100))), "baseline");
        assert!(!c.decide(sample(Some(7), Some(100))));
        assert!(!c.decide(sample(Some(2), Some(100))));
        // One of ours waited since the last look: back off, and again while
        // it keeps waiting.
        assert!(c.decide(sample(Some(2), Some(150))));
        assert!(c.decide(sample(Some(3), Some(151))));
        assert!(!c.decide(sample(Some(3), Some(151))), "no new wait");
        // A thread that exits takes its delay with it: not a wait.
        assert!(!c.decide(sample(Some(3), Some(40))));
        assert!(c.decide(sample(Some(3), Some(41))));
    }

    #[test]
    fn a_free_core_resets_the_baseline() {
        let mut c = Contention::new(2, 1);
        assert!(!c.decide(sample(Some(2), Some(100))));
        assert!(!c.decide(sample(Some(0), Some(900))));
        // Waits while a core was free do not count once the cores fill.
        assert!(!c.decide(sample(Some(2), Some(1000))), "new baseline");
        assert!(c.decide(sample(Some(2), Some(1001))));
    }

    #[test]
    fn unknowns() {
        let mut c = Contention::new(2, 1);
        assert!(c.decide(sample(Some(2), None)), "busy, own waits unknown");
        assert!(!c.decide(sample(None, Some(10))), "load unknown: baseline");
        assert!(c.decide(sample(None, Some(11))), "load unknown, own wait");
        assert!(c.decide(sample(None, None)));
    }

    #[test]
    fn kernel_numbers_parse() {
        assert_eq!(parse_running("14.88 15.00 11.69 15/224 5161\n"), Some(15));
        assert_eq!(parse_running("0.00 0.01 0.05 1/80 42"), Some(1));
        assert_eq!(parse_running("0.00 0.01"), None);
        assert_eq!(parse_running(""), None);
        assert_eq!(parse_run_delay("169331 3158791 2\n"), Some(3158791));
        assert_eq!(parse_run_delay("169331"), None);
        assert_eq!(parse_run_delay("1 x 2"), None);
    }

    #[test]
    fn reads_this_machine() {
        let c = Contention::of_this_thread();
        assert!(c.cpus >= 1 && c.tid > 0);
        assert!(others_running().is_some());
        // Another thread of this process has statistics where the kernel
        // keeps them (it does here; a kernel without them answers None).
        if std::path::Path::new("/proc/thread-self/schedstat").exists() {
            assert!(own_run_delay(c.tid).is_some());
        }
    }
}
