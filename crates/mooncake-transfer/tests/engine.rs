//! Two engines in one process over P2P handshake: every path (local memcpy,
//! same-host shared memory, TCP) moves the right bytes, and bad requests get
//! their error codes.

use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_transfer::{
    EngineConfig, Notify, Opcode, TransferEngine, TransferRequest, TransferState,
};

fn engine(force_tcp: bool) -> TransferEngine {
    let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
    c.rpc_bind_address = Some("127.0.0.1".into());
    c.force_tcp = force_tcp;
    c.slice_size = 4096; // many slices per request, spread over connections
    c.transfer_timeout = Duration::from_secs(20);
    TransferEngine::new(c).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A managed buffer viewed as bytes (the engine keeps it mapped).
fn managed(e: &TransferEngine, len: usize) -> &'static mut [u8] {
    let addr = e.allocate_managed_buffer(len).unwrap();
    // SAFETY: the engine owns `len` mapped bytes at `addr` until freed; tests
    // never free them while the slice is in use.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

fn req(op: Opcode, local: &[u8], target: u64, remote: u64, len: usize) -> TransferRequest {
    TransferRequest {
        opcode: op,
        source: local.as_ptr() as usize,
        target_id: target,
        target_offset: remote,
        length: len,
    }
}

fn round_trip(a: &TransferEngine, b: &TransferEngine) {
    const LEN: usize = 300_000; // not a multiple of the slice size
    let local = managed(a, LEN);
    let remote = managed(b, LEN);
    local.copy_from_slice(&pattern(LEN, 1));
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let remote_addr = a.first_buffer_address(&b.local_server_name()).unwrap();
    assert_eq!(remote_addr, remote.as_ptr() as u64);

    a.transfer_sync(&[req(Opcode::Write, local, seg, remote_addr, LEN)])
        .unwrap();
    assert!(remote[..] == pattern(LEN, 1)[..], "write landed");

    remote.copy_from_slice(&pattern(LEN, 9));
    a.transfer_sync(&[req(Opcode::Read, local, seg, remote_addr, LEN)])
        .unwrap();
    assert!(local[..] == pattern(LEN, 9)[..], "read landed");

    // A batch of small requests at odd offsets, both directions.
    let batch = a.allocate_batch(64).unwrap();
    let reqs: Vec<_> = (0..32)
        .map(|i| {
            let off = i * 997;
            let op = if i % 2 == 0 {
                Opcode::Write
            } else {
                Opcode::Read
            };
            req(
                op,
                &local[off..],
                seg,
                remote_addr + off as u64 + 50_000,
                997,
            )
        })
        .collect();
    let expect_local = local.to_vec();
    let expect_remote = remote.to_vec();
    a.submit(batch, &reqs).unwrap();
    let s = a.wait_batch(batch).unwrap();
    assert_eq!(s.state, TransferState::Completed);
    assert_eq!(s.transferred_bytes, 32 * 997);
    for i in 0..32 {
        assert_eq!(
            a.transfer_status(batch, i).unwrap().state,
            TransferState::Completed
        );
        let off = i * 997;
        let (l, r) = (&local[off..off + 997], &remote[off + 50_000..off + 50_997]);
        if i % 2 == 0 {
            assert_eq!(r, &expect_local[off..off + 997]);
        } else {
            assert_eq!(l, &expect_remote[off + 50_000..off + 50_997]);
        }
    }
    a.free_batch(batch).unwrap();
}

#[test]
fn tcp_round_trip() {
    let (a, b) = (engine(true), engine(true));
    round_trip(&a, &b);
    let s = a.transport_stats();
    assert!(s.tcp > 0 && s.shm == 0 && s.local == 0, "{s:?}");
}

#[test]
fn shm_round_trip() {
    let (a, b) = (engine(false), engine(false));
    round_trip(&a, &b);
    let s = a.transport_stats();
    assert!(s.shm > 0 && s.tcp == 0 && s.local == 0, "{s:?}");
}

#[test]
fn user_registered_memory_goes_over_tcp() {
    let (a, b) = (engine(false), engine(false));
    let mut theirs = vec![0u8; 100_000];
    b.register_local_memory(theirs.as_mut_ptr() as usize, theirs.len(), "cpu:0", true)
        .unwrap();
    let mine = pattern(100_000, 3);
    a.register_local_memory(mine.as_ptr() as usize, mine.len(), "*", true)
        .unwrap();
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    a.transfer_sync(&[req(
        Opcode::Write,
        &mine,
        seg,
        theirs.as_ptr() as u64,
        mine.len(),
    )])
    .unwrap();
    assert!(theirs == mine);
    assert_eq!(a.transport_stats().tcp, 1);
    b.unregister_local_memory(theirs.as_ptr() as usize).unwrap();
}

#[test]
fn own_segment_is_a_memcpy() {
    let a = engine(false);
    let buf = managed(&a, 8192);
    buf[..4096].copy_from_slice(&pattern(4096, 5));
    let me = a.open_segment(&a.local_server_name()).unwrap();
    let src = &buf[..4096];
    a.transfer_sync(&[req(
        Opcode::Write,
        src,
        me,
        buf.as_ptr() as u64 + 4096,
        4096,
    )])
    .unwrap();
    assert_eq!(&buf[4096..], &pattern(4096, 5)[..]);
    assert_eq!(a.transport_stats().local, 1);
    assert_eq!(a.segment_descriptor(me).unwrap().buffers.len(), 1);
}

#[test]
fn bad_requests_get_codes() {
    let (a, b) = (engine(true), engine(true));
    let local = managed(&a, 4096);
    let remote = managed(&b, 4096);
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let raddr = remote.as_ptr() as u64;

    // Unregistered local memory.
    let stray = vec![0u8; 64];
    let e = a
        .transfer_sync(&[req(Opcode::Write, &stray, seg, raddr, 64)])
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::ERR_ADDRESS_NOT_REGISTERED);
    // Local range running past its buffer.
    let e = a
        .transfer_sync(&[req(Opcode::Write, &local[4000..], seg, raddr, 200)])
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::ERR_ADDRESS_NOT_REGISTERED);
    // Remote range outside every buffer of the target.
    for (off, len) in [(4000u64, 200usize), (8192, 1), (u64::MAX - 10, 64)] {
        let e = a
            .transfer_sync(&[req(Opcode::Read, local, seg, raddr.wrapping_add(off), len)])
            .unwrap_err();
        assert_eq!(
            e.code,
            ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
            "offset {off}"
        );
    }
    // Unknown handle and batch.
    let e = a
        .transfer_sync(&[req(Opcode::Read, local, 999, raddr, 8)])
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::ERR_INVALID_ARGUMENT);
    assert_eq!(
        a.batch_status(12345).unwrap_err().code,
        ErrorCode::ERR_INVALID_ARGUMENT
    );
    // Batch capacity.
    let batch = a.allocate_batch(1).unwrap();
    let two = [
        req(Opcode::Read, local, seg, raddr, 8),
        req(Opcode::Read, local, seg, raddr, 8),
    ];
    assert_eq!(
        a.submit(batch, &two).unwrap_err().code,
        ErrorCode::ERR_TOO_MANY_REQUESTS
    );
    a.free_batch(batch).unwrap();
    // Nothing leaked into the target.
    assert!(remote.iter().all(|&x| x == 0));
    // Unknown segments.
    assert_eq!(
        a.open_segment("not-a-host-port").unwrap_err().code,
        ErrorCode::ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        a.open_segment("no.such.host.invalid:1234")
            .unwrap_err()
            .code,
        ErrorCode::ERR_DNS
    );
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    assert_eq!(
        a.open_segment(&format!("127.0.0.1:{closed_port}"))
            .unwrap_err()
            .code,
        ErrorCode::ERR_METADATA
    );
    // Registration errors.
    assert_eq!(
        a.register_local_memory(local.as_ptr() as usize, 10, "cpu:0", true)
            .unwrap_err()
            .code,
        ErrorCode::ERR_ADDRESS_OVERLAPPED
    );
    assert_eq!(
        a.unregister_local_memory(12345).unwrap_err().code,
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED
    );
    assert_eq!(
        a.allocate_managed_buffer(0).unwrap_err().code,
        ErrorCode::ERR_INVALID_ARGUMENT
    );
}

