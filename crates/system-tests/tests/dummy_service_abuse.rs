//! The dummy service (`mooncake_client`) against strangers on loopback and
//! on its Unix socket: idle sockets by the thousand, calls without a
//! session, stolen or guessed session tokens, other users. Waits are
//! bounded; nothing asserts a duration.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_store::client::dummy_proto::{local_socket_name, DummyRequest, DummyResponse};
use mooncake_store::client::{Client, DummyTransport, ServiceLimits, StoreService};
use mooncake_store::proto::frame::{decode_payload, encode_frame};
use mooncake_store::types::ReplicaPolicy;

mod common;
use common::dummy::{call, error_of, service};
use common::*;

const WAIT: Duration = Duration::from_secs(30);

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

/// A connection to the service's abstract Unix socket.
fn connect_local(service: &StoreService) -> UnixStream {
    let name = service
        .local_socket()
        .expect("the service has a Unix socket");
    assert_eq!(name, local_socket_name(service.local_addr().port()));
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
    let s = UnixStream::connect_addr(&addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

/// Connections accepted on the abstract Unix socket `name` (the kernel's
/// table shows an accepted socket under its listener's name, connected).
fn accepted_on(name: &str) -> usize {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let want = format!("@{name}");
    table
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // State 03: connected.
            f.len() == 8 && f[5] == "03" && f[7] == want
        })
        .count()
}

/// The session token a dummy was given, read through a second `Hello`
/// the way a stranger could not: from the dummy's own process (this one).
fn hello_token(addr: SocketAddr) -> (TcpStream, u64, tempfile_region::Region) {
    let region = tempfile_region::Region::new(1 << 20);
    let mut s = connect(addr);
    let resp = call(
        &mut s,
        &DummyRequest::Hello {
            shm_name: region.name.clone(),
            region_len: 1 << 20,
            pid: std::process::id(),
            fd: region.fd,
        },
    );
    match resp {
        DummyResponse::Session { session, .. } => (s, session, region),
        other => panic!("Hello refused: {other:?}"),
    }
}

/// A sealed memfd shared the way a dummy shares its region.
mod tempfile_region {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    pub struct Region {
        pub name: String,
        pub fd: i32,
        _file: OwnedFd,
    }

    impl Region {
        pub fn new(len: u64) -> Region {
            let name = format!("mooncake-dummy-{}-abuse", std::process::id());
            let cname = std::ffi::CString::new(name.clone()).unwrap();
            // SAFETY: a valid C string; the descriptor is owned below.
            let fd = unsafe {
                libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
            };
            assert!(fd >= 0);
            // SAFETY: `fd` was just created and is owned by nobody else.
            let file = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: a valid descriptor.
            assert_eq!(unsafe { libc::ftruncate(file.as_raw_fd(), len as i64) }, 0);
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            // SAFETY: a valid memfd created with sealing allowed.
            assert_eq!(
                unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) },
                0
            );
            Region {
                name,
                fd,
                _file: file,
            }
        }
    }
}

#[test]
fn calls_need_a_session_and_tokens_are_not_transferable() {
    let cluster = Cluster::start(&[]);
    let service = service(&cluster, ServiceLimits::default());
    let addr = service.local_addr();
    let mut stranger = connect(addr);
    // Destructive and data calls without a session are refused.
    for req in [
        DummyRequest::RemoveAll { force: true },
        DummyRequest::Remove {
            keys: vec!["k".into()],
            force: true,
        },
        DummyRequest::RemoveByRegex {
            pattern: ".*".into(),
            force: true,
        },
        DummyRequest::IsExist {
            keys: vec!["k".into()],
        },
    ] {
        assert_eq!(
            error_of(call(&mut stranger, &req)),
            ErrorCode::ILLEGAL_CLIENT,
            "{req:?}"
        );
    }
    // `Health` needs none.
    assert_eq!(
        call(&mut stranger, &DummyRequest::Health {}),
        DummyResponse::Unit { result: Ok(()) }
    );

    // A real session: tokens are not sequential, and a guessed one (the
    // old sequential ids) is refused.
    let (_owner, token, _region) = hello_token(addr);
    let (_owner2, token2, _region2) = hello_token(addr);
    assert!(token != 0 && token2 != 0 && token.abs_diff(token2) > 1 << 20);
    for guess in [1, 2, token ^ 1] {
        assert_eq!(
            error_of(call(
                &mut stranger,
                &DummyRequest::Attach { session: guess }
            )),
            ErrorCode::CLIENT_NOT_FOUND
        );
    }
    // The owner's own process joins with its token.
    let mut second = connect(addr);
    assert!(matches!(
        call(&mut second, &DummyRequest::Attach { session: token }),
        DummyResponse::Session { session, .. } if session == token
    ));
    // A stolen token, used from another process, is refused.
    assert_eq!(
        steal(&addr.to_string(), token),
        ErrorCode::CLIENT_NOT_FOUND.code()
    );
    service.stop();
}

