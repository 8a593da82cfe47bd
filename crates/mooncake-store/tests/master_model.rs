//! The master state machine against a model: random single-threaded
//! histories compared call by call, and many threads on overlapping keys
//! checked for per-thread model agreement and global invariants (space
//! accounting, no overlapping replicas).

use std::collections::HashMap;
use std::sync::Arc;

use mooncake_common::{ErrorCode, Result};
use mooncake_store::master::state::allocator::aligned_len;
use mooncake_store::master::{
    AllocationStrategy, EvictionPolicy, LeasePolicy, MasterService, Policy,
};
use mooncake_store::types::{ClientId, ReplicaDesc, ReplicaPolicy, SegmentInfo};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const LEASE: u64 = 100;

fn policy(lease_ttl: u64) -> Policy {
    Policy {
        lease: LeasePolicy {
            lease_ttl,
            soft_pin_ttl: 1_000,
        },
        client_ttl: u64::MAX / 4,
        discard_after: 1_000_000,
        release_after: 2_000_000,
        high_watermark: 1.0,
        eviction_ratio: 0.0,
        evict_soft_pinned: true,
        eviction_policy: EvictionPolicy::Frequency,
        strategy: AllocationStrategy::Random,
        put_fence: true,
    }
}

fn service(lease_ttl: u64, segments: usize, seg_size: u64) -> MasterService {
    let s = MasterService::with_policy(policy(lease_ttl));
    for i in 0..segments {
        let info = SegmentInfo {
            name: format!("seg{i}"),
            base: (i as u64 + 1) << 40,
            size: seg_size,
            transport_endpoint: format!("host{i}:1"),
        };
        s.mount_segment(1, &info, 0).unwrap();
    }
    s
}

fn code<T>(r: Result<T>) -> Option<ErrorCode> {
    r.err().map(|e| e.code)
}

/// What the model knows about a key.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Model {
    Pending { len: u64 },
    Complete { len: u64, lease_until: u64 },
}

