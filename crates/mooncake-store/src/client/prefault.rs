//! Faulting in a client's fresh memory (its mounted segments and staging
//! pool) off the hot path. Untouched pages cost a page fault and zeroing
//! on their first write, which made the first fill of a fresh cache run at
//! a quarter of memory speed; a background thread populates them right
//! after setup so puts find them resident.
//!
//! `MADV_POPULATE_WRITE` (Linux 5.14) populates without changing a byte, so
//! it is safe while puts already write the same memory; where the kernel
//! lacks it, reading one byte per page maps each page instead. The work is
//! cut into chunks so that stopping (the client closing before the memory
//! is freed) waits for one chunk at most.
//!
//! A low priority alone does not keep the thread out of the way: the RPC
//! layer's pollers yield the CPU every few polls, and the scheduler hands
//! a yielded core to any runnable thread, nice 19 included. A populating
//! thread that is always runnable then costs every small call a chunk's
//! worth of delay (a remote 4 KiB `get` took 55 µs instead of 24 µs while
//! a fresh 1.5 GiB segment was being populated). So the thread also backs
//! off: while other threads keep every core busy (the kernel's count of
//! runnable threads says so), it sleeps instead of taking the next chunk.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes populated per call: small enough to stop promptly, to hold the
/// process's mmap lock (which `MADV_POPULATE_WRITE` takes) only briefly,
/// so a thread that maps memory meanwhile, and the page faults queued
/// behind it, never wait long, and to delay a foreground thread that the
/// chunk displaces by ~0.2 ms at most.
const CHUNK: usize = 256 << 10;
const PAGE: usize = 4096;
/// How long to stay off the cores once they were found busy.
const BACKOFF: Duration = Duration::from_millis(20);

/// A running background population; [`Prefault::stop`] (or drop) ends it
/// and waits, so the memory may be unmapped afterwards.
pub(crate) struct Prefault {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How a range was populated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    PopulateWrite,
    ReadTouch,
}