/// Presents `token` in `Attach` from another process, over `target`
/// (`host:port`, or `@name` for an abstract Unix socket): the error code,
/// 0 when accepted.
fn steal(target: &str, token: u64) -> i32 {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!("{CONNECT_PY}{STEAL}"))
        .arg(target)
        .arg(token.to_string())
        .arg(mooncake_store::proto::PROTOCOL_VERSION.to_string())
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Connects to `sys.argv[1]`: `@name` (abstract Unix socket) or `host:port`.
const CONNECT_PY: &str = r#"
import socket, sys
def connect(target, timeout=None):
    if target.startswith("@"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect("\0" + target[1:])
        return s
    host, port = target.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)
"#;

/// Sends `Attach{token}` from another process and prints the error code
/// (0 when accepted). Frame: u32 length, the protocol version (`argv[3]`),
/// tag 2, varint token.
const STEAL: &str = r#"
import struct
token = int(sys.argv[2])
body = bytearray([int(sys.argv[3]), 2])
while True:
    b = token & 0x7f
    token >>= 7
    if token:
        body.append(b | 0x80)
    else:
        body.append(b)
        break
s = connect(sys.argv[1])
s.sendall(struct.pack("<I", len(body)) + body)
n = struct.unpack("<I", s.recv(4, socket.MSG_WAITALL))[0]
a = s.recv(n, socket.MSG_WAITALL)
# version, tag 2 (Unit), 1 (Err), zigzag code
if a[1] != 2 or a[2] != 1:
    print(0)
    sys.exit(0)
z, shift, i = 0, 0, 3
while True:
    z |= (a[i] & 0x7f) << shift
    shift += 7
    if a[i] & 0x80 == 0:
        break
    i += 1
print((z >> 1) ^ -(z & 1))
"#;

#[test]
fn thousands_of_idle_sockets_do_not_lock_dummies_out() {
    let cluster = Cluster::start(&[]);
    let service = service(&cluster, ServiceLimits::default());
    let addr = service.local_addr();
    let idle: Vec<TcpStream> = (0..2000)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let dummy =
        Client::setup_dummy_over(1 << 20, 1 << 20, &addr.to_string(), DummyTransport::Tcp).unwrap();
    let cfg = ReplicaPolicy::default();
    dummy.put("past-the-idle", b"served", &cfg).unwrap();
    assert_eq!(dummy.get("past-the-idle").unwrap(), b"served");
    dummy.close().unwrap();
    drop(idle);
    service.stop();
}

#[test]
fn thousands_of_idle_unix_connections_do_not_lock_dummies_out() {
    let cluster = Cluster::start(&[]);
    let service = service(&cluster, ServiceLimits::default());
    let addr = service.local_addr();
    let idle: Vec<UnixStream> = (0..2000).map(|_| connect_local(&service)).collect();
    let dummy = Client::setup_dummy_over(1 << 20, 1 << 20, &addr.to_string(), DummyTransport::Unix)
        .unwrap();
    let cfg = ReplicaPolicy::default();
    dummy.put("past-the-idle-unix", b"served", &cfg).unwrap();
    assert_eq!(dummy.get("past-the-idle-unix").unwrap(), b"served");
    dummy.close().unwrap();
    drop(idle);
    service.stop();
}

