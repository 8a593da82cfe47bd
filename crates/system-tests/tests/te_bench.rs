//! `transfer_engine_bench` end to end: a target process, and initiator runs
//! (library `run`, and the binary) that verify the bytes they moved.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;

use clap::Parser;
use mooncake_cli::te_bench::{run, BenchArgs};

struct Target {
    child: Child,
    segment: String,
}

impl Target {
    fn start(extra_env: &[(&str, &str)]) -> Target {
        let mut cmd = Command::new(mooncake_system_tests::program("transfer_engine_bench"));
        cmd.args([
            "--mode=target",
            "--local_server_name=127.0.0.1",
            "--buffer_size=8388608",
        ])
        .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        .stdout(Stdio::piped());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut segment = None;
        for line in stdout.lines() {
            let line = line.unwrap();
            if let Some(s) = line.split("segment_id=").nth(1) {
                segment = Some(s.trim().to_string());
                break;
            }
        }
        Target {
            child,
            segment: segment.expect("target announced its segment"),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // SIGINT: the target stops cleanly and exits 0.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().unwrap();
        assert!(
            status.success() || std::thread::panicking(),
            "target exited with {status}"
        );
    }
}

fn args(segment: &str, op: &str) -> BenchArgs {
    BenchArgs::try_parse_from([
        "transfer_engine_bench",
        "--local_server_name=127.0.0.1",
        &format!("--segment_id={segment}"),
        &format!("--operation={op}"),
        "--duration=0.3",
        "--threads=2",
        "--batch_size=8",
        "--block_size=65536",
        "--buffer_size=8388608",
        "--check_consistency=true",
    ])
    .unwrap()
}

#[test]
fn read_and_write_verify_same_host() {
    let target = Target::start(&[]);
    let stop = AtomicBool::new(false);
    for op in ["read", "write"] {
        let report = run(&args(&target.segment, op), &stop).unwrap().unwrap();
        assert_eq!(report.verified, Some(true), "{op}");
        assert!(
            report.batches > 0 && report.bytes == report.batches * 8 * 65536,
            "{report:?}"
        );
    }
}

#[test]
fn binary_prints_the_throughput_line() {
    let target = Target::start(&[("MC_FORCE_TCP", "1")]);
    let out = Command::new(mooncake_system_tests::program("transfer_engine_bench"))
        .args([
            "--local_server_name=127.0.0.1",
            &format!("--segment_id={}", target.segment),
            "--operation=write",
            "--duration=0.3",
            "--threads=2",
            "--batch_size=4",
            "--buffer_size=8388608",
            "--report_unit=MB",
            "--check_consistency",
        ])
        .env("MC_FORCE_TCP", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Test completed: duration"), "{stdout}");
    assert!(stdout.contains("MB/s"), "{stdout}");
    assert!(stdout.contains("Data consistency check passed"), "{stdout}");
}

#[test]
fn unknown_segment_fails_cleanly() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = Command::new(mooncake_system_tests::program("transfer_engine_bench"))
        .args([
            "--local_server_name=127.0.0.1",
            &format!("--segment_id={dead}"),
            "--duration=0.1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ERR_METADATA"));
}
