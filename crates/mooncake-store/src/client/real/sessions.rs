//! Put and get sessions (`batch_put_session_*`, `batch_get_session_*`).
//!
//! A put session asks the master for an object's replicas once (PutStart),
//! then writes the object in ranges from registered memory as the caller's
//! pages become ready (an inference engine's KV cache arrives a layer at a
//! time), and publishes it with one PutEnd; revoking it frees the space. A
//! get session looks an object's replicas up once and then reads ranges of
//! it without asking the master again while the lease it was given lasts.
//!
//! Sessions live in this client only. End and revoke first seal a put
//! session (no new range write may start) and wait for the range writes
//! already running, so the master never publishes or frees space that is
//! still being written.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

use super::super::metrics::Route;
use super::super::validate::{validate_key, validate_value_len};
use super::flight::Flight;
use super::plan::{check_ranges, plan_range_write, EngineWrite, Frag, WritePlan};
use super::write::write_request;
use super::{batch_answer, RealClient};
use crate::types::{MemoryDescriptor, ReplicaDesc, WriteOptions};

/// One range of a session call: `len` bytes at `addr` in this process, at
/// `offset` in the object.
pub(crate) type SessionRange = (usize, usize, u64);

#[derive(Default)]
pub(super) struct Sessions {
    state: Mutex<State>,
    /// Signalled whenever a range write ends.
    writes_done: Condvar,
}

#[derive(Default)]
struct State {
    puts: HashMap<String, PutSession>,
    gets: HashMap<String, GetSession>,
}

struct PutSession {
    replicas: Vec<ReplicaDesc>,
    size: u64,
    /// False once end or revoke began: no new range write starts.
    writable: bool,
    /// Range writes running now.
    inflight: usize,
}

struct GetSession {
    /// Complete memory replicas, best first.
    replicas: Vec<MemoryDescriptor>,
    size: u64,
    /// The lease the master granted at the lookup, measured from before
    /// the call was sent.
    lease_until: Instant,
}

fn invalid(what: String) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, what)
}

fn expired(key: &str) -> Error {
    Error::new(
        ErrorCode::LEASE_EXPIRED,
        format!("{key}: the get session's lease ran out"),
    )
}

