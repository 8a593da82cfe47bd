//! Where the offload loop's time goes, logged every [`REPORT_EVERY`] while
//! it works: rounds, tasks and bytes per round, the time spent copying
//! into the tier, committing (the sync) and reporting to the master, and
//! the time between rounds while busy (asking for tasks, and polls that
//! found none: the tier idle while memory may wait for it). Sums only;
//! the clock is the caller's.

use std::time::Duration;

/// How often a busy loop logs its sums.
pub(super) const REPORT_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct RoundStats {
    pub(super) rounds: u64,
    pub(super) tasks: u64,
    pub(super) bytes: u64,
    pub(super) stage: Duration,
    pub(super) commit: Duration,
    pub(super) report: Duration,
    /// Between a round's end and the next round's start, when that came
    /// within [`BUSY_GAP`].
    pub(super) between: Duration,
    /// Polls that found no task within [`BUSY_GAP`] of a round.
    pub(super) empty_polls: u64,
}

/// A pause between rounds up to this long counts as time between rounds
/// of one busy stretch; a longer one as idle.
pub(super) const BUSY_GAP: Duration = Duration::from_secs(1);

impl RoundStats {
    pub(super) fn add(&mut self, other: &RoundStats) {
        self.rounds += other.rounds;
        self.tasks += other.tasks;
        self.bytes += other.bytes;
        self.stage += other.stage;
        self.commit += other.commit;
        self.report += other.report;
        self.between += other.between;
        self.empty_polls += other.empty_polls;
    }

    /// Counts the time from the previous round's end (`last_end`) to this
    /// round's start, or a poll that found nothing (`worked` false), when
    /// within [`BUSY_GAP`] of that end.
    pub(super) fn note_poll(&mut self, last_end: Option<Duration>, worked: bool) {
        match last_end {
            Some(since) if since <= BUSY_GAP && worked => self.between += since,
            Some(since) if since <= BUSY_GAP => self.empty_polls += 1,
            _ => {}
        }
    }

    /// Time in rounds (copying, syncing, reporting).
    pub(super) fn busy(&self) -> Duration {
        self.stage + self.commit + self.report
    }

    /// MB/s while in rounds (0 when idle).
    pub(super) fn busy_mb_s(&self) -> f64 {
        let s = self.busy().as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 / s / 1e6
        } else {
            0.0
        }
    }

    /// Logs the sums of `over` and clears them.
    pub(super) fn log_and_clear(&mut self, over: Duration) {
        if self.rounds > 0 {
            tracing::info!(
                over_s = over.as_secs_f64(),
                rounds = self.rounds,
                tasks = self.tasks,
                tasks_per_round = self.tasks as f64 / self.rounds as f64,
                mb = self.bytes as f64 / 1e6,
                stage_s = self.stage.as_secs_f64(),
                commit_s = self.commit.as_secs_f64(),
                report_s = self.report.as_secs_f64(),
                between_s = self.between.as_secs_f64(),
                empty_polls = self.empty_polls,
                busy_mb_s = self.busy_mb_s(),
                "offload rounds"
            );
        }
        *self = RoundStats::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_add_up_and_rate_counts_time_in_rounds_only() {
        let one = RoundStats {
            rounds: 1,
            tasks: 4,
            bytes: 4_000_000,
            stage: Duration::from_millis(2),
            commit: Duration::from_millis(1),
            report: Duration::from_millis(1),
            ..RoundStats::default()
        };
        let mut sum = RoundStats::default();
        assert_eq!(sum.busy_mb_s(), 0.0, "idle");
        sum.add(&one);
        sum.add(&one);
        assert_eq!(sum.tasks, 8);
        assert_eq!(sum.busy(), Duration::from_millis(8));
        let ms = Duration::from_millis;
        sum.note_poll(Some(ms(3)), false);
        sum.note_poll(Some(ms(5)), true);
        sum.note_poll(Some(BUSY_GAP + ms(1)), true);
        sum.note_poll(None, true);
        assert_eq!(sum.between, ms(5), "only gaps inside a busy stretch");
        assert_eq!(sum.empty_polls, 1);
        assert_eq!(sum.busy(), ms(8), "time between rounds is not busy");
        assert!((sum.busy_mb_s() - 1000.0).abs() < 1e-6);
        sum.log_and_clear(REPORT_EVERY);
        assert_eq!(sum, RoundStats::default());
    }
}
