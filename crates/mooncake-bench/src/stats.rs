//! Latency statistics: percentiles, throughput, and table formatting.

use serde::Serialize;

/// Summary of one benchmark case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Calls measured (a batch call counts once).
    pub n: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    /// Items per second (an item is one value; a batch call moves several).
    pub ops_s: f64,
    /// 10⁹ bytes per second of summed call latency.
    pub gb_s: f64,
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=100).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarises per-call latencies in nanoseconds; each call moved
/// `bytes_per_call` bytes in `items_per_call` values.
pub fn summarize(latencies_ns: &mut [u64], bytes_per_call: u64, items_per_call: u64) -> Summary {
    latencies_ns.sort_unstable();
    let n = latencies_ns.len();
    let total_ns: u128 = latencies_ns.iter().map(|&x| x as u128).sum();
    let (ops_s, gb_s, mean_us) = if n == 0 || total_ns == 0 {
        (0.0, 0.0, 0.0)
    } else {
        let secs = total_ns as f64 / 1e9;
        (
            (n as u64 * items_per_call) as f64 / secs,
            (n as u64 * bytes_per_call) as f64 / secs / 1e9,
            total_ns as f64 / n as f64 / 1e3,
        )
    };
    Summary {
        n,
        p50_us: percentile(latencies_ns, 50.0) as f64 / 1e3,
        p99_us: percentile(latencies_ns, 99.0) as f64 / 1e3,
        mean_us,
        ops_s,
        gb_s,
    }
}

/// `4 KiB`, `1 MiB`, or plain bytes.
pub fn fmt_size(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// A markdown table.
pub fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    for r in rows {
        s.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    s
}

/// A horizontal bar chart of `rows` (label, value) in text, scaled to the
/// largest value: what a table shows, drawn.
pub fn bars(title: &str, unit: &str, rows: &[(String, f64)]) -> String {
    const WIDTH: f64 = 40.0;
    let max = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    let label_w = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
    let mut s = format!("{title}\n");
    for (label, v) in rows {
        let cells = if max > 0.0 { v / max * WIDTH } else { 0.0 };
        // Eighths of a cell, so small differences still show.
        let eighths = (cells * 8.0).round() as usize;
        let mut bar = "█".repeat(eighths / 8);
        if !eighths.is_multiple_of(8) {
            bar.push(['▏', '▎', '▍', '▌', '▋', '▊', '▉'][eighths % 8 - 1]);
        }
        let pad = label_w - label.chars().count();
        s.push_str(&format!(
            "{label}{} │{bar} {v:.2} {unit}\n",
            " ".repeat(pad)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest() {
        let chart = bars(
            "t",
            "GB/s",
            &[("a".into(), 2.0), ("bb".into(), 1.0), ("c".into(), 0.0)],
        );
        let lines: Vec<&str> = chart.lines().collect();
        assert_eq!(lines[0], "t");
        assert_eq!(lines[1], format!("a  │{} 2.00 GB/s", "█".repeat(40)));
        assert_eq!(lines[2], format!("bb │{} 1.00 GB/s", "█".repeat(20)));
        assert_eq!(lines[3], "c  │ 0.00 GB/s");
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn throughput_counts_items_and_bytes() {
        // Four calls of 1 ms, each moving 16 items of 1000 bytes.
        let mut lat = vec![1_000_000u64; 4];
        let s = summarize(&mut lat, 16_000, 16);
        assert_eq!(s.n, 4);
        assert_eq!(s.p50_us, 1000.0);
        assert!((s.ops_s - 16_000.0).abs() < 1e-6);
        assert!((s.gb_s - 0.016).abs() < 1e-9);
        assert_eq!(summarize(&mut [], 1, 1).gb_s, 0.0);
    }

    #[test]
    fn sizes_and_tables() {
        assert_eq!(fmt_size(4096), "4 KiB");
        assert_eq!(fmt_size(4 << 20), "4 MiB");
        assert_eq!(fmt_size(1000), "1000 B");
        let t = table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }
}