#[test]
fn random_histories_match_the_model() {
    for seed in 0..20u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let s = service(LEASE, 3, 64 << 20);
        let mut model: HashMap<String, Model> = HashMap::new();
        let mut now = 0u64;
        const W: ClientId = 9;
        let cfg = ReplicaPolicy {
            replica_num: 2,
            ..Default::default()
        };
        for step in 0..3_000 {
            let key = format!("k{}", rng.gen_range(0..12));
            let ctx = format!("seed {seed} step {step} key {key} now {now}");
            let m = model.get(&key).copied();
            match rng.gen_range(0..10) {
                0 => now += rng.gen_range(0..2 * LEASE),
                1 | 2 => {
                    let len = rng.gen_range(1..10_000);
                    let upsert = rng.gen_bool(0.2);
                    let r = s.put_start(W, &key, len, &cfg, upsert, now);
                    match (m, upsert) {
                        (None, _) => {
                            let d = r.expect(&ctx);
                            assert_eq!(d.len(), 2, "{ctx}");
                            model.insert(key, Model::Pending { len });
                        }
                        (Some(Model::Pending { .. }), _) => {
                            assert_eq!(code(r), Some(ErrorCode::OBJECT_REPLICA_BUSY), "{ctx}")
                        }
                        (Some(Model::Complete { .. }), false) => {
                            assert_eq!(code(r), Some(ErrorCode::OBJECT_ALREADY_EXISTS), "{ctx}")
                        }
                        (Some(Model::Complete { .. }), true) => {
                            r.expect(&ctx);
                            // End it at once to keep the model small; the new version is unleased.
                            s.put_end(W, &key, now).expect(&ctx);
                            model.insert(
                                key,
                                Model::Complete {
                                    len,
                                    lease_until: now,
                                },
                            );
                        }
                    }
                }
                3 => {
                    let r = s.put_end(W, &key, now);
                    match m {
                        None => assert_eq!(code(r), Some(ErrorCode::OBJECT_NOT_FOUND), "{ctx}"),
                        Some(Model::Pending { len }) => {
                            r.expect(&ctx);
                            model.insert(
                                key,
                                Model::Complete {
                                    len,
                                    lease_until: now,
                                },
                            );
                        }
                        Some(Model::Complete { .. }) => r.expect(&ctx),
                    }
                }
                4 => {
                    let r = s.put_revoke(W, &key, now);
                    match m {
                        None => assert_eq!(code(r), Some(ErrorCode::OBJECT_NOT_FOUND), "{ctx}"),
                        Some(Model::Pending { .. }) => {
                            r.expect(&ctx);
                            model.remove(&key);
                        }
                        Some(Model::Complete { .. }) => {
                            assert_eq!(code(r), Some(ErrorCode::INVALID_WRITE), "{ctx}")
                        }
                    }
                }
                5 | 6 => {
                    let r = s.get_replica_list(&key, now);
                    match m {
                        None => assert_eq!(code(r), Some(ErrorCode::OBJECT_NOT_FOUND), "{ctx}"),
                        Some(Model::Pending { .. }) => {
                            assert_eq!(code(r), Some(ErrorCode::REPLICA_IS_NOT_READY), "{ctx}")
                        }
                        Some(Model::Complete { len, lease_until }) => {
                            let got = r.expect(&ctx);
                            assert_eq!(got.replicas.len(), 2, "{ctx}");
                            assert!(got.replicas.iter().all(|d| d.size() == len), "{ctx}");
                            model.insert(
                                key,
                                Model::Complete {
                                    len,
                                    lease_until: lease_until.max(now + LEASE),
                                },
                            );
                        }
                    }
                }
                7 => {
                    // A check leases nothing: the model stays as it is.
                    let r = s.exist_key(&key, now).unwrap();
                    assert_eq!(r, matches!(m, Some(Model::Complete { .. })), "{ctx}");
                }
                _ => {
                    let force = rng.gen_bool(0.3);
                    let r = s.remove(&key, force, now);
                    match m {
                        None => assert_eq!(code(r), Some(ErrorCode::OBJECT_NOT_FOUND), "{ctx}"),
                        Some(Model::Pending { .. }) if !force => {
                            assert_eq!(code(r), Some(ErrorCode::REPLICA_IS_NOT_READY), "{ctx}")
                        }
                        Some(Model::Complete { lease_until, .. })
                            if !force && lease_until > now =>
                        {
                            assert_eq!(code(r), Some(ErrorCode::OBJECT_HAS_LEASE), "{ctx}")
                        }
                        Some(_) => {
                            r.expect(&ctx);
                            model.remove(&key);
                        }
                    }
                }
            }
        }
        // Space: complete and pending objects account for every allocated byte
        // (forced removal of puts in flight parks their space until the release timeout).
        let mut expected = 0;
        for (key, m) in &model {
            let len = match m {
                Model::Pending { len } | Model::Complete { len, .. } => *len,
            };
            expected += 2 * aligned_len(len).unwrap();
            if matches!(m, Model::Pending { .. }) {
                s.put_revoke(W, key, now).unwrap();
                expected -= 2 * aligned_len(len).unwrap();
            }
        }
        s.tick(now + 3_000_000);
        assert_eq!(s.stats(now).allocated_bytes, expected, "seed {seed}");
        s.remove_all(true, now);
        assert_eq!(s.stats(now).allocated_bytes, 0, "seed {seed}");
    }
}

/// Replica ranges of every complete object must be disjoint.
fn assert_disjoint(replicas: &[(String, ReplicaDesc)]) {
    let mut ranges: Vec<(u64, u64, &str)> = replicas
        .iter()
        .map(|(k, d)| {
            let m = d.memory().unwrap();
            (
                m.buffer_address,
                m.buffer_address + aligned_len(m.size).unwrap(),
                k.as_str(),
            )
        })
        .collect();
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "replicas of {} and {} overlap",
            w[0].2,
            w[1].2
        );
    }
}

