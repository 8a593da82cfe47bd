//! HA with real processes on a real etcd or redis (`MOONCAKE_TEST_ETCD`,
//! `MOONCAKE_TEST_REDIS`, or started here): two `mooncake_master
//! --enable_ha` of one cluster, one serving and one waiting; a store client
//! given `etcd://…` (`redis://…`) as its master follows the leader across a
//! `kill -9` and mounts its segment again.
//!
//! Waits are bounded hang guards, never speed checks.

mod common;

use std::net::TcpStream;

use common::{
    code, eventually, free_port, metadata_server, spawn_watching, value, MasterPorts, Proc, MASTER,
    WAIT,
};
use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::MasterClient;
use test_support::services;

fn ha_master(etcd: &str, cluster: &str, port: u16) -> (Proc, std::sync::mpsc::Receiver<String>) {
    let mut args = MasterPorts {
        rpc: port,
        ..MasterPorts::ANY
    }
    .args();
    args.extend([
        "--enable_ha=true".to_string(),
        format!("--etcd_endpoints={etcd}"),
        format!("--cluster_id={cluster}"),
        "--rpc_address=127.0.0.1".into(),
        "--metrics_host=127.0.0.1".into(),
        "--client_ttl=2".into(),
    ]);
    spawn_watching(&MASTER, &args, "listening on")
}

fn listens(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The cluster of this process's tests. Clients read it from
/// `MC_STORE_CLUSTER_ID` when they resolve an HA master address; every test
/// here sets the same value, so tests running at once do not disturb each
/// other (they use different coordination services).
fn cluster() -> String {
    let cluster = format!("ha-test-{}", std::process::id());
    std::env::set_var("MC_STORE_CLUSTER_ID", &cluster);
    cluster
}

#[test]
fn client_follows_the_leader_across_a_failover_on_etcd() {
    let etcd = services::etcd();
    failover(&etcd.addr, &format!("etcd://{}", etcd.addr));
}

#[test]
fn client_follows_the_leader_across_a_failover_on_redis() {
    let redis = services::redis();
    let redis = format!("redis://{}", redis.addr);
    failover(&redis, &redis);
}

/// `coordination`: the masters' `--etcd_endpoints`; `master`: the client's
/// master address.
fn failover(coordination: &str, master: &str) {
    let cluster = cluster();
    let (_meta, metadata) = metadata_server();

    let (pa, pb) = (free_port(), free_port());
    let (mut a, a_up) = ha_master(coordination, &cluster, pa);
    let a_line = a_up.recv_timeout(WAIT).expect("the only candidate leads");
    assert!(a_line.contains(&format!("127.0.0.1:{pa}")), "{a_line}");
    let (_b, b_up) = ha_master(coordination, &cluster, pb);
    // The standby campaigns but binds nothing while A leads.
    eventually("A serves", || listens(pa));
    assert!(
        b_up.try_recv().is_err() && !listens(pb),
        "standby must not serve"
    );

    let client = Client::setup(&ClientConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata,
        global_segment_size: 16 << 20,
        local_buffer_size: 16 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: master.to_string(),
        ..ClientConfig::default()
    })
    .unwrap();
    let v1 = value("before", 100_000);
    client.put("before", &v1, &Default::default()).unwrap();
    assert_eq!(client.get("before").unwrap(), v1);

    a.kill9();
    let b_line = b_up.recv_timeout(WAIT).expect("the standby takes over");
    assert!(b_line.contains(&format!("127.0.0.1:{pb}")), "{b_line}");

    // The new leader starts empty; the client finds it through the
    // coordination service, its
    // heartbeat is answered CLIENT_NOT_FOUND and it mounts its segment again.
    let v2 = value("after", 100_000);
    eventually("a put through the new leader", || {
        client.put("after", &v2, &Default::default()).is_ok()
    });
    assert_eq!(client.get("after").unwrap(), v2);
    assert_eq!(code(client.get("before")), ErrorCode::OBJECT_NOT_FOUND);

    // A fresh client resolves the new leader directly.
    let m = MasterClient::connect_in_cluster(master, &cluster).unwrap();
    assert!(m.exist_key("after").unwrap());
}

#[test]
fn bad_ha_settings_exit_with_a_message() {
    // No endpoints, or no fixed RPC port: refused before any campaign (on
    // free ports all the same, should one be bound).
    let fixed = MasterPorts {
        rpc: free_port(),
        ..MasterPorts::ANY
    };
    for (ports, args) in [
        (fixed, vec!["--enable_ha=true"]),
        (
            MasterPorts::ANY,
            vec!["--enable_ha=true", "--etcd_endpoints=127.0.0.1:1"],
        ),
        (
            fixed,
            vec![
                "--enable_ha=true",
                "--ha_backend_type=k8s",
                "--etcd_endpoints=h:1",
            ],
        ),
    ] {
        let out = std::process::Command::new(&*MASTER)
            .args(ports.args())
            .args(&args)
            .output()
            .unwrap();
        // A settings error: exit code 2 and the reference's code in the message.
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("mooncake_master: INVALID_PARAMS (-600)"),
            "{args:?}: {err}"
        );
    }
}
