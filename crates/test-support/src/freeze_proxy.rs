//! A loopback TCP relay that can be frozen: its connections stay open but
//! carry nothing more, as behind a network partition (no reset, no close),
//! which is how a coordination service becomes unreachable without the
//! client being told.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct FreezeProxy {
    /// `host:port` to connect to instead of the upstream.
    pub addr: String,
    frozen: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
}

impl FreezeProxy {
    /// Relays every connection made to [`addr`](Self::addr) to `upstream`.
    /// Its threads end with their connections (or the test process).
    pub fn start(upstream: &str) -> FreezeProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let frozen = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (upstream, flag, count) = (upstream.to_string(), frozen.clone(), accepted.clone());
        std::thread::spawn(move || {
            for down in listener.incoming() {
                let Ok(down) = down else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(up) = TcpStream::connect(&upstream) else {
                    continue;
                };
                for (from, to) in [
                    (down.try_clone().unwrap(), up.try_clone().unwrap()),
                    (up, down),
                ] {
                    let flag = flag.clone();
                    std::thread::spawn(move || relay(from, to, &flag));
                }
            }
        });
        FreezeProxy {
            addr,
            frozen,
            accepted,
        }
    }

    /// Connections made through the proxy so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// From now on nothing passes, in either direction.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Lets traffic pass again, held bytes first.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }
}

fn relay(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Frozen: hold what arrived until thawed.
        while frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
