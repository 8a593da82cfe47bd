//! `tebench` as processes: a target and initiators on loopback, for both
//! backends: the target's "To start initiators" line, a sweep with a
//! skipped case in the reference's table format, WRITE→READ consistency,
//! `write_seed` then `read_verify` (and `read_verify` failing on data never
//! written), and hardware flags refused by name.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const TEBENCH: &str = env!("CARGO_BIN_EXE_tebench");

/// A target process; killed on drop (it serves until killed, as the reference's).
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a target and returns it with the initiator command line it printed.
fn start_target(backend: &str) -> (Target, String) {
    let mut child = Command::new(TEBENCH)
        .args([&format!("--backend={backend}"), "--total_buffer_size=8M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn tebench target");
    let stdout = child.stdout.take().unwrap();
    let target = Target(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while lines.len() < 3 {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("target printed only {lines:?}"));
        lines.push(line);
    }
    assert!(lines[0].contains("To start initiators, run"), "{lines:?}");
    assert!(
        lines[2].starts_with("Press Ctrl-C to terminate"),
        "{lines:?}"
    );
    let cmd = lines[1].trim().to_string();
    let want_tail = format!(" --seg_type=DRAM --backend={backend}");
    assert!(
        cmd.starts_with("./tebench --target_seg_name=") && cmd.ends_with(&want_tail),
        "{cmd}"
    );
    let seg = cmd
        .trim_start_matches("./tebench --target_seg_name=")
        .trim_end_matches(&want_tail)
        .to_string();
    (target, seg)
}

fn initiator(backend: &str, seg: &str, extra: &[&str]) -> Output {
    Command::new(TEBENCH)
        .args([
            format!("--target_seg_name={seg}"),
            format!("--backend={backend}"),
            "--seg_type=DRAM".into(),
            "--duration=1".into(),
        ])
        .args(extra)
        .output()
        .expect("run tebench initiator")
}

/// The table's data rows, as columns.
fn rows(out: &Output) -> Vec<Vec<String>> {
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert!(
        lines
            .next()
            .is_some_and(|h| h.starts_with("BlkSize (B)   Batch   BW (GB/s)")),
        "{text}"
    );
    assert!(lines.next().is_some_and(|r| r == "-".repeat(160)), "{text}");
    lines
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

fn both_roles(backend: &str) {
    let (_target, seg) = start_target(backend);

    // Never written: read_verify must fail, naming the check.
    let out = initiator(
        backend,
        &seg,
        &[
            "--op_type=read_verify",
            "--start_block_size=64K",
            "--max_block_size=64K",
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("data check failed"));

    // Threads 1..2 × batch 1..2 of 1 MiB blocks in 2 MiB: (2 threads, batch 2) is skipped.
    let out = initiator(
        backend,
        &seg,
        &[
            "--op_type=mix",
            "--check_consistency",
            "--total_buffer_size=2M",
            "--start_block_size=1M",
            "--max_block_size=1M",
            "--max_batch_size=2",
            "--max_num_threads=2",
            "--request_interval_us=100",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Skipped for block_size 1048576 batch_size 2"),
        "{stderr}"
    );
    let table = rows(&out);
    let shape: Vec<(&str, &str)> = table.iter().map(|r| (&*r[0], &*r[1])).collect();
    assert_eq!(
        shape,
        [("1048576", "1"), ("1048576", "2"), ("1048576", "1")]
    );
    for r in &table {
        assert_eq!(r.len(), 8, "{r:?}");
        let v: Vec<f64> = r.iter().map(|c| c.parse().unwrap()).collect();
        assert!(v[2..].iter().all(|x| *x > 0.0 && x.is_finite()), "{r:?}");
        // Pacing counts in the wall-clock latency, not the transfer time.
        assert!(v[4] > v[5], "{r:?}");
    }
    println!("{backend}: {table:?}");

    // write_seed then read_verify over the same range.
    for op in ["--op_type=write_seed", "--op_type=read_verify"] {
        let out = initiator(
            backend,
            &seg,
            &[op, "--start_block_size=64K", "--max_block_size=64K"],
        );
        assert!(
            out.status.success(),
            "{op}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(rows(&out).len(), 1);
    }
}

#[test]
fn classic_target_and_initiator() {
    both_roles("classic");
}

#[test]
fn tent_target_and_initiator() {
    both_roles("tent");
}

#[test]
fn hardware_flags_are_refused() {
    for flag in ["--seg_type=VRAM", "--xport_type=rdma", "--local_gpu_id=1"] {
        let out = Command::new(TEBENCH).arg(flag).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let name = flag.trim_start_matches("--").split('=').next().unwrap();
        assert_eq!(out.status.code(), Some(1), "{flag}");
        assert!(
            stderr.contains(name) && stderr.contains("not supported"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "{flag} started a role");
    }
}
