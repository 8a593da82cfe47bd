//! Hot keys in the state machine: reads count heat (`hotkeys`), the tick
//! turns admitted keys into copy tasks onto another segment and takes the
//! extra replicas back when their key cools or memory runs short.
//!
//! An extra replica is an ordinary replica: written by a copy task between
//! `ReplicaTransferStart` and `ReplicaTransferEnd` (it joins the object,
//! and the log, only once its bytes are complete), served like the others
//! and dropped with `DropReplicas` (its space waits for readers' leases).
//! Which replicas are extra is volatile: a new leader or a restart knows
//! them as ordinary replicas.

use std::sync::atomic::Ordering;

use super::MasterService;
use crate::master::config::policy::{HotKeyMode, HotKeyPolicy};
use crate::master::state::hotkeys::{choose_target, Candidate, HeatTable, BATCH};
use crate::master::state::mutation::{Call, ObjectOp, Segments};
use crate::master::state::segments::SegmentStatus;
use crate::types::{ReplicaDesc, TaskStatus};

/// Extra replicas one tick takes back, at most.
const DROPS_PER_TICK: usize = 256;

/// The hot-key side of the service: the rules and the table.
#[derive(Default)]
pub(crate) struct HotKeys {
    pub(super) policy: HotKeyPolicy,
    pub(super) table: parking_lot::Mutex<HeatTable>,
    /// Reads of keys with extra replicas, to rotate which replica is first.
    reads: std::sync::atomic::AtomicU64,
}

impl MasterService {
    /// Turns on hot-key fan-out (`--dynamic_replication_*`).
    pub fn with_hot_key_policy(mut self, policy: HotKeyPolicy) -> Self {
        self.hot.policy = policy;
        self
    }

    /// Counts a served read of `key` whose complete replicas are
    /// `replicas` (memory ones first); with extra replicas, rotates the
    /// memory ones so that readers spread over them.
    pub(super) fn hot_key_read(&self, key: &str, replicas: &mut [ReplicaDesc], now: u64) {
        let p = &self.hot.policy;
        if !p.enabled() {
            return;
        }
        let memory = replicas.iter().take_while(|r| r.memory().is_some()).count();
        let mut table = self.hot.table.lock();
        let extras = table.has_extras(key);
        let below_cap = memory > 0 && memory < p.max_memory_replicas;
        if !below_cap && !extras {
            return;
        }
        let admitted = table.observe(p, key, now);
        if admitted && below_cap {
            self.counters
                .hot_key_admissions
                .fetch_add(1, Ordering::Relaxed);
            if p.mode == HotKeyMode::Enforce {
                table.enqueue(key);
            } else {
                tracing::debug!(
                    key,
                    "dynamic replication would add a memory replica (observe mode)"
                );
            }
        }
        drop(table);
        if extras && memory > 1 {
            let turn = self.hot.reads.fetch_add(1, Ordering::Relaxed);
            replicas[..memory].rotate_left((turn % memory as u64) as usize);
        }
    }

    /// The tick's hot-key work: forget extras whose copy failed or whose
    /// object went, take back extras of cooled keys (or every extra when
    /// memory is at the eviction watermark: they go before any object),
    /// then fan out the admitted keys queued by reads.
    pub(super) fn hot_key_tick(&self, call: &mut Call, now: u64) {
        if !self.hot.policy.enabled() {
            return;
        }
        self.hot.table.lock().expire_cooldowns(now);
        self.settle_extras(call, now);
        if self.hot.policy.mode != HotKeyMode::Enforce {
            return;
        }
        let keys = self.hot.table.lock().take_queued(BATCH);
        for key in keys {
            self.fan_out(call, &key, now);
        }
    }

