//! The offload loop and the restart registration.
//!
//! One round: take up to [`TASKS_PER_ROUND`] tasks from the master, stage
//! each object from this client's segment into the tier, commit once, then
//! report what is durable, polled by [`poll_until_stopped`].

use std::time::Duration;

use mooncake_common::Result;

use super::poll::poll_until_stopped;
use super::stats::{RoundStats, REPORT_EVERY};
use super::TierShared;
use crate::tier::{Committed, EvictionBatch, StageOutcome, WriteError};
use crate::types::OffloadTask;

const TASKS_PER_ROUND: u32 = 256;
/// How often the staged-read sweep and the watermark eviction run.
const HOUSEKEEPING: Duration = Duration::from_millis(200);

/// Mounts the tier on the master and registers every object it holds, in
/// batches of `MOONCAKE_OFFLOAD_SCANMETA_ITERATOR_KEYS_LIMIT`. Copies the
/// master refuses (it knows a newer version) are deleted. Returns how many
/// objects are registered.
pub(super) fn mount_and_restore(s: &TierShared) -> Result<usize> {
    let capacity = s.tier.config().total_size_limit;
    s.master
        .mount_local_disk(s.id, &s.tier_id, &s.service_addr, capacity)?;
    let objects = s.tier.objects();
    let per_call = (s.tier.config().scanmeta_iterator_keys_limit as usize).max(1);
    let mut registered = 0;
    for chunk in objects.chunks(per_call) {
        let keys: Vec<String> = chunk.iter().map(|(k, _)| k.clone()).collect();
        let sizes: Vec<u64> = chunk.iter().map(|(_, l)| l.len).collect();
        let results = s.master.notify_offload(s.id, &keys, &sizes, true)?;
        let mut refused = Vec::new();
        for (key, r) in keys.into_iter().zip(results) {
            match r {
                Ok(()) => registered += 1,
                Err(e) => {
                    tracing::debug!(key, error = %e, "tier copy refused by the master");
                    refused.push(key);
                }
            }
        }
        if !refused.is_empty() {
            s.tier.remove(&refused);
        }
    }
    Ok(registered)
}

pub(super) fn run(s: &TierShared) {
    // The master hands this tier its promotions once per heartbeat, as the
    // reference's owner pulls them.
    let heartbeat = s.tier.config().heartbeat_interval;
    let round_ms = u64::try_from(heartbeat.as_millis()).unwrap_or(u64::MAX);
    let mut last_housekeeping = std::time::Instant::now();
    let mut stats = RoundStats::default();
    let mut last_report = std::time::Instant::now();
    // When the last round ended (reported): the time to the next is the
    // tier waiting for work.
    let mut last_end = None;
    let poll = || {
        if last_report.elapsed() >= REPORT_EVERY {
            stats.log_and_clear(last_report.elapsed());
            last_report = std::time::Instant::now();
        }
        if last_housekeeping.elapsed() >= HOUSEKEEPING {
            last_housekeeping = std::time::Instant::now();
            s.gc_batches();
            let batch = s.tier.evict_above_watermark();
            report_eviction(s, batch);
        }
        let batch = s
            .master
            .fetch_offload_tasks(s.id, TASKS_PER_ROUND, round_ms)?;
        if !batch.removes.is_empty() {
            s.tier.remove(&batch.removes);
        }
        let any = !batch.tasks.is_empty() || !batch.promotions.is_empty();
        let since = last_end.map(|e: std::time::Instant| e.elapsed());
        stats.note_poll(since, !batch.tasks.is_empty());
        if !batch.tasks.is_empty() {
            stats.add(&offload_round(s, &batch.tasks));
            last_end = Some(std::time::Instant::now());
        }
        for key in &batch.promotions {
            promote(s, key);
        }
        Ok(any)
    };
    poll_until_stopped(&s.stop, "ssd", poll, || mount_and_restore(s).map(|_| ()));
}

