//! Registered memory: the address ranges this engine may read and write.
//!
//! Every local source address and every remote write that arrives over the
//! wire is checked here before a byte moves. Pure bookkeeping, no I/O.
//!
//! A peer's frame pins the region it touches ([`Pin`]) instead of holding the
//! registry lock while its bytes cross the socket: unregistering removes the
//! region at once (new frames are refused) and then waits for the pins to go.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

use crate::rawmem;
use crate::segment::{BufferDesc, ShmDesc};

/// Counts the frames using a region's memory right now, so that removing
/// the region can wait until none does.
#[derive(Debug)]
pub(crate) struct Pin {
    /// The region's range.
    addr: usize,
    len: usize,
    users: AtomicUsize,
    /// Set once the region left the registry: the last user wakes the remover.
    retired: AtomicBool,
    lock: Mutex<()>,
    drained: Condvar,
}

/// One frame's hold on a region's memory; dropping it releases the hold.
#[derive(Debug)]
pub(crate) struct PinGuard(Arc<Pin>);

impl Pin {
    fn new(addr: usize, len: usize) -> Pin {
        Pin {
            addr,
            len,
            users: AtomicUsize::new(0),
            retired: AtomicBool::new(false),
            lock: Mutex::new(()),
            drained: Condvar::new(),
        }
    }

    fn hold(self: &Arc<Pin>) -> PinGuard {
        // SeqCst pairs with `retire`: either the remover sees this user, or
        // the user was taken after the region left the registry (impossible:
        // holds are taken under the registry's read lock).
        self.users.fetch_add(1, Ordering::SeqCst);
        PinGuard(self.clone())
    }

    /// Marks the region gone and waits until no frame uses it, or until
    /// `give_up`; false if users remain.
    pub(crate) fn retire(&self, give_up: Instant) -> bool {
        self.retired.store(true, Ordering::SeqCst);
        let mut g = self.lock.lock();
        while self.users.load(Ordering::SeqCst) != 0 {
            if self.drained.wait_until(&mut g, give_up).timed_out() {
                return self.users.load(Ordering::SeqCst) == 0;
            }
        }
        true
    }
}

impl PinGuard {
    /// Whether this hold also covers `[addr, addr+len)` of a later frame:
    /// inside the region, which is still registered. Lets a burst of frames
    /// into one region skip the registry: the hold already keeps the memory
    /// registered, and a retired region is never reused (so frames that
    /// arrive after an unregister are refused).
    pub(crate) fn covers(&self, addr: u64, len: u64) -> bool {
        let (Ok(addr), Ok(len)) = (usize::try_from(addr), usize::try_from(len)) else {
            return false;
        };
        let pin = &self.0;
        rawmem::contains(pin.addr, pin.len, addr, len) && !pin.retired.load(Ordering::SeqCst)
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        let pin = &self.0;
        if pin.users.fetch_sub(1, Ordering::SeqCst) == 1 && pin.retired.load(Ordering::SeqCst) {
            // Under the lock, so the remover is either before its check or waiting.
            let _g = pin.lock.lock();
            pin.drained.notify_all();
        }
    }
}

/// One registered range.
#[derive(Clone, Debug)]
pub(crate) struct Region {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    /// `cpu:0`, `*`, … as given at registration (published as the buffer name).
    pub(crate) location: String,
    /// Whether peers may read and write it (published in the descriptor).
    pub(crate) remote_accessible: bool,
    /// Set for engine-managed buffers: how a same-host peer maps them.
    pub(crate) shm: Option<ShmDesc>,
    /// Frames of peers using this memory now.
    pub(crate) pin: Arc<Pin>,
}

impl Region {
    pub(crate) fn new(
        addr: usize,
        len: usize,
        location: String,
        remote_accessible: bool,
        shm: Option<ShmDesc>,
    ) -> Region {
        Region {
            addr,
            len,
            location,
            remote_accessible,
            shm,
            pin: Arc::new(Pin::new(addr, len)),
        }
    }