impl RealClient {
    /// Looks `keys` up once and keeps their complete memory replicas.
    pub(crate) fn get_session_start(&self, keys: &[String]) -> Vec<Result<()>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let asked = Instant::now();
        let answers = match self.check_open() {
            Ok(()) => batch_answer(self.master.batch_get_replica_list(keys), keys.len()),
            Err(e) => vec![Err(e); keys.len()],
        };
        let mut state = self.sessions.state.lock();
        keys.iter()
            .zip(answers)
            .map(|(key, answer)| {
                state.gets.remove(key);
                let resp = answer?;
                let replicas = self.site.rank(&resp.replicas);
                let Some(best) = replicas.first() else {
                    return Err(Error::new(
                        ErrorCode::INVALID_REPLICA,
                        format!("{key} has no complete memory replica"),
                    ));
                };
                let size = best.size;
                let lease_until = asked + Duration::from_millis(resp.lease_ttl_ms);
                if lease_until <= Instant::now() {
                    return Err(expired(key));
                }
                state.gets.insert(
                    key.clone(),
                    GetSession {
                        replicas,
                        size,
                        lease_until,
                    },
                );
                Ok(())
            })
            .collect()
    }

    /// Reads each key's ranges through its get session: the bytes read per key.
    pub(crate) fn get_session_ranges(
        &self,
        keys: &[String],
        ranges: &[Vec<SessionRange>],
    ) -> Vec<Result<u64>> {
        let mut out: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        // Copies of the sessions read, so no lock is held across transfers.
        let mut reads: Vec<(usize, Vec<MemoryDescriptor>, Vec<Frag>, Instant)> = Vec::new();
        {
            let mut state = self.sessions.state.lock();
            let now = Instant::now();
            for (i, (key, rs)) in keys.iter().zip(ranges).enumerate() {
                let Some(s) = state.gets.get(key) else {
                    out.push(Err(invalid(format!("{key}: no get session"))));
                    continue;
                };
                if s.lease_until <= now {
                    state.gets.remove(key);
                    out.push(Err(expired(key)));
                    continue;
                }
                let checked = check_ranges(rs, s.size).and_then(|total| {
                    rs.iter().try_for_each(|&(addr, len, _)| {
                        self.check_dest_range(addr, Some(len), 0, len)
                    })?;
                    Ok(total)
                });
                match checked {
                    Ok(total) => {
                        let frags = rs
                            .iter()
                            .filter(|r| r.1 > 0)
                            .map(|&(dst, len, src_off)| Frag { src_off, dst, len })
                            .collect();
                        reads.push((i, s.replicas.clone(), frags, s.lease_until));
                        out.push(Ok(total));
                    }
                    Err(e) => out.push(Err(e)),
                }
            }
        }
        if reads.is_empty() {
            return out;
        }
        let plans: Vec<_> = reads
            .iter()
            .map(|(i, reps, frags, _)| (reps.as_slice(), frags.clone(), keys[*i].as_str()))
            .collect();
        let fetched = self.fetch(&plans);
        let mut state = self.sessions.state.lock();
        let now = Instant::now();
        for ((i, _, _, lease_until), r) in reads.iter().zip(fetched) {
            if let Err(e) = r {
                out[*i] = Err(e);
            } else if *lease_until <= now {
                // The bytes may have been read after the object could move.
                state.gets.remove(&keys[*i]);
                out[*i] = Err(expired(&keys[*i]));
            }
        }
        out
    }

    pub(crate) fn get_session_end(&self, keys: &[String]) {
        let mut state = self.sessions.state.lock();
        for key in keys {
            state.gets.remove(key);
        }
    }

    /// Reserves each object's replicas (PutStart) without moving a byte.
    pub(crate) fn put_session_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        opts: &WriteOptions,
    ) -> Vec<Result<()>> {
        if keys.len() != sizes.len() {
            return vec![Err(invalid("one size per key".into())); keys.len()];
        }
        if !opts.config.groups_fit(keys.len()) {
            return vec![Err(invalid("group_ids must name one group per key".into())); keys.len()];
        }
        let mut out: Vec<Result<()>> = Vec::with_capacity(keys.len());
        let mut start = Vec::new();
        {
            let state = self.sessions.state.lock();
            for (i, key) in keys.iter().enumerate() {
                let dup = keys[..i].contains(key);
                let valid = validate_key(key).and_then(|()| validate_value_len(sizes[i]));
                if let Err(e) = valid {
                    out.push(Err(e));
                } else if state.puts.contains_key(key) {
                    out.push(Err(invalid(format!("{key}: a put session exists"))));
                } else if dup {
                    // The first of the batch reserves it, as the master
                    // would answer the second.
                    out.push(Err(Error::new(
                        ErrorCode::OBJECT_ALREADY_EXISTS,
                        format!("{key}: reserved earlier in this batch"),
                    )));
                } else {
                    out.push(Ok(()));
                    start.push(i);
                }
            }
        }
        if start.is_empty() {
            return out;
        }
        let start_keys: Vec<String> = start.iter().map(|&i| keys[i].clone()).collect();
        let start_sizes: Vec<u64> = start.iter().map(|&i| sizes[i]).collect();
        let start_opts = WriteOptions {
            config: opts.config.for_keys(&start),
            upsert: opts.upsert,
        };
        let answers = match self.check_open() {
            Ok(()) => batch_answer(
                self.master
                    .batch_put_start(self.id, &start_keys, &start_sizes, &start_opts),
                start_keys.len(),
            ),
            Err(e) => vec![Err(e); start_keys.len()],
        };
        let mut revoke = Vec::new();
        let mut state = self.sessions.state.lock();
        for ((answer, &i), key) in answers.into_iter().zip(&start).zip(&start_keys) {
            match answer {
                Ok(replicas) if replicas.iter().any(|r| r.memory().is_some()) => {
                    state.puts.insert(
                        key.clone(),
                        PutSession {
                            replicas,
                            size: sizes[i],
                            writable: true,
                            inflight: 0,
                        },
                    );
                }
                Ok(_) => {
                    revoke.push(key.clone());
                    out[i] = Err(Error::new(
                        ErrorCode::INVALID_REPLICA,
                        format!("{key}: a put session writes memory replicas only"),
                    ));
                }
                Err(e) => out[i] = Err(e),
            }
        }
        drop(state);
        if !revoke.is_empty() {
            if let Err(e) = self.master.batch_put_revoke(self.id, &revoke) {
                tracing::warn!(error = %e, "put_revoke failed");
            }
        }
        out
    }

    /// Writes each key's ranges into its put session's memory replicas:
    /// the bytes written per key.
    pub(crate) fn put_session_ranges(
        &self,
        keys: &[String],
        ranges: &[Vec<SessionRange>],
    ) -> Vec<Result<u64>> {
        let mut out: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        let mut writes: Vec<(usize, Vec<ReplicaDesc>)> = Vec::new();
        {
            let mut state = self.sessions.state.lock();
            for (i, (key, rs)) in keys.iter().zip(ranges).enumerate() {
                let s = match state.puts.get_mut(key) {
                    Some(s) if s.writable => s,
                    Some(_) => {
                        out.push(Err(invalid(format!("{key}: the put session is closing"))));
                        continue;
                    }
                    None => {
                        out.push(Err(invalid(format!("{key}: no put session"))));
                        continue;
                    }
                };
                let checked = check_ranges(rs, s.size).and_then(|total| {
                    rs.iter()
                        .try_for_each(|&(addr, len, _)| self.check_local(addr, len))?;
                    Ok(total)
                });
                match checked {
                    Ok(total) => {
                        s.inflight += 1;
                        writes.push((i, s.replicas.clone()));
                        out.push(Ok(total));
                    }
                    Err(e) => out.push(Err(e)),
                }
            }
        }
        if writes.is_empty() {
            return out;
        }
        let plans: Vec<Result<WritePlan<'_>>> = writes
            .iter()
            .map(|(i, reps)| plan_range_write(&ranges[*i], reps, &self.site))
            .collect();
        let written = self.write_plans(&plans);
        let mut state = self.sessions.state.lock();
        for ((i, _), r) in writes.iter().zip(written) {
            if let Err(e) = r {
                out[*i] = Err(e.with_context(format!("writing {}", keys[*i])));
            }
            if let Some(s) = state.puts.get_mut(&keys[*i]) {
                s.inflight = s.inflight.saturating_sub(1);
            }
        }
        drop(state);
        self.sessions.writes_done.notify_all();
        out
    }

    /// Carries out range-write plans in one engine batch; own-segment copies
    /// while it is in flight. One outcome per plan.
    fn write_plans(&self, plans: &[Result<WritePlan<'_>>]) -> Vec<Result<()>> {
        let mut out: Vec<Result<()>> = plans
            .iter()
            .map(|p| p.as_ref().map(|_| ()).map_err(Error::clone))
            .collect();
        let capacity = plans.iter().flatten().map(WritePlan::max_requests).sum();
        let mut flight = Flight::new(&self.engine, capacity);
        let (mut copies, mut owner, mut lens) = (Vec::new(), Vec::new(), Vec::new());
        for (i, plan) in plans.iter().enumerate() {
            let Ok(plan) = plan else { continue };
            let mut requests = Vec::with_capacity(plan.max_requests());
            for peer in &plan.peers {
                let target = match self.handle(peer.endpoint) {
                    Ok(h) => h,
                    Err(e) => {
                        out[i] = Err(e);
                        break;
                    }
                };
                if let EngineWrite::Parts(pieces) = &peer.engine {
                    requests.extend(
                        pieces
                            .iter()
                            .map(|p| write_request(target, p.local, p.remote, p.len)),
                    );
                }
            }
            if out[i].is_err() {
                continue;
            }
            self.count_route(Route::Local, true, plan.memcpy.iter().map(|c| c.len).sum());
            copies.extend_from_slice(&plan.memcpy);
            owner.extend(std::iter::repeat_n(i, requests.len()));
            lens.extend(requests.iter().map(|r| r.length));
            flight.submit(&requests);
        }
        let mut sent = 0;
        for ((r, &i), len) in flight
            .finish_into_segment(&copies)
            .into_iter()
            .zip(&owner)
            .zip(&lens)
        {
            match r {
                Err(e) if out[i].is_ok() => out[i] = Err(e),
                Err(_) => {}
                Ok(()) => sent += len,
            }
        }
        self.count_route(Route::Engine, true, sent);
        out
    }

    /// Seals the sessions of `keys` and waits for their range writes; an
    /// error for each key without a session.
    fn seal(&self, keys: &[String]) -> Vec<Result<()>> {
        let mut state = self.sessions.state.lock();
        let out: Vec<Result<()>> = keys
            .iter()
            .map(|key| match state.puts.get_mut(key) {
                Some(s) => {
                    s.writable = false;
                    Ok(())
                }
                None => Err(invalid(format!("{key}: no put session"))),
            })
            .collect();
        while keys
            .iter()
            .any(|k| state.puts.get(k).is_some_and(|s| s.inflight > 0))
        {
            self.sessions.writes_done.wait(&mut state);
        }
        out
    }

    /// Publishes each sealed session's object (PutEnd). A session whose
    /// PutEnd failed stays, so the caller can end or revoke it again.
    pub(crate) fn put_session_end(&self, keys: &[String]) -> Vec<Result<()>> {
        self.finish_sessions(keys, true)
    }

    /// Frees each session's reserved space (PutRevoke).
    pub(crate) fn put_session_revoke(&self, keys: &[String]) -> Vec<Result<()>> {
        self.finish_sessions(keys, false)
    }

    fn finish_sessions(&self, keys: &[String], publish: bool) -> Vec<Result<()>> {
        let mut out = self.seal(keys);
        let idx: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_ok()).collect();
        if idx.is_empty() {
            return out;
        }
        let ks: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
        let answers = if publish {
            batch_answer(self.master.batch_put_end(self.id, &ks), ks.len())
        } else {
            batch_answer(self.master.batch_put_revoke(self.id, &ks), ks.len())
        };
        let mut state = self.sessions.state.lock();
        for ((answer, &i), key) in answers.into_iter().zip(&idx).zip(&ks) {
            match answer {
                Ok(()) => {
                    state.puts.remove(key);
                }
                Err(e) => {
                    // The master no longer has the reservation: nothing is
                    // left to end or revoke.
                    if e.code == ErrorCode::OBJECT_NOT_FOUND {
                        state.puts.remove(key);
                    }
                    out[i] = Err(e);
                }
            }
        }
        out
    }
}