#[test]
fn metadata_server_must_be_reachable_or_valid() {
    let c = EngineConfig::defaults("ftp://nowhere", "127.0.0.1");
    assert_eq!(
        TransferEngine::new(c).err().unwrap().code,
        ErrorCode::ERR_METADATA
    );
}

/// As the reference on a host without an RDMA NIC: `rdma` starts and moves
/// bytes (over TCP here).
#[test]
fn rdma_runs_over_tcp() {
    let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
    c.protocol = "rdma".into();
    c.device_name = "mlx5_0".into();
    c.force_tcp = true;
    let a = TransferEngine::new(c).unwrap();
    let b = engine(true);
    let src = a.allocate_managed_buffer(4096).unwrap();
    let dst = b.allocate_managed_buffer(4096).unwrap();
    // SAFETY: `src` is a 4096-byte managed buffer of `a`.
    unsafe { std::ptr::write_bytes(src as *mut u8, 0x5a, 4096) };
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let req = TransferRequest {
        opcode: Opcode::Write,
        source: src,
        target_id: seg,
        target_offset: dst as u64,
        length: 4096,
    };
    a.transfer_sync(&[req]).unwrap();
    // SAFETY: `dst` is a 4096-byte managed buffer of `b`, written above.
    let got = unsafe { std::slice::from_raw_parts(dst as *const u8, 4096) };
    assert!(got.iter().all(|&x| x == 0x5a));
    assert_eq!(
        a.segment_descriptor(a.open_segment(&a.local_server_name()).unwrap())
            .unwrap()
            .protocol,
        "tcp"
    );
}

