//! Bad handles, pointers and sizes handed to the C functions: each is an
//! error code, never a crash. Called through the crate's Rust paths (the
//! same functions the shared library exports).

use std::ffi::{c_char, c_int, c_void};
use std::ptr::{null, null_mut};

use mooncake_capi::engine::*;
use mooncake_capi::store::*;
use mooncake_capi::types::*;

/// Handles that are not live: null, forged, and one destroyed below.
fn bogus() -> [*mut c_void; 2] {
    [null_mut(), 0xdead_bee0 as *mut c_void]
}

fn engine() -> *mut c_void {
    let e = createTransferEngine(
        c"P2PHANDSHAKE".as_ptr(),
        c"127.0.0.1".as_ptr(),
        c"127.0.0.1".as_ptr(),
        0,
        0,
    );
    assert!(!e.is_null(), "engine starts");
    e
}

fn request(
    opcode: c_int,
    source: *mut c_void,
    target_id: i32,
    offset: u64,
    length: u64,
) -> TransferRequestC {
    TransferRequestC {
        opcode,
        source,
        target_id,
        target_offset: offset,
        length,
    }
}

fn engine_calls_fail(e: *mut c_void) {
    let mut buf = [0 as c_char; 64];
    let mut status = TransferStatusC::default();
    let mut n: c_int = 7;
    let note = NotifyMsg {
        name: c"n".as_ptr().cast_mut(),
        msg: c"m".as_ptr().cast_mut(),
    };
    let mut mem = vec![0u8; 4096];
    let p = mem.as_mut_ptr().cast::<c_void>();
    assert_eq!(discoverTopology(e), -1);
    assert_eq!(getLocalIpAndPort(e, buf.as_mut_ptr(), buf.len()), -1);
    assert!(installTransport(e, c"tcp".as_ptr(), null_mut()).is_null());
    assert_eq!(uninstallTransport(e, c"tcp".as_ptr()), -1);
    assert_eq!(openSegment(e, c"127.0.0.1:1".as_ptr()), -1);
    assert_eq!(openSegmentNoCache(e, c"x".as_ptr()), -1);
    assert_eq!(closeSegment(e, 1), -1);
    assert_eq!(warmupEfaSegment(e, c"x".as_ptr()), -1);
    assert_eq!(removeLocalSegment(e, c"x".as_ptr()), -1);
    assert_eq!(registerLocalMemory(e, p, mem.len(), null(), 1), -1);
    assert_eq!(unregisterLocalMemory(e, p), -1);
    assert_eq!(registerLocalMemoryBatch(e, null_mut(), 0, null()), -1);
    assert_eq!(unregisterLocalMemoryBatch(e, null_mut(), 0), -1);
    assert_eq!(allocateBatchID(e, 1), INVALID_BATCH);
    let mut r = request(OPCODE_READ, p, 0, 0, 1);
    assert_eq!(submitTransfer(e, 1, &mut r, 1), 1);
    assert_eq!(submitTransferWithNotify(e, 1, &mut r, 1, note), 1);
    assert_eq!(getTransferStatus(e, 1, 0, &mut status), 1);
    assert_eq!(freeBatchID(e, 1), 1);
    assert!(getNotifsFromEngine(e, &mut n).is_null());
    assert_eq!(n, -1, "a bad handle reports size -1");
    assert_eq!(genNotifyInEngine(e, 0, note), -1);
    assert_eq!(syncSegmentCache(e), -1);
    let mut count = 4usize;
    let mut stats = [NicLoadStat {
        device_name: [0; 64],
        inflight_bytes: 0,
        ewma_bandwidth_bps: 0.0,
    }; 4];
    assert_eq!(getNicLoadStats(e, stats.as_mut_ptr(), &mut count), -1);
    assert_eq!(showLinks(e, buf.as_mut_ptr(), buf.len(), 0), -1);
    enableGracefulShutdown(e);
    destroyTransferEngine(e);
}

#[test]
fn bad_engine_handles_are_errors() {
    for h in bogus() {
        engine_calls_fail(h);
    }
    let e = engine();
    destroyTransferEngine(e);
    engine_calls_fail(e);
}

