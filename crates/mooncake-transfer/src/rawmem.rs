//! Every raw-pointer and mmap operation of the engine, in one place.
//!
//! The engine moves bytes between addresses it receives as integers (the
//! reference's API takes `void*`). The rest of the crate never dereferences
//! such an address itself: it first checks the range against the memory
//! registry (see `memory.rs`), then calls into this module.
//!
//! Invariants the callers uphold:
//! - a `(addr, len)` range handed to [`copy`], [`bytes`] or [`bytes_mut`] lies
//!   entirely inside memory registered with the engine (or a mapping owned by
//!   this module), and the registration's owner promised, by registering it,
//!   that the memory stays valid until it is unregistered;
//! - concurrent writers to the same bytes are the application's business (as
//!   with RDMA): the engine never creates references that outlive one copy.
//!
//! Shared memory: [`SharedRegion`] is an anonymous memfd mapping owned by this
//! process. Peers on the same host open it through `/proc/<pid>/fd/<fd>` and
//! check the inode, so nothing is left behind in `/dev/shm` when a process is
//! killed. [`PeerMapping`] is such a peer's mapping; it only ever hands out
//! addresses after a bounds check.
//!
//! A shared file that shrinks under a mapping turns the next access into
//! SIGBUS, so regions are sealed against resizing (`F_SEAL_SHRINK |
//! F_SEAL_GROW`, then `F_SEAL_SEAL`) before they are published, and a peer
//! maps only files that carry `F_SEAL_SHRINK` (which also proves a memfd).
//!
//! A peer's mapping keeps the memory alive after its owner freed it, so
//! copies into it would vanish silently. Each region therefore ends with one
//! more page whose first word is the owner's verdict: 0 while registered,
//! [`FREED`] once freed ([`SharedRegion::mark_freed`]). Peers check it
//! around each copy ([`PeerMapping::is_live`]).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// State word of a freed shared region (a fresh, zeroed region is live).
const FREED: u32 = 1;

/// Offset of a shared region's state page (after `len` data bytes, page
/// aligned) and the file length including it.
fn shared_layout(len: usize, page: usize) -> Option<(usize, usize)> {
    let data = len.checked_add(page - 1)? / page * page;
    let file = data.checked_add(page)?;
    (file <= i64::MAX as usize).then_some((data, file))
}

/// The state word at `addr` (page aligned, inside a live mapping).
///
/// # Safety
/// `addr` must point at the state page of a mapping that outlives `'a`.
unsafe fn state_word<'a>(addr: usize) -> &'a AtomicU32 {
    // SAFETY: page aligned (so aligned for u32) and mapped, per the caller;
    // every access to it is atomic, in every process.
    unsafe { AtomicU32::from_ptr(addr as *mut u32) }
}

/// Copies `len` bytes from `src` to `dst` (ranges may overlap).
///
/// # Safety
/// Both ranges must be valid for `len` bytes (see the module invariants).
pub(crate) unsafe fn copy(dst: usize, src: usize, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: the caller guarantees both ranges are valid for `len` bytes.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) }
}

/// Views registered memory as bytes, for a single I/O call.
///
/// # Safety
/// `addr..addr+len` must be valid for reads for the lifetime `'a`, which the
/// caller keeps to the duration of one send.
pub(crate) unsafe fn bytes<'a>(addr: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// Views registered memory as writable bytes, for a single I/O call.
///
/// # Safety
/// `addr..addr+len` must be valid for writes for the lifetime `'a`, which the
/// caller keeps to the duration of one receive.
pub(crate) unsafe fn bytes_mut<'a>(addr: usize, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

/// True when `[addr, addr+len)` lies inside `[base, base+base_len)`, with no
/// arithmetic overflow anywhere.
pub(crate) fn contains(base: usize, base_len: usize, addr: usize, len: usize) -> bool {
    let (Some(end), Some(base_end)) = (addr.checked_add(len), base.checked_add(base_len)) else {
        return false;
    };
    addr >= base && end <= base_end
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Identity of an open file, used to check that `/proc/<pid>/fd/<fd>` still
/// names the memfd a peer published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) size: u64,
    /// The file system's page: 4 KiB for a memfd, the huge page size for
    /// one on hugetlbfs (`MFD_HUGETLB`).
    pub(crate) page: usize,
}

fn file_id(fd: &OwnedFd) -> io::Result<FileId> {
    // SAFETY: fstat writes into the zeroed struct we own; fd is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let base = page_size();
    let blk = st.st_blksize as usize;
    Ok(FileId {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
        page: if blk.is_power_of_two() && blk > base {
            blk
        } else {
            base
        },
    })
}

