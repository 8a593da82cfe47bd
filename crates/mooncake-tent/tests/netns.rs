//! Real links: two network namespaces joined by two veth pairs, each
//! direction of each pair shaped to the same rate with `tbf` (so the links,
//! not the CPU, bound throughput). `tent_bench` serves in one namespace and
//! writes-then-reads-back 4 MiB blocks (two threads) from the other; mid-run one path's
//! link goes down (`ip link set down`) and comes back. Every round must
//! complete with the right bytes; throughput before, during and after the
//! fault is measured (targets: one of two equal paths down ≥ 45 % of both
//! up, both up ≥ 1.8× one path, back in rotation within 1 s of the link
//! coming back; measured and printed, not asserted, since a loaded
//! machine's CPU stalls can set them).
//! Then link 2 is slowed to a quarter of link 1: it must get fewer slices.
//! A classic-engine run over one link is the baseline.
//!
//! Needs root and iproute2 (`tbf`; this kernel has no `netem`); without
//! them it prints why it skipped and returns before any assertion.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const BENCH: &str = env!("CARGO_BIN_EXE_tent_bench");
const RATE: &str = "50mbit";
const SLOW_RATE: &str = "12mbit";

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The two namespaces; dropping it deletes them (and their veths).
struct Net {
    a: String,
    b: String,
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.a]);
        let _ = sh(&["ip", "netns", "del", &self.b]);
    }
}

