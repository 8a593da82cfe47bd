//! The one-line summary of `/metrics/summary` and the periodic log, with
//! the reference's sections. Request figures are per second since the
//! previous summary (the first one: since the master started).

use std::fmt::Write as _;
use std::time::Instant;

use mooncake_common::size::format_size;

use super::{BatchOp, MasterMetrics, Op};
use crate::master::state::service::{MasterService, MasterStats};

/// Counts at one summary.
pub(super) struct Snapshot {
    at: Instant,
    /// (requests, failures) per [`Op`].
    singles: Vec<(u64, u64)>,
    /// (requests, failures, partial successes, items, failed items) per [`BatchOp`].
    batches: Vec<[u64; 5]>,
}

const SINGLES: [(&str, Op); 15] = [
    ("PutStart", Op::PutStart),
    ("PutEnd", Op::PutEnd),
    ("PutRevoke", Op::PutRevoke),
    ("Get", Op::GetReplicaList),
    ("Exist", Op::ExistKey),
    ("Del", Op::Remove),
    ("DelAll", Op::RemoveAll),
    ("Ping", Op::Ping),
    ("CopyStart", Op::CopyStart),
    ("CopyEnd", Op::CopyEnd),
    ("CopyRevoke", Op::CopyRevoke),
    ("MoveStart", Op::MoveStart),
    ("MoveEnd", Op::MoveEnd),
    ("MoveRevoke", Op::MoveRevoke),
    ("EvictDiskReplica", Op::EvictDiskReplica),
];

const BATCHES: [(&str, BatchOp); 7] = [
    ("PutStart", BatchOp::PutStart),
    ("PutEnd", BatchOp::PutEnd),
    ("PutRevoke", BatchOp::PutRevoke),
    ("Get", BatchOp::GetReplicaList),
    ("ExistKey", BatchOp::ExistKey),
    ("QueryIp", BatchOp::QueryIp),
    ("Clear", BatchOp::ReplicaClear),
];

const TASKS: [(&str, Op); 5] = [
    ("CreateMoveTask", Op::CreateMoveTask),
    ("CreateCopyTask", Op::CreateCopyTask),
    ("QueryTask", Op::QueryTask),
    ("FetchTasks", Op::FetchTasks),
    ("MarkTaskToComplete", Op::UpdateTask),
];

impl MasterMetrics {
    fn snapshot(&self, at: Instant) -> Snapshot {
        Snapshot {
            at,
            singles: self
                .singles
                .iter()
                .map(|c| (c.requests.get(), c.failures.get()))
                .collect(),
            batches: self
                .batches
                .iter()
                .map(|c| {
                    [
                        c.requests.get(),
                        c.failures.get(),
                        c.partial_successes.get(),
                        c.items.get(),
                        c.failed_items.get(),
                    ]
                })
                .collect(),
        }
    }

