//! Leader election against a real redis (`MOONCAKE_TEST_REDIS`, or one
//! started here). Each test uses a cluster id of its own.
//!
//! Waits are bounded hang guards, never speed checks; "still waiting"
//! checks can only pass wrongly, never fail wrongly.

mod support;

use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_store::ha::redis::{leader_key, RedisElection};
use mooncake_store::ha::LeaderElection;
use mooncake_transfer::metadata::redis::RedisOptions;
use test_support::ports::MASTER_ANY_PORTS;
use test_support::{services, FreezeProxy};

/// Key expiry for tests: short so failover tests are quick.
const TTL: Duration = Duration::from_secs(2);
/// Hang guard for anything that must happen eventually.
const GUARD: Duration = Duration::from_secs(30);

fn cluster(name: &str) -> String {
    format!(
        "test-{}-{}-{name}",
        std::process::id(),
        rand::random::<u32>()
    )
}

async fn election(redis: &services::Service, cluster_id: &str) -> RedisElection {
    RedisElection::connect_with(&redis.addr, &RedisOptions::default(), cluster_id, TTL)
        .await
        .unwrap()
}

fn raw(redis: &services::Service) -> redis::Connection {
    redis::Client::open(format!("redis://{}", redis.addr))
        .unwrap()
        .get_connection()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_handover_on_resign() {
    let redis = services::redis();
    let id = cluster("handover");
    let (a, b) = (election(&redis, &id).await, election(&redis, &id).await);
    assert_eq!(a.leader().await.unwrap(), None);

    let la = a.campaign("10.0.0.1:50051").await.unwrap();
    let term_a = la.term();
    assert!(la.is_held());
    assert_eq!(b.leader().await.unwrap().as_deref(), Some("10.0.0.1:50051"));
    let found = b.leader_with_term().await.unwrap().unwrap();
    assert_eq!(found.address, "10.0.0.1:50051");
    assert_eq!(found.term, la.term(), "the lookup reads the winner's term");

    let b2 = b.clone();
    let mut b_campaign = tokio::spawn(async move { b2.campaign("10.0.0.2:50051").await });
    assert!(
        tokio::time::timeout(Duration::from_millis(700), &mut b_campaign)
            .await
            .is_err()
    );
    assert_eq!(a.leader().await.unwrap().as_deref(), Some("10.0.0.1:50051"));

    la.resign().await.unwrap();
    let lb = tokio::time::timeout(GUARD, b_campaign)
        .await
        .expect("b never won")
        .unwrap()
        .unwrap();
    assert_eq!(a.leader().await.unwrap().as_deref(), Some("10.0.0.2:50051"));
    let found = a.leader_with_term().await.unwrap().unwrap();
    assert_eq!(found.term, lb.term());
    assert!(lb.term() > term_a, "the next leader's term is higher");
    lb.resign().await.unwrap();
    assert_eq!(a.leader().await.unwrap(), None);
    assert_eq!(a.leader_with_term().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_see_every_change() {
    let redis = services::redis();
    let id = cluster("observe");
    let (a, watcher) = (election(&redis, &id).await, election(&redis, &id).await);
    let mut rx = watcher.observe().await.unwrap();
    assert_eq!(*rx.borrow(), None);
    let la = a.campaign("a:1").await.unwrap();
    tokio::time::timeout(GUARD, rx.wait_for(|l| l.as_deref() == Some("a:1")))
        .await
        .unwrap()
        .unwrap();
    drop(la);
    tokio::time::timeout(GUARD, rx.wait_for(|l| l.is_none()))
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_is_lost_when_the_key_goes_or_changes_hands() {
    let redis = services::redis();
    let id = cluster("lost");
    let a = election(&redis, &id).await;
    let mut conn = raw(&redis);

    let mut la = a.campaign("a:1").await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(leader_key(&id))
        .query(&mut conn)
        .unwrap();
    tokio::time::timeout(GUARD, la.lost())
        .await
        .expect("deletion never noticed");
    assert!(!la.is_held());

    let mut la = a.campaign("a:1").await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(leader_key(&id))
        .arg("usurper:9")
        .query(&mut conn)
        .unwrap();
    tokio::time::timeout(GUARD, la.lost())
        .await
        .expect("takeover never noticed");
    // Giving up must not delete the new holder's key.
    la.resign().await.ok();
    assert_eq!(a.leader().await.unwrap().as_deref(), Some("usurper:9"));
    let _: () = redis::cmd("DEL")
        .arg(leader_key(&id))
        .query(&mut conn)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_leader_is_replaced_after_its_key_expires() {
    let redis = services::redis();
    let id = cluster("crash");
    let (addr, cid) = (redis.addr.clone(), id.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let la = rt.block_on(async {
            let a = RedisElection::connect_with(&addr, &RedisOptions::default(), &cid, TTL)
                .await
                .unwrap();
            a.campaign("crasher:1").await.unwrap()
        });
        drop(rt); // renewals stop, no resign: a crash
        std::mem::forget(la);
    })
    .join()
    .unwrap();

    let b = election(&redis, &id).await;
    let lb = tokio::time::timeout(GUARD, b.campaign("b:2"))
        .await
        .expect("no failover")
        .unwrap();
    assert_eq!(b.leader().await.unwrap().as_deref(), Some("b:2"));
    lb.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_outlives_several_ttls() {
    let redis = services::redis();
    let id = cluster("renewal");
    let a = election(&redis, &id).await;
    let la = a.campaign("a:1").await.unwrap();
    tokio::time::sleep(TTL * 3).await;
    assert!(la.is_held());
    assert_eq!(a.leader().await.unwrap().as_deref(), Some("a:1"));
    la.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_and_db_index() {
    let redis = services::start_redis(&["--requirepass", "pw"]);
    let id = cluster("auth");
    let opts = RedisOptions {
        password: Some("pw".into()),
        db: Some(4),
    };
    let a = RedisElection::connect_with(&redis.addr, &opts, &id, TTL)
        .await
        .unwrap();
    let la = a.campaign("a:1").await.unwrap();
    let mut db4 = redis::Client::open(format!("redis://:pw@{}/4", redis.addr))
        .unwrap()
        .get_connection()
        .unwrap();
    let v: Option<String> = redis::cmd("GET")
        .arg(leader_key(&id))
        .query(&mut db4)
        .unwrap();
    assert_eq!(v.as_deref(), Some("a:1"));
    la.resign().await.unwrap();

    let e = RedisElection::connect_with(&redis.addr, &RedisOptions::default(), &id, TTL)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code, ErrorCode::ETCD_OPERATION_ERROR);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_redis_gives_up_before_another_can_win() {
    let redis = services::redis();
    let id = cluster("partition");
    let proxy = FreezeProxy::start(&redis.addr);
    let a = RedisElection::connect_with(&proxy.addr, &RedisOptions::default(), &id, TTL)
        .await
        .unwrap();
    let b = election(&redis, &id).await;
    support::partitioned_leader_gives_up(&a, &b, &proxy, GUARD).await;
}

/// An HA master (`serve_ha`) on the current runtime, electing through the
/// redis at `redis_addr`, serving RPC on loopback `port`.
struct HaMaster {
    task: tokio::task::JoinHandle<mooncake_common::Result<()>>,
    /// The RPC address of each term it starts as leader.
    terms: tokio::sync::mpsc::UnboundedReceiver<std::net::SocketAddr>,
    /// Send to shut it down (as SIGTERM does).
    stop: tokio::sync::oneshot::Sender<()>,
}

fn spawn_ha_master(redis_addr: &str, cluster_id: &str, port: u16) -> HaMaster {
    use mooncake_store::master::{ha::serve_ha, MasterConfig};

    let mut config = MasterConfig::from_settings(MASTER_ANY_PORTS).unwrap();
    for (k, v) in [
        ("enable_ha", "true".to_string()),
        ("etcd_endpoints", format!("redis://{redis_addr}")),
        ("cluster_id", cluster_id.to_string()),
        ("rpc_port", port.to_string()),
        ("rpc_address", "127.0.0.1".into()),
        ("metrics_host", "127.0.0.1".into()),
    ] {
        config.set(k, &v).unwrap();
    }
    let (terms_tx, terms) = tokio::sync::mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_ha(
        config,
        async {
            let _ = stopped.await;
        },
        move |s| {
            let _ = terms_tx.send(s.rpc_addr());
        },
    ));
    HaMaster { task, terms, stop }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_keeps_campaigning_through_a_redis_outage() {
    let redis = services::redis();
    let proxy = FreezeProxy::start(&redis.addr);
    let port = services::free_port();
    let HaMaster {
        task: mut master,
        mut terms,
        stop,
    } = spawn_ha_master(&proxy.addr, &cluster("outage"), port);
    tokio::time::timeout(GUARD, terms.recv())
        .await
        .expect("the only candidate leads");

    // Redis out of reach: the leader gives up; its campaigns then fail
    // (commands time out) for a while. It must keep trying, not exit.
    proxy.freeze();
    let listens = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    tokio::time::timeout(GUARD, async {
        while listens() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a leader cut off from redis never stopped serving");
    // Long enough for campaign commands to time out (a pause, not a check).
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        !master.is_finished(),
        "the master gave up: {:?}",
        (&mut master).await
    );

    proxy.thaw();
    tokio::time::timeout(GUARD, terms.recv())
        .await
        .expect("never led again once redis was back")
        .unwrap();
    assert!(listens());
    stop.send(()).unwrap();
    tokio::time::timeout(GUARD, master)
        .await
        .expect("shutdown hung")
        .unwrap()
        .unwrap();
}

#[test]
fn clients_without_a_leader_fail_with_rpc_fail_and_do_not_storm_redis() {
    use mooncake_store::master::{MasterConfig, MasterHandle};
    use mooncake_store::MasterClient;

    let id = cluster("client");
    let redis = services::start_redis(&[]);
    let proxy = FreezeProxy::start(&redis.addr);
    let config = MasterConfig::from_settings(
        MASTER_ANY_PORTS
            .into_iter()
            .chain([("rpc_address", "127.0.0.1"), ("metrics_host", "127.0.0.1")]),
    )
    .unwrap();
    let master = MasterHandle::spawn(config).unwrap();
    // Published as a leader would be.
    let _: () = redis::cmd("SET")
        .arg(leader_key(&id))
        .arg(master.rpc_addr().to_string())
        .query(&mut raw(&redis))
        .unwrap();
    let client = MasterClient::connect_in_cluster(&format!("redis://{}", proxy.addr), &id).unwrap();
    assert!(!client.exist_key("k").unwrap());

    // The leader is gone and none follows: every call fails, with RPC_FAIL,
    // without a lookup (a connection to redis) per call.
    master.stop().unwrap();
    let _: () = redis::cmd("DEL")
        .arg(leader_key(&id))
        .query(&mut raw(&redis))
        .unwrap();
    let before = proxy.connections();
    const CALLS: usize = 20;
    for _ in 0..CALLS {
        assert_eq!(client.exist_key("k").unwrap_err().code, ErrorCode::RPC_FAIL);
    }
    let lookups = proxy.connections() - before;
    assert!(lookups < CALLS / 2, "{lookups} lookups for {CALLS} calls");

    // Redis itself gone: still RPC_FAIL (a transport failure to the
    // caller), not the coordination service's own code.
    drop(redis);
    std::thread::sleep(Duration::from_secs(2)); // past any reuse of the last lookup
    assert_eq!(client.exist_key("k").unwrap_err().code, ErrorCode::RPC_FAIL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_while_redis_is_out_of_reach_stops_cleanly() {
    let redis = services::redis();
    let proxy = FreezeProxy::start(&redis.addr);
    let HaMaster {
        task: master,
        mut terms,
        stop,
    } = spawn_ha_master(&proxy.addr, &cluster("stop"), services::free_port());
    tokio::time::timeout(GUARD, terms.recv()).await.unwrap();

    // SIGTERM while redis does not answer: the key cannot be released (it
    // expires by itself), which is no reason to fail the shutdown.
    proxy.freeze();
    stop.send(()).unwrap();
    let ended = tokio::time::timeout(GUARD, master)
        .await
        .expect("shutdown hung")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
}
