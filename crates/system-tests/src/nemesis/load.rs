//! The load of a nemesis run: tasks that each own a store client (holding
//! a segment) and put new keys, read back their live ones, and remove the
//! oldest, recording every outcome in a [`History`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::ReplicaPolicy;

use super::checker::{value_of, History, Outcome};

/// Keys a task keeps live; older ones are removed, so the data stays far
/// below the segments' size (no eviction) however long the run, and
/// removes start early even when a loaded machine makes puts slow.
const LIVE: usize = 50;

/// What the tasks share: when puts were acknowledged.
pub struct Pulse {
    start: Instant,
    pub stop: AtomicBool,
    /// Nanoseconds since `start` of the latest acknowledged put.
    last_put: AtomicU64,
    /// Longest time between two acknowledged puts, in nanoseconds.
    worst_gap: AtomicU64,
    /// Acknowledged removes so far.
    pub acked_removes: AtomicU64,
    /// Reads of an acknowledged, never removed key that found nothing
    /// (the final check says whether it was lost).
    pub missing_reads: AtomicU64,
}

impl Pulse {
    pub fn new() -> Arc<Pulse> {
        Arc::new(Pulse {
            start: Instant::now(),
            stop: AtomicBool::new(false),
            last_put: AtomicU64::new(0),
            worst_gap: AtomicU64::new(0),
            acked_removes: AtomicU64::new(0),
            missing_reads: AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn put_acked(&self) {
        let now = self.now();
        let prev = self.last_put.fetch_max(now, Ordering::SeqCst);
        if prev > 0 && now > prev {
            self.worst_gap.fetch_max(now - prev, Ordering::SeqCst);
        }
    }

    /// Whether a put was acknowledged after `t`.
    pub fn put_since(&self, t: Instant) -> bool {
        let at = t.saturating_duration_since(self.start).as_nanos() as u64;
        self.last_put.load(Ordering::SeqCst) > at
    }

    /// The longest time without an acknowledged put so far.
    pub fn worst_gap(&self) -> Duration {
        Duration::from_nanos(self.worst_gap.load(Ordering::SeqCst))
    }
}

/// A store client holding a 64 MiB segment, finding the leader through
/// `master` (an `etcd://`, `redis://` or `k8s://` address).
pub fn client(master: &str, cluster: &str, metadata: &str) -> Client {
    Client::setup(&ClientConfig {
        cluster_id: cluster.to_string(),
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.to_string(),
        global_segment_size: 64 << 20,
        local_buffer_size: 32 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: master.to_string(),
        ..ClientConfig::default()
    })
    .expect("store client")
}

/// One load task: keys `<name>-<n>`, until `pulse.stop`.
pub fn run(client: &Client, name: &str, pulse: &Pulse) -> History {
    let mut h = History::default();
    let policy = ReplicaPolicy::default();
    // Keys put (acknowledged or not) and not removed yet, oldest first.
    let mut live: std::collections::VecDeque<String> = Default::default();
    let mut n = 0u64;
    // When each live key's put was acknowledged, to place a loss in the
    // masters' logs.
    let mut acked_at: std::collections::HashMap<String, String> = Default::default();
    while !pulse.stop.load(Ordering::SeqCst) {
        let key = format!("{name}-{n}");
        n += 1;
        match client.put(&key, &value_of(&key), &policy) {
            Ok(()) => {
                h.put(&key, Outcome::Acked);
                pulse.put_acked();
                acked_at.insert(key.clone(), wall_clock());
            }
            Err(_) => h.put(&key, Outcome::Unknown),
        }
        live.push_back(key);
        if live.len() > LIVE {
            let old = live.pop_front().expect("not empty");
            let put_at = acked_at.remove(&old);
            let vanished = h.vanished.len();
            let sent = wall_clock();
            let acked = remove(client, &old, &mut h);
            if h.vanished.len() > vanished {
                println!(
                    "nemesis: {old}: put acknowledged at {}, a remove sent at {sent} found it absent at {}",
                    put_at.as_deref().unwrap_or("?"),
                    wall_clock()
                );
            }
            if acked {
                pulse.acked_removes.fetch_add(1, Ordering::SeqCst);
            }
        }
        // Read back a live key whose put was acknowledged.
        let pick = live[(n as usize * 7919) % live.len()].clone();
        if h.keys[&pick].put == Some(Outcome::Acked) {
            match client.get(&pick) {
                Ok(got) => {
                    h.read(&pick, &got);
                }
                Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => {
                    pulse.missing_reads.fetch_add(1, Ordering::SeqCst);
                }
                Err(_) => {}
            }
        }
        // Leave the masters some of the two cores.
        std::thread::sleep(Duration::from_millis(1));
    }
    h
}

/// Seconds since the epoch, to the millisecond (`date -ud @<this>`).
fn wall_clock() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:03}", t.as_secs(), t.subsec_millis())
}

/// Removes `key`; returns whether the remove was acknowledged.
fn remove(client: &Client, key: &str, h: &mut History) -> bool {
    match client.remove(key, true) {
        Ok(()) => {
            h.remove(key, Outcome::Acked);
            return true;
        }
        Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => h.remove_found_absent(key),
        Err(_) => h.remove(key, Outcome::Unknown),
    }
    false
}
