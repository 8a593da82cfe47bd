//! Hedged reads: a read round whose engine reads of one object have not
//! all answered within their peers' hedge delay reads that object again
//! from its next replica, into a staging buffer. The first complete copy
//! wins. The destination is written by the first read (the primary) or,
//! when the second wins, by a copy from the staging buffer made only after
//! the primary was canceled, so it never holds a mix of the two. A late
//! read with no other replica to go to (or whose hedge failed) is watched
//! instead (`stall_watch`): it ends early only once the master Suspects
//! its holder and the Suspected deadline ran out.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{Opcode, TransferRequest};

use super::super::config::suspect_read_timeout;
use super::super::staging::StagingBuf;
use super::super::stall_watch::{holder_suspected, StallWatch, RECHECK};
use super::flight::{run_copies, Flight};
use super::plan::{plan_read, Frag, Memcpy, ReadPlan};
use super::read::FetchPlan;
use super::{batch_answer, RealClient};

/// How often a hedged round looks for the first complete copy.
const POLL: Duration = Duration::from_micros(200);
/// How long a round with only watched reads waits between looks at them.
const WATCH_POLL: Duration = Duration::from_millis(50);

/// One object read again from another replica.
struct Hedge<'e> {
    /// The plan it belongs to.
    plan: usize,
    /// Where the second copy lands, held until its reads ended.
    _scratch: StagingBuf,
    /// Its engine reads (`None`: done by now, through memcpy or shared memory).
    flight: Option<Flight<'e>>,
    requests: usize,
    /// From the staging buffer to the plan's destination, once it won.
    back: Vec<Memcpy>,
}

enum Outcome {
    Running,
    Done,
    Failed,
}

impl Hedge<'_> {
    fn state(&self) -> Outcome {
        let Some(f) = &self.flight else {
            return Outcome::Done;
        };
        let mut running = false;
        for i in 0..self.requests {
            match f.outcome(i) {
                None => running = true,
                Some(Err(_)) => return Outcome::Failed,
                Some(Ok(())) => {}
            }
        }
        if running {
            Outcome::Running
        } else {
            Outcome::Done
        }
    }

    /// Stops its reads (none lands in the staging buffer after this).
    fn cancel(self) {
        if let Some(f) = self.flight {
            for i in 0..self.requests {
                f.cancel(i);
            }
            f.finish(&[]);
        }
    }
}