#[test]
fn notifies_with_and_without_transfer() {
    let (a, b) = (engine(true), engine(true));
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    a.send_notify(
        seg,
        Notify {
            name: "n1".into(),
            msg: "hello".into(),
        },
    )
    .unwrap();
    assert_eq!(
        b.get_notifies(),
        vec![Notify {
            name: "n1".into(),
            msg: "hello".into()
        }]
    );
    assert!(b.get_notifies().is_empty(), "drained");

    let local = managed(&a, 4096);
    let remote = managed(&b, 4096);
    local.fill(7);
    let batch = a.allocate_batch(1).unwrap();
    let r = [req(Opcode::Write, local, seg, remote.as_ptr() as u64, 4096)];
    a.submit_with_notify(
        batch,
        &r,
        Notify {
            name: "n2".into(),
            msg: "done".into(),
        },
    )
    .unwrap();
    assert_eq!(a.wait_batch(batch).unwrap().state, TransferState::Completed);
    // Delivered asynchronously after completion; poll with a generous bound.
    let mut got = vec![];
    for _ in 0..500 {
        got.extend(b.get_notifies());
        if !got.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        got,
        vec![Notify {
            name: "n2".into(),
            msg: "done".into()
        }]
    );
    assert!(remote.iter().all(|&x| x == 7));
}