    pub(crate) fn contains(&self, addr: usize, len: usize) -> bool {
        rawmem::contains(self.addr, self.len, addr, len)
    }

    pub(crate) fn to_buffer_desc(&self) -> BufferDesc {
        BufferDesc {
            name: self.location.clone(),
            addr: self.addr as u64,
            length: self.len as u64,
            rkey: Vec::new(),
            lkey: Vec::new(),
            shm: self.shm.clone(),
        }
    }
}

/// Non-overlapping registered ranges, keyed by start address.
#[derive(Default, Debug)]
pub(crate) struct Registry {
    regions: BTreeMap<usize, Region>,
}

impl Registry {
    /// Adds a range. Zero length, a null address, address overflow or an
    /// overlap with an existing range is refused.
    pub(crate) fn insert(&mut self, region: Region) -> Result<()> {
        if region.addr == 0 || region.len == 0 {
            return Err(Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                format!("cannot register addr={:#x} len={}", region.addr, region.len),
            ));
        }
        let end = region.addr.checked_add(region.len).ok_or_else(|| {
            Error::new(
                ErrorCode::ERR_INVALID_ARGUMENT,
                "registered range overflows",
            )
        })?;
        let before = self.regions.range(..end).next_back();
        if let Some((_, prev)) = before {
            if prev.addr + prev.len > region.addr {
                return Err(Error::new(
                    ErrorCode::ERR_ADDRESS_OVERLAPPED,
                    format!(
                        "range {:#x}+{} overlaps registered {:#x}+{}",
                        region.addr, region.len, prev.addr, prev.len
                    ),
                ));
            }
        }
        self.regions.insert(region.addr, region);
        Ok(())
    }

    /// Removes the range starting exactly at `addr`.
    pub(crate) fn remove(&mut self, addr: usize) -> Result<Region> {
        self.regions.remove(&addr).ok_or_else(|| {
            Error::new(
                ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                format!("{addr:#x} is not a registered buffer start"),
            )
        })
    }

    /// The region holding all of `[addr, addr+len)`, if any.
    pub(crate) fn find(&self, addr: usize, len: usize) -> Option<&Region> {
        let (_, r) = self.regions.range(..=addr).next_back()?;
        r.contains(addr, len).then_some(r)
    }

    /// Checks a local source/destination range.
    pub(crate) fn check_local(&self, addr: usize, len: usize) -> Result<(), ErrorCode> {
        self.find(addr, len)
            .map(|_| ())
            .ok_or(ErrorCode::ERR_ADDRESS_NOT_REGISTERED)
    }

    /// The region holding a range a peer asked to read or write.
    fn remote_region(&self, addr: u64, len: u64) -> Result<&Region, ErrorCode> {
        let (Ok(addr), Ok(len)) = (usize::try_from(addr), usize::try_from(len)) else {
            return Err(ErrorCode::ERR_INVALID_ARGUMENT);
        };
        match self.find(addr, len) {
            Some(r) if r.remote_accessible => Ok(r),
            _ => Err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED),
        }
    }

    /// Checks a range a peer asked to read or write and pins its region:
    /// the memory stays registered until the guard drops (see [`Pin::retire`]).
    pub(crate) fn pin_remote(&self, addr: u64, len: u64) -> Result<PinGuard, ErrorCode> {
        self.remote_region(addr, len).map(|r| r.pin.hold())
    }

    /// Published buffers, in address order.
    pub(crate) fn buffers(&self) -> Vec<BufferDesc> {
        self.regions
            .values()
            .filter(|r| r.remote_accessible)
            .map(Region::to_buffer_desc)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(addr: usize, len: usize) -> Region {
        Region::new(addr, len, "cpu:0".into(), true, None)
    }

    #[test]
    fn insert_find_remove() {
        let mut r = Registry::default();
        r.insert(region(0x1000, 0x1000)).unwrap();
        r.insert(region(0x3000, 0x100)).unwrap();
        assert!(r.find(0x1000, 0x1000).is_some());
        assert!(r.find(0x1800, 0x800).is_some());
        assert!(r.find(0x1800, 0x801).is_none());
        assert!(r.find(0x2000, 1).is_none());
        assert!(r.find(0xfff, 2).is_none());
        assert_eq!(r.check_local(0x3000, 0x100), Ok(()));
        assert_eq!(
            r.check_local(0x3000, 0x101),
            Err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED)
        );
        assert_eq!(r.remove(0x1000).unwrap().len, 0x1000);
        assert_eq!(
            r.remove(0x1000).unwrap_err().code,
            ErrorCode::ERR_ADDRESS_NOT_REGISTERED
        );
        assert!(r.find(0x1800, 1).is_none());
    }

    #[test]
    fn refuses_overlap_and_bad_ranges() {
        let mut r = Registry::default();
        r.insert(region(0x1000, 0x1000)).unwrap();
        for (a, l) in [(0x1000, 1), (0x1fff, 2), (0x800, 0x801), (0x800, 0x10000)] {
            assert_eq!(
                r.insert(region(a, l)).unwrap_err().code,
                ErrorCode::ERR_ADDRESS_OVERLAPPED,
                "{a:#x}+{l}"
            );
        }
        r.insert(region(0x2000, 1)).unwrap();
        r.insert(region(0x800, 0x800)).unwrap();
        assert_eq!(
            r.insert(region(0, 10)).unwrap_err().code,
            ErrorCode::ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            r.insert(region(0x9000, 0)).unwrap_err().code,
            ErrorCode::ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            r.insert(region(usize::MAX, 2)).unwrap_err().code,
            ErrorCode::ERR_INVALID_ARGUMENT
        );
    }

    #[test]
    fn remote_checks_respect_accessibility_and_width() {
        let mut r = Registry::default();
        r.insert(region(0x1000, 0x1000)).unwrap();
        r.insert(Region {
            remote_accessible: false,
            ..region(0x4000, 0x1000)
        })
        .unwrap();
        assert!(r.pin_remote(0x1000, 0x1000).is_ok());
        for (addr, len) in [(0x4000, 1), (u64::MAX, 1), (0x1000, u64::MAX)] {
            assert_eq!(
                r.pin_remote(addr, len).unwrap_err(),
                ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                "{addr:#x}+{len}"
            );
        }
        assert_eq!(r.buffers().len(), 1);
    }

    #[test]
    fn retiring_waits_for_pins() {
        let mut r = Registry::default();
        r.insert(region(0x1000, 0x1000)).unwrap();
        let a = r.pin_remote(0x1000, 10).unwrap();
        let b = r.pin_remote(0x1800, 10).unwrap();
        assert_eq!(
            r.pin_remote(0x1800, 0x1000).unwrap_err(),
            ErrorCode::ERR_ADDRESS_NOT_REGISTERED
        );
        assert!(a.covers(0x1fff, 1) && a.covers(0x1000, 0x1000));
        assert!(!a.covers(0x1fff, 2) && !a.covers(0xfff, 1) && !a.covers(u64::MAX, 2));
        let gone = r.remove(0x1000).unwrap();
        // Removed at once: no new pins, and held ones serve no new frame.
        assert!(r.pin_remote(0x1000, 10).is_err());
        assert!(!gone.pin.retire(Instant::now()));
        assert!(!a.covers(0x1000, 10));
        // Held pins make a bounded retire give up (the deadline is already past).
        assert!(!gone.pin.retire(Instant::now()));
        drop(a);
        assert!(!gone.pin.retire(Instant::now()));
        let waiter = {
            let pin = gone.pin.clone();
            std::thread::spawn(move || {
                pin.retire(Instant::now() + std::time::Duration::from_secs(60))
            })
        };
        drop(b);
        assert!(waiter.join().unwrap(), "the last release wakes the remover");
        assert!(gone.pin.retire(Instant::now()));
    }
}
