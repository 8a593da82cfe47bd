//! `p2p-store-example` as separate processes against a real etcd: a
//! trainer and inferencers on loopback, each with its own engine. Every
//! inferencer checks every byte it received against the trainer's pattern.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mooncake_p2p_store::{Catalog, EtcdCatalog};
use test_support::process::{spawn_watching, Proc, WAIT};
use test_support::services;

const BIN: &str = env!("CARGO_BIN_EXE_p2p-store-example");
/// Bound on a whole transfer on a loaded machine: a hang guard only.
const TRANSFER_WAIT: Duration = Duration::from_secs(180);

fn unique(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("proc-{}-{nanos}/{what}", std::process::id())
}

struct Node {
    proc: Proc,
    lines: Receiver<String>,
    name: String,
}

impl Node {
    fn start(etcd: &str, cmd: &str, object: &str, size_mb: u64, extra: &[&str]) -> Node {
        let name = format!("127.0.0.1:{}", services::free_port());
        let mut args: Vec<String> = vec![
            format!("--cmd={cmd}"),
            format!("--metadata_server={etcd}"),
            format!("--local_server_name={name}"),
            format!("--name={object}"),
            format!("--file_size_mb={size_mb}"),
            "--shard_size_mb=4".into(),
            "--idle_seconds=600".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        // An empty marker: every stdout line comes back.
        let (proc, lines) = spawn_watching(BIN, &args, "");
        Node { proc, lines, name }
    }

    /// Lines until one containing `marker` (which is returned); panics on
    /// exit or after `limit`.
    fn until(&self, marker: &str, limit: Duration) -> (String, Vec<String>) {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(marker) => return (line, seen),
                Ok(line) => seen.push(line),
                Err(_) => panic!(
                    "{} printed no {marker:?} line; it printed {seen:?}",
                    self.name
                ),
            }
        }
    }

    /// Waits for a clean exit after `ALL DONE`; returns what it reported.
    fn finish(mut self) -> Report {
        let (_, lines) = self.until("ALL DONE", TRANSFER_WAIT);
        let status = self.proc.0.wait().unwrap();
        assert!(status.success(), "{} exited {status}: {lines:?}", self.name);
        Report::parse(&self.name, &lines)
    }
}

#[derive(Debug)]
struct Report {
    bytes_from: BTreeMap<String, u64>,
    failed_holders: Vec<String>,
}

impl Report {
    fn parse(node: &str, lines: &[String]) -> Report {
        let find = |prefix: &str| {
            lines
                .iter()
                .find_map(|l| l.strip_prefix(prefix))
                .unwrap_or_else(|| panic!("{node}: no {prefix:?} line in {lines:?}"))
                .to_string()
        };
        assert!(
            lines.iter().any(|l| l.starts_with("verified ")),
            "{node}: {lines:?}"
        );
        let bytes_from = find("bytes_from")
            .split_whitespace()
            .map(|kv| {
                let (k, v) = kv.rsplit_once('=').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect();
        let failed_holders = find("failed_holders")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        Report {
            bytes_from,
            failed_holders,
        }
    }
}

#[test]
fn three_consumers_end_with_the_publishers_bytes() {
    let etcd = services::etcd();
    let object = unique("model");
    let size_mb = 96;
    let trainer = Node::start(&etcd.addr, "trainer", &object, size_mb, &[]);
    trainer.until("Object registration done", WAIT);

    let consumers: Vec<Node> = (0..3)
        .map(|_| {
            Node::start(
                &etcd.addr,
                "inferencer",
                &object,
                size_mb,
                &["--hold_seconds=2"],
            )
        })
        .collect();
    let mut from_publisher = 0;
    for c in consumers {
        let r = c.finish();
        assert_eq!(r.bytes_from.values().sum::<u64>(), size_mb << 20, "{r:?}");
        from_publisher += r.bytes_from.get(&trainer.name).copied().unwrap_or(0);
    }
    // The consumers read from each other: the publisher sent each shard
    // about once (a claim that expired or a race at a claim's end may
    // double one; three copies is what reading all from it would cost).
    eprintln!(
        "the publisher sent {:.2} copies of the object to 3 consumers",
        from_publisher as f64 / (size_mb << 20) as f64
    );
    assert!(
        from_publisher >= size_mb << 20,
        "a shard never came from the publisher"
    );
    assert!(
        from_publisher < 2 * (size_mb << 20),
        "the publisher sent {from_publisher} bytes"
    );
}

#[test]
fn a_holder_killed_mid_transfer_does_not_stop_the_others() {
    let etcd = services::etcd();
    let catalog = EtcdCatalog::connect(&etcd.addr).unwrap();
    let object = unique("model");
    let size_mb = 256;
    let shards = (size_mb / 4) as usize;
    let trainer = Node::start(&etcd.addr, "trainer", &object, size_mb, &[]);
    trainer.until("Object registration done", WAIT);

    // A holds every shard and serves them until it is killed.
    let mut a = Node::start(
        &etcd.addr,
        "inferencer",
        &object,
        size_mb,
        &["--hold_seconds=600"],
    );
    a.until("serving", TRANSFER_WAIT);

    // B, C, D prefer A's copy (a consumer's) to the publisher's.
    let others: Vec<Node> = (0..3)
        .map(|_| {
            Node::start(
                &etcd.addr,
                "inferencer",
                &object,
                size_mb,
                &["--parallel=2"],
            )
        })
        .collect();
    let names: BTreeSet<String> = others.iter().map(|n| n.name.clone()).collect();
    // Kill A once the others are under way and none is half done.
    let deadline = Instant::now() + TRANSFER_WAIT;
    loop {
        let (record, _) = catalog.get(&object).unwrap().unwrap();
        let held: Vec<usize> = names
            .iter()
            .map(|n| {
                record
                    .shards
                    .iter()
                    .filter(|s| s.replica_list.iter().any(|l| &l.segment_name == n))
                    .count()
            })
            .collect();
        if held.iter().sum::<usize>() > 0 {
            assert!(
                held.iter().all(|&h| h < shards / 2),
                "the consumers went too far before the kill: {held:?} of {shards}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the consumers never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    a.proc.kill9();

    let mut failed = BTreeSet::new();
    for n in others {
        let r = n.finish();
        assert_eq!(r.bytes_from.values().sum::<u64>(), size_mb << 20, "{r:?}");
        failed.extend(r.failed_holders);
    }
    assert!(
        failed.contains(&a.name),
        "no consumer ever tried the killed holder: {failed:?}"
    );
}