impl RealClient {
    /// Runs one read round: `requests` (request `i` reads for plan
    /// `owners[i]` from peer `peers[i]`) as one engine batch and `copies`
    /// meanwhile. Plans still waiting after the hedge delay whose next
    /// replica can serve them are read again from it (see the module
    /// docs); the others are watched, and canceled with `TRANSFER_FAIL`
    /// once the master Suspects their holder and the Suspected deadline
    /// ran out. One outcome per request: a plan whose second copy won has
    /// its requests answer `Ok`.
    pub(super) fn run_hedged(
        &self,
        plans: &[FetchPlan<'_>],
        attempt: &[usize],
        requests: &[TransferRequest],
        owners: &[usize],
        peers: &[&str],
        copies: &[Memcpy],
    ) -> Vec<Result<()>> {
        let start = Instant::now();
        let mut flight = Flight::new(&self.engine, requests.len());
        flight.submit(requests);
        let slow = self.slow.as_ref();
        let mut watch = suspect_read_timeout().map(|t| StallWatch::new(t, RECHECK));
        if requests.is_empty() || (slow.is_none() && watch.is_none()) {
            return flight.finish(copies);
        }
        flight.copy(copies);
        // Hedging off: a read is watched once it ran for one interval.
        let delay = match slow {
            Some(slow) => {
                let t = slow.lock();
                peers
                    .iter()
                    .map(|p| t.hedge_delay(p))
                    .max()
                    .unwrap_or_default()
            }
            None => RECHECK,
        };
        if flight.wait_until(start + delay) {
            return self.finish_timed(flight, peers, Some(start));
        }
        let late: BTreeSet<usize> = (0..requests.len())
            .filter(|&i| flight.outcome(i).is_none())
            .map(|i| owners[i])
            .collect();
        let mut hedges = Vec::new();
        let now = Instant::now();
        for p in late {
            match slow.and_then(|s| self.hedge(plans, p, attempt[p]).map(|h| (s, h))) {
                Some((slow, h)) => {
                    if let Some(i) = owners.iter().position(|&o| o == p) {
                        slow.lock().mark_slow(peers[i], Instant::now());
                    }
                    hedges.push(h);
                }
                // Nothing to hedge to: only the master can end the wait.
                None => {
                    if let Some(w) = watch.as_mut() {
                        w.watch(p, now);
                    }
                }
            }
        }
        if hedges.is_empty() && watch.as_ref().is_none_or(StallWatch::is_empty) {
            return self.finish_timed(flight, peers, None);
        }
        let mut won = BTreeSet::new();
        let mut stalled = BTreeSet::new();
        loop {
            let mut open = false;
            let mut i = 0;
            while i < hedges.len() {
                let p = hedges[i].plan;
                let mine = (0..requests.len()).filter(|&r| owners[r] == p);
                let primary: Vec<Option<Result<()>>> = mine.map(|r| flight.outcome(r)).collect();
                let primary_done = primary.iter().all(|o| matches!(o, Some(Ok(()))));
                let primary_failed = primary.iter().any(|o| matches!(o, Some(Err(_))));
                match (primary_done, hedges[i].state(), primary_failed) {
                    (true, _, _) => hedges.swap_remove(i).cancel(),
                    (false, Outcome::Done, _) => {
                        let h = hedges.swap_remove(i);
                        for r in (0..requests.len()).filter(|&r| owners[r] == p) {
                            flight.cancel(r);
                        }
                        flight.copy(&h.back);
                        h.cancel();
                        won.insert(p);
                    }
                    // Both failed: the plan fails as its primary did.
                    (false, Outcome::Failed, true) => hedges.swap_remove(i).cancel(),
                    // The hedge failed, the primary still runs: watched
                    // as if it had had no other replica.
                    (false, Outcome::Failed, false) => {
                        hedges.swap_remove(i).cancel();
                        if let Some(w) = watch.as_mut() {
                            w.watch(p, Instant::now());
                        }
                    }
                    _ => {
                        open = true;
                        i += 1;
                    }
                }
            }
            if let Some(w) = watch.as_mut().filter(|w| !w.is_empty()) {
                self.watch_step(w, plans, attempt, &flight, owners, &mut stalled);
                open |= !w.is_empty();
            }
            if !open {
                // No hedge or watch left: the rest ends as an unhedged round does.
                break;
            }
            match watch.as_ref().and_then(StallWatch::next_event) {
                Some(at) if hedges.is_empty() => {
                    flight.wait_until(at.min(Instant::now() + WATCH_POLL));
                }
                _ => std::thread::sleep(POLL),
            }
        }
        let mut out = self.finish_timed(flight, peers, None);
        for (r, o) in out.iter_mut().enumerate() {
            if won.contains(&owners[r]) {
                *o = Ok(());
            } else if stalled.contains(&owners[r]) && o.is_err() {
                *o = Err(Error::new(
                    ErrorCode::TRANSFER_FAIL,
                    format!(
                        "no answer from {}, which the master Suspects (silent), within \
                         MC_STORE_SUSPECT_READ_TIMEOUT_MS of learning so",
                        peers[r]
                    ),
                ));
            }
        }
        out
    }

    /// One step of watching reads that wait on their only replica: forgets
    /// those that settled, asks the master about the holders due, and
    /// cancels the reads whose Suspected deadline ran out (into `stalled`).
    fn watch_step(
        &self,
        w: &mut StallWatch,
        plans: &[FetchPlan<'_>],
        attempt: &[usize],
        flight: &Flight<'_>,
        owners: &[usize],
        stalled: &mut BTreeSet<usize>,
    ) {
        let mine = |p: usize| (0..owners.len()).filter(move |&r| owners[r] == p);
        for p in w.plans() {
            if mine(p).all(|r| flight.outcome(r).is_some()) {
                w.forget(p);
            }
        }
        let due = w.due(Instant::now());
        if !due.is_empty() {
            let keys: Vec<String> = due.iter().map(|&p| plans[p].2.to_string()).collect();
            let answers = match keys.as_slice() {
                [key] => vec![self.master.get_replica_list(key)],
                _ => batch_answer(self.master.batch_get_replica_list(&keys), keys.len()),
            };
            let now = Instant::now();
            for (&p, answer) in due.iter().zip(answers) {
                let reading = &plans[p].0[attempt[p]];
                let suspected = answer.is_ok_and(|a| holder_suspected(&a, reading));
                w.answered(p, suspected, now);
            }
        }
        for p in w.expired(Instant::now()) {
            for r in mine(p) {
                flight.cancel(r);
            }
            stalled.insert(p);
        }
    }

    /// The peers this client passes over now because a read from them was
    /// late (sorted; empty with hedging off).
    pub(crate) fn slow_peers(&self) -> Vec<String> {
        self.slow
            .as_ref()
            .map_or_else(Vec::new, |s| s.lock().slow(Instant::now()))
    }

    /// Waits for the rest of the round. Each peer whose reads all completed
    /// answers: its latency is the round's since `start` when given (a
    /// round that was hedged says nothing of one peer's latency).
    fn finish_timed(
        &self,
        flight: Flight<'_>,
        peers: &[&str],
        start: Option<Instant>,
    ) -> Vec<Result<()>> {
        let out = flight.finish(&[]);
        let took = start.map(|s| s.elapsed());
        if let Some(slow) = &self.slow {
            let mut t = slow.lock();
            let mut seen: BTreeSet<&str> = BTreeSet::new();
            let failed: BTreeSet<&str> = peers
                .iter()
                .zip(&out)
                .filter(|(_, o)| o.is_err())
                .map(|(p, _)| *p)
                .collect();
            for p in peers {
                if !failed.contains(p) && seen.insert(p) {
                    match took {
                        Some(took) => t.record(p, took),
                        None => t.answered(p),
                    }
                }
            }
        }
        out
    }

    /// Starts reading plan `p` again from the replica after `attempt` that
    /// is on another peer and not Suspected, into a staging buffer; `None`
    /// when there is none or no room in the pool.
    fn hedge(&self, plans: &[FetchPlan<'_>], p: usize, attempt: usize) -> Option<Hedge<'_>> {
        let (replicas, frags, _) = &plans[p];
        let first = replicas.get(attempt)?;
        let rep = replicas[attempt + 1..]
            .iter()
            .find(|r| !r.suspected && r.transport_endpoint != first.transport_endpoint)?;
        let total: usize = frags.iter().map(|f| f.len).sum();
        let scratch = self.staging.as_ref()?.try_allocate(total as u64)?;
        let mut at = scratch.addr();
        let mut into = Vec::with_capacity(frags.len());
        let mut back = Vec::with_capacity(frags.len());
        for f in frags {
            into.push(Frag { dst: at, ..*f });
            back.push(Memcpy {
                src: at,
                dst: f.dst,
                len: f.len,
            });
            at += f.len;
        }
        let mut requests = Vec::new();
        match plan_read(rep, &into, &self.site).ok()? {
            ReadPlan::Memcpy(c) => run_copies(&c, false),
            ReadPlan::Peer { endpoint, pieces } => {
                let target = self.handle(endpoint).ok()?;
                for piece in pieces {
                    // SAFETY: the piece lands in `scratch`, a staging buffer
                    // this hedge holds.
                    if unsafe { self.read_shared(target, &piece) } {
                        continue;
                    }
                    requests.push(TransferRequest {
                        opcode: Opcode::Read,
                        source: piece.local,
                        target_id: target,
                        target_offset: piece.remote,
                        length: piece.len,
                    });
                }
            }
        }
        let flight = (!requests.is_empty()).then(|| {
            let mut f = Flight::new(&self.engine, requests.len());
            f.submit(&requests);
            f
        });
        Some(Hedge {
            plan: p,
            _scratch: scratch,
            flight,
            requests: requests.len(),
            back,
        })
    }
}