    /// `master={...}, ha={...}`: the sections after the role prefix.
    pub fn summary(&self, svc: &MasterService, st: &MasterStats) -> String {
        self.refresh(svc, st);
        let now = self.snapshot(Instant::now());
        let prev = self.last_summary.lock().replace(self.snapshot(now.at));
        let (prev_at, zero_singles, zero_batches);
        let (ps, pb) = match &prev {
            Some(p) => (&p.singles, &p.batches),
            None => {
                zero_singles = vec![(0, 0); now.singles.len()];
                zero_batches = vec![[0; 5]; now.batches.len()];
                (&zero_singles, &zero_batches)
            }
        };
        prev_at = prev.as_ref().map_or(self.created, |p| p.at);
        let secs = now.at.duration_since(prev_at).as_secs_f64().max(1e-3);
        let rate = |d: u64| d as f64 / secs;
        let pct = if st.capacity_bytes == 0 {
            0.0
        } else {
            st.allocated_bytes as f64 * 100.0 / st.capacity_bytes as f64
        };
        let g = |g: &prometheus_client::metrics::gauge::Gauge| g.get().max(0) as u64;
        let mut s = format!(
            "master={{Mem Storage: {} / {} ({pct:.1}%) | NVMe-oF SSD: 0 B / 0 B | SSD Storage: {} / {} | Keys: {} (soft-pinned: {}) | Clients: {} | Segments: {} | Requests (Success/Total per sec):",
            format_size(st.allocated_bytes),
            format_size(st.capacity_bytes),
            format_size(g(&self.file_tier.allocated)),
            format_size(g(&self.file_tier.capacity)),
            st.key_count,
            st.soft_pin_key_count,
            st.active_clients,
            st.segment_count,
        );
        for (i, (name, op)) in SINGLES.iter().enumerate() {
            let (req, fail) = now.singles[*op as usize];
            let (preq, pfail) = ps[*op as usize];
            let total = req - preq;
            let ok = total.saturating_sub(fail - pfail);
            let sep = if i == 0 { " " } else { ", " };
            let _ = write!(s, "{sep}{name}={:.2}/{:.2}", rate(ok), rate(total));
        }
        s.push_str(
            " | Batch Requests (per sec, Req=Success/PartialSuccess/Total, Item=Success/Total):",
        );
        for (i, (name, op)) in BATCHES.iter().enumerate() {
            let c = now.batches[*op as usize];
            let p = pb[*op as usize];
            let d: Vec<u64> = (0..5).map(|k| c[k] - p[k]).collect();
            let req_ok = d[0].saturating_sub(d[1] + d[2]);
            let item_ok = d[3].saturating_sub(d[4]);
            let sep = if i == 0 { " " } else { ", " };
            let _ = write!(
                s,
                "{sep}{name}:(Req={:.2}/{:.2}/{:.2}, Item={:.2}/{:.2})",
                rate(req_ok),
                rate(d[2]),
                rate(d[0]),
                rate(item_ok),
                rate(d[3])
            );
        }
        for (name, op) in TASKS {
            let (req, fail) = now.singles[op as usize];
            let (preq, pfail) = ps[op as usize];
            let total = req - preq;
            let ok = total.saturating_sub(fail - pfail);
            let _ = write!(s, ", {name}:(Req={:.2}/{:.2})", rate(ok), rate(total));
        }
        let evictions = format!(
            "Success/Attempts={}/{}, keys={}, size={}",
            self.successful_evictions.get(),
            self.attempted_evictions.get(),
            g(&self.evicted_keys),
            format_size(g(&self.evicted_bytes)),
        );
        let p = &self.promotion;
        let _ = write!(
            s,
            " | Eviction: {evictions}, AllocFail={}, PartialAlloc={} | Mem Eviction: {evictions} | NoF Eviction: Success/Attempts=0/0, keys=0, size=0 B | Discard: Released/Total={}/{}, StagingSize={} | Promotion: in_flight={}, admitted={}, completed={}, failed={}, cancelled={}, expired={}, bytes={}, rejected(freq/wm/cap)={}/{}/{} | Snapshots: Success={}, Fail={}}}",
            self.alloc_failures.get(),
            self.partial_allocations.get(),
            g(&self.released_puts),
            g(&self.discarded_puts),
            format_size(g(&self.discarded_staging)),
            p.in_flight.get(),
            p.admitted.get(),
            p.completed.get(),
            p.failed.get(),
            p.cancelled.get(),
            p.expired.get(),
            format_size(p.completed_bytes.get()),
            p.rejected_frequency.get(),
            p.rejected_watermark.get(),
            p.rejected_cap.get(),
            self.snapshots_ok.get(),
            self.snapshots_failed.get(),
        );
        let [last, applied, lag, pending, queue, state] = self.ha.snapshot();
        let _ = write!(
            s,
            ", ha={{HA Metrics Summary: last_seq={last}, applied_seq={applied}, lag={lag}, pending={pending}, mutation_queue={queue}, state={state}}}"
        );
        s
    }
}
