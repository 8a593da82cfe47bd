//! Shared by the fuzz targets: a counting allocator, so that every target
//! can check that decoding an input costs heap in proportion to its size
//! (a length field that lies must not buy memory), and the round-trip
//! check of the master codec.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The system allocator, counting the bytes live and their peak.
pub struct Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize, transient: usize) {
    let live = LIVE.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(live + transient, Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are
// added around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size(), 0);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size(), 0);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            let old = layout.size();
            if new_size >= old {
                // A moving realloc holds both blocks while it copies.
                grew(new_size - old, old);
            } else {
                LIVE.fetch_sub(old - new_size, Relaxed);
            }
        }
        p
    }
}

/// Fixed heap any decode may use whatever its input: read-ahead buffers
/// (the master's frame reader starts at 64 KiB), parser state.
pub const SLACK: usize = 256 << 10;

/// Heap per input byte allowed to the binary codecs (master and dummy
/// protocols).
pub const BINARY_PER_BYTE: usize = 1024;

/// Runs `f` (decoding an input of `input_len` bytes) and panics when the
/// heap it needed at its peak exceeds `per_byte * input_len + SLACK`.
///
/// `per_byte` is the target's own bound: what a decoded value may really
/// take per byte of its encoding (e.g. 32 bytes for a `Result<(), Error>`
/// encoded in one byte), times two for a vector's growth.
pub fn within_budget<R>(input_len: usize, per_byte: usize, f: impl FnOnce() -> R) -> R {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    let used = PEAK.load(Relaxed).saturating_sub(base);
    let budget = per_byte * input_len + SLACK;
    static STATS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let stats = *STATS.get_or_init(|| std::env::var_os("MOONCAKE_FUZZ_HEAP_STATS").is_some());
    if stats && input_len >= 64 {
        static MAX_RATIO: AtomicUsize = AtomicUsize::new(0);
        let ratio = used / input_len;
        if ratio > MAX_RATIO.fetch_max(ratio, Relaxed) {
            eprintln!("heap: {used} bytes for {input_len} input bytes ({ratio} per byte)");
        }
    }
    assert!(
        used <= budget,
        "decoding {input_len} bytes took {used} bytes of heap at its peak (budget {budget})"
    );
    out
}

/// Checks a message decoded from `payload` (a master-protocol payload:
/// version byte, message) against its re-encoding: the re-encoded frame
/// decodes to the same message, and is never longer than the input (the
/// only freedom of the encoding is an over-long varint), and equal in
/// length only when byte for byte the same.
#[macro_export]
macro_rules! check_round_trip {
    ($ty:ty, $payload:expr, $msg:expr) => {{
        use mooncake_store::proto::frame::{decode_payload, encode_frame, LEN_PREFIX};
        let (payload, msg): (&[u8], &$ty) = ($payload, $msg);
        let mut frame = Vec::new();
        encode_frame(msg, &mut frame).expect("a decoded message fits a frame");
        let again = &frame[LEN_PREFIX..];
        let back: $ty = decode_payload(again).expect("a re-encoded message decodes");
        assert_eq!(&back, msg);
        assert!(again.len() <= payload.len(), "re-encoding grew");
        if again.len() == payload.len() {
            assert_eq!(again, payload, "same length, different bytes");
        }
    }};
}
