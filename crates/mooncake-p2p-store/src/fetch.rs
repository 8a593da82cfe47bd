//! `GetReplica`'s executor: a few threads each take the next shard the
//! picker (`plan.rs`) chooses from the freshest record, read it with the
//! engine, and publish this consumer as one more holder of it at once, so
//! other consumers can read it from here while the rest is still coming.
//! A shard read from the publisher is claimed first (`Catalog::claim`) and
//! the claim released once the copy is published.
//!
//! A holder that fails a read is left out for the rest of the call and the
//! shard goes back to the queue (another holder serves it). A shard whose
//! source left the record while it was being read is read again: the
//! source may have reused its memory (the reference re-reads everything in
//! that case; here only the shard).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use mooncake_transfer::{Opcode, TransferEngine, TransferRequest};
use parking_lot::{Condvar, Mutex};

use crate::catalog::{modify, Catalog};
use crate::error::{P2pError, Result};
use crate::plan::{gold_cap, pick, seed_for, Pick, PickState};
use crate::record::{Location, Span};

/// Rounds over the holders: after every live holder of a shard failed
/// once, they are all tried again this many times in all (the reference
/// tries `max(3, holders)` locations per shard).
const ROUNDS: usize = 3;

/// Pause before a new round, so a holder that was restarting can answer.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

/// How often a reader with nothing to pick looks at the record again: other
/// consumers publish shards without telling this process.
const WAIT_POLL: Duration = Duration::from_millis(25);

/// What a `GetReplica` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchReport {
    /// Bytes read from each holder (segment name).
    pub bytes_from: BTreeMap<String, u64>,
    /// Holders that failed a read.
    pub failed_holders: Vec<String>,
    /// Shards read again because their source left while they were read.
    pub reread: usize,
}

pub(crate) struct Fetch<'a> {
    pub(crate) engine: &'a TransferEngine,
    pub(crate) catalog: &'a dyn Catalog,
    pub(crate) name: &'a str,
    pub(crate) me: &'a str,
    pub(crate) spans: &'a [Span],
    pub(crate) threads: usize,
}

struct State {
    todo: Vec<usize>,
    in_flight: usize,
    gold_in_flight: usize,
    failed: HashSet<String>,
    ever_failed: Vec<String>,
    load: HashMap<String, usize>,
    rounds: usize,
    error: Option<P2pError>,
    report: FetchReport,
}

enum Next {
    Go(Pick),
    Wait,
    Stop,
}

