//! Reads keep being served, with the right bytes, from the first read after
//! one of two holders stops (SIGSTOP), long before the master could
//! Suspect it: a read from the stopped holder that does not answer within
//! its hedge delay is read again from the other replica, and the client
//! passes over the stopped holder from then on. Once the holder resumes,
//! reads of objects listed on the other holder first leave it alone; the
//! first read that goes to it after its hold probes it, completes, and it
//! is used again.

use std::time::{Duration, Instant};

use mooncake_store::client::Client;
use mooncake_store::types::ReplicaPolicy;

mod common;
use common::*;

/// (segment, engine endpoint, Suspected) of each memory replica of `key`,
/// in the master's order.
fn replicas(client: &Client, key: &str) -> Vec<(String, String, bool)> {
    client
        .get_replica_desc(key)
        .unwrap()
        .iter()
        .filter_map(|d| d.memory())
        .map(|m| {
            (
                m.segment_name.clone(),
                m.transport_endpoint.clone(),
                m.suspected,
            )
        })
        .collect()
}

#[test]
fn reads_fail_over_from_the_first_read_after_a_holder_stops() {
    // TCP to both holders (shared memory would read a stopped process's
    // bytes without it), the default 30 s transfer timeout, default hedging,
    // and a master that Suspects no one during the test: only the client's
    // own failover can explain fast reads.
    std::env::set_var("MC_FORCE_TCP", "1");
    std::env::remove_var("MC_TRANSFER_TIMEOUT");
    std::env::remove_var("MC_STORE_HEDGE_READ_MS");
    // The stopped holder stays on the slow list for the hold after its
    // last late read: far longer than the 40 reads take on a loaded
    // machine (500 ms once ran out before they ended, emptying the list).
    std::env::set_var("MC_STORE_SLOW_PEER_HOLD_MS", "5000");
    let cluster = Cluster::start(&["--client_suspect_ms=600000", "--client_ttl=600"]);
    let a = cluster.storage("16MB");
    let b = cluster.storage("16MB");
    let client = cluster.pure_client();
    let both = ReplicaPolicy {
        replica_num: 2,
        ..ReplicaPolicy::default()
    };
    let objects: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| {
            let key = format!("k{i}");
            let v = value(&key, 256 << 10);
            client.put(&key, &v, &both).unwrap();
            assert_eq!(replicas(&client, &key).len(), 2, "{key}: two replicas");
            (key, v)
        })
        .collect();
    for (key, want) in &objects {
        assert_eq!(&client.get(key).unwrap(), want);
    }
    assert!(client.slow_peers().is_empty(), "nothing late yet");

    // Stop the holder the master lists first for k0: its first read goes
    // there.
    let (first_seg, stopped_endpoint, _) = replicas(&client, "k0")[0].clone();
    let stopped = if first_seg == a.segment { &a } else { &b };
    stopped.stop();

    // Generous for a loaded machine, yet far below the transfer timeout.
    let bound = Duration::from_secs(5);
    let t = Instant::now();
    let mut slowest = Duration::ZERO;
    for round in 0..5 {
        for (key, want) in &objects {
            let r = Instant::now();
            let got = client.get(key).unwrap_or_else(|e| panic!("{key}: {e}"));
            let took = r.elapsed();
            assert!(took < bound, "round {round}, {key}: {took:?}");
            assert!(&got == want, "{key}: wrong bytes");
            slowest = slowest.max(took);
        }
    }
    let stopped_phase_end = Instant::now();
    eprintln!(
        "40 reads with one holder stopped in {:?}, slowest {slowest:?}",
        t.elapsed()
    );
    // Hedged around, the stopped holder (and only it) is on the slow list.
    let slow = client.slow_peers();
    assert_eq!(
        slow,
        std::slice::from_ref(&stopped_endpoint),
        "the stopped holder is passed over"
    );
    assert!(
        replicas(&client, "k0").iter().all(|r| !r.2),
        "the master has not Suspected it: the failover was the client's"
    );

    stopped.signal(libc::SIGCONT);
    // Reads that list the other holder first go there and leave the
    // resumed one's probe alone, however many pass once its hold is over.
    // Every mark of the stopped holder was made before the reads above
    // ended, so its hold is over 5 s after.
    let hold_over = stopped_phase_end + Duration::from_millis(5000);
    let elsewhere: Vec<&(String, Vec<u8>)> = objects
        .iter()
        .filter(|(key, _)| replicas(&client, key)[0].1 != stopped_endpoint)
        .collect();
    if !elsewhere.is_empty() {
        while Instant::now() < hold_over + Duration::from_millis(300) {
            for (key, want) in &elsewhere {
                assert_eq!(&client.get(key).unwrap(), want);
            }
        }
        // (The other holder may be on the list: a read of it can be late
        // on a loaded machine.)
        assert!(
            !client.slow_peers().contains(&stopped_endpoint),
            "hold over and not probed: reads elsewhere took no probe"
        );
    }
    let resumed = Instant::now();
    let mut last = Vec::new();
    eventually("the resumed holder is read from again", || {
        for (key, want) in &objects {
            let r = Instant::now();
            assert_eq!(&client.get(key).unwrap(), want);
            if r.elapsed() > Duration::from_millis(40) {
                eprintln!(
                    "{:?} after resuming: {key} took {:?}",
                    resumed.elapsed(),
                    r.elapsed()
                );
            }
        }
        let slow = client.slow_peers();
        if slow != last {
            eprintln!("{:?} after resuming: slow {slow:?}", resumed.elapsed());
            last = slow.clone();
        }
        slow.is_empty()
    });
}
