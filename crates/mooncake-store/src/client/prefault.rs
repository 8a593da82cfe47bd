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
//! The thread runs at normal priority, so other processes on a busy
//! machine share the cores with it rather than starve it (at nice 19, a
//! fill 3 s after setup under a load of 10 ran as slowly as one with no
//! population at all). What it must not do is take a core from this
//! process's own threads: the RPC layer's pollers yield the CPU every few
//! polls, and a populating thread that is always runnable then costs every small call a chunk's worth of delay (a
//! remote 4 KiB `get` took 55 µs instead of 24 µs while a fresh 1.5 GiB
//! segment was being populated). So between chunks it backs off while both
//! hold: every core is busy (the kernel's count of runnable threads says
//! so) and one of the process's other threads is runnable, which a
//! populating thread on a core would make wait (see `contention`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use contention::Contention;

/// Bytes populated per call: small enough to stop promptly, to hold the
/// process's mmap lock (which `MADV_POPULATE_WRITE` takes) only briefly,
/// so a thread that maps memory meanwhile, and the page faults queued
/// behind it, never wait long, and to delay a foreground thread that the
/// chunk displaces by ~0.2 ms at most.
const CHUNK: usize = 256 << 10;
const PAGE: usize = 4096;
/// How long to stay off the cores before looking again.
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
        if ranges.iter().all(|&(_, len)| len == 0) || !super::config::prefault_enabled() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mc-prefault".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let mut total = 0;
                let mut method = None;
                let contention = Contention::of_this_thread();
                let mut busy = || contention.back_off();
                for (addr, len) in ranges {
                    // SAFETY: the caller keeps the ranges mapped until stop.
                    let (done, m) = unsafe { populate(addr, len, &flag, &mut busy) };
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

/// Populates `[addr, addr+len)` chunk by chunk until done or `stop`; returns
/// the bytes covered and how.
///
/// # Safety
/// The range must be mapped and readable for the whole call.
unsafe fn populate(
    addr: usize,
    len: usize,
    stop: &AtomicBool,
    busy: &mut dyn FnMut() -> bool,
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
        // While this process's threads wait for a core, sleep (stop
        // unparks) rather than stay runnable and be handed one they yield.
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

mod contention;

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
        let (done, method) = unsafe { populate(addr, n, &stop, &mut || false) };
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
    fn a_busy_machine_holds_the_next_chunk_back() {
        let len = 3 * CHUNK;
        let map = memmap2::MmapMut::map_anon(len).unwrap();
        // Busy twice, then free, after every chunk.
        let asked = std::cell::Cell::new(0);
        let mut busy = || {
            asked.set(asked.get() + 1);
            asked.get() % 3 != 0
        };
        let stop = AtomicBool::new(false);
        // SAFETY: `map` is mapped for the call.
        let (done, _) = unsafe { populate(map.as_ptr() as usize, len, &stop, &mut busy) };
        assert_eq!(done, len);
        assert_eq!(asked.get(), 9, "asked until free after each of 3 chunks");
    }

    #[test]
    fn a_stopped_run_ends() {
        let stop = AtomicBool::new(true);
        let map = memmap2::MmapMut::map_anon(CHUNK).unwrap();
        // SAFETY: `map` is mapped for the call.
        let (done, method) = unsafe { populate(map.as_ptr() as usize, CHUNK, &stop, &mut || true) };
        assert_eq!((done, method), (0, None));
    }
}
