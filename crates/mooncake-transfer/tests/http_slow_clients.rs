//! Clients that trickle their request headers (slowloris) or say nothing
//! must not hold an HTTP server: they are disconnected after the header
//! timeout, and a well-behaved client is served meanwhile. The metadata
//! server here; the master's and the client's HTTP services are served by
//! the same function (`mooncake_transfer::http_serve`).
//!
//! Timeouts here only guard against hangs; nothing asserts on durations.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

use mooncake_transfer::http_serve::HttpLimits;
use mooncake_transfer::metadata::http_server::MetadataServer;

/// One HTTP/1.1 exchange on a fresh connection; the response's first line
/// and body.
fn request(addr: SocketAddr, req: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.lines().next().unwrap_or_default().to_string();
    let body = resp
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

/// A client sending its request header one byte per tick.
struct Trickler {
    s: TcpStream,
    sent: usize,
    closed: bool,
}

/// A header that takes minutes at a byte per second.
const SLOW_HEADER: &[u8] = b"GET /metadata?key=slow HTTP/1.1\r\nHost: x\r\nX-Padding: \
    aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";

impl Trickler {
    fn connect(addr: SocketAddr) -> Trickler {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nonblocking(true).unwrap();
        Trickler {
            s,
            sent: 0,
            closed: false,
        }
    }

    /// Sends the next byte (none for a silent client) and notes whether the
    /// server has closed the connection (an end, a reset, or its 408 answer
    /// followed by the end).
    fn tick(&mut self, silent: bool) {
        if self.closed {
            return;
        }
        let mut buf = [0u8; 512];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => {
                    self.closed = true;
                    return;
                }
                Ok(_) => continue, // an error answer: the end follows
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.closed = true;
                    return;
                }
            }
        }
        if !silent {
            let byte = &SLOW_HEADER[self.sent % SLOW_HEADER.len()..][..1];
            if self.s.write_all(byte).is_err() {
                self.closed = true;
                return;
            }
            self.sent += 1;
        }
    }
}

#[test]
fn trickling_and_silent_clients_are_cut_off_and_others_served() {
    let server = MetadataServer::spawn("127.0.0.1", 0).unwrap();
    let addr = server.local_addr();
    let timeout = HttpLimits::default().header_read_timeout;

    let (status, _) = request(
        addr,
        "PUT /metadata?key=k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nvalue",
    );
    assert!(status.contains("200"), "{status}");

    let mut tricklers: Vec<Trickler> = (0..120).map(|_| Trickler::connect(addr)).collect();
    let mut silent: Vec<Trickler> = (0..30).map(|_| Trickler::connect(addr)).collect();
    // A byte per second per trickler, for up to six header timeouts.
    let ticks = 6 * timeout.as_secs() as usize;
    let mut served_meanwhile = false;
    for tick in 0..ticks {
        tricklers.iter_mut().for_each(|t| t.tick(false));
        silent.iter_mut().for_each(|t| t.tick(true));
        if tick == 2 {
            // Well-behaved clients are served while the tricklers hang on.
            let (status, body) = request(
                addr,
                "GET /metadata?key=k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            );
            assert!(status.contains("200"), "{status}");
            assert_eq!(body, "value");
            served_meanwhile = tricklers.iter().all(|t| !t.closed);
        }
        if tricklers.iter().chain(&silent).all(|t| t.closed) {
            break;
        }
        thread::sleep(Duration::from_secs(1));
    }
    assert!(served_meanwhile, "the tricklers were gone before the GET");
    let open = tricklers.iter().filter(|t| !t.closed).count();
    let open_silent = silent.iter().filter(|t| !t.closed).count();
    assert_eq!(
        (open, open_silent),
        (0, 0),
        "trickling / silent clients still connected after {ticks} s"
    );
    // None of them got its header through.
    assert!(tricklers.iter().all(|t| t.sent < SLOW_HEADER.len()));
    // And the server still serves.
    let (status, body) = request(
        addr,
        "GET /metadata?key=k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(status.contains("200"), "{status}");
    assert_eq!(body, "value");
}

#[test]
fn a_trickled_body_is_cut_off() {
    let server = MetadataServer::spawn("127.0.0.1", 0).unwrap();
    let addr = server.local_addr();
    let limit = HttpLimits::default().body_read_timeout;
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"PUT /metadata?key=b HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        .unwrap();
    s.set_nonblocking(true).unwrap();
    // A byte per second for up to three body deadlines.
    let mut answered = false;
    for _ in 0..3 * limit.as_secs() {
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(_) => {
                answered = true;
                break;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => {
                answered = true;
                break;
            }
        }
        if s.write_all(b"x").is_err() {
            answered = true;
            break;
        }
        thread::sleep(Duration::from_secs(1));
    }
    assert!(
        answered,
        "a body trickled for {} s was still being read",
        3 * limit.as_secs()
    );
    // Nothing was stored from the cut-off body.
    let (status, _) = request(
        addr,
        "GET /metadata?key=b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(status.contains("404"), "{status}");
}