/// Undrained notifies are bounded (64 MiB): past that a peer's notify is
/// refused with a code, and accepted again once the application drains.
#[test]
fn notify_queue_is_bounded() {
    let (a, b) = (engine(true), engine(true));
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let big = |i: usize| Notify {
        name: format!("n{i}"),
        msg: "x".repeat(1_000_000),
    };
    let mut accepted = 0;
    let refused = loop {
        assert!(accepted < 200, "notifies are not bounded");
        match a.send_notify(seg, big(accepted)) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(refused.code, ErrorCode::ERR_TOO_MANY_REQUESTS);
    assert!(accepted >= 60, "only {accepted} accepted");
    let got = b.get_notifies();
    assert_eq!(got.len(), accepted);
    assert!(got.iter().enumerate().all(|(i, n)| *n == big(i)));
    a.send_notify(seg, big(0)).unwrap();
    assert_eq!(b.get_notifies(), vec![big(0)]);
}

#[test]
fn p2p_names_carry_the_rpc_port() {
    let a = engine(true);
    assert_eq!(a.local_server_name(), format!("127.0.0.1:{}", a.rpc_port()));
    assert_eq!(a.hostname(), "127.0.0.1");
    let b = engine(true);
    assert_eq!(a.first_buffer_address(&b.local_server_name()).unwrap(), 0);
}

#[test]
fn out_of_range_config_values_do_not_break_the_engine() {
    let make = || {
        let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
        c.rpc_bind_address = Some("127.0.0.1".into());
        c.force_tcp = true;
        c.transfer_timeout = Duration::ZERO;
        c.slice_size = 0;
        c.tcp_connections = 0;
        c.handshake_max_length = 0;
        TransferEngine::new(c).unwrap()
    };
    let (a, b) = (make(), make());
    assert_eq!(a.config().transfer_timeout, Duration::from_secs(30));
    let local = managed(&a, 4096);
    let remote = managed(&b, 4096);
    local.fill(9);
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    a.transfer_sync(&[req(
        Opcode::Write,
        &local[..100],
        seg,
        remote.as_ptr() as u64,
        100,
    )])
    .unwrap();
    assert!(remote[..100].iter().all(|&x| x == 9) && remote[100] == 0);
}

#[test]
fn copy_shared_moves_bytes_to_and_from_unregistered_memory() {
    let (a, b) = (engine(false), engine(false));
    const LEN: usize = 200_000;
    let remote = managed(&b, LEN);
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let base = a.first_buffer_address(&b.local_server_name()).unwrap();
    // Plain heap memory, never registered with `a`.
    let mine = pattern(LEN, 4);
    // SAFETY: `mine` is readable for LEN bytes during the call.
    let wrote = unsafe { a.copy_shared(seg, Opcode::Write, mine.as_ptr() as usize, base, LEN) };
    assert!(wrote.unwrap());
    assert!(remote[..] == mine[..]);
    let mut back = vec![0u8; 1000];
    // SAFETY: `back` is writable for 1000 bytes during the call.
    let read = unsafe {
        a.copy_shared(
            seg,
            Opcode::Read,
            back.as_mut_ptr() as usize,
            base + 5000,
            1000,
        )
    };
    assert!(read.unwrap());
    assert!(back[..] == mine[5000..6000]);
    assert_eq!(a.transport_stats().shm, 2);

    // Ranges shared memory does not serve copy nothing: past the buffer's
    // end, outside any buffer, zero length.
    let mut spare = vec![7u8; LEN + 1];
    for (remote_addr, len) in [
        (base, LEN + 1),
        (base + LEN as u64, 1),
        (base - 4096, 16),
        (base, 0),
    ] {
        // SAFETY: `spare` is writable for up to LEN + 1 bytes.
        let r = unsafe {
            a.copy_shared(
                seg,
                Opcode::Read,
                spare.as_mut_ptr() as usize,
                remote_addr,
                len,
            )
        };
        assert!(!r.unwrap(), "{remote_addr:#x}+{len}");
    }
    assert!(spare.iter().all(|&x| x == 7), "nothing was written");
    // An unknown segment handle is an error, not a copy.
    // SAFETY: as above.
    let r = unsafe { a.copy_shared(999, Opcode::Read, spare.as_mut_ptr() as usize, base, 8) };
    assert_eq!(r.unwrap_err().code, ErrorCode::ERR_INVALID_ARGUMENT);

    // With shared memory off (MC_FORCE_TCP), nothing is served directly.
    let (c, d) = (engine(true), engine(true));
    let _theirs = managed(&d, 4096);
    let seg = c.open_segment(&d.local_server_name()).unwrap();
    let base = c.first_buffer_address(&d.local_server_name()).unwrap();
    // SAFETY: as above.
    let r = unsafe { c.copy_shared(seg, Opcode::Read, spare.as_mut_ptr() as usize, base, 8) };
    assert!(!r.unwrap());
    // And a segment of our own is the local transport's business.
    let me = a.open_segment(&a.local_server_name()).unwrap();
    // SAFETY: as above.
    let r = unsafe { a.copy_shared(me, Opcode::Read, spare.as_mut_ptr() as usize, base, 8) };
    assert!(!r.unwrap());
}

/// A same-host peer's freed managed buffer: writes and reads fail as over TCP
/// (the owner says it is not registered) instead of landing in a stale
/// mapping, and a buffer the peer allocates later is reachable.
#[test]
fn freed_peer_buffer_is_not_written_through_a_stale_mapping() {
    let (a, b) = (engine(false), engine(false));
    const LEN: usize = 1 << 16;
    let local = managed(&a, LEN);
    local.fill(3);
    let remote = b.allocate_managed_buffer(LEN).unwrap();
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let write = req(Opcode::Write, local, seg, remote as u64, LEN);
    a.transfer_sync(&[write]).unwrap();
    assert_eq!(a.transport_stats().shm, 1, "went through shared memory");

    b.free_managed_buffer(remote, LEN).unwrap();
    for op in [Opcode::Write, Opcode::Read] {
        let r = a.transfer_sync(&[req(op, local, seg, remote as u64, LEN)]);
        assert_eq!(
            r.unwrap_err().code,
            ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
            "{op:?} of a freed buffer"
        );
    }
    assert!(
        local.iter().all(|&x| x == 3),
        "a failed read left local memory"
    );

    // The peer's next buffer is used normally (mapped anew once refreshed).
    let again = managed(&b, LEN);
    a.refresh_segment(seg).unwrap();
    a.transfer_sync(&[req(Opcode::Write, local, seg, again.as_ptr() as u64, LEN)])
        .unwrap();
    assert!(again.iter().all(|&x| x == 3));
    assert_eq!(a.transport_stats().shm, 2, "the new buffer is mapped");

    // A peer engine dropped (its process lives on) takes its buffers along.
    drop(b);
    let r = a.transfer_sync(&[req(Opcode::Write, local, seg, again.as_ptr() as u64, LEN)]);
    assert!(r.is_err(), "write into a dropped engine's buffer: {r:?}");
    assert_eq!(a.transport_stats().shm, 2);
}

/// `copy_shared` never serves a buffer its same-host owner has freed.
#[test]
fn copy_shared_refuses_a_freed_peer_buffer() {
    let (a, b) = (engine(false), engine(false));
    const LEN: usize = 1 << 16;
    let remote = b.allocate_managed_buffer(LEN).unwrap();
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let mine = pattern(LEN, 2);
    // SAFETY: `mine` is readable for LEN bytes during the call.
    let r = unsafe {
        a.copy_shared(
            seg,
            Opcode::Write,
            mine.as_ptr() as usize,
            remote as u64,
            LEN,
        )
    };
    assert!(r.unwrap());
    b.free_managed_buffer(remote, LEN).unwrap();
    // SAFETY: as above.
    let r = unsafe {
        a.copy_shared(
            seg,
            Opcode::Write,
            mine.as_ptr() as usize,
            remote as u64,
            LEN,
        )
    };
    assert!(
        !r.unwrap(),
        "a freed buffer is left to the engine, which asks the owner"
    );
}