/// Copies `tasks` into the tier and reports them; returns where the
/// round's time went.
fn offload_round(s: &TierShared, tasks: &[OffloadTask]) -> RoundStats {
    let started = std::time::Instant::now();
    let now = s.now();
    let mut durable: Vec<(String, u64)> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let take_committed = |c: Option<Committed>, durable: &mut Vec<(String, u64)>| {
        if let Some(c) = c {
            durable.extend(c.objects.into_iter().map(|(k, l)| (k, l.len)));
        }
    };
    for t in tasks {
        let Some(bytes) = s.own_range(t.address, t.size) else {
            tracing::warn!(key = %t.key, "offload task outside this client's segments");
            failed.push(t.key.clone());
            continue;
        };
        let last_use = now.saturating_sub(t.idle_ms);
        match s.tier.stage_idle(&t.key, 0, &[bytes], now, last_use) {
            Ok(StageOutcome { committed, evicted }) => {
                take_committed(committed, &mut durable);
                report_eviction(s, evicted);
            }
            Err(WriteError { error, discarded }) => {
                tracing::warn!(key = %t.key, %error, "SSD tier write failed");
                failed.push(t.key.clone());
                failed.extend(discarded);
            }
        }
    }
    let staged = std::time::Instant::now();
    match s.tier.commit(now) {
        Ok(c) => take_committed(c, &mut durable),
        Err(WriteError { error, discarded }) => {
            tracing::warn!(%error, "SSD tier commit failed");
            failed.extend(discarded);
        }
    }
    let committed = std::time::Instant::now();
    let round = RoundStats {
        rounds: 1,
        tasks: tasks.len() as u64,
        bytes: durable.iter().map(|(_, n)| n).sum(),
        stage: staged - started,
        commit: committed - staged,
        report: std::time::Duration::ZERO,
        ..RoundStats::default()
    };
    report_durable(s, durable);
    if !failed.is_empty() {
        failed.sort();
        failed.dedup();
        if let Err(e) = s.master.notify_offload_failure(s.id, &failed) {
            tracing::debug!(error = %e, "reporting failed offloads");
        }
    }
    RoundStats {
        report: committed.elapsed(),
        ..round
    }
}

/// Copies the disk-only object `key` back into memory: the master places
/// it (on this client's segments when they have room), the tier reads it
/// there, PutEnd publishes it. A replica elsewhere is given up (the next
/// hits ask again).
fn promote(s: &TierShared, key: &str) {
    let descs = match s.master.promotion_start(s.id, key) {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(key, error = %e, "promotion not started");
            return;
        }
    };
    let now = s.now();
    let filled = descs.iter().all(|d| {
        let Some(m) = d.memory() else { return false };
        match s.own_range_mut(m.buffer_address, m.size) {
            Some(dst) => s.tier.read(key, dst, now).is_ok(),
            None => false,
        }
    });
    let done = if filled {
        s.master.put_end(s.id, key)
    } else {
        s.master.put_revoke(s.id, key)
    };
    if let Err(e) = done {
        tracing::debug!(key, error = %e, "ending a promotion failed");
    }
}

/// Tells the master which copies are durable; copies it refuses (the
/// object changed meanwhile) are deleted.
fn report_durable(s: &TierShared, durable: Vec<(String, u64)>) {
    if durable.is_empty() {
        return;
    }
    let (keys, sizes): (Vec<String>, Vec<u64>) = durable.into_iter().unzip();
    match s.master.notify_offload(s.id, &keys, &sizes, false) {
        Ok(results) => {
            let stale: Vec<String> = keys
                .into_iter()
                .zip(results)
                .filter(|(_, r)| r.is_err())
                .map(|(k, _)| k)
                .collect();
            if !stale.is_empty() {
                s.tier.remove(&stale);
            }
        }
        // Not reported, so not relied on: the master queues them again,
        // and a restart registers what is on disk.
        Err(e) => tracing::warn!(error = %e, "reporting durable copies failed"),
    }
}

/// Phase 1 reached the master: the files may go. If the master could not
/// be told, the copies are kept.
fn report_eviction(s: &TierShared, batch: EvictionBatch) {
    if batch.is_empty() {
        return;
    }
    match s.master.evict_disk_replicas(s.id, &batch.keys) {
        Ok(_) => s.tier.finalize(batch),
        Err(e) => {
            tracing::warn!(error = %e, "reporting a tier eviction failed; keeping the copies");
            s.tier.restore(batch);
        }
    }
}
