//! How far a restore has got, as the log and the metrics report it.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Below this many objects a restore logs only its start and its end.
const LOG_STEPS_FROM: u64 = 100_000;
/// How often (in objects) the count is published while decoding.
const PUBLISH_EVERY: u64 = 4096;

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Restore progress: the objects of the snapshot being restored (or last
/// restored) out of the count it holds, and the log entries replayed after
/// it. The numbers are gauges (shared atomics): the metrics export them.
#[derive(Debug, Default, Clone)]
pub struct RestoreProgress {
    snapshot: Gauge,
    objects: Gauge,
    expected: Gauge,
    entries: Gauge,
}

impl RestoreProgress {
    pub(crate) fn register(&self, r: &mut Registry) {
        let gauges = [
            (
                "master_snapshot_restore_seq",
                "Log position of the snapshot being (or last) restored",
                &self.snapshot,
            ),
            (
                "master_snapshot_restore_objects",
                "Objects restored so far from the snapshot being (or last) restored",
                &self.objects,
            ),
            (
                "master_snapshot_restore_objects_expected",
                "Objects the snapshot being (or last) restored holds",
                &self.expected,
            ),
            (
                "master_snapshot_restore_log_entries",
                "Log entries replayed after the restored snapshot",
                &self.entries,
            ),
        ];
        for (name, help, g) in gauges {
            r.register(name, help, g.clone());
        }
    }

    /// Snapshot `seq`, holding `total` objects, starts decoding.
    pub(crate) fn begin(&self, seq: u64, total: u64) {
        self.snapshot.set(as_i64(seq));
        self.expected.set(as_i64(total));
        self.objects.set(0);
        self.entries.set(0);
        tracing::info!(seq, "restoring snapshot {seq}: {total} objects");
    }

    /// `done` objects of the snapshot are restored (called for each).
    pub(crate) fn restored(&self, done: u64) {
        let total = self.expected.get() as u64;
        if !done.is_multiple_of(PUBLISH_EVERY) && done != total {
            return;
        }
        let before = self.objects.get() as u64;
        self.objects.set(as_i64(done));
        if total >= LOG_STEPS_FROM {
            if let Some(pct) = crossed_tenth(before, done, total) {
                let seq = self.snapshot.get();
                tracing::info!(
                    seq,
                    "restoring snapshot {seq}: {done}/{total} objects ({pct}%)"
                );
            }
        }
    }

    /// `n` log entries were replayed after the snapshot.
    pub(crate) fn replayed(&self, n: usize) {
        self.entries.set(as_i64(n as u64));
    }

    /// (objects restored, objects the snapshot holds).
    pub fn objects(&self) -> (u64, u64) {
        (self.objects.get() as u64, self.expected.get() as u64)
    }
}

/// The percentage (a multiple of ten) `done` of `total` reached, when
/// `before` had not reached it.
fn crossed_tenth(before: u64, done: u64, total: u64) -> Option<u64> {
    let tenth = |n: u64| (n as u128 * 10 / u128::from(total.max(1))) as u64;
    (tenth(done) > tenth(before)).then(|| tenth(done) * 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenths_are_crossed_once() {
        assert_eq!(crossed_tenth(0, 9, 100), None);
        assert_eq!(crossed_tenth(9, 10, 100), Some(10));
        assert_eq!(crossed_tenth(10, 19, 100), None);
        assert_eq!(crossed_tenth(19, 45, 100), Some(40));
        assert_eq!(crossed_tenth(99, 100, 100), Some(100));
        assert_eq!(crossed_tenth(0, 0, 0), None);
    }

    #[test]
    fn counts_are_published_in_steps_and_at_the_end() {
        let p = RestoreProgress::default();
        p.begin(7, PUBLISH_EVERY + 10);
        p.restored(1);
        assert_eq!(p.objects(), (0, PUBLISH_EVERY + 10));
        p.restored(PUBLISH_EVERY);
        assert_eq!(p.objects().0, PUBLISH_EVERY);
        p.restored(PUBLISH_EVERY + 10);
        assert_eq!(p.objects(), (PUBLISH_EVERY + 10, PUBLISH_EVERY + 10));
        p.begin(6, 3);
        assert_eq!(
            p.objects(),
            (0, 3),
            "a fallback to an older snapshot starts over"
        );
    }
}
