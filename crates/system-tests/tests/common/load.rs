//! A put/get/remove load from several threads through one store client,
//! with a ledger of what was acknowledged, for the failover tests: every
//! acknowledged put must read back byte-exact, every acknowledged remove
//! must stay removed, and no read may return wrong bytes.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::ReplicaPolicy;

use super::{code, eventually, value};

/// What one load thread saw acknowledged.
#[derive(Default)]
pub struct Ledger {
    pub present: HashMap<String, Vec<u8>>,
    pub removed: HashSet<String>,
}

/// Shared counters of the load.
#[derive(Default)]
pub struct Load {
    pub stop: AtomicBool,
    pub puts: AtomicUsize,
    pub wrong: AtomicUsize,
    /// Nanoseconds since `start` of the first good put and get after the
    /// last kill (`u64::MAX`: none yet).
    kill_at: AtomicU64,
    pub first_put: AtomicU64,
    pub first_get: AtomicU64,
    /// Nanoseconds since `start` of the latest good get.
    last_get: AtomicU64,
}

impl Load {
    fn note(&self, start: Instant, slot: &AtomicU64) {
        let now = start.elapsed().as_nanos() as u64;
        if now > self.kill_at.load(Ordering::SeqCst) {
            let _ = slot.fetch_min(now, Ordering::SeqCst);
        }
    }

    /// Whether a get succeeded after `at` (nanoseconds since `start`).
    /// (A get the old leader answered just before it died counts as the
    /// first after the kill; this tells one through its successor.)
    pub fn got_after(&self, at: u64) -> bool {
        self.last_get.load(Ordering::SeqCst) > at
    }

    /// A kill now: the first good put and get are timed from here.
    pub fn killed(&self, start: Instant) {
        self.first_put.store(u64::MAX, Ordering::SeqCst);
        self.first_get.store(u64::MAX, Ordering::SeqCst);
        self.kill_at
            .store(start.elapsed().as_nanos() as u64, Ordering::SeqCst);
    }

    pub fn since_kill(&self, slot: &AtomicU64) -> Option<Duration> {
        let (at, kill) = (
            slot.load(Ordering::SeqCst),
            self.kill_at.load(Ordering::SeqCst),
        );
        // A call that ended as the slots were reset can be stamped just
        // before the kill: it counts as at the kill.
        (at != u64::MAX).then(|| Duration::from_nanos(at.saturating_sub(kill)))
    }

    /// Waits until `n` more puts were acknowledged.
    pub fn wait_puts(&self, n: usize) {
        let target = self.puts.load(Ordering::SeqCst) + n;
        eventually("puts go on", || self.puts.load(Ordering::SeqCst) >= target);
    }
}

/// One load thread: puts new keys, removes some of its own, reads back.
pub fn worker(client: &Client, id: usize, load: &Load, start: Instant) -> Ledger {
    let mut ledger = Ledger::default();
    let mut mine: Vec<String> = Vec::new();
    let cfg = ReplicaPolicy::default();
    let mut i = 0usize;
    while !load.stop.load(Ordering::SeqCst) {
        let key = format!("w{id}-{i}");
        i += 1;
        let v = value(&key, 4096 + (i % 7) * 512);
        if client.put(&key, &v, &cfg).is_ok() {
            load.note(start, &load.first_put);
            load.puts.fetch_add(1, Ordering::SeqCst);
            ledger.present.insert(key.clone(), v);
            mine.push(key);
        }
        if i.is_multiple_of(3) && mine.len() > 4 {
            let k = mine.swap_remove(i % mine.len());
            let was = ledger.present.remove(&k);
            match client.remove(&k, true) {
                Ok(()) => {
                    ledger.removed.insert(k);
                }
                // Unknown outcome: neither present nor removed is asserted.
                Err(_) => drop(was),
            }
        }
        if let Some(k) = mine.get(i % mine.len().max(1)) {
            if let Ok(got) = client.get(k) {
                load.note(start, &load.first_get);
                let now = start.elapsed().as_nanos() as u64;
                load.last_get.fetch_max(now, Ordering::SeqCst);
                if Some(&got) != ledger.present.get(k) {
                    load.wrong.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }
    ledger
}

/// Runs `threads` workers on `client` while `during` runs, then stops them.
pub fn under_load<R>(
    client: &Client,
    threads: usize,
    load: &Load,
    during: impl FnOnce(Instant) -> R,
) -> (Vec<Ledger>, R) {
    /// Stops the workers however `during` ends: a failed assertion in it
    /// must fail the test, not leave the scope waiting for them forever.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let start = Instant::now();
    load.killed(start);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|id| s.spawn(move || worker(client, id, load, start)))
            .collect();
        let stop = StopOnDrop(&load.stop);
        let r = during(start);
        drop(stop);
        let ledgers = workers.into_iter().map(|w| w.join().unwrap()).collect();
        (ledgers, r)
    })
}

/// Asserts the ledgers: no wrong read, every acknowledged put readable
/// byte-exact, every acknowledged remove still removed. Returns how many
/// puts and removes were checked.
pub fn check(client: &Client, load: &Load, ledgers: &[Ledger]) -> (usize, usize) {
    assert_eq!(
        load.wrong.load(Ordering::SeqCst),
        0,
        "a read returned wrong bytes"
    );
    let (mut present, mut removed) = (0, 0);
    for ledger in ledgers {
        for (k, v) in &ledger.present {
            assert_eq!(client.get(k).as_ref(), Ok(v), "acknowledged put {k} lost");
            present += 1;
        }
        for k in &ledger.removed {
            assert_eq!(
                code(client.get(k)),
                ErrorCode::OBJECT_NOT_FOUND,
                "removed {k} is back"
            );
            removed += 1;
        }
    }
    assert!(present > 0 && removed > 0, "the load did too little");
    (present, removed)
}

/// A store client holding a 256 MiB segment, finding its master through
/// `master` (an `etcd://`, `redis://` or `k8s://` address).
pub fn storage_client(master: &str, cluster: &str, metadata: &str) -> Client {
    Client::setup(&ClientConfig {
        cluster_id: cluster.to_string(),
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.to_string(),
        global_segment_size: 256 << 20,
        local_buffer_size: 64 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: master.to_string(),
        ..ClientConfig::default()
    })
    .unwrap()
}
