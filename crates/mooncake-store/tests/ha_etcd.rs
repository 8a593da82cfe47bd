//! Leader election against a real etcd (`MOONCAKE_TEST_ETCD`, or one
//! started here). Each test uses a cluster id of its own.
//!
//! Waits are bounded hang guards, never speed checks; "still waiting"
//! checks can only pass wrongly, never fail wrongly.

mod support;

use std::time::Duration;

use mooncake_store::ha::etcd::{election_name, EtcdElection};
use mooncake_store::ha::{find_leader, ElectionBackend, Leader, LeaderElection};
use test_support::{services, FreezeProxy};

/// Lease TTL for tests: short so failover tests are quick.
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

async fn election(etcd: &services::Service, cluster_id: &str) -> EtcdElection {
    EtcdElection::connect(std::slice::from_ref(&etcd.addr), cluster_id, TTL)
        .await
        .unwrap()
}

/// Polls `leader()` until it equals `want` (bounded).
async fn leader_becomes(e: &EtcdElection, want: Option<&str>) {
    tokio::time::timeout(GUARD, async {
        while e.leader().await.unwrap().as_deref() != want {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("leader never became {want:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_handover_on_resign() {
    let etcd = services::etcd();
    let id = cluster("handover");
    let (a, b) = (election(&etcd, &id).await, election(&etcd, &id).await);
    assert_eq!(a.leader().await.unwrap(), None);

    let la = a.campaign("10.0.0.1:50051").await.unwrap();
    let term_a = la.term();
    assert!(la.is_held());
    assert_eq!(b.leader().await.unwrap().as_deref(), Some("10.0.0.1:50051"));
    let (backend, cid) = (ElectionBackend::Etcd(vec![etcd.addr.clone()]), id.clone());
    let found = tokio::task::spawn_blocking(move || find_leader(&backend, &cid))
        .await
        .unwrap()
        .unwrap();
    let (address, term) = ("10.0.0.1:50051".to_string(), la.term());
    assert_eq!(found, Some(Leader { address, term }), "with its term");

    // b waits while a leads...
    let b2 = b.clone();
    let mut b_campaign = tokio::spawn(async move { b2.campaign("10.0.0.2:50051").await });
    assert!(
        tokio::time::timeout(Duration::from_millis(700), &mut b_campaign)
            .await
            .is_err()
    );
    assert_eq!(a.leader().await.unwrap().as_deref(), Some("10.0.0.1:50051"));

    // ...and wins as soon as a resigns.
    la.resign().await.unwrap();
    let lb = tokio::time::timeout(GUARD, b_campaign)
        .await
        .expect("b never won")
        .unwrap()
        .unwrap();
    assert_eq!(lb.candidate(), "10.0.0.2:50051");
    assert_eq!(a.leader().await.unwrap().as_deref(), Some("10.0.0.2:50051"));
    let found = a.leader_with_term().await.unwrap().unwrap();
    assert_eq!(found.term, lb.term());
    assert!(lb.term() > term_a, "the next leader's term is higher");
    lb.resign().await.unwrap();
    assert_eq!(a.leader().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_see_every_change() {
    let etcd = services::etcd();
    let id = cluster("observe");
    let (a, watcher) = (election(&etcd, &id).await, election(&etcd, &id).await);
    let mut rx = watcher.observe().await.unwrap();
    assert_eq!(*rx.borrow(), None);

    let la = a.campaign("a:1").await.unwrap();
    tokio::time::timeout(GUARD, rx.wait_for(|l| l.as_deref() == Some("a:1")))
        .await
        .unwrap()
        .unwrap();
    drop(la); // dropping the handle gives leadership up too
    tokio::time::timeout(GUARD, rx.wait_for(|l| l.is_none()))
        .await
        .unwrap()
        .unwrap();
    let lb = a.campaign("b:2").await.unwrap();
    tokio::time::timeout(GUARD, rx.wait_for(|l| l.as_deref() == Some("b:2")))
        .await
        .unwrap()
        .unwrap();
    lb.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_is_lost_when_its_lease_is_revoked() {
    let etcd = services::etcd();
    let id = cluster("revoked");
    let a = election(&etcd, &id).await;
    let mut la = a.campaign("a:1").await.unwrap();

    // An operator (or etcd itself) removes the lease behind the leader's back.
    let mut raw = etcd_client::Client::connect([format!("http://{}", etcd.addr)], None)
        .await
        .unwrap();
    let opts = etcd_client::GetOptions::new().with_prefix();
    let resp = raw
        .get(format!("{}/", election_name(&id)), Some(opts))
        .await
        .unwrap();
    let lease = resp.kvs()[0].lease();
    assert_ne!(lease, 0);
    raw.lease_revoke(lease).await.unwrap();

    tokio::time::timeout(GUARD, la.lost())
        .await
        .expect("loss never noticed");
    assert!(!la.is_held());
    assert_eq!(a.leader().await.unwrap(), None);
    la.resign().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_leader_is_replaced_after_its_lease_expires() {
    let etcd = services::etcd();
    let id = cluster("crash");
    // The leader lives on a runtime of its own; dropping that runtime stops
    // its renewals without a resign, as a crash would.
    let (addr, cid) = (etcd.addr.clone(), id.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let la = rt.block_on(async {
            let a = EtcdElection::connect(&[addr], &cid, TTL).await.unwrap();
            a.campaign("crasher:1").await.unwrap()
        });
        drop(rt);
        std::mem::forget(la);
    })
    .join()
    .unwrap();

    let b = election(&etcd, &id).await;
    assert_eq!(b.leader().await.unwrap().as_deref(), Some("crasher:1"));
    let lb = tokio::time::timeout(GUARD, b.campaign("b:2"))
        .await
        .expect("no failover")
        .unwrap();
    assert_eq!(b.leader().await.unwrap().as_deref(), Some("b:2"));
    lb.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_candidacy_leaves_nothing_behind() {
    let etcd = services::etcd();
    let id = cluster("withdrawn");
    let (a, b) = (election(&etcd, &id).await, election(&etcd, &id).await);
    let la = a.campaign("a:1").await.unwrap();
    // b campaigns, gives up waiting (the future is dropped)...
    assert!(
        tokio::time::timeout(Duration::from_millis(500), b.campaign("b:2"))
            .await
            .is_err()
    );
    // ...so once a resigns there is no leader, rather than b.
    la.resign().await.unwrap();
    leader_becomes(&a, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_outlives_several_lease_periods() {
    let etcd = services::etcd();
    let id = cluster("renewal");
    let a = election(&etcd, &id).await;
    let la = a.campaign("a:1").await.unwrap();
    // Three TTLs: without renewals the lease would be long gone.
    tokio::time::sleep(TTL * 3).await;
    assert!(la.is_held());
    assert_eq!(a.leader().await.unwrap().as_deref(), Some("a:1"));
    la.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_gives_up_before_another_can_win() {
    let etcd = services::etcd();
    let id = cluster("partition");
    let proxy = FreezeProxy::start(&etcd.addr);
    let a = EtcdElection::connect(std::slice::from_ref(&proxy.addr), &id, TTL)
        .await
        .unwrap();
    let b = election(&etcd, &id).await;
    support::partitioned_leader_gives_up(&a, &b, &proxy, GUARD).await;
}
