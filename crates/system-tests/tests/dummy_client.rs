//! The dummy (real/dummy split) client against real processes: a dummy
//! attached to a `mooncake_client` storage process, and the dummy service's
//! connection bounds, deadlines and malformed-frame answers. Ports are free
//! loopback ports; every wait is bounded.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_store::client::dummy_proto::{DummyRequest, DummyResponse};
use mooncake_store::client::{Client, ServiceLimits};
use mooncake_store::proto::frame::{decode_payload, encode_frame, read_frame};
use mooncake_store::types::ReplicaPolicy;

mod common;
use common::dummy::{answer, error_of, service};
use common::*;

/// Says Hello to the service at `addr` for `len` bytes of `fd` named `name`.
fn hello(addr: &str, name: &str, fd: i32, len: u64) -> DummyResponse {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut out = Vec::new();
    let req = DummyRequest::Hello {
        shm_name: name.into(),
        region_len: len,
        pid: std::process::id(),
        fd,
    };
    encode_frame(&req, &mut out).unwrap();
    s.write_all(&out).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut s, &mut buf).unwrap();
    decode_payload(&buf).unwrap()
}

#[test]
fn dummy_client_through_mooncake_client() {
    let cluster = Cluster::start(&[]);
    let s = cluster.storage("32MB");
    // The service maps only a memfd sealed against shrinking: a region a
    // dummy could truncate would SIGBUS the service (and every dummy).
    let name = format!("mooncake-dummy-{}-unsealed", std::process::id());
    let cname = std::ffi::CString::new(name.clone()).unwrap();
    // SAFETY: memfd_create reads the NUL-terminated name, returns a new fd.
    let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: `raw` is a fresh fd nothing else owns.
    let unsealed = unsafe { std::fs::File::from_raw_fd(raw) };
    unsealed.set_len(1 << 20).unwrap();
    match hello(&s.dummy_addr, &name, unsealed.as_raw_fd(), 1 << 20) {
        DummyResponse::Unit { result: Err(e) } => assert_eq!(e.code, ErrorCode::INVALID_PARAMS),
        other => panic!("an unsealed region was accepted: {other:?}"),
    }
    let dummy = Client::setup_dummy(8 << 20, 8 << 20, &s.dummy_addr).unwrap();
    assert_eq!(dummy.get_hostname(), s.segment);
    dummy.health_check().unwrap();
    let cfg = ReplicaPolicy::default();
    dummy.put("d1", &value("d1", 100_000), &cfg).unwrap();
    assert_eq!(dummy.get("d1").unwrap(), value("d1", 100_000));
    // Zero copy from the shared pool.
    let p = dummy.alloc_from_mem_pool(1 << 20).unwrap();
    // SAFETY: the pool handed out 1 MiB at `p`, alive until freed below.
    let pool = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, 1 << 20) };
    pool[..4096].copy_from_slice(&value("d2", 4096));
    dummy.put_from("d2", p, 4096, &cfg).unwrap();
    pool[..4096].fill(0);
    assert_eq!(dummy.get_into("d2", p + 8192, 4096).unwrap(), 4096);
    assert_eq!(&pool[8192..8192 + 4096], value("d2", 4096).as_slice());
    // Registered private memory goes through the staging pool.
    let mut private = value("d3", 10_000);
    let mut out = vec![0u8; 10_000];
    dummy
        .register_buffer(private.as_mut_ptr() as usize, private.len())
        .unwrap();
    dummy
        .register_buffer(out.as_mut_ptr() as usize, out.len())
        .unwrap();
    dummy
        .put_from("d3", private.as_ptr() as usize, private.len(), &cfg)
        .unwrap();
    assert_eq!(
        dummy
            .get_into("d3", out.as_mut_ptr() as usize, out.len())
            .unwrap(),
        10_000
    );
    assert_eq!(out, private);
    assert_eq!(
        code(dummy.get_into("d3", out.as_mut_ptr() as usize, 10)),
        ErrorCode::BUFFER_OVERFLOW
    );
    // Two parts at one private address, of different lengths: each staged
    // part is copied back with its own length (the 10-byte part once copied
    // 100 bytes, reading past its staging buffer).
    let d4 = value("d4", 110);
    dummy.put("d4", &d4, &cfg).unwrap();
    let mut twice = vec![0u8; 100];
    let at = twice.as_mut_ptr() as usize;
    dummy.register_buffer(at, twice.len()).unwrap();
    let r = dummy
        .batch_get_into_multi_buffers(&["d4".into()], &[vec![at, at]], &[vec![100, 10]], false)
        .unwrap();
    assert_eq!(*r[0].as_ref().unwrap(), 110);
    assert_eq!(&twice[..10], &d4[100..110]);
    assert_eq!(&twice[10..], &d4[10..100]);
    dummy.unregister_buffer(at).unwrap();
    let mut unregistered = [0u8; 16];
    assert_eq!(
        code(dummy.put_from("x", unregistered.as_mut_ptr() as usize, 16, &cfg)),
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED
    );
    // Batches and ranges.
    let keys: Vec<String> = (0..5).map(|i| format!("db-{i}")).collect();
    let vals: Vec<Vec<u8>> = keys.iter().map(|k| value(k, 3000)).collect();
    let refs: Vec<&[u8]> = vals.iter().map(Vec::as_slice).collect();
    assert!(dummy
        .put_batch(&keys, &refs, &cfg)
        .unwrap()
        .iter()
        .all(Result::is_ok));
    let got = dummy.get_batch(&keys);
    for (g, v) in got.iter().zip(&vals) {
        assert_eq!(g.as_ref().unwrap(), v);
    }
    let r = dummy.get_into_ranges(
        &[p],
        &[vec!["db-1".into()]],
        &[vec![vec![0, 10]]],
        &[vec![vec![5, 100]]],
        &[vec![vec![4, 6]]],
    );
    assert_eq!(*r[0][0][0].as_ref().unwrap(), 4);
    assert_eq!(&pool[..4], &vals[1][5..9]);
    assert_eq!(&pool[10..16], &vals[1][100..106]);
    // Visible to an embedded client too, and the other way round.
    let pure = cluster.pure_client();
    assert_eq!(pure.get("d3").unwrap(), private);
    pure.put("from-pure", b"hello dummy", &cfg).unwrap();
    assert_eq!(dummy.get("from-pure").unwrap(), b"hello dummy");
    assert!(dummy.is_exist("d1").unwrap());
    assert_eq!(dummy.get_size("d1").unwrap(), 100_000);
    assert_eq!(dummy.get_replica_desc("d1").unwrap().len(), 1);
    eventually("lease on d1 expires", || dummy.remove("d1", false).is_ok());
    assert_eq!(code(dummy.get("d1")), ErrorCode::OBJECT_NOT_FOUND);
    dummy.free_to_mem_pool(p).unwrap();
    dummy.close().unwrap();
}

