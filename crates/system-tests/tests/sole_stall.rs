//! A read whose only replica is on a storage process that stops (SIGSTOP)
//! just before the read starts, long before the master Suspects it, ends
//! in a bounded time rather than the 30 s transfer timeout: the waiting
//! read asks the master about the holder until it is Suspected, then gets
//! the Suspected deadline (`MC_STORE_SUSPECT_READ_TIMEOUT_MS`, from that
//! answer) and is canceled with TRANSFER_FAIL. An object with a replica on
//! another process reads fine in the same batch. Once the holder resumes,
//! every object reads back with the right bytes.

use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::types::ReplicaPolicy;

mod common;
use common::*;

#[test]
fn a_read_planned_before_its_only_holder_is_suspected_ends_in_bounded_time() {
    // TCP (shared memory would read a stopped process's bytes without it),
    // the default 30 s transfer timeout and hedging, a 2 s Suspected
    // deadline, and a master that Suspects after 3 s of silence: every
    // read below is planned while the holder is still listed as live.
    std::env::set_var("MC_FORCE_TCP", "1");
    std::env::remove_var("MC_TRANSFER_TIMEOUT");
    std::env::remove_var("MC_STORE_HEDGE_READ_MS");
    std::env::set_var("MC_STORE_SUSPECT_READ_TIMEOUT_MS", "2000");
    let cluster = Cluster::start(&["--client_suspect_ms=3000", "--client_ttl=120"]);
    let holder = cluster.storage("16MB");
    let other = cluster.storage("16MB");
    let client = cluster.pure_client();
    let sole = value("sole", 256 << 10);
    client
        .put("sole", &sole, &pinned_to(&holder.segment))
        .unwrap();
    assert_eq!(
        segments_of(&client, "sole"),
        std::slice::from_ref(&holder.segment)
    );
    let both = value("both", 256 << 10);
    let two = ReplicaPolicy {
        replica_num: 2,
        ..ReplicaPolicy::default()
    };
    client.put("both", &both, &two).unwrap();
    let mut all = vec![holder.segment.clone(), other.segment.clone()];
    all.sort();
    assert_eq!(segments_of(&client, "both"), all);
    assert_eq!(client.get("sole").unwrap(), sole);
    assert_eq!(client.get("both").unwrap(), both);

    holder.stop();
    let t = Instant::now();
    let err = client.get("sole").unwrap_err();
    let took = t.elapsed();
    eprintln!("single read of the stopped holder's only replica failed after {took:?}: {err}");
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
    // Only the master's verdict ends it, and the deadline runs from when
    // the reader learned it; the upper bound is generous for a loaded
    // machine, yet half the transfer timeout.
    assert!(took >= Duration::from_secs(2), "ended early: {took:?}");
    assert!(took < Duration::from_secs(15), "took {took:?}");

    // Resume, wait until the master lists it as live again, and stop it
    // again: a batch planned before the new verdict, with one object on it
    // alone and one with another replica.
    holder.signal(libc::SIGCONT);
    eventually("the resumed holder is read again", || {
        client.get("sole").is_ok_and(|got| got == sole)
    });
    let marked = || {
        client
            .get_replica_desc("sole")
            .unwrap()
            .iter()
            .any(|d| d.memory().is_some_and(|m| m.suspected))
    };
    eventually("the resumed holder is not marked", || !marked());
    holder.stop();
    let t = Instant::now();
    let got = client.batch_get_buffer(&["sole".to_owned(), "both".to_owned()]);
    let took = t.elapsed();
    eprintln!("batch of both objects with the holder stopped took {took:?}");
    let err = got[0].as_ref().expect_err("the only replica is stopped");
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
    let other_copy = got[1].as_ref().unwrap_or_else(|e| panic!("both: {e}"));
    assert!(
        other_copy.as_slice() == both.as_slice(),
        "both: wrong bytes"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
    drop(got);
    // The object with another replica reads on meanwhile.
    let t = Instant::now();
    assert!(client.get("both").unwrap() == both, "both: wrong bytes");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    holder.signal(libc::SIGCONT);
    eventually("the resumed holder is read again", || {
        client.get("sole").is_ok_and(|got| got == sole)
    });
    assert_eq!(client.get("both").unwrap(), both);
}