#[test]
fn bad_pointers_and_sizes_are_errors() {
    let e = engine();
    let mut mem = vec![0u8; 1 << 16];
    let p = mem.as_mut_ptr().cast::<c_void>();
    let code = bad_pointers_and_sizes_are_errors as fn() as usize as *mut c_void;

    // Registration: null, empty, unmapped, wrapping, read-only memory.
    assert_eq!(registerLocalMemory(e, null_mut(), 64, null(), 1), -1);
    assert_eq!(registerLocalMemory(e, p, 0, null(), 1), -1);
    assert_eq!(
        registerLocalMemory(e, 0x1000 as *mut c_void, 64, null(), 1),
        -1
    );
    assert_eq!(
        registerLocalMemory(e, (usize::MAX - 8) as *mut c_void, 64, null(), 1),
        -1
    );
    assert_eq!(
        registerLocalMemory(e, code, 64, null(), 1),
        -1,
        "code is not writable"
    );
    assert_eq!(
        registerLocalMemory(e, p, mem.len() + (1 << 40), null(), 1),
        -1,
        "past the mapping"
    );
    assert_eq!(
        unregisterLocalMemory(e, p),
        -3,
        "ERR_ADDRESS_NOT_REGISTERED"
    );
    let mut entries = [BufferEntry {
        addr: 0x1000 as *mut c_void,
        length: 64,
    }];
    assert_eq!(
        registerLocalMemoryBatch(e, entries.as_mut_ptr(), 1, null()),
        -1
    );
    assert_eq!(registerLocalMemoryBatch(e, null_mut(), 3, null()), -1);
    assert_eq!(
        registerLocalMemoryBatch(e, entries.as_mut_ptr(), usize::MAX, null()),
        -1
    );
    assert_eq!(unregisterLocalMemoryBatch(e, null_mut(), 2), -1);
    assert_eq!(
        registerLocalMemory(e, p, mem.len(), c"cpu:0".as_ptr(), 1),
        0
    );
    assert_eq!(
        registerLocalMemory(e, p, 16, null(), 1),
        -7,
        "ERR_ADDRESS_OVERLAPPED"
    );

    // Strings and out-pointers.
    let mut small = [0 as c_char; 4];
    assert_eq!(getLocalIpAndPort(e, null_mut(), 64), -1);
    assert_eq!(
        getLocalIpAndPort(e, small.as_mut_ptr(), small.len()),
        -1,
        "truncated"
    );
    assert_eq!(small[3], 0, "NUL-terminated");
    let mut buf = [0 as c_char; 256];
    assert_eq!(getLocalIpAndPort(e, buf.as_mut_ptr(), buf.len()), 0);
    assert_eq!(openSegment(e, null()), -1);
    assert_eq!(openSegment(e, c"".as_ptr()), -1);
    assert_eq!(openSegment(e, c"///".as_ptr()), -1);
    assert!(openSegment(e, c"127.0.0.1:1".as_ptr()) < 0, "nobody there");
    assert_eq!(closeSegment(e, 4242), -1);
    assert_eq!(closeSegment(e, -5), -1);
    assert!(installTransport(e, c"rdma".as_ptr(), null_mut()).is_null());
    assert!(installTransport(e, null(), null_mut()).is_null());
    assert!(!installTransport(e, c"tcp".as_ptr(), null_mut()).is_null());
    assert_eq!(uninstallTransport(e, c"tcp".as_ptr()), -1);
    assert_eq!(removeLocalSegment(e, c"someone-else".as_ptr()), -1);
    let mut count = 0usize;
    assert_eq!(getNicLoadStats(e, null_mut(), &mut count), -1);
    assert_eq!(showLinks(e, null_mut(), 10, 1), -1);
    assert_eq!(showLinks(e, buf.as_mut_ptr(), buf.len(), 1), 0);

    // Batches and requests.
    assert_eq!(allocateBatchID(e, 0), INVALID_BATCH);
    let b = allocateBatchID(e, 4);
    assert_ne!(b, INVALID_BATCH);
    assert_eq!(submitTransfer(e, b, null_mut(), 1), 1);
    let mut r = request(OPCODE_READ, p, LOCAL_SEGMENT, p as u64, 64);
    assert_eq!(
        submitTransfer(e, b, &mut r, usize::MAX),
        1,
        "oversize count"
    );
    let mut bad_op = request(7, p, LOCAL_SEGMENT, p as u64, 64);
    assert_eq!(submitTransfer(e, b, &mut bad_op, 1), 1);
    let mut neg = request(OPCODE_READ, p, -3, p as u64, 64);
    assert_eq!(submitTransfer(e, b, &mut neg, 1), 1);
    let mut unknown = request(OPCODE_READ, p, 999, p as u64, 64);
    assert_eq!(submitTransfer(e, b, &mut unknown, 1), 1);
    let mut huge = request(OPCODE_READ, p, LOCAL_SEGMENT, p as u64, u64::MAX);
    assert_ne!(submitTransfer(e, b, &mut huge, 1), 0);
    let mut past = request(
        OPCODE_READ,
        p,
        LOCAL_SEGMENT,
        p as u64,
        mem.len() as u64 + 1,
    );
    assert_eq!(
        submitTransfer(e, b, &mut past, 1),
        3,
        "source past registered memory"
    );
    let mut unreg = request(
        OPCODE_READ,
        0x1000 as *mut c_void,
        LOCAL_SEGMENT,
        p as u64,
        8,
    );
    assert_eq!(submitTransfer(e, b, &mut unreg, 1), 3);
    let null_note = NotifyMsg {
        name: null_mut(),
        msg: null_mut(),
    };
    assert_eq!(submitTransferWithNotify(e, b, &mut r, 1, null_note), 1);
    assert_eq!(genNotifyInEngine(e, 0, null_note), -1);
    assert_eq!(genNotifyInEngine(e, u64::MAX, null_note), -1);
    assert_eq!(getTransferStatus(e, b, 0, null_mut()), 1);
    let mut st = TransferStatusC::default();
    assert_eq!(getTransferStatus(e, b, 99, &mut st), 1, "no such task");
    assert_eq!(freeBatchID(e, b), 0);
    assert_eq!(freeBatchID(e, b), 1, "freed");
    assert_eq!(getTransferStatus(e, b, 0, &mut st), 1, "freed");
    assert_eq!(submitTransfer(e, b, &mut r, 1), 1, "freed");
    assert_eq!(freeBatchID(e, 0xdead), 1);

    // A real local transfer still works after all that.
    let b = allocateBatchID(e, 1);
    mem[..8].copy_from_slice(b"abcdefgh");
    let mut copy = request(
        OPCODE_READ,
        p.wrapping_byte_add(1024),
        LOCAL_SEGMENT,
        p as u64,
        8,
    );
    assert_eq!(submitTransfer(e, b, &mut copy, 1), 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        assert_eq!(getTransferStatus(e, b, 0, &mut st), 0);
        if st.status == 4 || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(st.status, 4, "STATUS_COMPLETED");
    assert_eq!(&mem[1024..1032], b"abcdefgh");
    assert_eq!(freeBatchID(e, b), 0);

    // Notify arrays: null size, bogus arrays.
    assert!(getNotifsFromEngine(e, null_mut()).is_null());
    let mut fake = NotifyMsg {
        name: null_mut(),
        msg: null_mut(),
    };
    assert_eq!(freeNotifsMsgBuf(&mut fake, 1), -1);
    assert_eq!(freeNotifsMsgBuf(null_mut(), 0), 0);
    let note = NotifyMsg {
        name: c"me".as_ptr().cast_mut(),
        msg: c"hi".as_ptr().cast_mut(),
    };
    assert_eq!(genNotifyInEngine(e, 0, note), 0, "to itself");
    let mut n: c_int = 0;
    let arr = getNotifsFromEngine(e, &mut n);
    assert_eq!(n, 1);
    assert_eq!(freeNotifsMsgBuf(arr, 2), -1, "wrong size");
    assert_eq!(freeNotifsMsgBuf(arr, 1), 0);
    assert_eq!(freeNotifsMsgBuf(arr, 1), -1, "twice");

    assert_eq!(unregisterLocalMemory(e, p), 0);
    destroyTransferEngine(e);
    destroyTransferEngine(e);
}

#[test]
fn bad_store_handles_and_arguments_are_errors() {
    let mut buf = [0 as c_char; 64];
    let mut results = [0 as c_int; 2];
    let mut sizes64 = [0i64; 2];
    let keys = [c"a".as_ptr(), c"b".as_ptr()];
    let mut bufs = [null_mut::<c_void>(); 2];
    let sizes = [8usize, 8];
    let destroyed = mooncake_store_create();
    mooncake_store_destroy(destroyed);
    let not_set_up = mooncake_store_create();
    for s in [
        null_mut(),
        0xdead_bee0 as *mut c_void,
        destroyed,
        not_set_up,
    ] {
        let k = c"k".as_ptr();
        if s != not_set_up {
            // (Not on the live one: a null master address means 50051.)
            assert_eq!(
                mooncake_store_setup(s, null(), null(), 0, 0, null(), null(), null()),
                -1
            );
            assert_eq!(mooncake_store_init_all(s, null(), null(), 0), -1);
        }
        assert_eq!(
            mooncake_store_put(s, k, c"v".as_ptr().cast(), 1, null()),
            -1
        );
        assert_eq!(mooncake_store_put_from(s, k, null_mut(), 0, null()), -1);
        assert_eq!(
            mooncake_store_batch_put_from(
                s,
                keys.as_ptr(),
                bufs.as_mut_ptr(),
                sizes.as_ptr(),
                2,
                null(),
                results.as_mut_ptr()
            ),
            -1
        );
        assert_eq!(mooncake_store_get_into(s, k, null_mut(), 0), -1);
        assert_eq!(
            mooncake_store_batch_get_into(
                s,
                keys.as_ptr(),
                bufs.as_mut_ptr(),
                sizes.as_ptr(),
                2,
                sizes64.as_mut_ptr()
            ),
            -1
        );
        assert_eq!(mooncake_store_is_exist(s, k), -1);
        assert_eq!(
            mooncake_store_batch_is_exist(s, keys.as_ptr(), 2, results.as_mut_ptr()),
            -1
        );
        assert_eq!(mooncake_store_get_size(s, k), -1);
        assert_eq!(
            mooncake_store_get_hostname(s, buf.as_mut_ptr(), buf.len()),
            -1
        );
        assert_eq!(mooncake_store_remove(s, k, 1), -1);
        assert_eq!(mooncake_store_remove_by_regex(s, c".*".as_ptr(), 1), -1);
        assert_eq!(mooncake_store_remove_all(s, 1), -1);
        let mut mem = [0u8; 64];
        assert_eq!(
            mooncake_store_register_buffer(s, mem.as_mut_ptr().cast(), 64),
            -1
        );
        assert_eq!(
            mooncake_store_unregister_buffer(s, mem.as_mut_ptr().cast()),
            -1
        );
        let health = mooncake_store_health_check(s);
        assert_eq!(health, if s == not_set_up { 1 } else { -1 });
    }
    mooncake_store_destroy(not_set_up);
}

/// Two engines on `metadata`; `a` has registered memory and `b` opened it.
fn pair(metadata: &str, tag: &str) -> (*mut c_void, *mut c_void, std::ffi::CString, Vec<u8>) {
    let url = std::ffi::CString::new(metadata).unwrap();
    let name_a = std::ffi::CString::new(format!("capi-remove-{tag}-a")).unwrap();
    let name_b = std::ffi::CString::new(format!("capi-remove-{tag}-b")).unwrap();
    let start = |name: &std::ffi::CStr| {
        let e = createTransferEngine(url.as_ptr(), name.as_ptr(), c"127.0.0.1".as_ptr(), 0, 0);
        assert!(!e.is_null());
        e
    };
    let (a, b) = (start(&name_a), start(&name_b));
    let mut mem = vec![0u8; 4096];
    assert_eq!(
        registerLocalMemory(a, mem.as_mut_ptr().cast(), mem.len(), null(), 1),
        0
    );
    assert!(openSegment(b, name_a.as_ptr()) >= 0);
    assert_eq!(removeLocalSegment(a, name_b.as_ptr()), -1, "not its own");
    (a, b, name_a, mem)
}

#[test]
fn remove_local_segment_withdraws_the_descriptor() {
    let redis = test_support::services::redis();
    let (a, b, name_a, _mem) = pair(&format!("redis://{}", redis.addr), "redis");
    assert_eq!(removeLocalSegment(a, name_a.as_ptr()), 0);
    assert!(openSegmentNoCache(b, name_a.as_ptr()) < 0, "withdrawn");
    // Registering memory publishes the descriptor again.
    let mut more = vec![0u8; 4096];
    assert_eq!(
        registerLocalMemory(a, more.as_mut_ptr().cast(), more.len(), null(), 1),
        0
    );
    assert!(
        openSegmentNoCache(b, name_a.as_ptr()) >= 0,
        "published again"
    );
    destroyTransferEngine(b);
    destroyTransferEngine(a);
}

/// Our HTTP metadata server without a cluster token keeps a live engine's
/// keys from being deleted by anyone (it cannot tell who asks): the
/// metadata error, and the segment stays.
#[test]
fn remove_local_segment_on_a_guarding_http_server_is_err_metadata() {
    use mooncake_transfer::metadata::http_server::MetadataServer;
    let server = MetadataServer::spawn("127.0.0.1", 0).unwrap();
    let (a, b, name_a, _mem) = pair(&server.url(), "http");
    assert_eq!(removeLocalSegment(a, name_a.as_ptr()), -200);
    assert!(
        openSegmentNoCache(b, name_a.as_ptr()) >= 0,
        "still published"
    );
    destroyTransferEngine(b);
    destroyTransferEngine(a);
    server.stop();
}