/// Huge page sizes a region may ask for: what `MC_STORE_HUGEPAGE_SIZE`
/// accepts (2 MiB and 1 GiB, the x86-64 sizes).
pub const HUGE_PAGE_SIZES: [usize; 2] = [2 << 20, 1 << 30];

/// A shared mapping `[ptr, ptr+len)` of a file; unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is plain memory; access to its bytes follows the module
// invariants, and the pointer itself is only used to unmap.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map_shared(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: we ask the kernel for a fresh mapping of `len` bytes of an
        // open file; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr/len` is exactly the mapping created in `map_shared`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Engine-owned shared memory: a zeroed, page-aligned memfd mapping
/// (followed by its state page).
pub(crate) struct SharedRegion {
    map: Mapping,
    /// Data bytes (page rounded): the state page starts here.
    data_len: usize,
    fd: OwnedFd,
    id: FileId,
}

impl SharedRegion {
    /// Creates and maps `len` bytes (rounded up to whole pages in the file),
    /// on huge pages of `huge` bytes (one of [`HUGE_PAGE_SIZES`]) from the
    /// host's HugeTLB pool when given: none left is an error, never a quiet
    /// fall back to small pages.
    pub(crate) fn create(name: &str, len: usize, huge: Option<usize>) -> io::Result<SharedRegion> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "zero-length shared region",
            ));
        }
        let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        let page = match huge {
            None => page_size(),
            Some(h) if HUGE_PAGE_SIZES.contains(&h) => {
                flags |= libc::MFD_HUGETLB | (h.trailing_zeros() << libc::MFD_HUGE_SHIFT);
                h
            }
            Some(h) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("huge pages of {h} bytes: only 2 MiB and 1 GiB"),
                ))
            }
        };
        let (data_len, file_len) = shared_layout(len, page).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "shared region too large")
        })?;
        let cname = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad name"))?;
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new fd.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), file_len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on our own fd with integer arguments.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping::map_shared(&fd, file_len)?;
        let id = file_id(&fd)?;
        Ok(SharedRegion {
            map,
            data_len,
            fd,
            id,
        })
    }

    pub(crate) fn addr(&self) -> usize {
        self.map.ptr as usize
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.data_len
    }

    /// Tells peers' mappings that the region is no longer registered.
    pub(crate) fn mark_freed(&self) {
        // SAFETY: the state page lies inside our mapping, alive with `self`.
        unsafe { state_word(self.addr() + self.data_len) }.store(FREED, Ordering::SeqCst);
    }

    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    pub(crate) fn file_id(&self) -> FileId {
        self.id
    }
}

impl Drop for SharedRegion {
    /// However the region goes (freed, or its engine dropped), peers that
    /// mapped it stop copying into it.
    fn drop(&mut self) {
        self.mark_freed();
    }
}

/// A peer's [`SharedRegion`], mapped into this process.
pub(crate) struct PeerMapping {
    map: Mapping,
    /// Usable bytes (the published buffer length).
    len: usize,
    /// Offset of the state page in the mapping.
    state: usize,
}

impl PeerMapping {
    /// Opens `/proc/<pid>/fd/<fd>` and maps `len` bytes of it, after checking
    /// that the file is the one the peer published (`expect`) and is large
    /// enough. Any mismatch is an error; the caller falls back to TCP.
    pub(crate) fn open(pid: u32, fd: i32, expect: FileId, len: usize) -> io::Result<PeerMapping> {
        if len == 0 || fd < 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad peer region",
            ));
        }
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        let owned = OwnedFd::from(file);
        // Sealed against shrinking first, so the size checked below holds
        // for the mapping's whole life.
        // SAFETY: fcntl on an fd we own, no pointers.
        let seals = unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{path} is not a memfd sealed against shrinking"),
            ));
        }
        let id = file_id(&owned)?;
        if id.dev != expect.dev || id.ino != expect.ino {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{path} is not the published region"),
            ));
        }
        // The state page sits after the data rounded to the file's own page
        // (a huge page on hugetlbfs), as the owner laid it out.
        let Some((state, file_len)) = shared_layout(len, id.page) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad peer region",
            ));
        };
        if id.size < file_len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path} is smaller than {len} bytes and a state page"),
            ));
        }
        let map = Mapping::map_shared(&owned, file_len)?;
        // The mapping keeps the memory alive; the fd is no longer needed.
        Ok(PeerMapping { map, len, state })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Local address of `[offset, offset+len)` of the region, or `None` when
    /// the range is not entirely inside it.
    pub(crate) fn range(&self, offset: usize, len: usize) -> Option<usize> {
        contains(0, self.len, offset, len).then(|| self.map.ptr as usize + offset)
    }

    /// False once the owner freed the region: copies would go nowhere.
    pub(crate) fn is_live(&self) -> bool {
        // SAFETY: the state page lies inside our mapping, alive with `self`.
        unsafe { state_word(self.map.ptr as usize + self.state) }.load(Ordering::SeqCst) != FREED
    }
}

