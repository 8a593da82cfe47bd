//! The decide/apply split is complete: a follower that only replays the
//! mutations a leader's sink sees, reserving each logged range itself,
//! stays in the leader's replicated state through random histories of
//! every call.

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::MasterService;
use crate::master::config::policy::{
    AllocationStrategy, EvictionPolicy, LeasePolicy, OffloadPolicy, Policy, TaskPolicy,
};
use crate::master::state::mutation::{Mutation, MutationSink, ObjectOp, Release, Write};
use crate::master::state::objects::{ObjectMeta, PendingKind, Replicas, SHARDS};
use crate::master::state::segments::Placement;
use crate::types::{ClientId, ReplicaPolicy, SegmentInfo, TaskId};

pub(in crate::master) const OWNERS: [ClientId; 2] = [1, 2];
pub(in crate::master) const WRITERS: [ClientId; 2] = [7, 8];
pub(in crate::master) const SEGMENTS: [(&str, ClientId); 3] = [("a1", 1), ("a2", 1), ("b1", 2)];

fn policy(strategy: AllocationStrategy) -> Policy {
    Policy {
        lease: LeasePolicy {
            lease_ttl: 100,
            soft_pin_ttl: 1_000,
        },
        client_ttl: 500,
        discard_after: 300,
        release_after: 600,
        high_watermark: 0.8,
        eviction_ratio: 0.2,
        evict_soft_pinned: true,
        eviction_policy: EvictionPolicy::Frequency,
        strategy,
        put_fence: true,
    }
}

pub(in crate::master) fn service(strategy: AllocationStrategy) -> MasterService {
    MasterService::with_policy(policy(strategy))
        .with_task_policy(TaskPolicy {
            pending_timeout: 700,
            processing_timeout: 900,
            max_finished: 4,
            ..TaskPolicy::default()
        })
        .with_offload_policy(OffloadPolicy {
            enabled: true,
            queue_limit: 6,
            ..OffloadPolicy::default()
        })
}

pub(in crate::master) fn segment(name: &str) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        base: 1 << 40,
        size: 64 << 10,
        transport_endpoint: format!("{name}:1"),
    }
}

/// Replays what the leader applies into `follower`, as a standby would.
pub(in crate::master) struct Mirror {
    pub(in crate::master) follower: Arc<MasterService>,
}

impl MutationSink for Mirror {
    fn applied(&self, m: &Mutation<'_>) -> Release {
        let m = reserve_on(&self.follower, m);
        if let Err(e) = self.follower.replay(m) {
            panic!("replay failed: {e}");
        }
        Release::Now
    }
}

/// `m` with its placements reserved on `f`'s segments: allocating the
/// same sizes in the same order from the same state must give the logged
/// offsets.
fn reserve_on<'a>(f: &MasterService, m: &Mutation<'a>) -> Mutation<'a> {
    let mut m = m.clone();
    let Mutation::Object { key, op } = &mut m else {
        return m;
    };
    let reserve = |r: &Replicas, size: u64| {
        let placed = r.as_slice().iter().map(|p| {
            let seg = f.segments.get(&p.segment.info.name).expect("mounted here");
            let offset = seg.allocate(size).expect("room here");
            assert_eq!(offset, p.offset, "{key}: a logged range differs");
            Placement {
                segment: seg,
                offset,
            }
        });
        Replicas::from_vec(placed.collect())
    };
    match op {
        ObjectOp::PutStart {
            size,
            write: Write::Fresh(r) | Write::Replacing(r),
            ..
        } => *r = reserve(r, *size),
        ObjectOp::TransferStart { replicas, .. } => {
            let size = f.objects.lock(key).get(key).expect("present").size;
            *replicas = reserve(replicas, size);
        }
        _ => {}
    }
    m
}

fn placements(r: &Replicas) -> Vec<(String, u64)> {
    let v = r.as_slice().iter();
    v.map(|p| (p.segment.info.name.clone(), p.offset)).collect()
}

/// An object's replicated state (not its lease or soft-pin deadline).
fn replicated(o: &ObjectMeta) -> String {
    let pending = o.pending.as_ref().map(|p| {
        let kind = match &p.kind {
            PendingKind::Fresh => "fresh".to_string(),
            PendingKind::InPlace => "in place".to_string(),
            PendingKind::Replacing {
                replicas,
                size,
                flags,
            } => format!("replacing {:?} {size} {flags}", placements(replicas)),
            PendingKind::Replicating {
                replicas,
                drop_source,
            } => format!("replicating {:?} {drop_source:?}", placements(replicas)),
        };
        (p.client, p.started, kind)
    });
    let replicas = placements(&o.replicas);
    format!("{} {:x} {replicas:?} {pending:?}", o.size, o.flags)
}

