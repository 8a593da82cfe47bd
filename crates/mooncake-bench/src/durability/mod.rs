//! Durability costs: 4 KiB put latency through a real `mooncake_master`
//! without and with the local write-ahead log (`--enable_oplog`, fsync
//! before each acknowledgement), and the snapshot path at scale
//! (`snapshot`: snapshot and restore time,
//! put latency while a snapshot runs).

use std::time::Instant;

use self::snapshot::{self as snap, SnapshotBench};

mod snapshot;
use mooncake_common::Result;

use crate::cluster;
use crate::stats::{self, summarize, Summary};

/// Put latency of one master configuration.
#[derive(Debug, Clone)]
pub struct PutRow {
    pub case: &'static str,
    pub summary: Summary,
}

/// `puts` sequential 4 KiB puts by one client against a fresh master
/// with `flags`.
fn put_latency(case: &'static str, flags: &[String], puts: usize) -> Result<PutRow> {
    let master = cluster::start_master(&[], flags)?;
    let client = master.tcp_client(512 << 20)?;
    let value = vec![0x5au8; 4096];
    let mut ns = Vec::with_capacity(puts);
    for i in 0..puts {
        let key = format!("wal-bench/{i}");
        let t = Instant::now();
        client.put(&key, &value, &Default::default())?;
        ns.push(t.elapsed().as_nanos() as u64);
        // Keep the segment from filling: the cost measured is the put's.
        if i % 1000 == 999 {
            for j in i - 999..=i {
                let _ = client.remove(&format!("wal-bench/{j}"), true);
            }
        }
    }
    Ok(PutRow {
        case,
        summary: summarize(&mut ns, 4096, 1),
    })
}

pub struct DurabilityReport {
    pub puts: Vec<PutRow>,
    pub snapshot: SnapshotBench,
}

/// Runs the benchmark; `progress` sees each step as it ends.
pub fn run(
    puts: usize,
    objects: usize,
    mut progress: impl FnMut(String),
) -> Result<DurabilityReport> {
    let dir = cluster::work_dir()?;
    let wal = dir.join("wal-bench");
    let _ = std::fs::remove_dir_all(&wal);
    let logged = [
        "--enable_oplog=true".into(),
        format!("--wal_dir={}", wal.display()),
    ];
    let mut rows = Vec::new();
    for (case, flags) in [
        ("put 4 KiB, no log", &[][..]),
        ("put 4 KiB, write-ahead log (fdatasync)", &logged[..]),
    ] {
        let row = put_latency(case, flags, puts)?;
        progress(format!(
            "{case}: {} puts, p50 {:.1} µs, p99 {:.1} µs",
            row.summary.n, row.summary.p50_us, row.summary.p99_us
        ));
        rows.push(row);
    }
    let snapshot = snap::run(objects, &dir.join("snapshot-bench"), &mut progress)?;
    let _ = std::fs::remove_dir_all(dir.join("snapshot-bench"));
    Ok(DurabilityReport {
        puts: rows,
        snapshot,
    })
}

