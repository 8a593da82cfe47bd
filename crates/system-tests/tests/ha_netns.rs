//! Replicated HA with every process on an address of its own: network
//! namespaces created here (`ip netns add`), joined by veth pairs to a
//! bridge. A coordination host runs etcd, three master hosts run
//! `mooncake_master --enable_ha --enable_oplog`, a storage host runs
//! `mooncake_client` (in a PID namespace of its own too, so its transfer
//! engine counts as another machine and serves over TCP, never shared
//! memory); the test process is the client, on the bridge's address.
//!
//! The leader's link is then cut (no reset, no close: its packets are
//! dropped): a standby takes over, every acknowledged put reads back
//! byte-exact, and the old leader, once its lease is gone, gives up. The
//! storage host's link is cut too: reads of its objects stop, which shows
//! the bytes travel over that link.
//!
//! Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), `ip`, `unshare` and
//! `etcd`; without them the test says so and passes as skipped. Waits are
//! bounded hang guards, never speed checks.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{eventually, metadata_server_on, value, MasterPorts, Proc, MASTER, STORAGE};
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::ReplicaPolicy;

/// What this machine must allow; `Err` says why the test cannot run.
fn permitted() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root: network namespaces need CAP_NET_ADMIN".into());
    }
    for tool in ["ip", "unshare", "etcd"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Err(format!("{tool} is not installed"));
        }
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The namespaces, the bridge and the veth pairs; all removed on drop.
struct Net {
    tag: String,
    subnet: String,
    hosts: Vec<String>,
}

impl Net {
    /// A bridge on `10.213.<n>.1/24` and one namespace per host name, the
    /// `i`-th at `10.213.<n>.<10 + i>`.
    fn build(names: &[&str]) -> Result<Net, String> {
        let pid = std::process::id();
        let tag = format!("mc{}", pid % 100_000);
        let mut net = Net {
            subnet: format!("10.213.{}", pid % 250),
            hosts: Vec::new(),
            tag,
        };
        let bridge = net.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", net.subnet),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{}-{name}", net.tag);
            ip(&["netns", "add", &ns])?;
            net.hosts.push(ns.clone());
            let (outside, inside) = (net.port(i), format!("{}p{i}", net.tag));
            ip(&[
                "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ])?;
            ip(&["link", "set", &inside, "netns", &ns])?;
            ip(&["link", "set", &outside, "master", &bridge])?;
            ip(&["link", "set", &outside, "up"])?;
            let addr = format!("{}/24", net.addr(i));
            ip(&[
                "netns", "exec", &ns, "ip", "addr", "add", &addr, "dev", &inside,
            ])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", &inside, "up"])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn bridge(&self) -> String {
        format!("{}b", self.tag)
    }

    /// The bridge-side end of host `i`'s link.
    fn port(&self, i: usize) -> String {
        format!("{}v{i}", self.tag)
    }

    fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.subnet, 10 + i)
    }

    /// The test process's own address (the bridge's).
    fn own_addr(&self) -> String {
        format!("{}.1", self.subnet)
    }

    /// Cuts (`false`) or restores host `i`'s link: its packets are dropped,
    /// no connection is reset.
    fn link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &self.port(i), state]).unwrap();
    }

    /// Runs `bin args` on host `i` (with `own_pids`: in a PID namespace of
    /// its own as well, killed with the `unshare` that holds it).
    fn spawn(&self, i: usize, own_pids: bool, bin: &str, args: &[String], log: &str) -> Proc {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hosts[i]]);
        if own_pids {
            cmd.args(["unshare", "--pid", "--fork", "--kill-child=SIGKILL"]);
        }
        let log = std::fs::File::create(log).unwrap();
        cmd.arg(bin).args(args).stdout(Stdio::null()).stderr(log);
        Proc(cmd.spawn().unwrap())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and so the pairs.
        for ns in &self.hosts {
            let _ = ip(&["netns", "delete", ns]);
        }
        let _ = ip(&["link", "delete", &self.bridge()]);
    }
}

/// One HTTP GET to `addr`; `None` while it does not answer.
fn http_get(addr: &str, path: &str) -> Option<String> {
    let sock = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    Some(resp.split_once("\r\n\r\n")?.1.to_string())
}

