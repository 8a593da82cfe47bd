//! The put fence of a replicated leader (`segments::space`): puts placed
//! in reserved space, reservations logged, and the reserved space a new
//! leader finds retired for the put release timeout.

use mooncake_common::{ErrorCode, Result};

use super::MasterService;
use crate::master::state::mutation::{Call, Mutation, Release};
use crate::master::state::segments::space::{all_reserved, Reserving};
use crate::master::state::segments::{Placement, Segment};
use crate::types::ReplicaPolicy;

/// Logs the reservations a placement makes, for `call`.
struct Log<'a>(&'a MasterService, &'a mut Call);

impl Reserving for Log<'_> {
    fn reserved(&mut self, segment: &Segment, offset: u64, len: u64) -> u64 {
        let Log(s, call) = self;
        // The reservation is made under its segment's space lock, which a
        // cut also takes: holding the cut out while it is logged is enough.
        let _cut = s.objects.hold_cut();
        let m = Mutation::Reserve {
            segment: segment.id,
            offset,
            len,
        };
        let at = s.sink.as_ref().map_or(Release::Now, |k| k.applied(&m));
        call.logged(at);
        at.position()
    }
}

impl MasterService {
    /// Places a new version's replicas. With the fence, in reserved space
    /// where it fits, and the call is then answered once the reservations
    /// are committed (`Call::answer_at`) rather than its own entries.
    pub(super) fn place_put(
        &self,
        call: &mut Call,
        len: u64,
        cfg: &ReplicaPolicy,
        now: u64,
    ) -> Result<Vec<Placement>> {
        if !self.fence {
            return self.place(len, cfg, now);
        }
        let mut at = Some(0u64);
        let mut log = Log(self, call);
        let mut carve = |seg: &Segment, n: u64| {
            let c = seg.carve(n, &mut log)?;
            at = at.zip(c.reserved_at).map(|(a, b)| a.max(b));
            Some(c.offset)
        };
        let placed = self.segments.place_ranked(
            len,
            cfg,
            self.policy.strategy,
            &|s| self.segment_score(s),
            &mut carve,
            now,
        );
        let placed = match placed {
            Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE => {
                // Full but for reserved space: it goes back, and the put
                // is placed as without the fence.
                if self.unreserve_all(call, now, now) == 0 {
                    return Err(e);
                }
                at = None;
                self.place(len, cfg, now)?
            }
            r => r?,
        };
        match at {
            Some(upto) => call.answer_at(upto),
            None => call.answer_after_all(),
        }
        Ok(placed)
    }

    /// A new leader at `now`: the reserved space it inherits may hold puts
    /// its predecessor answered but never committed, whose writers may
    /// still write. Retired until the put release timeout, then freed.
    /// (It answers no call: the master serves none yet.)
    pub(crate) fn retire_reserved(&self, now: u64) -> usize {
        let free_at = now.saturating_add(self.policy.release_after);
        self.unreserve_all(&mut Call::default(), free_at, now)
    }

    /// Gives back every reserved range no object took, freed at `free_at`.
    fn unreserve_all(&self, call: &mut Call, free_at: u64, now: u64) -> usize {
        let ranges = all_reserved(&self.segments.all());
        let mut n = 0;
        for (seg, offset, len) in ranges {
            // Taken, logged and given back with no cut between.
            let _cut = self.objects.hold_cut();
            if seg.take_reserved(offset, len) {
                let _logged = self.observe(
                    call,
                    &Mutation::Unreserve {
                        segment: seg.id,
                        offset,
                        len,
                        free_at,
                        now,
                    },
                );
                self.release_unreserved(seg, offset, len, free_at, now);
                n += 1;
            }
        }
        n
    }

    /// Frees (or retires until `free_at`) a range taken out of reserved space.
    fn release_unreserved(
        &self,
        segment: std::sync::Arc<Segment>,
        offset: u64,
        len: u64,
        free_at: u64,
        now: u64,
    ) {
        if free_at <= now {
            segment.free(offset, len);
        } else {
            self.retired
                .retire(&[Placement { segment, offset }], len, free_at);
        }
    }

