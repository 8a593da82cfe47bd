//! Hot keys: per-key heat, admission and the extra memory replicas made
//! for admitted keys (`--dynamic_replication_*`). Pure bookkeeping over a
//! `now` in milliseconds; the service reads the objects and queues the
//! copy tasks (`service::hotkeys`).
//!
//! Heat is counted as the reference counts it: a read of a key with at
//! least one memory replica and fewer than the cap starts a window of
//! `window_ms` at its first hit; a read after the window ends starts a new
//! one from zero. The read that brings a window to `min_hits` admits the
//! key (once per window). Observe mode stops there; enforce mode queues
//! the key, and the tick turns queued keys still admitted into copy tasks.
//! After a fan-out a key is left alone for `ACTION_COOLDOWN_MS`; after one
//! of its extra replicas is dropped, for `RECREATE_COOLDOWN_MS`.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::master::config::policy::HotKeyPolicy;
use crate::types::TaskId;

/// Keys whose windows are tracked at most; a new key past it is not counted.
pub(crate) const WINDOW_ENTRY_LIMIT: usize = 50_000;
/// Windows looked at by one cleanup (which runs at most once a second).
const CLEANUP_BUDGET: usize = 256;
const CLEANUP_INTERVAL_MS: u64 = 1_000;
/// Admitted keys waiting for the tick, at most.
pub(crate) const QUEUE_LIMIT: usize = 50_000;
/// Queued keys one tick turns into copy tasks, at most.
pub(crate) const BATCH: usize = 64;
/// No second fan-out of a key within this time of its last one.
pub(crate) const ACTION_COOLDOWN_MS: u64 = 30_000;
/// No new extra replica of a key within this time of one being dropped.
pub(crate) const RECREATE_COOLDOWN_MS: u64 = 60_000;
/// A target segment must stay below this share used with the copy in it.
pub(crate) const TARGET_HIGH_WATERMARK: f64 = 0.85;

#[derive(Debug, Clone, Copy)]
struct Window {
    start: u64,
    hits: u64,
}

/// One extra memory replica: the segment it was copied to and the task
/// that writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Extra {
    pub(crate) segment: String,
    pub(crate) task: TaskId,
}

/// Every hot key the master tracks.
#[derive(Default)]
pub(crate) struct HeatTable {
    windows: HashMap<String, Window>,
    /// Window keys, oldest first, for bounded cleanup.
    order: VecDeque<String>,
    next_cleanup: u64,
    queue: VecDeque<String>,
    queued: HashSet<String>,
    /// No fan-out of a key before this time.
    cooldown: HashMap<String, u64>,
    /// No new extra replica of a key before this time.
    recreate_after: HashMap<String, u64>,
    /// Extra replicas per key.
    extras: HashMap<String, Vec<Extra>>,
    /// When a key with extras was last seen at or above `min_hits`.
    hot_at: HashMap<String, u64>,
}

impl HeatTable {
    /// Counts one read of `key`; true when it admits the key (the hit that
    /// reaches `min_hits` in the current window).
    pub(crate) fn observe(&mut self, p: &HotKeyPolicy, key: &str, now: u64) -> bool {
        if !p.enabled() {
            return false;
        }
        if self.windows.len() >= WINDOW_ENTRY_LIMIT && now >= self.next_cleanup {
            self.next_cleanup = now + CLEANUP_INTERVAL_MS;
            self.cleanup(p, now);
        }
        if !self.windows.contains_key(key) {
            if self.windows.len() >= WINDOW_ENTRY_LIMIT {
                return false;
            }
            self.order.push_back(key.to_string());
            self.windows.insert(
                key.to_string(),
                Window {
                    start: now,
                    hits: 0,
                },
            );
        }
        let Some(w) = self.windows.get_mut(key) else {
            return false;
        };
        if now.saturating_sub(w.start) >= p.window_ms {
            *w = Window {
                start: now,
                hits: 0,
            };
        }
        w.hits += 1;
        let hits = w.hits;
        if hits >= p.min_hits() && self.extras.contains_key(key) {
            self.hot_at.insert(key.to_string(), now);
        }
        hits == p.min_hits()
    }

    /// Whether `key`'s current window has reached `min_hits`.
    pub(crate) fn admitted(&self, p: &HotKeyPolicy, key: &str, now: u64) -> bool {
        p.enabled()
            && self.windows.get(key).is_some_and(|w| {
                now.saturating_sub(w.start) < p.window_ms && w.hits >= p.min_hits()
            })
    }

    /// Drops up to `CLEANUP_BUDGET` windows older than two windows.
    fn cleanup(&mut self, p: &HotKeyPolicy, now: u64) {
        for _ in 0..CLEANUP_BUDGET {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            match self.windows.get(&key) {
                Some(w) if now.saturating_sub(w.start) > 2 * p.window_ms => {
                    self.windows.remove(&key);
                }
                Some(_) => self.order.push_back(key),
                None => {}
            }
        }
    }

    /// Queues an admitted key for the tick; false when it is queued
    /// already or the queue is full.
    pub(crate) fn enqueue(&mut self, key: &str) -> bool {
        if self.queued.contains(key) || self.queue.len() >= QUEUE_LIMIT {
            return false;
        }
        self.queued.insert(key.to_string());
        self.queue.push_back(key.to_string());
        true
    }