/// Tells whether a peer process still runs (a pidfd), so that its mapped
/// buffers are not used after it died: the mapping would keep the memory
/// alive and writes would vanish silently.
pub(crate) struct ProcessWatch {
    fd: OwnedFd,
}

impl ProcessWatch {
    pub(crate) fn open(pid: u32) -> io::Result<ProcessWatch> {
        let pid =
            libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        Ok(ProcessWatch {
            fd: unsafe { OwnedFd::from_raw_fd(raw as i32) },
        })
    }

    /// False once the process has exited (its pidfd turns readable).
    pub(crate) fn is_alive(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no waiting.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_rejects_overflow_and_edges() {
        assert!(contains(100, 50, 100, 50));
        assert!(contains(100, 50, 120, 0));
        assert!(!contains(100, 50, 99, 2));
        assert!(!contains(100, 50, 149, 2));
        assert!(!contains(100, 50, usize::MAX, 2));
        assert!(!contains(usize::MAX - 1, 10, usize::MAX - 1, 1));
        assert!(!contains(0, 10, 5, usize::MAX));
    }

    #[test]
    fn shared_region_is_zeroed_and_page_aligned() {
        let r = SharedRegion::create("test", 10_000, None).unwrap();
        assert_eq!(r.addr() % page_size(), 0);
        assert!(r.len() >= 10_000);
        // SAFETY: the whole region is our mapping.
        let b = unsafe { bytes(r.addr(), r.len()) };
        assert!(b.iter().all(|&x| x == 0));
    }

    #[test]
    fn shared_region_rejects_bad_sizes() {
        assert!(SharedRegion::create("zero", 0, None).is_err());
        assert!(SharedRegion::create("huge", usize::MAX, None).is_err());
        assert!(SharedRegion::create("bad\0name", 10, None).is_err());
    }

    /// Holds `pages` 2 MiB pages in the host's HugeTLB pool (root only),
    /// giving the pool back as it was on drop.
    struct HugePool(Option<String>);

    const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

    impl HugePool {
        fn reserve(pages: usize) -> HugePool {
            let old = std::fs::read_to_string(NR_HUGEPAGES).ok();
            let have: usize = old
                .as_deref()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let _ = std::fs::write(NR_HUGEPAGES, (have + pages).to_string());
            HugePool(old)
        }
    }

    impl Drop for HugePool {
        fn drop(&mut self) {
            if let Some(old) = &self.0 {
                let _ = std::fs::write(NR_HUGEPAGES, old.trim());
            }
        }
    }

    // SAFETY: geteuid has no preconditions.
    fn root() -> bool {
        unsafe { libc::geteuid() == 0 }
    }

    // One test: it changes the host's pool, which the others do not touch.
    #[test]
    fn shared_region_on_huge_pages() {
        const HUGE: usize = 2 << 20;
        assert!(
            SharedRegion::create("odd", 4096, Some(3 << 20)).is_err(),
            "3 MiB is no huge page size"
        );
        if !root() {
            eprintln!("skipped: needs root to size the HugeTLB pool");
            return;
        }
        let free = || {
            std::fs::read_to_string("/proc/meminfo")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0)
        };
        let pool = HugePool::reserve(4);
        let before = free();
        assert!(
            before >= 4,
            "the pool did not grow (HugePages_Free {before})"
        );
        // 3 MiB of data: two huge pages, the state page a third.
        let r = SharedRegion::create("huge", 3 << 20, Some(HUGE)).unwrap();
        assert_eq!(r.addr() % HUGE, 0);
        assert_eq!(r.len(), 4 << 20);
        assert_eq!(r.file_id().page, HUGE);
        // A peer finds the state page by the file's own page size.
        let m = PeerMapping::open(std::process::id(), r.raw_fd(), r.file_id(), 3 << 20).unwrap();
        let dst = m.range((3 << 20) - 16, 16).unwrap();
        assert!(m.range((3 << 20) - 15, 16).is_none());
        // SAFETY: `dst` is inside the peer mapping (bounds-checked above).
        unsafe { copy(dst, [9u8; 16].as_ptr() as usize, 16) };
        // SAFETY: the region is our mapping.
        assert_eq!(unsafe { bytes(r.addr() + (3 << 20) - 16, 16) }, [9u8; 16]);
        assert!(m.is_live());
        assert!(free() <= before - 2, "the data came from the pool");
        drop(r);
        assert!(!m.is_live(), "the owner's drop reaches the peer");
        drop(m);
        // More than the pool holds: an error, not small pages (or SIGBUS).
        assert!(SharedRegion::create("too-big", 64 << 20, Some(HUGE)).is_err());
        drop(pool);
    }

