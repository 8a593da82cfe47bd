//! Copy and move tasks against real processes: `mooncake_master`, a
//! `mooncake_http_metadata_server` and three storage nodes run as
//! `mooncake_client` processes, which execute the tasks; an in-test pure
//! client creates and follows them. Every wait is bounded.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::{ReplicaKind, ReplicateConfig, TaskId, TaskStatus, TaskType};

const MASTER: &str = env!("CARGO_BIN_EXE_mooncake_master");
const METADATA: &str = env!("CARGO_BIN_EXE_mooncake_http_metadata_server");
const STORAGE: &str = env!("CARGO_BIN_EXE_mooncake_client");
const WAIT: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed (by pid) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `bin` and returns it with the first stdout line containing `marker`.
fn spawn_until_line(bin: &str, args: &[String], marker: &str) -> (Proc, String) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let proc = Proc(child);
    let (tx, rx) = mpsc::channel();
    let wanted = marker.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if line.contains(&wanted) {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("{bin} printed no {marker:?} line"));
    (proc, line)
}

/// Polls `cond` until it holds (bounded; no timing is asserted).
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Cluster {
    master_addr: String,
    metadata: String,
    _procs: Vec<Proc>,
}

struct Storage {
    proc: Proc,
    segment: String,
    dummy_addr: String,
}