/// A dummy on the service's host talks to it over the Unix socket without
/// being told to, and moves bytes through the shared region there.
#[test]
fn a_dummy_on_this_host_uses_the_unix_socket() {
    let cluster = Cluster::start(&[]);
    let service = service(&cluster, ServiceLimits::default());
    let name = service
        .local_socket()
        .expect("the service has a Unix socket");
    assert_eq!(accepted_on(&name), 0);
    let dummy = Client::setup_dummy(4 << 20, 1 << 20, &service.local_addr().to_string()).unwrap();
    assert!(accepted_on(&name) >= 1, "the dummy came over TCP");
    let cfg = ReplicaPolicy::default();
    dummy.put("over-unix", b"bytes", &cfg).unwrap();
    assert_eq!(dummy.get("over-unix").unwrap(), b"bytes");
    // Zero copy: a pool buffer is written and read in place.
    let len = 256 << 10;
    let (src, dst) = (
        dummy.alloc_from_mem_pool(len).unwrap(),
        dummy.alloc_from_mem_pool(len).unwrap(),
    );
    let want = value("zero-copy", len);
    // SAFETY: `src` and `dst` are distinct pool allocations of `len` bytes.
    let (src_buf, dst_buf) = unsafe {
        (
            std::slice::from_raw_parts_mut(src as *mut u8, len),
            std::slice::from_raw_parts_mut(dst as *mut u8, len),
        )
    };
    src_buf.copy_from_slice(&want);
    dummy.put_from("zero-copy", src, len, &cfg).unwrap();
    assert_eq!(dummy.get_into("zero-copy", dst, len).unwrap(), len as u64);
    assert!(
        dst_buf == &want[..],
        "wrong bytes through the shared region"
    );
    dummy.free_to_mem_pool(src).unwrap();
    dummy.free_to_mem_pool(dst).unwrap();
    dummy.close().unwrap();
    // Told to use TCP, it does.
    let before = accepted_on(&name);
    let over_tcp = Client::setup_dummy_over(
        1 << 20,
        1 << 20,
        &service.local_addr().to_string(),
        DummyTransport::Tcp,
    )
    .unwrap();
    assert_eq!(over_tcp.get("over-unix").unwrap(), b"bytes");
    assert!(
        accepted_on(&name) <= before,
        "told TCP, came over the Unix socket"
    );
    over_tcp.close().unwrap();
    service.stop();
}

/// Over the Unix socket the kernel names the peer: `Hello` must name the
/// peer's own pid, and a session's token is no use to another process.
#[test]
fn unix_peers_are_who_the_kernel_says() {
    let cluster = Cluster::start(&[]);
    let service = service(&cluster, ServiceLimits::default());
    let region = tempfile_region::Region::new(1 << 20);
    let hello = |pid| DummyRequest::Hello {
        shm_name: region.name.clone(),
        region_len: 1 << 20,
        pid,
        fd: region.fd,
    };
    // Another process's pid (our parent's) in Hello is refused.
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() } as u32;
    let mut liar = connect_local(&service);
    assert_eq!(
        error_of(call(&mut liar, &hello(parent))),
        ErrorCode::ILLEGAL_CLIENT
    );
    // Our own is accepted.
    let mut owner = connect_local(&service);
    let token = match call(&mut owner, &hello(std::process::id())) {
        DummyResponse::Session { session, .. } => session,
        other => panic!("Hello refused: {other:?}"),
    };
    let mut second = connect_local(&service);
    assert!(matches!(
        call(&mut second, &DummyRequest::Attach { session: token }),
        DummyResponse::Session { session, .. } if session == token
    ));
    // Without a session, nothing but Health.
    let mut stranger = connect_local(&service);
    assert_eq!(
        error_of(call(
            &mut stranger,
            &DummyRequest::RemoveAll { force: true }
        )),
        ErrorCode::ILLEGAL_CLIENT
    );
    // The token, stolen by another process, is refused over the Unix
    // socket as over TCP.
    let name = service.local_socket().unwrap();
    assert_eq!(
        steal(&format!("@{name}"), token),
        ErrorCode::CLIENT_NOT_FOUND.code()
    );
    assert_eq!(
        steal(&service.local_addr().to_string(), token),
        ErrorCode::CLIENT_NOT_FOUND.code()
    );
    service.stop();
}