    /// Up to `max` queued keys, oldest first.
    pub(crate) fn take_queued(&mut self, max: usize) -> Vec<String> {
        let n = max.min(self.queue.len());
        let keys: Vec<String> = self.queue.drain(..n).collect();
        for k in &keys {
            self.queued.remove(k);
        }
        keys
    }

    /// Whether a fan-out of `key` must wait (a recent fan-out or a
    /// recently dropped extra replica).
    pub(crate) fn blocked(&self, key: &str, now: u64) -> bool {
        let until = |m: &HashMap<String, u64>| m.get(key).is_some_and(|&t| now < t);
        until(&self.cooldown) || until(&self.recreate_after)
    }

    /// A copy task of `key` to `segment` was queued.
    pub(crate) fn fanned_out(&mut self, key: &str, segment: &str, task: TaskId, now: u64) {
        self.cooldown
            .insert(key.to_string(), now + ACTION_COOLDOWN_MS);
        self.hot_at.insert(key.to_string(), now);
        self.extras.entry(key.to_string()).or_default().push(Extra {
            segment: segment.to_string(),
            task,
        });
    }

    pub(crate) fn extras(&self, key: &str) -> &[Extra] {
        self.extras.get(key).map_or(&[], Vec::as_slice)
    }

    pub(crate) fn has_extras(&self, key: &str) -> bool {
        self.extras.contains_key(key)
    }

    /// Every key with extra replicas.
    pub(crate) fn keys_with_extras(&self) -> Vec<String> {
        self.extras.keys().cloned().collect()
    }

    /// `key`'s extra replica on `segment` is gone. `dropped`: the master
    /// took it back (cooling or memory pressure), so it is not made again
    /// for a while; otherwise its copy failed or the object changed.
    pub(crate) fn forget_extra(&mut self, key: &str, segment: &str, dropped: bool, now: u64) {
        if let Some(v) = self.extras.get_mut(key) {
            v.retain(|e| e.segment != segment);
            if v.is_empty() {
                self.extras.remove(key);
                self.hot_at.remove(key);
            }
        }
        if dropped {
            self.recreate_after
                .insert(key.to_string(), now + RECREATE_COOLDOWN_MS);
        }
    }

    /// Whether a key with extras has cooled: not read at the admission
    /// rate for two windows.
    pub(crate) fn cooled(&self, p: &HotKeyPolicy, key: &str, now: u64) -> bool {
        self.hot_at
            .get(key)
            .is_some_and(|&t| now.saturating_sub(t) >= 2 * p.window_ms)
    }

    /// Forgets cooldowns that ran out (called from the tick).
    pub(crate) fn expire_cooldowns(&mut self, now: u64) {
        self.cooldown.retain(|_, &mut t| now < t);
        self.recreate_after.retain(|_, &mut t| now < t);
    }

    /// Keys counted in a window now.
    pub(crate) fn tracked(&self) -> usize {
        self.windows.len()
    }

    /// Extra replicas recorded now (written or being written).
    pub(crate) fn extra_count(&self) -> usize {
        self.extras.values().map(Vec::len).sum()
    }
}

/// A segment a hot key's copy may go to.
#[derive(Debug, Clone)]
pub(crate) struct Candidate<'a> {
    pub(crate) name: &'a str,
    /// Its engine endpoint (its host decides spreading).
    pub(crate) endpoint: &'a str,
    pub(crate) used: u64,
    pub(crate) capacity: u64,
    /// Mounted and taking new replicas (not draining).
    pub(crate) allocatable: bool,
}

/// Host part of an engine endpoint `host:port` (`[v6]:port` too).
fn endpoint_host(endpoint: &str) -> &str {
    if let Some(rest) = endpoint.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match endpoint.rsplit_once(':') {
        Some((host, _)) if !host.contains(':') => host,
        _ => endpoint,
    }
}

/// FNV-1a of the key then the segment: the same tie-break on every master.
fn stable_score(key: &str, segment: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [key, segment] {
        for b in part.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Where `key`'s next memory replica goes: a segment holding none of its
/// replicas, with room for `size` bytes below `TARGET_HIGH_WATERMARK`; one
/// on another host than every replica first, then the emptiest, then a
/// stable hash of key and segment.
pub(crate) fn choose_target<'a>(
    key: &str,
    size: u64,
    held: &[&str],
    segments: &[Candidate<'a>],
) -> Option<&'a str> {
    let host = |s: &Candidate<'_>| endpoint_host(s.endpoint).to_string();
    let held_hosts: HashSet<String> = segments
        .iter()
        .filter(|s| held.contains(&s.name))
        .map(host)
        .collect();
    segments
        .iter()
        .filter(|s| s.allocatable && s.capacity > 0 && !held.contains(&s.name))
        .filter(|s| {
            s.capacity.saturating_sub(s.used) >= size
                && (s.used + size) as f64 / (s.capacity as f64) < TARGET_HIGH_WATERMARK
        })
        .min_by(|a, b| {
            let other = |s: &Candidate<'_>| held_hosts.contains(&host(s));
            let util = |s: &Candidate<'_>| s.used as f64 / s.capacity as f64;
            other(a)
                .cmp(&other(b))
                .then(util(a).total_cmp(&util(b)))
                .then(stable_score(key, a.name).cmp(&stable_score(key, b.name)))
        })
        .map(|s| s.name)
}