#[test]
fn threads_on_overlapping_keys_keep_the_invariants() {
    const THREADS: usize = 8;
    const OPS: usize = 20_000;
    const SHARED_KEYS: usize = 48;
    const MAX_REPLICAS: usize = 3;
    let s = Arc::new(service(0, 4, 4 << 20));
    let allowed = [
        ErrorCode::OBJECT_NOT_FOUND,
        ErrorCode::OBJECT_ALREADY_EXISTS,
        ErrorCode::OBJECT_REPLICA_BUSY,
        ErrorCode::REPLICA_IS_NOT_READY,
        ErrorCode::ILLEGAL_CLIENT,
        ErrorCode::INVALID_WRITE,
        ErrorCode::NO_AVAILABLE_HANDLE,
    ];
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let me = 100 + t as ClientId;
                let mut rng = StdRng::seed_from_u64(t as u64);
                // Private keys follow an exact model while the shared ones are contended.
                let mut private: HashMap<String, u64> = HashMap::new();
                let cfg = ReplicaPolicy {
                    replica_num: 1 + t % MAX_REPLICAS,
                    ..Default::default()
                };
                for i in 0..OPS {
                    let shared = rng.gen_bool(0.7);
                    let key = if shared {
                        format!("s{}", rng.gen_range(0..SHARED_KEYS))
                    } else {
                        format!("p{t}-{}", rng.gen_range(0..8))
                    };
                    let len = rng.gen_range(1..20_000);
                    let op = rng.gen_range(0..6);
                    let check = |r: Result<()>| {
                        if let Err(e) = r {
                            assert!(allowed.contains(&e.code), "thread {t} op {i} on {key}: {e}");
                        }
                    };
                    match op {
                        0 | 1 => match s.put_start(me, &key, len, &cfg, op == 1, 0) {
                            Ok(d) => {
                                // An upsert of an unchanged size reuses the existing replicas
                                // in place, and on a shared key another thread may have placed
                                // them with its own replica_num (at most MAX_REPLICAS).
                                let most = if op == 1 && shared {
                                    MAX_REPLICAS
                                } else {
                                    cfg.replica_num
                                };
                                assert!(
                                    !d.is_empty() && d.len() <= most,
                                    "thread {t} op {i} on {key}: {} replicas",
                                    d.len()
                                );
                                assert!(d.iter().all(|r| r.size() == len));
                                // On shared keys another thread may force-remove our put meanwhile.
                                if rng.gen_bool(0.9) {
                                    let r = s.put_end(me, &key, 0);
                                    if !shared {
                                        r.clone().unwrap();
                                        private.insert(key.clone(), len);
                                    }
                                    check(r);
                                } else {
                                    let r = s.put_revoke(me, &key, 0);
                                    if !shared {
                                        r.clone().unwrap();
                                        // Revoking an in-place upsert (same size) drops the torn object.
                                        if op == 1 && private.get(&key) == Some(&len) {
                                            private.remove(&key);
                                        }
                                    }
                                    check(r);
                                }
                            }
                            Err(e) => {
                                check(Err(e.clone()));
                                if !shared && e.code != ErrorCode::NO_AVAILABLE_HANDLE {
                                    assert!(
                                        op == 0 && private.contains_key(&key),
                                        "private {key}: {e}"
                                    );
                                }
                            }
                        },
                        2 | 3 => match s.get_replica_list(&key, 0) {
                            Ok(got) => {
                                assert!(!got.replicas.is_empty());
                                let size = got.replicas[0].size();
                                assert!(got.replicas.iter().all(|r| r.size() == size));
                                if !shared {
                                    assert_eq!(Some(&size), private.get(&key), "private {key}");
                                }
                            }
                            Err(e) => {
                                check(Err(e.clone()));
                                if !shared {
                                    assert!(!private.contains_key(&key), "private {key}: {e}");
                                }
                            }
                        },
                        4 => {
                            let r = s.remove(&key, rng.gen_bool(0.2), 0);
                            if !shared {
                                assert_eq!(
                                    r.is_ok(),
                                    private.remove(&key).is_some(),
                                    "private {key}"
                                );
                            }
                            check(r);
                        }
                        _ => {
                            let exists = s.exist_key(&key, 0).unwrap();
                            if !shared {
                                assert_eq!(exists, private.contains_key(&key), "private {key}");
                            }
                        }
                    }
                }
                private
            })
        })
        .collect();
    let mut private_all = HashMap::new();
    for h in handles {
        private_all.extend(h.join().unwrap());
    }

    // Quiescent: every private key is as its thread left it, every object's
    // replicas are disjoint, and allocation equals what the objects hold.
    let keys = s.all_keys();
    for (k, len) in &private_all {
        assert_eq!(s.get_size(k, 0).unwrap(), *len);
    }
    let mut replicas = Vec::new();
    let mut held = 0;
    for k in &keys {
        let got = s.get_replica_list(k, 0).unwrap();
        for d in got.replicas {
            held += aligned_len(d.size()).unwrap();
            replicas.push((k.clone(), d));
        }
    }
    assert_disjoint(&replicas);
    let stats = s.stats(0);
    assert_eq!(stats.pending_puts, 0);
    assert_eq!(stats.key_count as usize, keys.len());
    // Forced removals of puts in flight park their space until the release timeout.
    let parked: u64 = s.retired_bytes();
    assert_eq!(stats.allocated_bytes, held + parked);
    s.tick(3_000_000);
    assert_eq!(s.stats(0).allocated_bytes, held);
    assert_eq!(s.remove_all(true, 0) as usize, keys.len());
    assert_eq!(s.stats(0).allocated_bytes, 0);
}