/// True when the peer closes `s` (EOF or reset) within a bounded wait.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
        Ok(_) => panic!("unexpected bytes from the service"),
        Err(_) => false,
    }
}

/// True while `s` is open with nothing to read.
fn still_open(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let r = s.peek(&mut [0u8; 1]);
    s.set_nonblocking(false).unwrap();
    matches!(r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[test]
fn dummy_service_bounds_connections_and_stalled_calls() {
    let cluster = Cluster::start(&[]);
    let service = service(
        &cluster,
        ServiceLimits {
            max_connections: 3,
            frame_timeout: Duration::from_secs(1),
            ..ServiceLimits::default()
        },
    );
    let addr = service.local_addr();
    // Three idle connections fill the service; a fourth takes the place
    // of the oldest, which had no session.
    let mut idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let extra = TcpStream::connect(addr).unwrap();
    let mut oldest = idle.remove(0);
    assert!(
        closed_by_peer(&mut oldest),
        "the oldest connection without a session stayed"
    );
    idle.push(extra);
    // A call that declares 64 MiB and stalls after one byte is dropped...
    let mut stalled = idle.pop().unwrap();
    stalled.write_all(&(64u32 << 20).to_le_bytes()).unwrap();
    stalled.write_all(&[1]).unwrap();
    assert!(
        closed_by_peer(&mut stalled),
        "a stalled call kept its connection"
    );
    // ...while connections idle for longer than that stay open.
    assert!(idle.iter().all(still_open));
    // The freed slot serves a dummy.
    let mut dummy = None;
    eventually("a connection slot frees", || {
        dummy = Client::setup_dummy(1 << 20, 1 << 20, &addr.to_string()).ok();
        dummy.is_some()
    });
    let dummy = dummy.unwrap();
    let cfg = ReplicaPolicy::default();
    dummy.put("capped", b"served", &cfg).unwrap();
    assert_eq!(dummy.get("capped").unwrap(), b"served");
    dummy.close().unwrap();
    drop(idle);
    service.stop();
}

#[test]
fn dummy_service_answers_malformed_frames_and_closes_idle_connections_as_the_master() {
    let cluster = Cluster::start(&[]);
    let service = service(
        &cluster,
        ServiceLimits {
            idle_timeout: Some(Duration::from_secs(1)),
            ..ServiceLimits::default()
        },
    );
    let addr = service.local_addr();
    let connect = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s
    };
    // A length that cannot be trusted is answered, then the connection closes.
    for len in [u32::MAX, 0] {
        let mut s = connect();
        let e = error_of(answer(&mut s, &len.to_le_bytes()));
        assert_eq!(e, ErrorCode::DESERIALIZE_FAIL);
        assert!(closed_by_peer(&mut s), "a bad length kept its connection");
    }
    // A well-framed but undecodable payload is answered and the connection goes on.
    let mut s = connect();
    let mut garbage = 5u32.to_le_bytes().to_vec();
    garbage.extend_from_slice(&[mooncake_store::proto::PROTOCOL_VERSION, 200, 1, 2, 3]);
    assert_eq!(
        error_of(answer(&mut s, &garbage)),
        ErrorCode::DESERIALIZE_FAIL
    );
    let mut frame = Vec::new();
    encode_frame(&DummyRequest::Health {}, &mut frame).unwrap();
    let mut wrong_version = frame.clone();
    wrong_version[4] = 99;
    assert_eq!(
        error_of(answer(&mut s, &wrong_version)),
        ErrorCode::INVALID_VERSION
    );
    assert_eq!(
        answer(&mut s, &frame),
        DummyResponse::Unit { result: Ok(()) }
    );
    // Silent past the idle limit: closed by the service, which still serves.
    assert!(closed_by_peer(&mut s), "an idle connection stayed open");
    assert_eq!(
        answer(&mut connect(), &frame),
        DummyResponse::Unit { result: Ok(()) }
    );
    service.stop();
}
