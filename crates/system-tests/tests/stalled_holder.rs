//! A read whose only replica is on a stopped (SIGSTOP) storage process
//! fails within the short deadline a Suspected owner's replica gets
//! (`MC_STORE_SUSPECT_READ_TIMEOUT_MS`), not the whole transfer timeout,
//! and succeeds again once the process resumes.

use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::types::ReplicaPolicy;

mod common;
use common::*;

#[test]
fn a_read_from_a_stopped_only_holder_fails_fast_and_recovers() {
    // This test's only client lives in this process: TCP to the holder
    // (shared memory would read a stopped process's bytes without it), a
    // 1 s deadline for Suspected owners and the default 30 s transfer
    // timeout, which the bound below must stay well under.
    std::env::set_var("MC_FORCE_TCP", "1");
    std::env::set_var("MC_STORE_SUSPECT_READ_TIMEOUT_MS", "1000");
    std::env::remove_var("MC_TRANSFER_TIMEOUT");
    let cluster = Cluster::start(&["--client_suspect_ms=1000", "--client_ttl=120"]);
    let holder = cluster.storage("16MB");
    let client = cluster.pure_client();
    let v = value("k", 256 << 10);
    client.put("k", &v, &ReplicaPolicy::default()).unwrap();
    assert_eq!(client.get("k").unwrap(), v);
    let marked = || {
        let descs = client.get_replica_desc("k").unwrap();
        descs.len() == 1 && descs[0].memory().is_some_and(|m| m.suspected)
    };
    assert!(!marked(), "a live holder is not marked");

    holder.stop();
    eventually("the stopped holder's replica is marked Suspected", marked);
    let t = Instant::now();
    let err = client.get("k").unwrap_err();
    let took = t.elapsed();
    eprintln!("read from the stopped holder failed after {took:?}: {err}");
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
    // Generous for a loaded machine, yet half the transfer timeout.
    assert!(took < Duration::from_secs(15), "took {took:?}");

    holder.signal(libc::SIGCONT);
    eventually("the resumed holder is read again", || {
        client.get("k").is_ok_and(|got| got == v)
    });
    // The resumed holder can serve a read before its next ping (every
    // 500 ms) reaches the master, which only then ends the suspicion.
    eventually("heard from again: not marked", || !marked());
}
