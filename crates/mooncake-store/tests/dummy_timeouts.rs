//! A dummy client whose store service accepts but never answers: setup
//! fails with `RPC_FAIL` instead of blocking, and leaves no `/dev/shm` file.
//! The wait is bounded; nothing asserts a duration.

use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_store::client::Client;

fn our_shm_names() -> Vec<String> {
    let prefix = format!("mooncake-dummy-{}-", std::process::id());
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn setup_dummy_against_a_silent_service_fails() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut keep = Vec::new();
        for s in l.incoming() {
            keep.push(s); // accept, never answer
        }
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = Client::setup_dummy(1 << 20, 1 << 20, &addr);
        let _ = tx.send(r.map(drop).map_err(|e| e.code));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("setup_dummy still blocked after 60 s");
    assert_eq!(got, Err(ErrorCode::RPC_FAIL));
    assert_eq!(our_shm_names(), Vec::<String>::new(), "leaked shm files");
}