pub(in crate::master) fn assert_same(
    l: &MasterService,
    f: &MasterService,
    tasks: &[TaskId],
    ctx: &str,
) {
    let segs = l.segments.all();
    assert_eq!(segs.len(), f.segments.all().len(), "{ctx}: segments");
    for s in &segs {
        let t = f.segments.get(&s.info.name).expect("mounted on both");
        assert_eq!(
            (s.id, s.owner, &s.info, s.used(), s.reserved_ranges()),
            (t.id, t.owner, &t.info, t.used(), t.reserved_ranges()),
            "{ctx}"
        );
    }
    let mut objects = 0;
    for i in 0..SHARDS {
        let shard = l.objects.lock_shard(i);
        for (key, o) in shard.iter() {
            objects += 1;
            let theirs = f.objects.lock(key);
            let p = theirs
                .get(key)
                .unwrap_or_else(|| panic!("{ctx}: {key} missing"));
            assert_eq!(replicated(o), replicated(p), "{ctx}: {key}");
        }
    }
    let theirs: usize = (0..SHARDS).map(|i| f.objects.lock_shard(i).len()).sum();
    assert_eq!(objects, theirs, "{ctx}: object count");
    let (lc, fc) = (l.clients.lock(), f.clients.lock());
    assert_eq!(lc.len(), fc.len(), "{ctx}: clients");
    for c in OWNERS.iter().chain(&WRITERS) {
        assert_eq!(lc.contains(*c), fc.contains(*c), "{ctx}: client {c}");
    }
    let (lt, ft) = (l.tasks.lock(), f.tasks.lock());
    assert_eq!(
        (lt.pending(), lt.processing()),
        (ft.pending(), ft.processing())
    );
    for &id in tasks {
        assert_eq!(lt.info(id, 0), ft.info(id, 0), "{ctx}: task {id}");
    }
    assert_eq!(l.retired_bytes(), f.retired_bytes(), "{ctx}: retired");
    assert_eq!(l.disk.snapshot(), f.disk.snapshot(), "{ctx}: SSD tiers");
    assert_eq!(
        l.objects.groups.export(),
        f.objects.groups.export(),
        "{ctx}: groups"
    );
}

fn config(rng: &mut StdRng) -> ReplicaPolicy {
    let pick = |rng: &mut StdRng| SEGMENTS[rng.gen_range(0..SEGMENTS.len())].0.to_string();
    ReplicaPolicy {
        replica_num: rng.gen_range(1..=3),
        with_soft_pin: rng.gen_bool(0.2),
        with_hard_pin: rng.gen_bool(0.1),
        preferred_segment: if rng.gen_bool(0.3) {
            pick(rng)
        } else {
            String::new()
        },
        ..ReplicaPolicy::default()
    }
}

/// Keys k0, k4, ... name no group; k1, k5, ... name none explicitly; the
/// others are in one of two groups, for life (drawn from the key, so the
/// random sequence stays what it was).
fn grouped(key: &str, mut cfg: ReplicaPolicy) -> ReplicaPolicy {
    let n: usize = key[1..].parse().expect("k<n>");
    cfg.group_ids = match n % 4 {
        0 => None,
        1 => Some(vec![String::new()]),
        _ => Some(vec![format!("g{}", n % 2)]),
    };
    cfg
}

/// What the history remembers to make likely calls.
#[derive(Default)]
pub(in crate::master) struct History {
    pub(in crate::master) now: u64,
    /// Who started the last put of each key.
    pub(in crate::master) writers: HashMap<String, ClientId>,
    /// Transfers started: (key, executor).
    pub(in crate::master) transfers: Vec<(String, ClientId)>,
    pub(in crate::master) tasks: Vec<TaskId>,
}

