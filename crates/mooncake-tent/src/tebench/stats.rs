//! One case's measurements and its row in the reference's table format.

/// What the threads of one case measured.
#[derive(Clone, Debug, Default)]
pub struct CaseStats {
    /// Each transfer's execution time (µs), pacing excluded.
    pub transfer_us: Vec<f64>,
    /// Each transfer's bytes / execution time, in GB/s (10^9 bytes).
    pub instant_gbps: Vec<f64>,
    /// Each thread's wall-clock measurement time (µs), pacing included.
    pub thread_wall_us: Vec<f64>,
}

impl CaseStats {
    pub fn merge(&mut self, other: CaseStats) {
        self.transfer_us.extend(other.transfer_us);
        self.instant_gbps.extend(other.instant_gbps);
        self.thread_wall_us.extend(other.thread_wall_us);
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The `p`th percentile, linearly interpolated between the closest ranks.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (s.len() - 1) as f64;
    let i = rank as usize;
    match s.get(i + 1) {
        Some(next) => s[i] + (next - s[i]) * (rank - i as f64),
        None => s[i],
    }
}

/// The table's header and rule.
pub fn header() -> String {
    format!(
        "{:<14}{:<8}{:<14}{:<18}{:<14}{:<14}{:<14}{:<14}\n{}",
        "BlkSize (B)",
        "Batch",
        "BW (GB/s)",
        "Avg Inst GB/s",
        "Avg Lat (us)",
        "Avg Tx (us)",
        "P99 Tx (us)",
        "P999 Tx (us)",
        "-".repeat(160)
    )
}

/// One row: throughput over the threads' mean wall time; latency per
/// operation scaled by the thread count, as the reference computes them.
pub fn format_row(block_size: u64, batch_size: u64, threads: usize, s: &CaseStats) -> String {
    let ops = s.transfer_us.len() as f64;
    let wall_us = mean(&s.thread_wall_us);
    let bytes = (block_size * batch_size) as f64 * ops;
    let bw = if wall_us > 0.0 {
        bytes / 1e9 / (wall_us / 1e6)
    } else {
        0.0
    };
    let lat = if ops > 0.0 {
        wall_us * threads as f64 / ops
    } else {
        0.0
    };
    format!(
        "{:<14}{:<8}{:<14.6}{:<18.6}{:<14.1}{:<14.1}{:<14.1}{:<14.1}",
        block_size,
        batch_size,
        bw,
        mean(&s.instant_gbps),
        lat,
        mean(&s.transfer_us),
        percentile(&s.transfer_us, 99.0),
        percentile(&s.transfer_us, 99.9),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate() {
        let v: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), 100.0);
        assert!((percentile(&v, 99.9) - 100.9).abs() < 1e-9);
        assert_eq!(percentile(&[5.0], 99.0), 5.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[3.0, 1.0], 50.0), 2.0);
    }

    #[test]
    fn row_matches_the_references_arithmetic() {
        // 2 threads, 1 s each, 4 transfers of 1 MB × 2 = 8 MB in 1 s.
        let s = CaseStats {
            transfer_us: vec![100.0, 200.0, 300.0, 400.0],
            instant_gbps: vec![1.0, 2.0, 3.0, 4.0],
            thread_wall_us: vec![1e6, 1e6],
        };
        let row = format_row(1_000_000, 2, 2, &s);
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[..4], ["1000000", "2", "0.008000", "2.500000"]);
        // Avg Lat = 1e6 µs × 2 threads / 4 ops.
        assert_eq!(cols[4], "500000.0");
        assert_eq!(cols[5], "250.0");
        assert_eq!(cols[6], "397.0");
        assert_eq!(&row[..14], "1000000       ");
        assert!(header().starts_with("BlkSize (B)   Batch   BW (GB/s)"));
    }

    #[test]
    fn empty_case_prints_zeros_not_nan() {
        let row = format_row(4096, 1, 1, &CaseStats::default());
        assert!(!row.contains("NaN") && !row.contains("inf"), "{row}");
    }
}
