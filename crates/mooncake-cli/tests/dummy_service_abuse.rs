//! The dummy service (`mooncake_client`) against strangers on loopback:
//! idle sockets by the thousand, calls without a session, stolen or
//! guessed session tokens. Waits are bounded; nothing asserts a duration.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_store::client::dummy_proto::{DummyRequest, DummyResponse};
use mooncake_store::client::{Client, ServiceConfig, ServiceLimits, StoreService};
use mooncake_store::proto::frame::{decode_payload, encode_frame, read_frame};
use mooncake_store::types::ReplicateConfig;

mod common;
use common::*;

const WAIT: Duration = Duration::from_secs(30);

fn service(cluster: &Cluster, limits: ServiceLimits) -> StoreService {
    StoreService::start(&ServiceConfig {
        client: cluster.config(16 << 20, 0),
        host: "127.0.0.1".into(),
        port: 0,
        limits,
        allowed_uids: Vec::new(),
    })
    .unwrap()
}

fn call(s: &mut TcpStream, req: &DummyRequest) -> DummyResponse {
    let mut frame = Vec::new();
    encode_frame(req, &mut frame).unwrap();
    s.write_all(&frame).unwrap();
    let mut buf = Vec::new();
    read_frame(s, &mut buf).unwrap();
    decode_payload(&buf).unwrap()
}

fn error_of(resp: DummyResponse) -> ErrorCode {
    match resp {
        DummyResponse::Unit { result: Err(e) } => e.code,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
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
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(STEAL)
        .arg(addr.to_string())
        .arg(token.to_string())
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{out:?}");
    let code: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(code, ErrorCode::CLIENT_NOT_FOUND.code(), "{out:?}");
    service.stop();
}

/// Sends `Attach{token}` from another process and prints the error code
/// (0 when accepted). Frame: u32 length, version 1, tag 2, varint token.
const STEAL: &str = r#"
import socket, struct, sys
host, port = sys.argv[1].rsplit(":", 1)
token = int(sys.argv[2])
body = bytearray([1, 2])
while True:
    b = token & 0x7f
    token >>= 7
    if token:
        body.append(b | 0x80)
    else:
        body.append(b)
        break
s = socket.create_connection((host, int(port)))
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
    let dummy = Client::setup_dummy(1 << 20, 1 << 20, &addr.to_string()).unwrap();
    let cfg = ReplicateConfig::default();
    dummy.put("past-the-idle", b"served", &cfg).unwrap();
    assert_eq!(dummy.get("past-the-idle").unwrap(), b"served");
    dummy.close().unwrap();
    drop(idle);
    service.stop();
}

/// A process of another user on this host cannot open a session, even
/// for its own memory: the service checks the peer socket's owner.
#[test]
fn other_users_cannot_open_sessions() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run a process as another user");
        return;
    }
    let cluster = Cluster::start(&[]);
    let svc = service(&cluster, ServiceLimits::default());
    let addr = svc.local_addr();
    // The stranger (uid 65534) relays one frame we build for it and
    // prints the answer in hex.
    let relay = r#"
import socket, sys, os
print(os.getpid(), flush=True)
frame = bytes.fromhex(sys.stdin.readline().strip())
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
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
        .args([
            "-c",
            relay,
            &addr.ip().to_string(),
            &addr.port().to_string(),
        ])
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
    let resp: DummyResponse = decode_payload(&body).unwrap();
    match resp {
        DummyResponse::Unit { result: Err(e) } => {
            assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{e}");
            assert!(e.context.contains("user"), "refused for its user: {e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    svc.stop();
}