/// One random call on the leader; its result does not matter, only that
/// the follower follows.
pub(in crate::master) fn step(s: &MasterService, rng: &mut StdRng, h: &mut History) {
    let key = format!("k{}", rng.gen_range(0..16));
    let writer = match h.writers.get(&key) {
        Some(&w) if rng.gen_bool(0.9) => w,
        _ => WRITERS[rng.gen_range(0..WRITERS.len())],
    };
    let (seg, owner) = SEGMENTS[rng.gen_range(0..SEGMENTS.len())];
    let (other, _) = SEGMENTS[rng.gen_range(0..SEGMENTS.len())];
    let task = h.tasks.last().copied().unwrap_or(0);
    let t = h.now;
    match rng.gen_range(0..30) {
        0..=4 => {
            let len = if rng.gen_bool(0.3) {
                4096
            } else {
                rng.gen_range(1..12 << 10)
            };
            let cfg = grouped(&key, config(rng));
            if s.put_start(writer, &key, len, &cfg, rng.gen_bool(0.4), t)
                .is_ok()
            {
                h.writers.insert(key, writer);
            }
        }
        5..=8 => {
            let _ = s.put_end(writer, &key, t);
        }
        9 => {
            let _ = s.put_revoke(writer, &key, t);
        }
        10 => {
            let _ = s.get_replica_list(&key, t);
        }
        11 => {
            let _ = s.remove(&key, rng.gen_bool(0.3), t);
        }
        12 => {
            let _ = s.remove_by_regex("^k1", rng.gen_bool(0.5), t);
        }
        13 if rng.gen_bool(0.2) => {
            let _ = s.remove_all(rng.gen_bool(0.5), t);
        }
        14 => {
            let name = if rng.gen_bool(0.3) { "" } else { seg };
            let _ = s.batch_replica_clear(&[key.as_str(), "k3"], name, t);
        }
        15 => {
            let _ = s.mount_segment(owner, &segment(seg), t);
        }
        16 if rng.gen_bool(0.3) => {
            let _ = s.unmount_segment(owner, seg, t);
        }
        17 => {
            if let Ok(id) = s.create_copy_task(&key, &[seg], t) {
                h.tasks.push(id);
            }
        }
        18 => {
            if let Ok(id) = s.create_move_task(&key, other, seg, t) {
                h.tasks.push(id);
            }
        }
        19 => {
            let _ = s.fetch_tasks(owner, 2, t);
        }
        20 | 21 => {
            let source = if rng.gen_bool(0.5) { other } else { "" };
            if s.replica_transfer_start(owner, &key, source, &[seg], t)
                .is_ok()
            {
                h.transfers.push((key, owner));
            }
        }
        22 | 23 if !h.transfers.is_empty() => {
            let (key, client) = h.transfers.swap_remove(rng.gen_range(0..h.transfers.len()));
            if rng.gen_bool(0.7) {
                let _ = s.replica_transfer_end(client, &key, t);
            } else {
                let _ = s.replica_transfer_revoke(client, &key);
            }
        }
        24 => {
            let _ = s.mark_task_complete(owner, task, rng.gen_bool(0.7), "done", t);
        }
        25 => {
            // Two directories; mounting one another client holds is a takeover.
            // Or a storage client withdraws its tier.
            if rng.gen_bool(0.15) {
                let _ = s.unmount_local_disk(owner);
            } else {
                let tier = ["t1", "t2"][rng.gen_range(0..2)];
                let _ = s.mount_local_disk(owner, tier, "svc:1", 1 << 20, t);
            }
        }
        26 => {
            if let Ok(batch) = s.fetch_offload_tasks(owner, 4, t) {
                let keys: Vec<&str> = batch.tasks.iter().map(|t| t.key.as_str()).collect();
                let sizes: Vec<u64> = batch.tasks.iter().map(|t| t.size).collect();
                if rng.gen_bool(0.8) {
                    let _ = s.notify_offload(owner, &keys, &sizes, false, t);
                } else {
                    let _ = s.notify_offload_failure(owner, &keys);
                }
            }
        }
        27 => {
            let size = if rng.gen_bool(0.5) {
                4096
            } else {
                rng.gen_range(1..12 << 10)
            };
            let _ = s.notify_offload(owner, &[key.as_str()], &[size], true, t);
        }
        28 => {
            let _ = s.evict_disk_replicas(owner, &[key.as_str()], t);
        }
        _ => {
            // Time passes; owners usually keep their heartbeat.
            h.now += if rng.gen_bool(0.1) {
                rng.gen_range(200..700)
            } else {
                rng.gen_range(0..60)
            };
            for c in OWNERS.iter().chain(&WRITERS) {
                if rng.gen_bool(0.8) {
                    let _ = s.ping(*c, h.now);
                }
            }
            s.tick(h.now);
        }
    }
}

#[test]
fn a_follower_replaying_the_mutations_stays_in_step() {
    for seed in 0..24u64 {
        let strategy = if seed % 2 == 0 {
            AllocationStrategy::Random
        } else {
            AllocationStrategy::FreeRatioFirst
        };
        let follower = Arc::new(service(strategy));
        let mirror = Box::new(Mirror {
            follower: follower.clone(),
        });
        let leader = service(strategy).with_sink(mirror);
        for (name, owner) in SEGMENTS {
            leader.mount_segment(owner, &segment(name), 0).unwrap();
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut history = History::default();
        for i in 0..1_500 {
            step(&leader, &mut rng, &mut history);
            let ctx = format!("seed {seed} step {i}");
            assert_same(&leader, &follower, &history.tasks, &ctx);
        }
    }
}

#[test]
fn replay_refuses_what_does_not_fit() {
    let s = service(AllocationStrategy::Random);
    let end = ObjectOp::PutEnd {
        now: 0,
        readers_until: 0,
    };
    let err = s
        .replay(Mutation::Object { key: "k", op: end })
        .unwrap_err();
    assert_eq!(err.code, mooncake_common::ErrorCode::INTERNAL_ERROR);
    let unmount = crate::master::state::mutation::SegmentOp::Unmount { name: "a1" };
    assert!(s.replay(Mutation::Segment(unmount)).is_err());
}