impl Prefault {
    /// Starts populating `ranges` (address, length) in order.
    ///
    /// # Safety
    /// Every range must stay mapped and readable until `stop` returns (or
    /// the handle drops).
    pub(crate) unsafe fn start(ranges: Vec<(usize, usize)>) -> Option<Prefault> {
        if ranges.iter().all(|&(_, len)| len == 0) || disabled() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mc-prefault".into())
            .spawn(move || {
                lowest_priority();
                let started = std::time::Instant::now();
                let mut total = 0;
                let mut method = None;
                let cpus = online_cpus();
                let busy = || others_running().is_some_and(|n| cores_busy(n, cpus));
                for (addr, len) in ranges {
                    // SAFETY: the caller keeps the ranges mapped until stop.
                    let (done, m) = unsafe { populate(addr, len, &flag, &busy) };
                    total += done;
                    method = method.or(m);
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                }
                tracing::debug!(
                    bytes = total,
                    ?method,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "prefaulted client memory"
                );
            })
            .ok()?;
        Some(Prefault {
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // Ends a backoff sleep at once.
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Populating is opportunistic: it must never take CPU from the puts and
/// gets it is meant to speed up, so the thread runs at nice 19 (not
/// SCHED_IDLE: a thread that is never scheduled while it holds the mmap
/// lock would stall everyone behind it).
fn lowest_priority() {
    // SAFETY: plain syscalls on the calling thread; no memory is passed.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}

/// `MC_STORE_PREFAULT=0` leaves pages to fault on first use.
fn disabled() -> bool {
    std::env::var("MC_STORE_PREFAULT")
        .ok()
        .and_then(|v| mooncake_common::gflags::parse_bool(&v).ok())
        == Some(false)
}

/// Runnable threads on the machine other than the caller (the fourth
/// field of `/proc/loadavg`, `running/total`, counts the reader too);
/// `None` where it cannot be read.
fn others_running() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_running(&text).map(|n| n.saturating_sub(1))
}

fn parse_running(loadavg: &str) -> Option<u64> {
    let field = loadavg.split_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// Online CPUs: the machine-wide count `/proc/loadavg` is measured against.
fn online_cpus() -> u64 {
    // SAFETY: sysconf reads a system constant.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as u64
}

/// Whether `others` runnable threads leave no core for populating.
fn cores_busy(others: u64, cpus: u64) -> bool {
    others >= cpus
}

/// Populates `[addr, addr+len)` chunk by chunk until done or `stop`; returns
/// the bytes covered and how.
///
/// # Safety
/// The range must be mapped and readable for the whole call.
unsafe fn populate(
    addr: usize,
    len: usize,
    stop: &AtomicBool,
    busy: &dyn Fn() -> bool,
) -> (usize, Option<Method>) {
    let mut method = None;
    let mut off = 0;
    while off < len && !stop.load(Ordering::Relaxed) {
        let n = CHUNK.min(len - off);
        let start = addr + off;
        let m = match method {
            Some(Method::ReadTouch) => None,
            _ => Some(populate_write(start, n)),
        };
        match m {
            Some(true) => method = Some(Method::PopulateWrite),
            _ => {
                // SAFETY: the caller keeps the range mapped and readable.
                unsafe { read_touch(start, n) };
                method = Some(Method::ReadTouch);
            }
        }
        off += n;
        // Let runnable foreground threads go first between chunks.
        std::thread::yield_now();
        // While others need every core, sleep (stop unparks) rather than
        // stay runnable and be handed a core they yield.
        while !stop.load(Ordering::Relaxed) && busy() {
            std::thread::park_timeout(BACKOFF);
        }
    }
    (off, method)
}

/// `madvise(MADV_POPULATE_WRITE)` on a page-aligned cover of the range;
/// false when the kernel refuses it (too old, or not this kind of memory).
fn populate_write(addr: usize, len: usize) -> bool {
    let start = addr & !(PAGE - 1);
    let end = (addr + len).div_ceil(PAGE) * PAGE;
    // SAFETY: madvise only changes residency; POPULATE_WRITE never alters
    // contents, and an unmapped range is refused with ENOMEM.
    unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            end - start,
            libc::MADV_POPULATE_WRITE,
        ) == 0
    }
}

/// Reads one byte per page, which maps each page.
///
/// # Safety
/// The range must be mapped and readable.
unsafe fn read_touch(addr: usize, len: usize) {
    let mut p = addr;
    while p < addr + len {
        // SAFETY: `p` lies inside the range the caller keeps mapped; a
        // volatile read is not optimised away and changes nothing.
        unsafe { std::ptr::read_volatile(p as *const u8) };
        p = (p / PAGE + 1) * PAGE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident_pages(map: &memmap2::MmapMut) -> usize {
        let pages = map.len().div_ceil(PAGE);
        let mut vec = vec![0u8; pages];
        // SAFETY: mincore fills one byte per page of our own mapping.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr() as *mut libc::c_void,
                map.len(),
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn populates_without_changing_bytes() {
        let len = 3 * CHUNK + 5 * PAGE;
        let mut map = memmap2::MmapMut::map_anon(len).unwrap();
        map[CHUNK + 17] = 0xAB;
        let before = resident_pages(&map);
        let (addr, n) = (map.as_ptr() as usize, map.len());
        // SAFETY: `map` outlives the handle, which joins on stop below.
        let mut p = unsafe { Prefault::start(vec![(addr, n)]) }.unwrap();
        p.stop();
        // Stop may cut it short; a full run covers every page.
        let stop = AtomicBool::new(false);
        // SAFETY: `map` is mapped for the whole call.
        let (done, method) = unsafe { populate(addr, n, &stop, &|| false) };
        assert_eq!(done, len);
        assert!(method.is_some());
        assert!(resident_pages(&map) > before);
        assert_eq!(resident_pages(&map), len / PAGE);
        assert_eq!(map[CHUNK + 17], 0xAB);
        assert!(map
            .iter()
            .enumerate()
            .all(|(i, &b)| b == 0 || i == CHUNK + 17));
    }

    #[test]
    fn read_touch_maps_pages() {
        let len = 16 * PAGE;
        let map = memmap2::MmapMut::map_anon(len).unwrap();
        // SAFETY: `map` is mapped for the call.
        unsafe { read_touch(map.as_ptr() as usize + 1, len - 1) };
        // Anonymous read faults may map the shared zero page, which mincore
        // reports resident too.
        assert_eq!(resident_pages(&map), 16);
    }

    #[test]
    fn busy_cores_read_from_loadavg() {
        assert_eq!(parse_running("14.88 15.00 11.69 15/224 5161\n"), Some(15));
        assert_eq!(parse_running("0.00 0.01 0.05 1/80 42"), Some(1));
        assert_eq!(parse_running("0.00 0.01"), None);
        assert_eq!(parse_running(""), None);
        assert!(!cores_busy(0, 2), "an idle machine");
        assert!(!cores_busy(1, 2), "a core is free");
        assert!(cores_busy(2, 2), "two pollers on two cores");
        assert!(cores_busy(13, 2));
        assert!(online_cpus() >= 1);
        assert!(others_running().is_some());
    }

    #[test]
    fn a_busy_machine_holds_the_next_chunk_back() {
        let len = 3 * CHUNK;
        let map = memmap2::MmapMut::map_anon(len).unwrap();
        // Busy twice, then free, after every chunk.
        let asked = std::cell::Cell::new(0);
        let busy = || {
            asked.set(asked.get() + 1);
            asked.get() % 3 != 0
        };
        let stop = AtomicBool::new(false);
        // SAFETY: `map` is mapped for the call.
        let (done, _) = unsafe { populate(map.as_ptr() as usize, len, &stop, &busy) };
        assert_eq!(done, len);
        assert_eq!(asked.get(), 9, "asked until free after each of 3 chunks");
    }

    #[test]
    fn a_stopped_run_ends() {
        let stop = AtomicBool::new(true);
        let map = memmap2::MmapMut::map_anon(CHUNK).unwrap();
        // SAFETY: `map` is mapped for the call.
        let (done, method) = unsafe { populate(map.as_ptr() as usize, CHUNK, &stop, &|| true) };
        assert_eq!((done, method), (0, None));
    }
}
