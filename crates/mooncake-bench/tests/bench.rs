//! `mooncake-bench` end to end, with tiny budgets: the real executable,
//! which runs itself as `mooncake_master` and `mooncake_client`, every
//! phase verified. (Speed is never asserted here; the benchmarks measure it.)

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_mooncake-bench");
const TIMEOUT: Duration = Duration::from_secs(240);

/// Runs `mooncake-bench args…` with a deadline (killed past it).
fn bench(args: &[&str], cwd: &Path) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("mooncake-bench {args:?} did not finish in {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn rows(path: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

/// The bars of the SVG chart at `path`: (data-label, data-value) of every
/// `rect class="bar"`.
fn chart_bars(path: &Path) -> Vec<(String, f64)> {
    let svg = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no chart at {}: {e}", path.display()));
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    let attr = |tag: &str, name: &str| {
        let at = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        tag[at..at + tag[at..].find('"').unwrap()].to_string()
    };
    svg.split('<')
        .filter(|t| t.starts_with("rect class=\"bar\""))
        .map(|t| {
            (
                attr(t, "data-label"),
                attr(t, "data-value").parse().unwrap(),
            )
        })
        .collect()
}

fn check_store_run(args: &[&str], topologies: &[&str], mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("store.json");
    let json_s = json.to_str().unwrap();
    let mut all = vec![
        "store",
        "--sizes",
        "4096,65536",
        "--seconds",
        "0.02",
        "--max-iters",
        "12",
        "--segment-size",
        "64MiB",
        "--local-buffer-size",
        "16MiB",
        "--json",
        json_s,
    ];
    all.extend_from_slice(args);
    let out = bench(&all, dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows(&json);
    assert_eq!(rows.len(), topologies.len() * 2 * 6, "{rows:?}");
    for r in &rows {
        assert!(topologies.contains(&r["topology"].as_str().unwrap()), "{r}");
        assert_eq!(r["mode"], mode);
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["verify_errors"], 0, "{r}");
        assert!(r["n"].as_u64().unwrap() >= 8, "{r}");
        let batch = if r["op"].as_str().unwrap().ends_with("_batch") {
            16
        } else {
            1
        };
        assert_eq!(r["batch"], batch, "{r}");
    }
    // The chart next to the JSON: GB/s and p50 of every case.
    let bars = chart_bars(&json.with_extension("svg"));
    assert_eq!(bars.len(), 2 * rows.len(), "{bars:?}");
    let first = &rows[0];
    assert_eq!(bars[0].1, first["gb_s"].as_f64().unwrap(), "{first}");
    // The table on stdout names every case.
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("| op |") && table.contains("get_into"),
        "{table}"
    );
}

#[test]
fn store_bench_local_and_remote() {
    check_store_run(
        &["--topology", "local,remote"],
        &["local", "remote"],
        "default",
    );
}

#[test]
fn store_bench_forced_tcp() {
    check_store_run(&["--topology", "remote", "--force-tcp"], &["remote"], "tcp");
}

#[test]
fn memory_bench_counts_objects() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("mem.json");
    let out = bench(
        &[
            "memory",
            "--objects",
            "3000",
            "--batch",
            "256",
            "--json",
            json.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["objects"], 3000);
    assert_eq!(v["failed_puts"], 0);
    assert!(v["master_rss_after"].as_u64().unwrap() > 0);
    let bars = chart_bars(&json.with_extension("svg"));
    let after = v["master_rss_after"].as_u64().unwrap() as f64 / (1u64 << 20) as f64;
    assert_eq!(bars[1], ("after".to_string(), after));
}

#[test]
fn rpc_and_baseline_print_tables() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("rpc.svg");
    let out = bench(
        &["rpc", "--calls", "50", "--chart", chart.to_str().unwrap()],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("get_replica_list"), "{text}");
    assert!(chart_bars(&chart)
        .iter()
        .any(|(l, v)| l.starts_with("get_replica_list") && *v > 0.0));
    let chart = dir.path().join("baseline.svg");
    let out = bench(
        &[
            "baseline",
            "--iters",
            "50",
            "--chart",
            chart.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("memcpy 4 MiB"));
    assert!(chart_bars(&chart).iter().any(|(l, _)| l == "memcpy 4 MiB"));
}

#[test]
fn bad_usage_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing to do.
    let out = bench(&[], dir.path());
    assert_eq!(out.status.code(), Some(1));
    // Bad op / topology names.
    let out = bench(&["store", "--ops", "fly"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fly"));
    let out = bench(&["store", "--topology", "far"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    // The comparison needs the repository.
    let out = bench(&["--compare-reference"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--repo"));
}