    fn settle_extras(&self, call: &mut Call, now: u64) {
        let p = self.hot.policy;
        // At the eviction watermark: the extras go before the round runs.
        let (used, capacity) = self.segments.usage();
        let pressed = capacity > 0 && used as f64 >= self.policy.high_watermark * capacity as f64;
        let keys = self.hot.table.lock().keys_with_extras();
        let mut dropped = 0;
        for key in keys {
            let (extras, cooled) = {
                let t = self.hot.table.lock();
                (t.extras(&key).to_vec(), t.cooled(&p, &key, now))
            };
            for e in extras {
                let running = matches!(
                    self.tasks.lock().state(e.task),
                    Some((_, TaskStatus::Pending | TaskStatus::Processing))
                );
                if running {
                    continue;
                }
                let mut shard = self.objects.lock(&key);
                let now = shard.clock(now);
                let held = shard.get(&key).filter(|o| o.is_complete()).map(|o| {
                    let on = o
                        .replicas
                        .as_slice()
                        .iter()
                        .any(|r| r.segment.info.name == e.segment);
                    (on, o.replicas.len(), o.pending.is_some(), o.lease_until)
                });
                match held {
                    // The copy failed, or the object was removed or written
                    // again: nothing of it is left to drop.
                    None | Some((false, ..)) => {
                        drop(shard);
                        self.hot
                            .table
                            .lock()
                            .forget_extra(&key, &e.segment, false, now);
                    }
                    Some((true, n, false, lease_until))
                        if (cooled || pressed) && n > 1 && dropped < DROPS_PER_TICK =>
                    {
                        let op = ObjectOp::DropReplicas {
                            on: Segments::Named(&e.segment),
                            free_at: lease_until,
                            now,
                        };
                        self.apply_in(call, &mut shard, &key, op);
                        drop(shard);
                        dropped += 1;
                        self.counters
                            .hot_key_replicas_dropped
                            .fetch_add(1, Ordering::Relaxed);
                        self.hot
                            .table
                            .lock()
                            .forget_extra(&key, &e.segment, true, now);
                    }
                    Some(_) => {}
                }
            }
        }
    }

    /// Queues a copy of `key` onto a segment holding none of its replicas,
    /// if it is still admitted, below the cap and not cooling down.
    fn fan_out(&self, call: &mut Call, key: &str, now: u64) {
        let p = self.hot.policy;
        let extras = {
            let t = self.hot.table.lock();
            if !t.admitted(&p, key, now) || t.blocked(key, now) {
                return;
            }
            t.extras(key).to_vec()
        };
        // The heat table is a leaf: the task table is read without it.
        let tasks = self.tasks.lock();
        let running = extras.iter().any(|e| {
            matches!(
                tasks.state(e.task),
                Some((_, TaskStatus::Pending | TaskStatus::Processing))
            )
        });
        drop(tasks);
        if running {
            return;
        }
        let (size, held) = {
            let shard = self.objects.lock(key);
            let Some(obj) = shard.get(key) else { return };
            if !obj.is_complete() || obj.pending.is_some() {
                return;
            }
            let held: Vec<String> = obj
                .replicas
                .as_slice()
                .iter()
                .filter(|r| r.segment.is_mounted())
                .map(|r| r.segment.info.name.clone())
                .collect();
            (obj.size, held)
        };
        if held.is_empty() || held.len() >= p.max_memory_replicas {
            return;
        }
        let segments = self.segments.all();
        let candidates: Vec<Candidate<'_>> = segments
            .iter()
            .map(|s| Candidate {
                name: &s.info.name,
                endpoint: &s.info.transport_endpoint,
                used: s.used(),
                capacity: s.capacity(),
                allocatable: s.is_mounted() && s.status() == SegmentStatus::Ok,
            })
            .collect();
        let held_names: Vec<&str> = held.iter().map(String::as_str).collect();
        let Some(target) = choose_target(key, size, &held_names, &candidates) else {
            tracing::debug!(
                key,
                "dynamic replication: no segment has room for another replica"
            );
            return;
        };
        match self.create_copy_task_in(call, key, &[target], now) {
            Ok(task) => {
                self.counters
                    .hot_key_fan_outs
                    .fetch_add(1, Ordering::Relaxed);
                self.hot.table.lock().fanned_out(key, target, task, now);
            }
            Err(e) => tracing::debug!(key, error = %e, "dynamic replication: copy task not queued"),
        }
    }

    /// Keys counted in a heat window, and extra replicas recorded.
    pub fn hot_key_gauges(&self) -> (usize, usize) {
        let t = self.hot.table.lock();
        (t.tracked(), t.extra_count())
    }
}
