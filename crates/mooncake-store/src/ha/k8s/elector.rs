//! The two tasks of one candidacy, client-go's LeaderElector loops:
//! the candidate reads the lease every retry period and takes it when it is
//! free or expired; the holder then renews it every retry period, gives
//! leadership up once no renewal got through for the renew deadline, and
//! releases the lease (clears `holderIdentity`) when it stops. Writes of
//! the replication record go through the holder too ([`RecordWrite`]):
//! they are renewals that also set the record's annotation, so they never
//! race the holder's own writes for the resourceVersion.

use std::time::SystemTime;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::api::{ApiError, Failure, Lease};
use super::record::{decide, still_ours, LeaseRecord, Observed, Step};
use super::{K8sElection, Timings, RECORD_ANNOTATION};
use crate::ha::{HeldUntil, Leadership, ResignRequest};

/// A write of the replication record, asked of the holder task of one
/// term: done once the Lease carries it, as of a version that was still
/// this holder's (a compare-and-swap, so a deposed holder's write fails).
pub(super) struct RecordWrite {
    pub(super) value: String,
    pub(super) done: oneshot::Sender<Result<(), ApiError>>,
}

/// A won lease: as last written, its term, and when the winning write was
/// sent (the lease runs, for everyone else, from no earlier than that).
struct Held {
    lease: Lease,
    term: i64,
    sent: Instant,
}

/// Logs a failure the first time it happens (and again once it changed),
/// not every retry period.
#[derive(Default)]
struct Complaints {
    last: Option<String>,
}

impl Complaints {
    fn report(&mut self, e: &ApiError, during: &str) {
        if self.last.as_deref() == Some(e.message.as_str()) {
            tracing::debug!("{during}: {e}");
            return;
        }
        self.last = Some(e.message.clone());
        match e.failure {
            Failure::Forbidden | Failure::Unauthorized => tracing::error!("{during}: {e}"),
            _ => tracing::warn!("{during}: {e}; retrying"),
        }
    }

    fn clear(&mut self) {
        self.last = None;
    }
}

/// Campaigns as `identity` until it wins, then holds. The won
/// [`Leadership`] (and its term) goes to `won`; when nobody waits for it
/// any more the task stops, releasing the lease if it had just won it.
pub(super) async fn run(e: K8sElection, identity: String, won: oneshot::Sender<(Leadership, i64)>) {
    let mut won = won;
    let mut observed = None;
    let mut complaints = Complaints::default();
    let mut last_holder = None;
    let held = loop {
        if won.is_closed() {
            return;
        }
        // Not raced against cancellation: a write cut off midway could
        // leave the lease taken with no holder task to release it.
        match attempt(&e, &identity, &mut observed).await {
            Ok(Ok(held)) => break held,
            Ok(Err(holder)) => {
                complaints.clear();
                if last_holder.as_ref() != Some(&holder) {
                    tracing::info!(lease = %e.lease, %holder, "lease held by another candidate; standing by");
                    last_holder = Some(holder);
                }
            }
            Err(err) => complaints.report(&err, &format!("campaign for lease {}", e.lease)),
        }
        tokio::select! {
            _ = won.closed() => return,
            _ = tokio::time::sleep(e.timings.jittered_retry()) => {}
        }
    };
    let (lost_tx, lost_rx) = watch::channel(false);
    let (resign_tx, resign_rx) = oneshot::channel::<ResignRequest>();
    tracing::info!(lease = %e.lease, candidate = %identity, term = held.term, "won leader election");
    let term = held.term;
    let (writes_tx, writes) = mpsc::unbounded_channel();
    let key = (identity.clone(), term);
    e.writers.lock().insert(key.clone(), writes_tx);
    // If the campaign was dropped meanwhile, the Leadership comes back and
    // is dropped here, which makes `hold` release at once.
    let proven = HeldUntil::until((held.sent + e.timings.renew_deadline).into_std());
    let leadership =
        Leadership::new(identity.clone(), lost_rx, resign_tx).with_held(proven.clone());
    let _ = won.send((leadership, term));
    hold(
        e.clone(),
        identity,
        held,
        proven,
        lost_tx,
        resign_rx,
        writes,
    )
    .await;
    e.writers.lock().remove(&key);
}

