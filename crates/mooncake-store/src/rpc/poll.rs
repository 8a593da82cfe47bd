//! Polling policy: short busy-waits on a socket before blocking on it.
//!
//! On a virtual machine whose vCPUs halt when idle, a blocking read that has
//! to be woken costs far more than the round trip itself: on the 2-vCPU test
//! VM a loopback ping-pong takes ~80 µs when both sides block and ~8 µs when
//! both poll. So a side that expects bytes soon — a client awaiting its
//! answer, the master awaiting the next call of a client that just got one —
//! polls for a bounded window (yielding the CPU now and then, so a runnable
//! thread is not starved) and only then blocks. An idle connection costs one
//! window of polling per answer, then nothing. The master's window per
//! connection follows that client's last gap between answer and next call
//! (up to [`AdaptiveWindow::MAX`]), so a client that calls back after a short
//! piece of work finds the master still polling. Windows longer than the
//! base are rationed ([`LongPolls`]): at most half the cores poll that long
//! at once, so busy clients never cost the master more than that.
//!
//! Polling pays only while a core is free. When every core is wanted (a
//! host running inference, builds, other tenants), a spinning thread takes
//! its core from the threads doing the work it waits for: on the 2-vCPU VM
//! under other sessions' builds, the master's polls took 1.0 of the 2.7
//! CPU seconds of an offload run. So a spin that was switched out for
//! another thread (the kernel's count of involuntary switches moved: its
//! yield found one runnable, or it was preempted) while every core is busy
//! (`/proc/loadavg`'s runnable count, read only then: a kernel thread that
//! preempts a spin on an idle host does not count) turns polling off in
//! this process for [`CONTENDED_HOLD`] ([`Contended`]); the waits then
//! block in the kernel, and the first spin after the hold looks again.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a client polls for its answer before blocking.
pub const DEFAULT_CLIENT_SPIN: Duration = Duration::from_micros(100);
/// How long the master polls for a client's next call after answering one.
pub const DEFAULT_SERVER_SPIN: Duration = Duration::from_micros(50);

/// `MC_RPC_SPIN_US` (microseconds; `0` turns polling off) scales both
/// windows: the client polls for that long, the master for half of it.
fn env_spin() -> Option<Duration> {
    static SPIN: OnceLock<Option<Duration>> = OnceLock::new();
    *SPIN.get_or_init(|| {
        std::env::var("MC_RPC_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|us| Duration::from_micros(us.min(10_000)))
    })
}

/// The client's window.
pub fn client_window() -> Duration {
    env_spin().unwrap_or(DEFAULT_CLIENT_SPIN)
}

/// The master's window.
pub fn server_window() -> Duration {
    env_spin().map_or(DEFAULT_SERVER_SPIN, |d| d / 2)
}

/// The master's polling window for one connection, adapted to how soon its
/// client called again lately. A client that calls back a little later than
/// the base window (a put's end after copying a 1 MiB value, ~0.1-0.2 ms)
/// would otherwise always find the master asleep and pay a wakeup. The last
/// two gaps count, because calls often alternate (a put's start comes right
/// after the previous end, its end only after the copy). A client whose
/// recent gaps were all long gets only the base window, so idle connections
/// cost no more polling than before.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdaptiveWindow {
    gaps: [Option<Duration>; 2],
}

impl AdaptiveWindow {
    /// The longest window it grows to: a same-host 1 MiB `get_into` and the
    /// check of its buffer take ~0.3 ms between calls on the test VM.
    pub const MAX: Duration = Duration::from_millis(1);

    /// The window for the next wait: half again the longest recent gap of at
    /// most [`Self::MAX`] (within `[base, MAX]`), else `base`; zero when
    /// polling is off (`base` zero).
    pub fn window(&self, base: Duration) -> Duration {
        if base.is_zero() {
            return Duration::ZERO;
        }
        match self
            .gaps
            .iter()
            .flatten()
            .filter(|g| **g <= Self::MAX)
            .max()
        {
            Some(&gap) => (gap + gap / 2).clamp(base, Self::MAX.max(base)),
            None => base,
        }
    }