fn setup() -> Result<Net, String> {
    let id = std::process::id() % 100_000;
    let net = Net {
        a: format!("tenta{id}"),
        b: format!("tentb{id}"),
    };
    sh(&["ip", "netns", "add", &net.a])?;
    sh(&["ip", "netns", "add", &net.b])?;
    let (a, b) = (net.a.as_str(), net.b.as_str());
    for ns in [a, b] {
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
    }
    for k in 1..=2 {
        let (va, vb) = (format!("ta{id}p{k}"), format!("tb{id}p{k}"));
        sh(&[
            "ip", "link", "add", &va, "type", "veth", "peer", "name", &vb,
        ])?;
        sh(&["ip", "link", "set", &va, "netns", a])?;
        sh(&["ip", "link", "set", &vb, "netns", b])?;
        for (ns, dev, host) in [(a, &va, 1), (b, &vb, 2)] {
            let addr = format!("10.201.{k}.{host}/24");
            sh(&["ip", "-n", ns, "addr", "add", &addr, "dev", dev])?;
            sh(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            sh(&[
                "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                RATE, "burst", "64kb", "latency", "50ms",
            ])?;
        }
    }
    Ok(net)
}

fn path_dev(net: &Net, k: u32) -> String {
    let id = net.a.trim_start_matches("tenta");
    format!("ta{id}p{k}")
}

struct Server {
    child: Child,
    name: String,
    buffer: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn server(net: &Net) -> Server {
    let mut child = Command::new("ip")
        .args(["netns", "exec", &net.b, BENCH, "--mode=server"])
        .arg("--addresses=10.201.1.2,10.201.2.2")
        .arg("--buffer_size=64M")
        .env(
            "MC_TENT_CONF",
            r#"{"metrics": {"http_port": 0, "report_interval_seconds": 0}}"#,
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("server starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut parts = line.split_whitespace();
    assert_eq!(parts.next(), Some("READY"), "server said {line:?}");
    Server {
        name: parts.next().unwrap().to_string(),
        buffer: parts.next().unwrap().to_string(),
        child,
    }
}

/// A client run; its lines arrive on the returned channel.
fn client(
    net: &Net,
    s: &Server,
    backend: &str,
    addresses: &str,
    peer: &str,
    secs: u32,
) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", &net.a, BENCH, "--mode=client"])
        .arg(format!("--backend={backend}"))
        .arg(format!("--addresses={addresses}"))
        .arg(format!("--peer={peer}"))
        .arg(format!("--peer_buffer={}", s.buffer))
        .arg(format!("--seconds={secs}"))
        .args(["--block_size=4M", "--window_ms=250", "--threads=2"])
        .env(
            "MC_TENT_CONF",
            r#"{"transports": {"tcp": {"slice_size": 262144, "stall_timeout_ms": 1000}},
                "metrics": {"http_port": 0, "report_interval_seconds": 0}}"#,
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("client starts");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Rounds `(end ms, bytes)`, path changes `(ms, endpoint, up)` and the DONE line's numbers.
fn collect(
    rx: &mpsc::Receiver<String>,
    windows: &mut Vec<(u64, u64)>,
    paths: &mut Vec<(u64, String, bool)>,
) -> Option<[u64; 4]> {
    collect_slices(rx, windows, paths, &mut Vec::new())
}

/// As [`collect`], with the slices each path carried.
fn collect_slices(
    rx: &mpsc::Receiver<String>,
    windows: &mut Vec<(u64, u64)>,
    paths: &mut Vec<(u64, String, bool)>,
    slices: &mut Vec<(String, u64)>,
) -> Option<[u64; 4]> {
    for line in rx.iter() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.first() {
            Some(&"S") => slices.push((f[1].to_string(), f[2].parse().unwrap())),
            Some(&"P") => paths.push((f[1].parse().unwrap(), f[2].to_string(), f[3] == "up")),
            Some(&"R") => windows.push((f[1].parse().unwrap(), f[2].parse().unwrap())),
            Some(&"DONE") => {
                let n: Vec<u64> = f[1..].iter().map(|x| x.parse().unwrap()).collect();
                return Some([n[0], n[1], n[2], n[3]]);
            }
            Some(&"ERR") => eprintln!("client: {line}"),
            _ => {}
        }
    }
    None
}

/// MB/s of the rounds that ended in `(from, to]`: the bytes of all but
/// the first over the time since the first ended (no window edges).
fn rate(rounds: &[(u64, u64)], from: u64, to: u64) -> f64 {
    let r: Vec<_> = rounds
        .iter()
        .filter(|(t, _)| *t > from && *t <= to)
        .collect();
    assert!(r.len() >= 3, "too few rounds in ({from}, {to}]: {rounds:?}");
    let bytes: u64 = r[1..].iter().map(|(_, b)| b).sum();
    let ms = r[r.len() - 1].0 - r[0].0;
    bytes as f64 / (ms as f64 / 1000.0) / 1e6
}

#[test]
fn a_link_going_down_mid_transfer_costs_only_its_share() {
    let net = match setup() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("SKIPPED: needs root and iproute2 (network namespaces, veth, tc tbf): {e}");
            return;
        }
    };
    let srv = server(&net);

    // Baseline: the classic engine over one link.
    let (mut c, rx) = client(
        &net,
        &srv,
        "classic",
        "10.201.1.1",
        &format!("10.201.1.2:{}", srv.name.rsplit(':').next().unwrap()),
        4,
    );
    let mut classic = Vec::new();
    let done = collect(&rx, &mut classic, &mut Vec::new()).expect("classic run ends");
    assert!(c.wait().unwrap().success());
    assert_eq!(done[2..], [0, 0], "classic: errors, mismatches");
    let classic_rate = rate(&classic, 0, u64::MAX);

    // TENT over both links; link 2 down from t+6 s to t+16 s.
    let (mut c, rx) = client(&net, &srv, "tent", "10.201.1.1,10.201.2.1", &srv.name, 24);
    let mut windows = Vec::new();
    let mut paths = Vec::new();
    let first = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("client runs");
        if line.starts_with('R') {
            break line;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() == Some(&"P") {
            paths.push((f[1].parse().unwrap(), f[2].to_string(), f[3] == "up"));
        }
    };
    let t0 = first
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap();
    windows.push((
        t0,
        first.split_whitespace().nth(2).unwrap().parse().unwrap(),
    ));
    let dev = path_dev(&net, 2);
    let at = |ms: u64| {
        let wait = (t0 + ms).saturating_sub(now_ms());
        std::thread::sleep(Duration::from_millis(wait));
    };
    at(6000);
    sh(&["ip", "-n", &net.a, "link", "set", &dev, "down"]).unwrap();
    let down = now_ms();
    at(16000);
    sh(&["ip", "-n", &net.a, "link", "set", &dev, "up"]).unwrap();
    let up = now_ms();
    let done = collect(&rx, &mut windows, &mut paths).expect("tent run ends");
    assert!(c.wait().unwrap().success());
    let end = windows.last().unwrap().0;
    let before = rate(&windows, t0 + 1000, down);
    let during = rate(&windows, down + 2500, up);
    let after = rate(&windows, up + 1500, end);
    // Recovered: the path back in rotation after the link came up.
    let recovered = paths
        .iter()
        .find(|(t, ep, is_up)| *t >= up && *is_up && ep.starts_with("10.201.2."))
        .map(|(t, _, _)| t - up);
    let left = paths
        .iter()
        .find(|(t, ep, is_up)| *t >= down && !*is_up && ep.starts_with("10.201.2."))
        .map(|(t, _, _)| t - down);

    // A slow path: link 2 shaped to a quarter of link 1's rate both ways.
    for (ns, dev) in [(&net.a, dev.clone()), (&net.b, dev.replace("ta", "tb"))] {
        sh(&[
            "ip", "netns", "exec", ns, "tc", "qdisc", "change", "dev", &dev, "root", "tbf", "rate",
            SLOW_RATE, "burst", "64kb", "latency", "50ms",
        ])
        .unwrap();
    }
    let (mut c, rx) = client(&net, &srv, "tent", "10.201.1.1,10.201.2.1", &srv.name, 6);
    let (mut slow, mut slices) = (Vec::new(), Vec::new());
    let done_slow =
        collect_slices(&rx, &mut slow, &mut Vec::new(), &mut slices).expect("slow run ends");
    assert!(c.wait().unwrap().success());
    let slow_rate = rate(&slow, 0, u64::MAX);
    let count = |prefix: &str| {
        slices
            .iter()
            .filter(|(ep, _)| ep.starts_with(prefix))
            .map(|(_, n)| *n)
            .sum::<u64>() as f64
    };
    let slow_share = count("10.201.2.") / (count("10.201.1.") + count("10.201.2.")).max(1.0);

    let report = format!(
        "classic one link {classic_rate:.1} MB/s | tent both {before:.1} MB/s, one down {during:.1} MB/s ({:.0} %), after {after:.1} MB/s; both/one {:.2}x; out of rotation {left:?} ms after link down, back {recovered:?} ms after link up; {} rounds, {} errors, {} mismatches; link 2 at {SLOW_RATE}: {slow_rate:.1} MB/s, {:.0} % of slices on it",
        100.0 * during / before,
        before / during,
        done[1],
        done[2],
        done[3],
        100.0 * slow_share
    );
    eprintln!("{report}");
    if let Ok(path) = std::env::var("TENT_NETNS_REPORT") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(f, "{report}").unwrap();
    }
    assert_eq!(
        done[2..],
        [0, 0],
        "every round completed with the right bytes"
    );
    // Throughput and recovery time are measured, not asserted: on a
    // loaded machine CPU stalls, not links, can set them (the targets,
    // ≥ 45 %, ≥ 1.8× and 1 s, and the measured numbers are in
    // docs/tent.md). What must hold on any machine: the path left rotation
    // while its link was down and came back once the link was up.
    let recovered = recovered.unwrap_or_else(|| panic!("never recovered: {report}"));
    assert!(recovered <= 10_000, "{report}");
    assert!(left.is_some(), "{report}");
    assert_eq!(done_slow[2..], [0, 0], "slow path: every round right");
    // A link at a quarter of the other's rate must carry the smaller share.
    assert!(
        slow_share < 0.5,
        "the slow path gets fewer slices: {report}"
    );
}