/// One acquisition attempt: `Ok(Ok(held))` when won, `Ok(Err(holder))`
/// while someone else holds the lease.
async fn attempt(
    e: &K8sElection,
    identity: &str,
    observed: &mut Option<Observed>,
) -> Result<Result<Held, String>, ApiError> {
    let secs = e.timings.lease_secs();
    let current = match e.api.get_lease(&e.lease).await {
        Ok(l) => l,
        Err(err) if err.failure == Failure::NotFound => {
            let record = LeaseRecord::acquired(identity, secs, 0, SystemTime::now());
            let sent = Instant::now();
            return match e.api.create_lease(&e.lease, &record).await {
                Ok(lease) => Ok(Ok(Held {
                    lease,
                    term: 0,
                    sent,
                })),
                // Someone else created it first: theirs; read it next round.
                Err(err) if err.failure == Failure::AlreadyExists => {
                    Ok(Err("(its creator)".into()))
                }
                Err(err) => Err(err),
            };
        }
        Err(err) => return Err(err),
    };
    match decide(
        identity,
        &current.record,
        observed,
        Instant::now(),
        SystemTime::now(),
        secs,
    ) {
        Step::Wait { holder } => Ok(Err(holder)),
        Step::Take(record) => {
            let sent = Instant::now();
            match e.api.update_lease(&e.lease, &current, &record).await {
                Ok(lease) => Ok(Ok(Held {
                    lease,
                    term: record.transitions,
                    sent,
                })),
                // Another candidate's write landed first: it won.
                Err(err) if err.failure == Failure::Conflict => {
                    Ok(Err("(a faster candidate)".into()))
                }
                Err(err) => Err(err),
            }
        }
    }
}

enum Renewal {
    Renewed(Lease),
    /// The lease is someone else's now (or gone).
    Lost(String),
}

/// The holder: renews every retry period; flags `lost` when the lease is
/// someone else's, or when no renewal got through within the renew
/// deadline of the last one sent. That deadline is checked on the clock,
/// so a hung request is abandoned at it, not waited for. Then releases.
async fn hold(
    e: K8sElection,
    identity: String,
    mut held: Held,
    proven: HeldUntil,
    lost: watch::Sender<bool>,
    mut resign: oneshot::Receiver<ResignRequest>,
    mut writes: mpsc::UnboundedReceiver<RecordWrite>,
) {
    let t: Timings = e.timings;
    let mut renewed_at = held.sent;
    let mut next = Instant::now() + t.retry;
    let mut complaints = Complaints::default();
    let reply = loop {
        let write = tokio::select! {
            r = &mut resign => break r.ok(),
            w = writes.recv() => w,
            _ = tokio::time::sleep_until(next) => None,
        };
        let deadline = renewed_at + t.renew_deadline;
        let sent = Instant::now();
        let annotation = write
            .as_ref()
            .map(|w| (RECORD_ANNOTATION, w.value.as_str()));
        let outcome = tokio::time::timeout_at(
            deadline,
            renew(&e, &identity, held.term, &held.lease, annotation),
        )
        .await;
        let answer = match outcome {
            Ok(Ok(Renewal::Renewed(lease))) => {
                held.lease = lease;
                renewed_at = sent;
                proven.extend_to((sent + t.renew_deadline).into_std());
                complaints.clear();
                Ok(())
            }
            Ok(Ok(Renewal::Lost(holder))) => {
                tracing::warn!(lease = %e.lease, %holder, "leader lease taken over; giving leadership up");
                if let Some(w) = write {
                    let _ = w.done.send(Err(lost_to(&e, &holder)));
                }
                break None;
            }
            Ok(Err(err)) => {
                complaints.report(&err, &format!("renewing lease {}", e.lease));
                Err(err)
            }
            Err(_) => Err(ApiError {
                failure: Failure::Transport,
                message: format!(
                    "kubernetes API: update lease {}: no answer within the renew deadline",
                    e.lease
                ),
            }),
        };
        if let Some(w) = write {
            let _ = w.done.send(answer);
        }
        let deadline = renewed_at + t.renew_deadline;
        if Instant::now() >= deadline {
            tracing::warn!(lease = %e.lease, "no renewal within the renew deadline ({:?}); giving leadership up", t.renew_deadline);
            break None;
        }
        if renewed_at == sent || Instant::now() >= next {
            next = (Instant::now() + t.retry).min(deadline);
        }
    };
    // Writes asked for from now on find no holder: they fail.
    drop(writes);
    proven.end();
    lost.send_replace(true);
    let released = match tokio::time::timeout(
        t.renew_deadline,
        release(&e, &identity, held.term, &held.lease),
    )
    .await
    {
        Ok(r) => r.map_err(ApiError::into_error),
        Err(_) => Err(mooncake_common::Error::new(
            mooncake_common::ErrorCode::K8S_LEASE_OPERATION_ERROR,
            format!("releasing lease {}: no answer", e.lease),
        )),
    };
    match &released {
        Ok(()) => tracing::info!(lease = %e.lease, "leader lease released"),
        Err(err) => tracing::warn!("releasing lease {}: {err}", e.lease),
    }
    if let Some(reply) = reply {
        let _ = reply.send(released);
    }
}