    #[test]
    fn peer_mapping_sees_the_same_bytes() {
        let r = SharedRegion::create("peer", 8192, None).unwrap();
        let id = r.file_id();
        let m = PeerMapping::open(std::process::id(), r.raw_fd(), id, 8192).unwrap();
        let src = [7u8; 16];
        let dst = m.range(100, 16).unwrap();
        // SAFETY: `dst` is inside the peer mapping (bounds-checked above).
        unsafe { copy(dst, src.as_ptr() as usize, 16) };
        // SAFETY: the owner's mapping is valid for its whole length.
        let owner = unsafe { bytes(r.addr(), r.len()) };
        assert_eq!(&owner[100..116], &src);
        assert_eq!(owner[99], 0);
        assert_eq!(owner[116], 0);
        // The owner's verdict reaches the peer's mapping.
        assert!(m.is_live());
        r.mark_freed();
        assert!(!m.is_live());
        drop(r);
        assert!(!m.is_live(), "the mapping outlives the owner's");
        // Dropping a region marks it freed too.
        let r = SharedRegion::create("dropped", 4096, None).unwrap();
        let m = PeerMapping::open(std::process::id(), r.raw_fd(), r.file_id(), 4096).unwrap();
        assert!(m.is_live());
        drop(r);
        assert!(!m.is_live());
    }

    #[test]
    fn process_watch_sees_exit() {
        let me = ProcessWatch::open(std::process::id()).unwrap();
        assert!(me.is_alive());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let watch = ProcessWatch::open(child.id()).unwrap();
        child.wait().unwrap();
        assert!(!watch.is_alive());
        assert!(ProcessWatch::open(u32::MAX).is_err());
        assert!(ProcessWatch::open(0).is_err());
    }

    #[test]
    fn shared_region_cannot_be_resized() {
        let r = SharedRegion::create("sealed", 8192, None).unwrap();
        // Any process that can open the fd (a peer, the owner) tries.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", r.raw_fd()))
            .unwrap();
        assert!(f.set_len(0).is_err(), "a published region shrank");
        assert!(f.set_len(1 << 20).is_err(), "a published region grew");
        assert_eq!(f.metadata().unwrap().len(), 8192 + page_size() as u64);
    }

    #[test]
    fn peer_mapping_requires_a_shrink_seal() {
        let pid = std::process::id();
        // An unsealed memfd: anyone holding it could shrink it under us.
        let name = CString::new("unsealed").unwrap();
        // SAFETY: memfd_create reads the name and returns a new fd.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: `raw` is a fresh fd nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own fd.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        let id = file_id(&fd).unwrap();
        assert!(PeerMapping::open(pid, fd.as_raw_fd(), id, 4096).is_err());
        // A regular file, whatever its published identity.
        let file = tempfile::tempfile().unwrap();
        file.set_len(4096).unwrap();
        let fd = OwnedFd::from(file);
        let id = file_id(&fd).unwrap();
        assert!(PeerMapping::open(pid, fd.as_raw_fd(), id, 4096).is_err());
    }

    #[test]
    fn peer_mapping_rejects_bad_input() {
        let r = SharedRegion::create("bad", 4096, None).unwrap();
        let id = r.file_id();
        let pid = std::process::id();
        // wrong inode
        assert!(PeerMapping::open(
            pid,
            r.raw_fd(),
            FileId {
                ino: id.ino + 1,
                ..id
            },
            4096
        )
        .is_err());
        // longer than the file
        assert!(PeerMapping::open(pid, r.raw_fd(), id, 1 << 20).is_err());
        // no such fd / pid
        assert!(PeerMapping::open(pid, -1, id, 4096).is_err());
        assert!(PeerMapping::open(pid, 1_000_000, id, 4096).is_err());
        assert!(PeerMapping::open(u32::MAX, r.raw_fd(), id, 4096).is_err());
        assert!(PeerMapping::open(pid, r.raw_fd(), id, 0).is_err());
        // bounds checks on a good mapping
        let m = PeerMapping::open(pid, r.raw_fd(), id, 4096).unwrap();
        assert_eq!(m.len(), 4096);
        assert!(m.range(0, 4096).is_some());
        assert!(m.range(1, 4096).is_none());
        assert!(m.range(4096, 1).is_none());
        assert!(m.range(usize::MAX, 1).is_none());
    }
}