    /// Replays a `Reserve` or `Unreserve` (a standby); false when it
    /// does not fit this state.
    pub(super) fn replay_space(&self, call: &mut Call, m: Mutation<'_>) -> bool {
        let _cut = self.observe(call, &m);
        let (Mutation::Reserve {
            segment,
            offset,
            len,
        }
        | Mutation::Unreserve {
            segment,
            offset,
            len,
            ..
        }) = m
        else {
            return false;
        };
        let Some(seg) = self.segments.any_by_id(segment) else {
            return false;
        };
        if !seg.is_mounted() {
            // Unmounted since: its space went with it.
            return true;
        }
        match m {
            Mutation::Unreserve { free_at, now, .. } => {
                if !seg.take_reserved(offset, len) {
                    return false;
                }
                self.release_unreserved(seg, offset, len, free_at, now);
                true
            }
            _ => seg.add_reserved(offset, len),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::super::tests::{segment, service};
    use super::MasterService;
    use crate::master::config::policy::AllocationStrategy;
    use crate::master::durable::oplog::OwnedMutation;
    use crate::master::state::mutation::{Mutation, MutationSink, Release};
    use crate::proto::{Request, Response};
    use crate::types::{ReplicaKind, ReplicaPolicy};

    /// A leader's log, positions from 1.
    #[derive(Default)]
    struct Log(Mutex<Vec<OwnedMutation>>);

    impl MutationSink for Arc<Log> {
        fn applied(&self, m: &Mutation<'_>) -> Release {
            let mut log = self.0.lock();
            log.push(OwnedMutation::from_mutation(m));
            Release::Committed(log.len() as u64)
        }
    }

    /// Puts `key` (1 KiB, one replica) and returns its offset in "a1".
    fn put(s: &MasterService, key: &str, now: u64) -> Option<u64> {
        let cfg = ReplicaPolicy::default();
        let descs = s.put_start(7, key, 1024, &cfg, false, now).ok()?;
        match &descs[0].kind {
            ReplicaKind::Memory(m) => Some(m.buffer_address - segment("a1").base),
            other => panic!("{other:?}"),
        }
    }

    /// A leader answers a put before its entry is committed; it dies, and
    /// the standby that takes over holds the log only up to what that
    /// answer waited for. Until the put release timeout it must not hand
    /// the put's range to anyone: its writer may still be writing.
    #[test]
    fn a_new_leader_never_hands_out_space_an_answered_put_may_be_writing() {
        let log = Arc::new(Log::default());
        let a = service(AllocationStrategy::Random)
            .with_sink(Box::new(log.clone()))
            .with_put_fence();
        a.mount_segment(1, &segment("a1"), 0).unwrap();
        let start = Request::PutStart {
            client_id: 7,
            key: "k",
            value_len: 1024,
            config: ReplicaPolicy::default(),
            upsert: false,
        };
        let answer = a.handle(start, 10);
        let Response::Replicas { result: Ok(descs) } = answer.response else {
            panic!("{:?}", answer.response)
        };
        let offset = match &descs[0].kind {
            ReplicaKind::Memory(m) => m.buffer_address - segment("a1").base,
            other => panic!("{other:?}"),
        };
        let Release::Committed(upto) = answer.release else {
            panic!("{:?}", answer.release)
        };
        let entries = log.0.lock().clone();
        assert!(
            (upto as usize) < entries.len(),
            "the put's own entry comes after what its answer waited for"
        );

        let b = service(AllocationStrategy::Random).with_put_fence();
        for m in &entries[..upto as usize] {
            b.apply_logged(m).unwrap();
        }
        assert!(!b.exist_key("k", 20).unwrap(), "never committed");
        assert!(b.retire_reserved(20) > 0);
        let overlaps = |o: u64| o < offset + 1024 && offset < o + 1024;
        let mut n = 0;
        while let Some(o) = put(&b, &format!("b{n}"), 30) {
            assert!(!overlaps(o), "put b{n} at {o} overlaps k at {offset}");
            n += 1;
        }
        assert!(n > 0);
        // Past the release timeout (600 ms in these tests) it is free.
        b.ping(1, 600).unwrap();
        b.tick(20 + 600);
        let mut reused = false;
        while let Some(o) = put(&b, &format!("c{n}"), 700) {
            reused |= overlaps(o);
            n += 1;
        }
        assert!(reused, "the retired range came back");
    }
}