impl Fetch<'_> {
    pub(crate) fn run(&self) -> Result<FetchReport> {
        let state = Mutex::new(State {
            todo: (0..self.spans.len()).collect(),
            in_flight: 0,
            gold_in_flight: 0,
            failed: HashSet::new(),
            ever_failed: Vec::new(),
            load: HashMap::new(),
            rounds: 1,
            error: None,
            report: FetchReport::default(),
        });
        let changed = Condvar::new();
        std::thread::scope(|s| {
            for _ in 0..self.threads.clamp(1, self.spans.len().max(1)) {
                s.spawn(|| self.worker(&state, &changed));
            }
        });
        let st = state.into_inner();
        match st.error {
            Some(e) => Err(e),
            None => {
                let mut report = st.report;
                report.failed_holders = st.ever_failed;
                Ok(report)
            }
        }
    }

    fn worker(&self, state: &Mutex<State>, changed: &Condvar) {
        let seed = seed_for(self.me);
        let mut rng = rand::thread_rng();
        loop {
            // Claims before the record: a claim gone by now was released
            // after its copy was published, so the record shows that copy.
            let claimed = self.catalog.claimed(self.name);
            let record = self.catalog.get(self.name);
            let mut st = state.lock();
            if st.error.is_some() || (st.todo.is_empty()) {
                return;
            }
            let (payload, claimed) = match (record, claimed) {
                (Ok(Some((p, _))), Ok(c)) => (p, c),
                (Ok(None), _) => return fail(&mut st, changed, P2pError::PayloadNotFound),
                (Err(e), _) | (_, Err(e)) => return fail(&mut st, changed, e),
            };
            let next = {
                let view = PickState {
                    me: self.me,
                    todo: &st.todo,
                    failed: &st.failed,
                    claimed: &claimed,
                    load: &st.load,
                    seed,
                    gold_in_flight: st.gold_in_flight,
                    gold_cap: gold_cap(&payload, self.me, self.threads),
                };
                match pick(&payload, &view, &mut rng) {
                    Some(p) => Next::Go(p),
                    // Reads here may free holders; claimers will publish.
                    None if st.in_flight > 0 || st.todo.iter().any(|i| claimed.contains(i)) => {
                        Next::Wait
                    }
                    None if st.rounds < ROUNDS && !st.failed.is_empty() => {
                        st.rounds += 1;
                        st.failed.clear();
                        drop(st);
                        std::thread::sleep(ROUND_PAUSE);
                        continue;
                    }
                    None => Next::Stop,
                }
            };
            let p = match next {
                Next::Go(p) => p,
                Next::Wait => {
                    // Woken when a read here ends; else a peer may have
                    // published a shard meanwhile.
                    changed.wait_for(&mut st, WAIT_POLL);
                    continue;
                }
                Next::Stop => {
                    let holders: Vec<String> = st.failed.iter().cloned().collect();
                    let msg = format!(
                        "no live holder of shard {} of {:?} (failed: {holders:?})",
                        st.todo[0], self.name
                    );
                    return fail(&mut st, changed, P2pError::TooManyRetries(msg));
                }
            };
            st.todo.retain(|&i| i != p.shard);
            st.in_flight += 1;
            st.gold_in_flight += usize::from(p.from_gold);
            *st.load.entry(p.source.segment_name.clone()).or_default() += 1;
            drop(st);

            let span = self.spans[p.shard];
            let outcome = match self.claim(&p) {
                Ok(true) => {
                    let outcome = match self.read(span, &p.source) {
                        Ok(()) => self.publish(p.shard, span, &p.source),
                        Err(e) => Err(e),
                    };
                    // After publishing: readers see this holder first.
                    if p.from_gold {
                        if let Err(e) = self.catalog.unclaim(self.name, p.shard) {
                            tracing::warn!("releasing the claim of shard {}: {e}", p.shard);
                        }
                    }
                    outcome
                }
                // Another consumer claimed it first: pick again.
                Ok(false) => Ok(Done::Claimed),
                Err(e) => Err(Fatal(e)),
            };

            let mut st = state.lock();
            st.in_flight -= 1;
            st.gold_in_flight -= usize::from(p.from_gold);
            if let Some(n) = st.load.get_mut(&p.source.segment_name) {
                *n -= 1;
            }
            match outcome {
                Ok(Done::Read) => {
                    *st.report
                        .bytes_from
                        .entry(p.source.segment_name.clone())
                        .or_default() += span.length;
                }
                Ok(Done::Stale) => {
                    st.report.reread += 1;
                    st.todo.push(p.shard);
                }
                Ok(Done::Claimed) => st.todo.push(p.shard),
                Err(Fatal(e)) => return fail(&mut st, changed, e),
                Err(Holder(e)) => {
                    tracing::warn!(
                        "shard {} of {:?} from {}: {e}; trying another holder",
                        p.shard,
                        self.name,
                        p.source.segment_name
                    );
                    if !st.ever_failed.contains(&p.source.segment_name) {
                        st.ever_failed.push(p.source.segment_name.clone());
                    }
                    st.failed.insert(p.source.segment_name.clone());
                    st.todo.push(p.shard);
                }
            }
            changed.notify_all();
        }
    }

    /// Reads one shard; any failure is the holder's.
    fn read(&self, span: Span, from: &Location) -> std::result::Result<(), Failure> {
        let target = self
            .engine
            .open_segment(&from.segment_name)
            .map_err(|e| Holder(e.to_string()))?;
        let request = TransferRequest {
            opcode: Opcode::Read,
            source: span.addr as usize,
            target_id: target,
            target_offset: from.offset,
            length: span.length as usize,
        };
        self.engine
            .transfer_sync(&[request])
            .map_err(|e| Holder(e.to_string()))
    }

    /// Claims a shard to be read from the publisher (true for others).
    fn claim(&self, p: &Pick) -> Result<bool> {
        if !p.from_gold {
            return Ok(true);
        }
        self.catalog.claim(self.name, p.shard, self.me)
    }

    /// Adds this consumer as a holder of `shard`, if `source` still holds
    /// it (else the bytes read may be stale: read it again).
    fn publish(
        &self,
        shard: usize,
        span: Span,
        source: &Location,
    ) -> std::result::Result<Done, Failure> {
        let me = Location {
            segment_name: self.me.to_string(),
            offset: span.addr,
        };
        let mut fresh = true;
        let record = modify(self.catalog, self.name, |p| {
            fresh = p.holds(shard, source);
            fresh && p.add_replica(shard, me.clone())
        })
        .map_err(Fatal)?;
        match record {
            None => Err(Fatal(P2pError::PayloadNotFound)),
            Some(_) if fresh => Ok(Done::Read),
            Some(_) => Ok(Done::Stale),
        }
    }
}

/// How a shard's turn ended, short of a failure.
enum Done {
    Read,
    /// Its source left while it was read: read it again.
    Stale,
    /// Another consumer is reading it from the publisher.
    Claimed,
}

enum Failure {
    /// The holder failed: try another.
    Holder(String),
    /// The call cannot go on.
    Fatal(P2pError),
}
use Failure::{Fatal, Holder};

fn fail(st: &mut State, changed: &Condvar, e: P2pError) {
    if st.error.is_none() {
        st.error = Some(e);
    }
    changed.notify_all();
}
