//! The object counts `/metrics` reads, kept as objects change, checked
//! against a walk over every object (here, not in `service`, because it
//! also takes snapshots).

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::master::config::policy::AllocationStrategy;
use crate::master::durable::snapshot::format::{self, SnapshotMeta};
use crate::master::durable::snapshot::RestoreProgress;
use crate::master::state::service::tests::{segment, service, step, History, Mirror, SEGMENTS};

/// The counts `/metrics` shows, kept as objects change, agree with a walk
/// over every object after every call of random histories, on a leader,
/// on a follower replaying its mutations, and on masters restored from
/// its snapshots (time only moves forward, as the master's clock does).
#[test]
fn object_counts_follow_every_change() {
    let mut soft_pinned_seen = 0;
    for seed in 0..16u64 {
        let follower = Arc::new(service(AllocationStrategy::Random));
        let mirror = Box::new(Mirror {
            follower: follower.clone(),
        });
        let leader = service(AllocationStrategy::Random).with_sink(mirror);
        for (name, owner) in SEGMENTS {
            leader.mount_segment(owner, &segment(name), 0).unwrap();
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut history = History::default();
        for i in 0..1_500 {
            step(&leader, &mut rng, &mut history);
            let now = history.now;
            let want = leader.objects_table().scan_counts(now);
            let ctx = format!("seed {seed} step {i}");
            assert_eq!(leader.objects_table().counts(now), want, "{ctx}: leader");
            assert_eq!(
                follower.objects_table().counts(now),
                follower.objects_table().scan_counts(now),
                "{ctx}: follower"
            );
            let stats = leader.stats(now);
            assert_eq!(
                (
                    stats.key_count,
                    stats.pending_puts,
                    stats.soft_pin_key_count,
                    stats.hard_pin_key_count
                ),
                (
                    want.complete,
                    want.pending,
                    want.soft_pinned,
                    want.hard_pinned
                ),
                "{ctx}: stats"
            );
            soft_pinned_seen += want.soft_pinned;
            if i % 250 == 249 {
                let meta = SnapshotMeta {
                    seq: 1,
                    term: 1,
                    now,
                };
                let bytes = format::encode(&leader, meta);
                let restored = service(AllocationStrategy::Random);
                format::decode_into(&bytes, &restored, &RestoreProgress::default()).unwrap();
                assert_eq!(
                    restored.objects_table().counts(now),
                    restored.objects_table().scan_counts(now),
                    "{ctx}: restored"
                );
                // Pins lapse with time alone.
                let later = now + 5_000;
                assert_eq!(
                    restored.objects_table().counts(later),
                    restored.objects_table().scan_counts(later),
                    "{ctx}: restored later"
                );
            }
        }
    }
    assert!(soft_pinned_seen > 0, "the histories soft-pin objects");
}