/// A process of another user on this host cannot open a session, even
/// for its own memory, over TCP or the Unix socket: the service checks
/// the peer's owner.
#[test]
fn other_users_cannot_open_sessions() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run a process as another user");
        return;
    }
    let cluster = Cluster::start(&[]);
    let svc = service(&cluster, ServiceLimits::default());
    let local = format!("@{}", svc.local_socket().expect("a Unix socket"));
    for target in [svc.local_addr().to_string(), local] {
        let e = stranger_hello(&target);
        assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{target}: {e}");
        assert!(
            e.context.contains("user"),
            "{target}: refused for its user: {e}"
        );
    }
    svc.stop();
}

/// Runs a process as uid 65534 that says `Hello` (for its own pid) to the
/// service at `target` and returns the refusal.
fn stranger_hello(target: &str) -> mooncake_common::Error {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    // The stranger relays one frame we build for it and prints the answer
    // in hex.
    let relay = r#"
import os
print(os.getpid(), flush=True)
frame = bytes.fromhex(sys.stdin.readline().strip())
s = connect(sys.argv[1], timeout=20)
s.sendall(frame)
n = int.from_bytes(s.recv(4, socket.MSG_WAITALL), "little")
body = b""
while len(body) < n:
    chunk = s.recv(n - len(body))
    if not chunk:
        break
    body += chunk
print(body.hex(), flush=True)
"#;
    let mut child = Command::new("python3")
        .args(["-c", &format!("{CONNECT_PY}{relay}"), target])
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid: u32 = line.trim().parse().unwrap();
    let mut frame = Vec::new();
    let hello = DummyRequest::Hello {
        shm_name: "stranger".into(),
        region_len: 4096,
        pid,
        fd: 0,
    };
    encode_frame(&hello, &mut frame).unwrap();
    let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(child.stdin.as_mut().unwrap(), "{hex}").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let _ = child.wait();
    let body: Vec<u8> = (0..line.trim().len() / 2)
        .map(|i| u8::from_str_radix(&line.trim()[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    match decode_payload::<DummyResponse>(&body).unwrap() {
        DummyResponse::Unit { result: Err(e) } => e,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Resident memory of process `pid`, in bytes.
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// Lets this process hold `n` descriptors (the storms below need more
/// than a common default of 1024).
fn allow_descriptors(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < n {
            lim.rlim_cur = n.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    assert!(
        lim.rlim_cur >= n,
        "cannot hold {n} descriptors: {}",
        lim.rlim_cur
    );
}

/// `mooncake_client` (its dummy service on TCP) run under `shell_prefix`
/// (a shell snippet run before it, e.g. a `ulimit`): the process, and
/// the address dummies connect to.
fn storage_process(cluster: &Cluster, shell_prefix: &str) -> (Proc, String) {
    let args = vec![
        "-c".to_string(),
        format!("{shell_prefix} exec \"$0\" \"$@\""),
        STORAGE.to_string(),
        format!("--master_server_address={}", cluster.master_addr),
        format!("--metadata_server={}", cluster.metadata),
        "--host=127.0.0.1".into(),
        "--port=0".into(),
        "--global_segment_size=16MB".into(),
    ];
    let (node, line) = spawn_until_line("/bin/sh", &args, "mooncake_client ready");
    (node, ready_dummy_addr(&line))
}

/// Connections that trickle a large frame, a byte every half second,
/// reconnecting when dropped, until `stop`.
fn slowloris(addr: SocketAddr, n: usize, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut s: Option<TcpStream> = None;
                while !stop.load(Ordering::Relaxed) {
                    let sent = s.as_mut().is_some_and(|c| c.write_all(&[1]).is_ok());
                    if !sent {
                        s = TcpStream::connect(addr).ok();
                        if let Some(c) = s.as_mut() {
                            let _ = c.write_all(&(1u32 << 20).to_le_bytes());
                        }
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        })
        .collect()
}

/// Waits (bounded) until `pid` runs at most `n` threads.
fn wait_threads_at_most(pid: u32, n: usize) {
    let deadline = std::time::Instant::now() + WAIT;
    while threads_of(pid) > n {
        assert!(
            std::time::Instant::now() < deadline,
            "still {} threads, want at most {n}",
            threads_of(pid)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `mooncake_client` held by 2,000 idle connections and 100 slow ones
/// still serves a new dummy, and its memory stays within a bound.
#[test]
fn a_storm_of_idle_and_slow_connections_costs_little() {
    allow_descriptors(4096);
    let cluster = Cluster::start(&[]);
    let (node, target) = storage_process(&cluster, "");
    let pid = node.0.id();
    let addr: SocketAddr = target.parse().unwrap();
    let cfg = ReplicaPolicy::default();
    let warm = Client::setup_dummy_over(1 << 20, 1 << 20, &target, DummyTransport::Tcp).unwrap();
    warm.put("warm", b"up", &cfg).unwrap();
    warm.close().unwrap();
    let (rss_before, threads_before) = (rss_of(pid), threads_of(pid));
    let idle: Vec<TcpStream> = (0..2000)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let slow = slowloris(addr, 100, &stop);
    std::thread::sleep(Duration::from_secs(2));
    let dummy = Client::setup_dummy_over(1 << 20, 1 << 20, &target, DummyTransport::Tcp).unwrap();
    dummy.put("past-the-storm", b"served", &cfg).unwrap();
    assert_eq!(dummy.get("past-the-storm").unwrap(), b"served");
    let grown = rss_of(pid).saturating_sub(rss_before);
    eprintln!(
        "storm: RSS grew by {} MiB, {} threads",
        grown >> 20,
        threads_of(pid)
    );
    // 1,024 connection threads with small stacks and 8 KiB buffers; the
    // bound leaves room for a debug build.
    assert!(grown < 160 << 20, "RSS grew by {} MiB", grown >> 20);
    dummy.close().unwrap();
    stop.store(true, Ordering::Relaxed);
    for t in slow {
        t.join().unwrap();
    }
    drop(idle);
    // Their threads end with them.
    wait_threads_at_most(pid, threads_before + 16);
}

/// A frame that asks for `Health`: no session needed, answered at once.
fn health_frame() -> Vec<u8> {
    let mut frame = Vec::new();
    encode_frame(&DummyRequest::Health {}, &mut frame).unwrap();
    frame
}

/// `mooncake_client` out of file descriptors before its connection cap,
/// held by 2,000 connections that call often enough never to time out,
/// still serves a new dummy: it sheds one of them as a full service would.
#[test]
fn out_of_descriptors_the_service_sheds_strangers_for_a_dummy() {
    allow_descriptors(4096);
    let cluster = Cluster::start(&[]);
    let (_node, target) = storage_process(&cluster, "ulimit -n 400 &&");
    let addr: SocketAddr = target.parse().unwrap();
    let held: Vec<TcpStream> = (0..2000)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let keeper = {
        let stop = stop.clone();
        let frame = health_frame();
        let mut socks = held;
        std::thread::spawn(move || {
            for s in &socks {
                s.set_nonblocking(true).unwrap();
            }
            let mut sink = [0u8; 4096];
            while !stop.load(Ordering::Relaxed) {
                // Well within the 10 s a connection without a session may
                // stay silent; answers are read and dropped.
                for s in socks.iter_mut() {
                    let _ = s.write_all(&frame);
                    let _ = std::io::Read::read(s, &mut sink);
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let dummy = Client::setup_dummy_over(1 << 20, 1 << 20, &target, DummyTransport::Tcp).unwrap();
    let cfg = ReplicaPolicy::default();
    dummy.put("past-the-holders", b"served", &cfg).unwrap();
    assert_eq!(dummy.get("past-the-holders").unwrap(), b"served");
    dummy.close().unwrap();
    stop.store(true, Ordering::Relaxed);
    keeper.join().unwrap();
}