    /// Records how long the client took to call again after an answer.
    pub fn observe(&mut self, gap: Duration) {
        self.gaps = [Some(gap), self.gaps[0]];
    }

    /// Polls `stream` for the client's next call for this window (the part
    /// beyond `base` only with a slot of [`LongPolls::shared`]); see
    /// [`await_readable`].
    pub fn await_next(&self, stream: &impl AsRawFd, base: Duration) -> bool {
        let window = self.window(base);
        if window <= base {
            return await_readable(stream, window);
        }
        match LongPolls::shared().take() {
            Some(_slot) => await_readable(stream, window),
            None => await_readable(stream, base),
        }
    }
}

/// Slots for polling longer than the base window: spinning threads past the
/// number of slots would take CPU from the work their clients wait for.
#[derive(Debug)]
pub struct LongPolls {
    active: AtomicUsize,
    limit: usize,
}

/// A taken slot; dropping it gives the slot back.
#[derive(Debug)]
pub struct LongPoll<'a>(&'a LongPolls);

impl Drop for LongPoll<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl LongPolls {
    pub const fn new(limit: usize) -> LongPolls {
        LongPolls {
            active: AtomicUsize::new(0),
            limit,
        }
    }

    /// The process's slots: half the cores, at least one.
    pub fn shared() -> &'static LongPolls {
        static SHARED: OnceLock<LongPolls> = OnceLock::new();
        SHARED.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            LongPolls::new((cores / 2).max(1))
        })
    }

    /// A slot, unless all are taken.
    pub fn take(&self) -> Option<LongPoll<'_>> {
        let taken = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            });
        taken.ok().map(|_| LongPoll(self))
    }
}

/// One `poll(2)` of `fds`, waiting up to `timeout_ms` (0 never blocks, -1
/// has no bound): how many have events (`revents`). Entries with a negative
/// fd are skipped by the kernel.
pub fn poll_fds(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: the slice is valid for its length for the call's duration and
    // the kernel writes only its `revents` fields.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// How long polling stays off after a spin was switched out for another
/// thread: long enough that a loaded host pays one short spin per thread
/// this often, short enough that an idle one is back to polling at once.
pub const CONTENDED_HOLD: Duration = Duration::from_millis(100);

/// Whether the cores were wanted by other threads lately: polling is off
/// until the time it holds (microseconds of the process clock).
#[derive(Debug, Default)]
pub struct Contended {
    until_us: AtomicU64,
}

impl Contended {
    pub const fn new() -> Contended {
        Contended {
            until_us: AtomicU64::new(0),
        }
    }

    /// The process's record.
    pub fn shared() -> &'static Contended {
        static SHARED: Contended = Contended::new();
        &SHARED
    }

    /// Whether polling is off at `now_us`.
    pub fn holds(&self, now_us: u64) -> bool {
        now_us < self.until_us.load(Ordering::Relaxed)
    }

    /// A spin that ended at `now_us` was switched out for another thread
    /// (`switched`): polling goes off for [`CONTENDED_HOLD`] from then.
    pub fn note(&self, switched: bool, now_us: u64) {
        if switched {
            let until = now_us.saturating_add(CONTENDED_HOLD.as_micros() as u64);
            self.until_us.fetch_max(until, Ordering::Relaxed);
        }
    }
}

/// Microseconds since this process first asked.
fn clock_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// The calling thread's involuntary context switches so far.
fn involuntary_switches() -> Option<i64> {
    // SAFETY: a plain-data struct that zeroes are valid for.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only the struct it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (rc == 0).then_some(ru.ru_nivcsw as i64)
}

/// One spin's watch on its thread's switches; `None` from [`Self::start`]
/// while polling is off ([`Contended`]).
pub struct SpinWatch(Option<i64>);

impl SpinWatch {
    /// Before a spin: `None` means do not spin.
    pub fn start() -> Option<SpinWatch> {
        if Contended::shared().holds(clock_us()) {
            return None;
        }
        Some(SpinWatch(involuntary_switches()))
    }