impl Cluster {
    fn start() -> Cluster {
        let mport = free_port();
        let (meta, line) = spawn_until_line(
            METADATA,
            &["-port=0".into(), "--host=127.0.0.1".into()],
            "listening on",
        );
        let meta_addr = line.trim().rsplit(' ').next().unwrap().to_owned();
        let master = Proc(
            Command::new(MASTER)
                .args([
                    format!("--rpc_port={mport}"),
                    "--rpc_address=127.0.0.1".into(),
                    "--metrics_host=127.0.0.1".into(),
                    "--metrics_port=0".into(),
                    "--client_ttl=2".into(),
                    "--default_kv_lease_ttl=50".into(),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        eventually("master listens", || {
            TcpStream::connect(("127.0.0.1", mport)).is_ok()
        });
        Cluster {
            master_addr: format!("127.0.0.1:{mport}"),
            metadata: format!("http://{meta_addr}/metadata"),
            _procs: vec![meta, master],
        }
    }

    fn storage(&self) -> Storage {
        let args = vec![
            format!("--master_server_address={}", self.master_addr),
            format!("--metadata_server={}", self.metadata),
            "--host=127.0.0.1".into(),
            "--port=0".into(),
            "--global_segment_size=16MB".into(),
        ];
        let (proc, line) = spawn_until_line(STORAGE, &args, "mooncake_client ready");
        // "mooncake_client ready: dummy clients connect to ADDR; segment NAME (SIZE)"
        let after = |tag: &str, end: char| {
            let rest = line.split(tag).nth(1).unwrap();
            rest.split(end).next().unwrap().to_owned()
        };
        Storage {
            dummy_addr: after("connect to ", ';'),
            segment: after("segment ", ' '),
            proc,
        }
    }

    fn pure_client(&self) -> Client {
        Client::setup(&ClientConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: self.metadata.clone(),
            global_segment_size: 0,
            local_buffer_size: 32 << 20,
            protocol: "tcp".into(),
            device_name: String::new(),
            master_server_address: self.master_addr.clone(),
        })
        .unwrap()
    }
}

fn value(key: &str, len: usize) -> Vec<u8> {
    let seed = key
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

fn code<T: std::fmt::Debug>(r: mooncake_common::Result<T>) -> ErrorCode {
    r.expect_err("expected an error").code
}

fn segments_of(client: &Client, key: &str) -> Vec<String> {
    let mut v: Vec<String> = client
        .get_replica_desc(key)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.kind {
            ReplicaKind::Memory(m) => Some(m.segment_name),
            ReplicaKind::Disk(_) => None,
        })
        .collect();
    v.sort();
    v
}

fn sorted(names: &[&String]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

fn pinned_to(segment: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segment: segment.to_owned(),
        ..Default::default()
    }
}

/// Waits until the task has finished and returns its final status.
fn finished(client: &Client, id: TaskId) -> (TaskStatus, String) {
    let mut last = None;
    eventually("task finishes", || {
        let info = client.query_task(id).unwrap();
        assert_eq!(info.id, id);
        let done = matches!(info.status, TaskStatus::Success | TaskStatus::Failed);
        last = Some((info.status, info.message));
        done
    });
    last.unwrap()
}

#[test]
fn copy_and_move_tasks_run_on_the_target_node() {
    let cluster = Cluster::start();
    let mut a = cluster.storage();
    let mut b = cluster.storage();
    let c = cluster.storage();
    let client = cluster.pure_client();

    // Copy onto two segments: B reads from A, then writes C from its copy.
    let big = value("big", 3 << 20);
    client.put("big", &big, &pinned_to(&a.segment)).unwrap();
    let targets = vec![b.segment.clone(), c.segment.clone()];
    let id = client.create_copy_task("big", &targets).unwrap();
    let info = client.query_task(id).unwrap();
    assert_eq!(info.task_type, TaskType::ReplicaCopy);
    assert!(info.created_at_ms_epoch > 0);
    assert_eq!(finished(&client, id), (TaskStatus::Success, String::new()));
    assert_eq!(
        segments_of(&client, "big"),
        sorted(&[&a.segment, &b.segment, &c.segment])
    );
    assert_eq!(client.get("big").unwrap(), big);

    // Move A -> B: the source replica goes.
    let moved = value("moved", 1 << 20);
    client.put("moved", &moved, &pinned_to(&a.segment)).unwrap();
    let id = client
        .create_move_task("moved", &a.segment, &b.segment)
        .unwrap();
    assert_eq!(
        client.query_task(id).unwrap().task_type,
        TaskType::ReplicaMove
    );
    assert_eq!(finished(&client, id).0, TaskStatus::Success);
    assert_eq!(segments_of(&client, "moved"), vec![b.segment.clone()]);
    assert_eq!(client.get("moved").unwrap(), moved);

    // Copying onto a segment that already holds a replica is a no-op.
    let id = client
        .create_copy_task("moved", std::slice::from_ref(&b.segment))
        .unwrap();
    assert_eq!(finished(&client, id).0, TaskStatus::Success);
    assert_eq!(segments_of(&client, "moved"), vec![b.segment.clone()]);

    // Through a dummy client of C: C reads B's replica.
    let dummy = Client::setup_dummy(1 << 20, 4 << 20, &c.dummy_addr).unwrap();
    let id = dummy
        .create_copy_task("moved", std::slice::from_ref(&c.segment))
        .unwrap();
    assert_eq!(finished(&dummy, id).0, TaskStatus::Success);
    assert_eq!(
        segments_of(&client, "moved"),
        sorted(&[&b.segment, &c.segment])
    );
    assert_eq!(
        code(dummy.query_task(12345)),
        ErrorCode::TASK_NOT_FOUND,
        "dummy answers errors with their codes"
    );
    drop(dummy);

    // Errors.
    assert_eq!(
        code(client.create_copy_task("missing", std::slice::from_ref(&b.segment))),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(client.create_copy_task("big", &["nosuch:1".to_string()])),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(client.create_copy_task("big", &[])),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(client.create_move_task("big", &a.segment, "nosuch:1")),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(client.create_move_task("missing", &a.segment, &b.segment)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(client.create_move_task("moved", &a.segment, &c.segment)),
        ErrorCode::REPLICA_NOT_FOUND,
        "A holds no replica of `moved` any more"
    );
    assert_eq!(code(client.query_task(0)), ErrorCode::TASK_NOT_FOUND);
    assert_eq!(
        code(client.query_task(u128::MAX)),
        ErrorCode::TASK_NOT_FOUND
    );

    // Each copy holds the bytes: drop the nodes one by one and read what is left.
    a.proc.kill();
    eventually("A's replicas go", || {
        segments_of(&client, "big") == sorted(&[&b.segment, &c.segment])
    });
    assert_eq!(client.get("big").unwrap(), big);
    b.proc.kill();
    eventually("B's replicas go", || {
        segments_of(&client, "big") == vec![c.segment.clone()]
    });
    assert_eq!(
        client.get("big").unwrap(),
        big,
        "C's copy, written from B's"
    );
    assert_eq!(client.get("moved").unwrap(), moved, "C's copy, read from B");
}

#[test]
fn batch_replica_clear_drops_expired_replicas() {
    let cluster = Cluster::start();
    let a = cluster.storage();
    let b = cluster.storage();
    let client = cluster.pure_client();
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    client.put("c1", b"one", &two).unwrap();
    client.put("c2", b"two", &two).unwrap();
    let keys = vec!["c1".to_string(), "c2".to_string(), "missing".to_string()];
    // Only replicas whose lease has expired are cleared.
    let mut cleared = Vec::new();
    eventually("A's replica of c1 is cleared", || {
        cleared = client.batch_replica_clear(&keys[..1], &a.segment).unwrap();
        !cleared.is_empty()
    });
    assert_eq!(cleared, ["c1"]);
    assert_eq!(segments_of(&client, "c1"), vec![b.segment.clone()]);
    // An empty segment name clears every replica (the object goes).
    let mut all = Vec::new();
    eventually("c1 and c2 are cleared", || {
        all.extend(client.batch_replica_clear(&keys, "").unwrap());
        all.len() >= 2
    });
    all.sort();
    assert_eq!(all, ["c1", "c2"]);
    assert!(!client.is_exist("c1").unwrap());
    assert!(!client.is_exist("c2").unwrap());
    assert_eq!(
        client.batch_replica_clear(&keys, "nosuch:1").unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn a_copy_that_does_not_fit_fails_and_changes_nothing() {
    let cluster = Cluster::start();
    let a = cluster.storage();
    let b = cluster.storage();
    let client = cluster.pure_client();
    // Hard-pinned so eviction cannot make room on B.
    let on = |segment: &str| ReplicateConfig {
        with_hard_pin: true,
        ..pinned_to(segment)
    };
    let x = value("x", 10 << 20);
    client.put("x", &x, &on(&a.segment)).unwrap();
    client
        .put("y", &value("y", 10 << 20), &on(&b.segment))
        .unwrap();
    let id = client
        .create_copy_task("x", std::slice::from_ref(&b.segment))
        .unwrap();
    let (status, message) = finished(&client, id);
    assert_eq!(status, TaskStatus::Failed);
    assert!(!message.is_empty(), "a failed task says why");
    assert_eq!(segments_of(&client, "x"), vec![a.segment.clone()]);
    // Once B has room the same copy goes through.
    client.remove("y", true).unwrap();
    let id = client
        .create_copy_task("x", std::slice::from_ref(&b.segment))
        .unwrap();
    assert_eq!(finished(&client, id).0, TaskStatus::Success);
    assert_eq!(segments_of(&client, "x"), sorted(&[&a.segment, &b.segment]));
    assert_eq!(client.get("x").unwrap(), x);
}