#[test]
fn a_leader_cut_off_on_its_own_host_is_replaced_and_nothing_acknowledged_is_lost() {
    if let Err(why) = permitted() {
        println!("skipped: {why}");
        return;
    }
    let (coord, masters, storage) = (0, [1, 2, 3], 4);
    let net = match Net::build(&["coord", "m0", "m1", "m2", "storage"]) {
        Ok(n) => n,
        Err(why) => {
            println!("skipped: network namespaces not permitted here: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let log = |name: &str| dir.path().join(name).display().to_string();
    let etcd_addr = format!("{}:2379", net.addr(coord));
    let _etcd = net.spawn(
        coord,
        false,
        "etcd",
        &[
            format!("--data-dir={}", dir.path().join("etcd").display()),
            format!("--listen-client-urls=http://{etcd_addr}"),
            format!("--advertise-client-urls=http://{etcd_addr}"),
            "--name=coord".into(),
            format!("--listen-peer-urls=http://{}:2380", net.addr(coord)),
            format!(
                "--initial-advertise-peer-urls=http://{}:2380",
                net.addr(coord)
            ),
            format!("--initial-cluster=coord=http://{}:2380", net.addr(coord)),
        ],
        &log("etcd.log"),
    );
    eventually("etcd answers", || {
        TcpStream::connect_timeout(&etcd_addr.parse().unwrap(), Duration::from_millis(200)).is_ok()
    });
    // The transfer-engine metadata lives with the test process.
    let (_meta, metadata) = metadata_server_on(&net.own_addr());

    let master = |i: usize| {
        let host = net.addr(i);
        // The deployment's own ports: each master is alone in its network
        // namespace, so they collide with nothing on this machine.
        let mut args = MasterPorts {
            rpc: 50051,
            metrics: 9003,
            ..MasterPorts::ANY
        }
        .args();
        args.extend([
            "--enable_ha=true".to_string(),
            "--enable_oplog=true".into(),
            format!("--etcd_endpoints={etcd_addr}"),
            format!("--rpc_address={host}"),
            format!("--metrics_host={host}"),
            // Longer than the storage host is cut off below: it must not expire.
            "--client_ttl=300".into(),
            "--oplog_poll_interval_ms=200".into(),
        ]);
        net.spawn(i, false, &MASTER, &args, &log(&format!("master-{i}.log")))
    };
    let role = |i: usize| http_get(&format!("{}:9003", net.addr(i)), "/role");
    let mut procs: Vec<Proc> = Vec::new();
    for (n, &i) in masters.iter().enumerate() {
        procs.push(master(i));
        if n == 0 {
            eventually("the first master leads", || {
                role(i).as_deref() == Some("leader")
            });
        }
    }
    let in_sync = |i: usize| {
        http_get(&format!("{}:9003", net.addr(i)), "/replication")
            .and_then(|b| {
                let list = b
                    .split("\"in_sync\":[")
                    .nth(1)?
                    .split(']')
                    .next()?
                    .to_string();
                Some(list.matches('#').count())
            })
            .unwrap_or(0)
    };
    let leader = masters[0];
    eventually("both standbys in sync", || in_sync(leader) == 2);

    let master_addr = format!("etcd://{etcd_addr}");
    let _storage = net.spawn(
        storage,
        true,
        &STORAGE,
        &[
            format!("--master_server_address={master_addr}"),
            format!("--metadata_server={metadata}"),
            format!("--host={}", net.addr(storage)),
            "--port=0".into(),
            "--global_segment_size=64MB".into(),
        ],
        &log("storage.log"),
    );
    let client = Client::setup(&ClientConfig {
        local_hostname: net.own_addr(),
        metadata_server: metadata.clone(),
        global_segment_size: 0,
        local_buffer_size: 32 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: master_addr.clone(),
        ..ClientConfig::default()
    })
    .unwrap();
    let cfg = ReplicaPolicy::default();
    let key = |i: usize| format!("netns-{i}");
    // The storage host's segment is mounted once a put finds room.
    eventually("the storage host's segment takes puts", || {
        client.put(&key(0), &value(&key(0), 8192), &cfg).is_ok()
    });
    for i in 1..50 {
        client.put(&key(i), &value(&key(i), 8192), &cfg).unwrap();
    }

    // The leader's host drops off the network.
    net.link(leader, false);
    let next = {
        let mut found = None;
        eventually("a standby on another host takes over", || {
            found = masters[1..]
                .iter()
                .copied()
                .find(|&i| role(i).as_deref() == Some("leader"));
            found.is_some()
        });
        found.unwrap()
    };
    eventually("puts through the new leader", || {
        client.put("after", &value("after", 8192), &cfg).is_ok()
    });
    for i in 0..50 {
        assert_eq!(
            client.get(&key(i)).unwrap(),
            value(&key(i), 8192),
            "{}",
            key(i)
        );
    }
    // The old leader lost its lease without hearing from anyone: it gives
    // up and exits rather than serve on.
    eventually("the cut-off leader exits", || {
        procs[0].0.try_wait().unwrap().is_some()
    });
    let status = procs[0].0.try_wait().unwrap().unwrap();
    assert!(!status.success(), "a deposed leader exits with an error");
    net.link(leader, true);

    // The bytes cross the storage host's link: cut it and reads stop.
    net.link(storage, false);
    assert!(
        client.get(&key(7)).is_err(),
        "read with the storage host cut off"
    );
    net.link(storage, true);
    eventually("reads come back with the link", || {
        client.get(&key(7)).is_ok_and(|v| v == value(&key(7), 8192))
    });
    println!(
        "netns: master on {} took over from {}; 50 puts kept",
        net.addr(next),
        net.addr(leader)
    );
}