/// client-go's renewal: an optimistic update over the version last
/// written; on a conflict, re-read: still ours (an earlier write whose
/// answer was lost) means update over the fresh version, else lost.
///
/// With `annotation`, the renewal also sets it (the replication record).
async fn renew(
    e: &K8sElection,
    identity: &str,
    term: i64,
    last: &Lease,
    annotation: Option<(&str, &str)>,
) -> Result<Renewal, ApiError> {
    let record = last
        .record
        .renewed(e.timings.lease_secs(), SystemTime::now());
    match e
        .api
        .update_lease_annotated(&e.lease, last, &record, annotation)
        .await
    {
        Ok(lease) => return Ok(Renewal::Renewed(lease)),
        Err(err) if err.failure == Failure::Conflict => {}
        Err(err) => return Err(err),
    }
    let current = match e.api.get_lease(&e.lease).await {
        Ok(l) => l,
        Err(err) if err.failure == Failure::NotFound => {
            return Ok(Renewal::Lost("(deleted)".into()))
        }
        Err(err) => return Err(err),
    };
    if !still_ours(identity, term, &current.record) {
        return Ok(Renewal::Lost(current.record.holder));
    }
    match e
        .api
        .update_lease_annotated(&e.lease, &current, &record, annotation)
        .await
    {
        Ok(lease) => Ok(Renewal::Renewed(lease)),
        Err(err) => Err(err),
    }
}

/// Clears the holder if the lease is still ours (compare-and-swap on the
/// version, so a successor's lease is never touched).
async fn release(e: &K8sElection, identity: &str, term: i64, last: &Lease) -> Result<(), ApiError> {
    let mut current = last.clone();
    for _ in 0..2 {
        if !still_ours(identity, term, &current.record) {
            return Ok(());
        }
        let record = current.record.released(SystemTime::now());
        match e.api.update_lease(&e.lease, &current, &record).await {
            Ok(_) => return Ok(()),
            Err(err) if err.failure == Failure::Conflict => {
                current = e.api.get_lease(&e.lease).await?
            }
            Err(err) if err.failure == Failure::NotFound => return Ok(()),
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

fn lost_to(e: &K8sElection, holder: &str) -> ApiError {
    ApiError {
        failure: Failure::Conflict,
        message: format!(
            "lease {} is no longer this master's (holder now {holder:?}): record not written",
            e.lease
        ),
    }
}
