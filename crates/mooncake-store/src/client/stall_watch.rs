//! Reads left waiting on a replica nothing else can stand in for. A read
//! planned before the master Suspected its holder has no short deadline:
//! if that holder stalls, the read would wait the whole engine transfer
//! timeout. Once such a read is past its hedge delay with no other replica
//! to hedge to, the client asks the master again every [`RECHECK`] whether
//! the holder is Suspected now; from the answer that says so, the read has
//! the Suspected deadline (`MC_STORE_SUSPECT_READ_TIMEOUT_MS`, measured
//! from that answer), and is canceled when it runs out. A holder that is
//! merely slow but still pings the master is never Suspected, so its reads
//! end only when they complete or time out. Pure logic: the clock is an
//! argument.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::types::{GetReplicaListResponse, MemoryDescriptor};

/// How often a waiting read asks the master about its holder.
pub(crate) const RECHECK: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Watched {
    /// When to ask the master next (`None` once it said Suspected).
    next_ask: Option<Instant>,
    /// Canceled at this instant (set once the master said Suspected).
    deadline: Option<Instant>,
}

/// The reads of one round (by plan index) whose holder is watched.
#[derive(Debug)]
pub(crate) struct StallWatch {
    timeout: Duration,
    interval: Duration,
    plans: BTreeMap<usize, Watched>,
}

impl StallWatch {
    /// `timeout`: how long a read may go on once its holder is known
    /// Suspected; `interval`: between two questions to the master.
    pub(crate) fn new(timeout: Duration, interval: Duration) -> Self {
        StallWatch {
            timeout,
            interval,
            plans: BTreeMap::new(),
        }
    }

    /// Starts watching `plan`'s read: the first question is due at once
    /// (the read is already past its hedge delay).
    pub(crate) fn watch(&mut self, plan: usize, now: Instant) {
        self.plans.entry(plan).or_insert(Watched {
            next_ask: Some(now),
            deadline: None,
        });
    }

    /// Stops watching `plan` (its read settled).
    pub(crate) fn forget(&mut self, plan: usize) {
        self.plans.remove(&plan);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// The plans watched, ascending.
    pub(crate) fn plans(&self) -> Vec<usize> {
        self.plans.keys().copied().collect()
    }

    /// The plans whose holder to ask the master about now.
    pub(crate) fn due(&self, now: Instant) -> Vec<usize> {
        self.plans
            .iter()
            .filter(|(_, w)| w.next_ask.is_some_and(|t| t <= now))
            .map(|(&p, _)| p)
            .collect()
    }

    /// The master answered about `plan`'s holder at `now`: Suspected
    /// starts its deadline; anything else (not Suspected, no answer) asks
    /// again after the interval.
    pub(crate) fn answered(&mut self, plan: usize, suspected: bool, now: Instant) {
        let Some(w) = self.plans.get_mut(&plan) else {
            return;
        };
        if suspected {
            w.next_ask = None;
            w.deadline = Some(now + self.timeout);
        } else {
            w.next_ask = Some(now + self.interval);
        }
    }

    /// The plans whose deadline passed, no longer watched: cancel them.
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<usize> {
        let out: Vec<usize> = self
            .plans
            .iter()
            .filter(|(_, w)| w.deadline.is_some_and(|d| d <= now))
            .map(|(&p, _)| p)
            .collect();
        for p in &out {
            self.plans.remove(p);
        }
        out
    }

    /// The next instant something is due (a question or a deadline).
    pub(crate) fn next_event(&self) -> Option<Instant> {
        self.plans
            .values()
            .filter_map(|w| w.next_ask.or(w.deadline))
            .min()
    }
}

/// Whether the master's `answer` lists a memory replica on the holder of
/// `reading` (its engine endpoint) marked Suspected.
pub(crate) fn holder_suspected(
    answer: &GetReplicaListResponse,
    reading: &MemoryDescriptor,
) -> bool {
    answer
        .replicas
        .iter()
        .filter_map(|r| r.memory())
        .any(|m| m.suspected && m.transport_endpoint == reading.transport_endpoint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ReplicaDesc, ReplicaKind, ReplicaStatus};

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn watch() -> StallWatch {
        StallWatch::new(MS(2000), MS(250))
    }

    #[test]
    fn asks_at_once_then_every_interval_while_not_suspected() {
        let t0 = Instant::now();
        let mut w = watch();
        assert!(w.is_empty());
        w.watch(3, t0);
        assert_eq!(w.due(t0), [3]);
        w.answered(3, false, t0 + MS(5));
        assert!(w.due(t0 + MS(254)).is_empty());
        assert_eq!(w.next_event(), Some(t0 + MS(255)));
        assert_eq!(w.due(t0 + MS(255)), [3]);
        // A merely slow holder: never canceled, however long it takes.
        let mut now = t0;
        for _ in 0..400 {
            now += MS(250);
            w.answered(3, false, now);
            assert!(w.expired(now).is_empty());
        }
        assert_eq!(w.plans(), [3]);
    }

    #[test]
    fn suspected_starts_the_deadline_from_the_answer() {
        let t0 = Instant::now();
        let mut w = watch();
        w.watch(0, t0);
        w.watch(1, t0);
        w.answered(0, true, t0 + MS(700));
        w.answered(1, false, t0 + MS(700));
        // No more questions about a Suspected holder.
        assert_eq!(w.due(t0 + MS(2600)), [1]);
        assert!(w.expired(t0 + MS(2699)).is_empty());
        assert_eq!(w.next_event(), Some(t0 + MS(950)));
        assert_eq!(w.expired(t0 + MS(2700)), [0]);
        assert_eq!(w.plans(), [1], "expired plans are no longer watched");
        assert!(w.expired(t0 + MS(9000)).is_empty());
    }

    #[test]
    fn forgotten_and_rewatched_plans() {
        let t0 = Instant::now();
        let mut w = watch();
        w.watch(2, t0);
        w.answered(2, true, t0);
        // Watching again keeps the running deadline.
        w.watch(2, t0 + MS(1000));
        assert_eq!(w.next_event(), Some(t0 + MS(2000)));
        w.forget(2);
        assert!(w.is_empty());
        assert_eq!(w.next_event(), None);
        assert!(w.expired(t0 + MS(5000)).is_empty());
        // An answer about a plan no longer watched changes nothing.
        w.answered(2, true, t0);
        assert!(w.is_empty());
    }

    fn mem(endpoint: &str, suspected: bool) -> MemoryDescriptor {
        MemoryDescriptor {
            segment_name: endpoint.into(),
            transport_endpoint: endpoint.into(),
            buffer_address: 4096,
            size: 10,
            suspected,
        }
    }

    fn answer(reps: Vec<MemoryDescriptor>) -> GetReplicaListResponse {
        GetReplicaListResponse {
            replicas: reps
                .into_iter()
                .map(|m| ReplicaDesc {
                    kind: ReplicaKind::Memory(m),
                    status: ReplicaStatus::Complete,
                })
                .collect(),
            lease_ttl_ms: 5000,
        }
    }

    #[test]
    fn only_the_read_holder_marked_suspected_counts() {
        let reading = mem("h1:1", false);
        assert!(holder_suspected(&answer(vec![mem("h1:1", true)]), &reading));
        assert!(!holder_suspected(
            &answer(vec![mem("h1:1", false)]),
            &reading
        ));
        assert!(!holder_suspected(
            &answer(vec![mem("h2:1", true)]),
            &reading
        ));
        assert!(!holder_suspected(&answer(vec![]), &reading));
    }
}