    /// After the spin: a switch meanwhile, with every core busy, turns
    /// polling off for a while.
    pub fn end(self) {
        let switched = matches!((self.0, involuntary_switches()), (Some(a), Some(b)) if b > a);
        let contended = switched && cores_busy(others_running(), online_cpus());
        Contended::shared().note(contended, clock_us());
    }
}

/// Whether `others` runnable threads (besides the caller) fill `cpus`
/// cores; an unknown count does not (polling stays as it was).
pub(crate) fn cores_busy(others: Option<u64>, cpus: u64) -> bool {
    others.is_some_and(|n| n >= cpus)
}

fn online_cpus() -> u64 {
    static CPUS: OnceLock<u64> = OnceLock::new();
    // SAFETY: a plain syscall; no memory is passed.
    *CPUS.get_or_init(|| unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u64)
}

/// Runnable threads on the machine other than the caller (the fourth
/// field of `/proc/loadavg`, `running/total`, counts the reader too).
pub(crate) fn others_running() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_running(&text).map(|n| n.saturating_sub(1))
}

pub(crate) fn parse_running(loadavg: &str) -> Option<u64> {
    let field = loadavg.split_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// Polls `fds` without blocking until one has events (readable, hung up or
/// failed) or `window` has passed, yielding the CPU now and then: whether
/// one has. While the cores are contended ([`SpinWatch`]) it waits as long
/// in one blocking `ppoll(2)` instead, taking no CPU. An interrupted poll
/// is tried again; any other failure is returned.
pub fn spin_fds(fds: &mut [libc::pollfd], window: Duration) -> io::Result<bool> {
    let Some(watch) = SpinWatch::start() else {
        return block_fds(fds, window);
    };
    let r = spin_fds_watched(fds, window);
    watch.end();
    r
}

/// Waits in the kernel until one of `fds` has events or `window` has
/// passed (an interruption starts the wait again): whether one has.
fn block_fds(fds: &mut [libc::pollfd], window: Duration) -> io::Result<bool> {
    let ts = libc::timespec {
        tv_sec: window.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: window.subsec_nanos() as libc::c_long,
    };
    loop {
        // SAFETY: the slice and the timespec are valid for the call; the
        // kernel writes only the `revents` fields.
        let n = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn spin_fds_watched(fds: &mut [libc::pollfd], window: Duration) -> io::Result<bool> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        match poll_fds(fds, 0) {
            Ok(0) => {}
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if start.elapsed() >= window {
            return Ok(false);
        }
        spins += 1;
        if spins.is_multiple_of(16) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Polls `stream` until it has bytes to read (or an error or end of stream
/// to report) or `window` has passed. Returns whether it is readable; the
/// caller then reads as usual (blocking when it is not, or when the poll
/// itself failed: the read will tell).
pub fn await_readable(stream: &impl AsRawFd, window: Duration) -> bool {
    if window.is_zero() {
        return false;
    }
    let mut p = [libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    spin_fds(&mut p, window).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn adaptive_window_follows_short_gaps_only() {
        let base = DEFAULT_SERVER_SPIN;
        let us = Duration::from_micros;
        let mut w = AdaptiveWindow::default();
        assert_eq!(w.window(base), base, "nothing seen yet");
        w.observe(us(10));
        assert_eq!(w.window(base), base, "never below the base");
        w.observe(us(120));
        assert_eq!(w.window(base), us(180));
        // A put: start right after the previous end, end after the copy.
        w.observe(us(5));
        assert_eq!(w.window(base), us(180), "the longer of the last two");
        w.observe(AdaptiveWindow::MAX * 3 / 4);
        assert_eq!(w.window(base), AdaptiveWindow::MAX, "capped");
        w.observe(Duration::from_millis(5));
        assert_eq!(
            w.window(base),
            AdaptiveWindow::MAX,
            "one short gap still counts"
        );
        w.observe(Duration::from_millis(7));
        assert_eq!(w.window(base), base, "long gaps only: back to the base");
        w.observe(us(120));
        assert_eq!(w.window(Duration::ZERO), Duration::ZERO, "polling off");
        let big = AdaptiveWindow::MAX * 2;
        assert_eq!(w.window(big), big, "a larger base is kept");
    }

    #[test]
    fn a_spin_switched_out_turns_polling_off_for_a_while() {
        let c = Contended::new();
        let hold = CONTENDED_HOLD.as_micros() as u64;
        assert!(!c.holds(0), "polling is on at first");
        c.note(false, 1_000);
        assert!(!c.holds(1_000), "a spin that kept its core changes nothing");
        c.note(true, 1_000);
        assert!(c.holds(1_000) && c.holds(1_000 + hold - 1));
        assert!(!c.holds(1_000 + hold), "on again after the hold");
        c.note(true, 5_000);
        c.note(true, 2_000);
        assert!(c.holds(5_000 + hold - 1), "a later switch extends the hold");
        assert!(involuntary_switches().is_some(), "the kernel counts them");
        // Only a switch while every core is busy counts.
        assert!(!cores_busy(Some(1), 2), "a core is free");
        assert!(cores_busy(Some(2), 2) && cores_busy(Some(13), 2));
        assert!(!cores_busy(None, 2), "unknown: polling stays");
        assert_eq!(parse_running("14.88 15.00 11.69 15/224 5161\n"), Some(15));
        assert_eq!(parse_running("0.00 0.01"), None);
        assert!(others_running().is_some() && online_cpus() >= 1);
    }

    #[test]
    fn a_blocking_wait_sees_bytes_and_gives_up_in_silence() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let mut p = [libc::pollfd {
            fd: b.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let t = Instant::now();
        assert!(!block_fds(&mut p, Duration::from_millis(30)).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(30), "it waited");
        a.write_all(b"x").unwrap();
        assert!(block_fds(&mut p, Duration::from_secs(60)).unwrap());
    }

    #[test]
    fn long_polls_are_rationed() {
        let slots = LongPolls::new(2);
        let a = slots.take().unwrap();
        let b = slots.take().unwrap();
        assert!(slots.take().is_none(), "both slots taken");
        drop(a);
        let c = slots.take().expect("a returned slot is free again");
        assert!(slots.take().is_none());
        drop((b, c));
        assert!(slots.take().is_some());
        assert!(LongPolls::new(0).take().is_none());
        assert!(LongPolls::shared().limit >= 1);
    }

    #[test]
    fn sees_bytes_and_gives_up_in_silence() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        assert!(!await_readable(&b, Duration::from_micros(200)));
        assert!(!await_readable(&b, Duration::ZERO));
        a.write_all(b"x").unwrap();
        assert!(await_readable(&b, Duration::from_secs(10)));
        // A closed peer is "readable" too: the read reports end of stream.
        let (c, _) = {
            let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
            let d = TcpStream::connect(l2.local_addr().unwrap()).unwrap();
            let (c, addr) = l2.accept().unwrap();
            drop(d);
            (c, addr)
        };
        assert!(await_readable(&c, Duration::from_secs(10)));
    }

    #[test]
    fn poll_fds_takes_empty_skipped_and_bad_descriptors() {
        let pfd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(poll_fds(&mut [], 0).unwrap(), 0, "nothing to poll");
        let mut skipped = [pfd(-1)];
        assert_eq!(
            poll_fds(&mut skipped, 0).unwrap(),
            0,
            "a negative fd is skipped"
        );
        // An fd number far above any open one: reported, not an error.
        let mut bad = [pfd(1 << 20)];
        assert_eq!(poll_fds(&mut bad, 0).unwrap(), 1);
        assert_eq!(bad[0].revents, libc::POLLNVAL);
        assert!(spin_fds(&mut bad, Duration::from_millis(1)).unwrap());
        let mut none = [pfd(-1), pfd(-1)];
        assert!(!spin_fds(&mut none, Duration::from_millis(1)).unwrap());
    }
}
