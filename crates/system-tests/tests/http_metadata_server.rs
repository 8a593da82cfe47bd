//! The real `mooncake_http_metadata_server` process: flags, the protocol
//! through the metadata client, and a clean stop on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_transfer::metadata::{connect, MetadataUri};

static BIN: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| mooncake_system_tests::program("mooncake_http_metadata_server"));

/// Kills the server (by pid) if a test fails before stopping it.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// Starts the binary and waits (bounded) for its `listening on` line.
    fn start(args: &[&str]) -> (Server, String) {
        let mut child = Command::new(&*BIN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let server = Server(child);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("no 'listening on' line");
        let addr = line.trim().rsplit(' ').next().unwrap().to_string();
        assert!(line.contains("listening on"), "{line:?}");
        (server, addr)
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(self.0.id() as i32, sig) }, 0);
    }

    /// Waits (bounded) for the process to exit.
    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn serves_the_metadata_protocol_and_stops_on_sigterm() {
    let (mut server, addr) = Server::start(&["-port=0", "--host=127.0.0.1"]);
    let url = format!("http://{addr}/metadata");
    let store = connect(&MetadataUri::parse(&url).unwrap()).unwrap();
    assert_eq!(store.get("mooncake/ram/n0").unwrap(), None);
    store
        .put("mooncake/ram/n0", br#"{"protocol":"tcp","buffers":[]}"#)
        .unwrap();
    assert_eq!(
        store.get("mooncake/ram/n0").unwrap().as_deref(),
        Some(&br#"{"protocol":"tcp","buffers":[]}"#[..])
    );
    store.delete("mooncake/ram/n0").unwrap();
    assert_eq!(store.get("mooncake/ram/n0").unwrap(), None);

    server.signal(libc::SIGTERM);
    assert!(server.wait().success());
    assert_eq!(store.get("k").unwrap_err().code, ErrorCode::ERR_METADATA);
}

#[test]
fn sigint_stops_it_too() {
    let (mut server, addr) = Server::start(&["--port", "0", "-host", "127.0.0.1"]);
    connect(&MetadataUri::Http(format!("http://{addr}/metadata"))).unwrap();
    server.signal(libc::SIGINT);
    assert!(server.wait().success());
}

#[test]
fn bad_flags_and_busy_port_fail() {
    let out = Command::new(&*BIN).arg("--port=notaport").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("port"));

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = Command::new(&*BIN)
        .args([format!("--port={port}"), "--host=127.0.0.1".into()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&port.to_string()));
}