fn ms(d: std::time::Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Where `--update-docs` draws the chart (the section links it).
pub const CHART_IN_DOCS: &str = "docs/img/durability.svg";
const DOC_BEGIN: &str = "<!-- mooncake-bench durability: begin -->";
const DOC_END: &str = "<!-- mooncake-bench durability: end -->";

/// Replaces the durability section of `docs/benchmarks.md` in `repo`.
pub fn update_docs(
    repo: &std::path::Path,
    section: &str,
    command: &str,
) -> std::result::Result<(), String> {
    let path = repo.join("docs/benchmarks.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    let block = format!(
        "{DOC_BEGIN}\nCommand:\n\n    {command}\n\n{}\n\n\
         ![Put latency with and without the log; snapshot and restore times](img/durability.svg)\n{DOC_END}",
        section.trim_end()
    );
    let doc = match (doc.find(DOC_BEGIN), doc.find(DOC_END)) {
        (Some(b), Some(e)) if e > b => format!("{}{block}{}", &doc[..b], &doc[e + DOC_END.len()..]),
        _ => format!(
            "{}\n\n## Durability (write-ahead log, snapshots)\n\n{block}\n",
            doc.trim_end()
        ),
    };
    std::fs::write(&path, doc).map_err(|e| format!("{}: {e}", path.display()))
}

/// Put latency with and without the log, and the snapshot path's times, drawn.
pub fn charts(r: &DurabilityReport) -> Vec<crate::svg::Bars> {
    let put = |f: fn(&Summary) -> f64| {
        r.puts
            .iter()
            .map(|p| (p.case.to_string(), f(&p.summary)))
            .collect()
    };
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let s = &r.snapshot;
    let total = |x: &mooncake_store::master::durable::snapshot::SnapshotReport| {
        ms(x.apply + x.encode + x.store)
    };
    vec![
        crate::svg::Bars::new("master put p50", "µs", put(|s| s.p50_us)),
        crate::svg::Bars::new("master put p99", "µs", put(|s| s.p99_us)),
        crate::svg::Bars::new(
            format!("snapshot path, {} objects", s.objects),
            "ms",
            vec![
                ("first snapshot".into(), total(&s.first)),
                ("later snapshot".into(), total(&s.second)),
                ("restore".into(), ms(s.restore)),
            ],
        ),
    ]
}

/// Markdown tables of a report.
pub fn render(r: &DurabilityReport) -> String {
    let rows: Vec<Vec<String>> = r
        .puts
        .iter()
        .map(|p| {
            vec![
                p.case.to_string(),
                p.summary.n.to_string(),
                format!("{:.1}", p.summary.p50_us),
                format!("{:.1}", p.summary.p99_us),
            ]
        })
        .collect();
    let build = if cfg!(debug_assertions) {
        "debug build (numbers far above a release build's)"
    } else {
        "release build"
    };
    let mut out = format!("Measured with a {build}.\n\n");
    out.push_str(&stats::table(
        &["master", "puts", "p50 µs", "p99 µs"],
        &rows,
    ));
    let s = &r.snapshot;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let lat = |l: &snap::PutLatency| {
        format!(
            "{} puts: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            l.puts, l.p50_us, l.p99_us, l.max_us
        )
    };
    let rows = vec![
        vec!["objects".into(), s.objects.to_string()],
        vec![
            "snapshot size".into(),
            stats::fmt_size(s.second.bytes as usize),
        ],
        vec![
            "first snapshot (shadow built from the log), ms".into(),
            format!(
                "{} (apply {}, encode {}, write {})",
                ms(s.first.apply + s.first.encode + s.first.store),
                ms(s.first.apply),
                ms(s.first.encode),
                ms(s.first.store)
            ),
        ],
        vec![
            "later snapshot (shadow rebuilt from the first and the log), ms".into(),
            format!(
                "{} (apply {}, encode {}, write {})",
                ms(s.second.apply + s.second.encode + s.second.store),
                ms(s.second.apply),
                ms(s.second.encode),
                ms(s.second.store)
            ),
        ],
        vec![
            "log cut (the snapshot thread waits for it; writers do not), µs".into(),
            format!(
                "{:.0} (first), {:.0} (later)",
                s.first.cut.as_secs_f64() * 1e6,
                s.second.cut.as_secs_f64() * 1e6
            ),
        ],
        vec!["in-process puts, no snapshot running".into(), lat(&s.idle)],
        vec![
            "in-process puts while a snapshot runs".into(),
            lat(&s.during),
        ],
        vec![
            "live snapshot (cut, objects walked live, streamed), ms".into(),
            format!(
                "{} (cut {:.0} µs, encode and write {}, store {})",
                ms(s.live_total),
                s.live.cut.as_secs_f64() * 1e6,
                ms(s.live.encode),
                ms(s.live.store)
            ),
        ],
        vec![
            "in-process puts while a live snapshot runs".into(),
            lat(&s.live_during),
        ],
        vec![
            "process RSS after the fill; peak during the live round; during the shadow round, MiB"
                .into(),
            format!(
                "{:.0}; {:.0} ({:.2}×); {:.0} ({:.2}×)",
                mib(s.rss_steady),
                mib(s.rss_peak_live),
                s.rss_peak_live as f64 / s.rss_steady.max(1) as f64,
                mib(s.rss_peak_shadow),
                s.rss_peak_shadow as f64 / s.rss_steady.max(1) as f64
            ),
        ],
        vec![
            "restore (snapshot + log tail), ms".into(),
            format!("{} ({} objects)", ms(s.restore), s.restored_objects),
        ],
    ];
    out.push('\n');
    out.push_str(&stats::table(&["snapshot path", "measured"], &rows));
    out
}
