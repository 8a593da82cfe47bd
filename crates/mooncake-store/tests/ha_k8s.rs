//! Leader election on a Kubernetes Lease, against the API stand-in
//! (`k8s-standin`), one stand-in per test. The scenarios of the
//! reference's Go tests, plus renewals by someone else, an API outage,
//! RBAC denials, token rotation and TLS.
//!
//! Waits are bounded hang guards, never speed checks; "still waiting"
//! checks can only pass wrongly, never fail wrongly. The one clock check
//! is the property itself: a leader cut off from the API gives up before
//! its last renewal's lease could run out.

mod support;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use k8s_standin::{tls::TestCa, Kind, StandIn};
use mooncake_common::ErrorCode;
use mooncake_store::ha::k8s::config::{Auth, ClusterConfig};
use mooncake_store::ha::k8s::{K8sElection, LeaseRef, Timings};
use mooncake_store::ha::LeaderElection;
use serde_json::json;
use test_support::FreezeProxy;
use tokio::time::{sleep, timeout, Instant};

/// Short timings so that expiry tests are quick, with a renew deadline of
/// four renewals so that a holder starved on a busy machine keeps its lease.
const TIMINGS: Timings = Timings {
    lease: Duration::from_secs(2),
    renew_deadline: Duration::from_millis(1200),
    retry: Duration::from_millis(300),
};
/// Hang guard for anything that must happen eventually.
const GUARD: Duration = Duration::from_secs(30);
const TOKEN: &str = "t0ken";
const NS: &str = "mooncake";

struct Api {
    standin: StandIn,
    url: String,
}

async fn api() -> Api {
    let standin = StandIn::new();
    standin.add_token(TOKEN, "system:serviceaccount:mooncake:master");
    let url = k8s_standin::spawn(standin.clone(), None).await;
    Api { standin, url }
}

fn config(server: &str) -> ClusterConfig {
    ClusterConfig {
        server: server.to_string(),
        ca_pem: None,
        insecure_skip_tls_verify: false,
        auth: Auth::Token(TOKEN.into()),
    }
}

fn lease() -> LeaseRef {
    LeaseRef::parse(&format!("{NS}/store-leader")).unwrap()
}

fn election_at(server: &str, timings: Timings) -> K8sElection {
    K8sElection::new(&config(server), lease(), timings).unwrap()
}

fn election(api: &Api) -> K8sElection {
    election_at(&api.url, TIMINGS)
}

/// The lease's spec as stored.
fn spec(api: &Api) -> serde_json::Value {
    api.standin.object(Kind::Lease, NS, "store-leader").unwrap()["spec"].clone()
}

/// Polls `cond` until it holds, within [`GUARD`].
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + GUARD;
    while !cond().await {
        assert!(Instant::now() < deadline, "never: {what}");
        sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_election() {
    let api = api().await;
    let e = election(&api);
    assert_eq!(e.leader().await.unwrap(), None, "no lease yet: no leader");
    let (l, term) = timeout(GUARD, e.campaign_with_term("node-1:8080"))
        .await
        .unwrap()
        .unwrap();
    assert!(l.is_held());
    assert_eq!(term, 0, "the creator is the first holder");
    let h = e.holder().await.unwrap();
    assert_eq!(h.identity.as_deref(), Some("node-1:8080"));
    assert_eq!(h.transitions, 0);
    let s = spec(&api);
    assert_eq!(s["holderIdentity"], "node-1:8080");
    assert_eq!(s["leaseDurationSeconds"], 2);
    // Concurrent lookups during the election all see the holder.
    let lookups: Vec<_> = (0..5)
        .map(|_| {
            tokio::spawn({
                let e = e.clone();
                async move { e.leader().await.unwrap() }
            })
        })
        .collect();
    for l in lookups {
        assert_eq!(l.await.unwrap().as_deref(), Some("node-1:8080"));
    }
    l.resign().await.unwrap();
    assert_eq!(e.leader().await.unwrap(), None, "released on resign");
    assert_eq!(spec(&api)["holderIdentity"], "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epoch_increments_on_every_new_holder() {
    let api = api().await;
    let (a, b) = (election(&api), election(&api));
    let mut terms = vec![];
    for (e, who) in [
        (&a, "node-epoch-1:8080"),
        (&b, "node-epoch-2:8080"),
        (&a, "node-epoch-1:8080"),
    ] {
        let (l, term) = timeout(GUARD, e.campaign_with_term(who))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(spec(&api)["leaseTransitions"], term);
        assert_eq!(e.holder().await.unwrap().transitions, term);
        terms.push(term);
        l.resign().await.unwrap();
    }
    // The same identity winning again is a new holder too.
    assert_eq!(terms, [0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_handoff_and_observers() {
    let api = api().await;
    let (a, b) = (election(&api), election(&api));
    let mut seen = b.observe().await.unwrap();
    let la = timeout(GUARD, a.campaign("candidate-a:8080"))
        .await
        .unwrap()
        .unwrap();
    timeout(
        GUARD,
        seen.wait_for(|l| l.as_deref() == Some("candidate-a:8080")),
    )
    .await
    .unwrap()
    .unwrap();
    let mut b_campaign = Box::pin(b.campaign("candidate-b:8080"));
    // B stands by while A renews, through several lease durations.
    assert!(
        timeout(TIMINGS.lease * 3, &mut b_campaign).await.is_err(),
        "B won while A held"
    );
    assert!(la.is_held());
    la.resign().await.unwrap();
    let lb = timeout(GUARD, b_campaign).await.unwrap().unwrap();
    assert_eq!(
        b.leader().await.unwrap().as_deref(),
        Some("candidate-b:8080")
    );
    timeout(
        GUARD,
        seen.wait_for(|l| l.as_deref() == Some("candidate-b:8080")),
    )
    .await
    .unwrap()
    .unwrap();
    lb.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_candidates_yield_exactly_one_winner() {
    let api = api().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = vec![];
    for i in 0..3 {
        let (e, tx) = (election(&api), tx.clone());
        tasks.push(tokio::spawn(async move {
            let who = format!("candidate-{i}:8080");
            let l = e.campaign(&who).await.unwrap();
            tx.send((who, l)).unwrap();
        }));
    }
    let (winner, l) = timeout(GUARD, rx.recv()).await.unwrap().unwrap();
    // Nobody else wins while the winner renews.
    assert!(
        timeout(TIMINGS.lease * 3, rx.recv()).await.is_err(),
        "a second winner"
    );
    assert!(l.is_held());
    assert_eq!(spec(&api)["holderIdentity"], winner.as_str());
    // Handing over: exactly one of the others is next.
    l.resign().await.unwrap();
    let (next, l2) = timeout(GUARD, rx.recv()).await.unwrap().unwrap();
    assert_ne!(next, winner);
    assert!(
        timeout(TIMINGS.lease * 2, rx.recv()).await.is_err(),
        "two winners after handover"
    );
    assert_eq!(spec(&api)["leaseTransitions"], 1);
    l2.resign().await.unwrap();
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_means_lost_and_the_holder_released() {
    let api = api().await;
    let e = election(&api);
    // Dropping the handle (cancel without waiting) also releases.
    let l = timeout(GUARD, e.campaign("cancel-node:8080"))
        .await
        .unwrap()
        .unwrap();
    drop(l);
    eventually("released after drop", || async {
        spec(&api)["holderIdentity"] == ""
    })
    .await;
    assert_eq!(e.leader().await.unwrap(), None);

    // A campaign dropped before winning withdraws: once the holder
    // resigns, nobody takes the lease.
    let other = election(&api);
    let holder = timeout(GUARD, other.campaign("holder:8080"))
        .await
        .unwrap()
        .unwrap();
    assert!(timeout(TIMINGS.lease, e.campaign("quitter:8080"))
        .await
        .is_err());
    holder.resign().await.unwrap();
    sleep(TIMINGS.lease * 2).await;
    assert_eq!(
        spec(&api)["holderIdentity"],
        "",
        "a withdrawn candidate took the lease"
    );
}

/// A leader whose only route to the API is `proxy` (frozen: it "dies"
/// without releasing).
fn behind_proxy(api: &Api) -> (K8sElection, FreezeProxy) {
    let upstream = api.url.trim_start_matches("http://");
    let proxy = FreezeProxy::start(upstream);
    (
        election_at(&format!("http://{}", proxy.addr), TIMINGS),
        proxy,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_is_empty_after_the_leader_dies_without_releasing() {
    let api = api().await;
    let (doomed, proxy) = behind_proxy(&api);
    let observer = election(&api);
    let _l = timeout(GUARD, doomed.campaign("doomed-leader:8080"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        observer.leader().await.unwrap().as_deref(),
        Some("doomed-leader:8080")
    );
    proxy.freeze();
    // No renewal and no release get through; once renewTime +
    // leaseDurationSeconds has passed the lookup shows no holder, while
    // the lease itself still names the dead leader.
    eventually("no holder once the lease ran out", || async {
        observer.leader().await.unwrap().is_none()
    })
    .await;
    assert_eq!(spec(&api)["holderIdentity"], "doomed-leader:8080");
    assert_eq!(observer.holder().await.unwrap().transitions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_after_leader_death() {
    let api = api().await;
    let (a, proxy) = behind_proxy(&api);
    let b = election(&api);
    // A leads, is cut off (renewals hang), B wins; by then A has given up.
    support::partitioned_leader_gives_up(&a, &b, &proxy, GUARD).await;
    let s = spec(&api);
    assert_eq!(s["leaseTransitions"], 1, "{s}");
    assert_eq!(s["holderIdentity"], "", "B resigned: {s}");
    proxy.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewed_by_someone_else_is_left_alone_until_it_expires() {
    let api = api().await;
    let http = reqwest::Client::new();
    let url = format!(
        "{}/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
        api.url
    );
    // Another program's 3 s lease, renewed every retry period (15 rounds
    // outlast it) with a renewTime in 2001: expiry is judged by when a
    // change was seen here, not by that clock.
    let mut obj: serde_json::Value = http
        .post(&url)
        .bearer_auth(TOKEN)
        .json(&json!({
            "metadata": {"name": "store-leader"},
            "spec": {"holderIdentity": "other:1", "leaseDurationSeconds": 3,
                     "leaseTransitions": 7, "renewTime": "2001-01-01T00:00:00.000000Z"},
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let e = election(&api);
    let mut campaign = Box::pin(e.campaign_with_term("ours:1"));
    for i in 1..=15 {
        assert!(
            timeout(TIMINGS.retry, &mut campaign).await.is_err(),
            "took a lease renewed {i} rounds ago"
        );
        obj["spec"]["renewTime"] = json!(format!("2001-01-01T00:00:{i:02}.000000Z"));
        obj = http
            .put(format!("{url}/store-leader"))
            .bearer_auth(TOKEN)
            .json(&obj)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(obj["spec"]["holderIdentity"], "other:1", "{obj}");
    }
    // The other program stops renewing: taken, with the next term.
    let (l, term) = timeout(GUARD, campaign).await.unwrap().unwrap();
    assert_eq!(term, 8);
    assert_eq!(spec(&api)["holderIdentity"], "ours:1");
    l.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_makes_the_leader_give_up_before_its_lease_runs_out() {
    let api = api().await;
    // A full second between renew deadline and lease, so that scheduling
    // delays on a busy machine stay inside the margin.
    let timings = Timings {
        lease: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1000),
        retry: Duration::from_millis(300),
    };
    let a = election_at(&api.url, timings);
    let mut la = timeout(GUARD, a.campaign("a:1")).await.unwrap().unwrap();
    sleep(timings.retry * 3).await; // a few renewals
    api.standin.freeze();
    // Every renewal that got through was sent before the freeze, so none
    // of them gives the lease beyond `frozen_at + lease`.
    let frozen_at = Instant::now();
    timeout(GUARD, la.lost())
        .await
        .expect("leader kept leading through the outage");
    assert!(
        Instant::now() < frozen_at + timings.lease,
        "gave up {:?} after the outage began, past the lease",
        frozen_at.elapsed()
    );
    // While the API is out, nobody can win.
    let b = election_at(&api.url, timings);
    let mut lb = Box::pin(b.campaign("b:1"));
    assert!(timeout(timings.lease, &mut lb).await.is_err());
    // Back: a leader again.
    api.standin.thaw();
    let lb = timeout(GUARD, lb).await.unwrap().unwrap();
    assert!(lb.is_held());
}

/// Runs `f` on a current-thread runtime with log output captured: what it
/// logged.
fn logged<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) -> String {
    #[derive(Clone, Default)]
    struct Capture(Arc<parking_lot::Mutex<Vec<u8>>>);
    impl Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let cap = Capture::default();
    let writer = cap.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f());
    let out = String::from_utf8_lossy(&cap.0.lock()).into_owned();
    out
}

#[test]
fn rbac_denials_name_the_verb_and_resource() {
    let out = logged(|| async {
        let api = api().await;
        api.standin.deny("create", "leases");
        let e = election(&api);
        let mut campaign = Box::pin(e.campaign("a:1"));
        // Refused: keeps retrying, never claims.
        assert!(timeout(TIMINGS.lease * 2, &mut campaign).await.is_err());
        // Granted: the retries go through.
        api.standin.allow("create", "leases");
        let l = timeout(GUARD, campaign).await.unwrap().unwrap();
        l.resign().await.unwrap();

        api.standin.deny("get", "leases");
        let err = e.leader().await.unwrap_err();
        assert_eq!(err.code, ErrorCode::K8S_LEASE_OPERATION_ERROR);
        assert!(
            err.context.contains(r#"forbids verb "get" on resource "leases.coordination.k8s.io" in namespace "mooncake""#),
            "{err}"
        );
    });
    let line = out
        .lines()
        .find(|l| l.contains("forbids verb \"create\""))
        .unwrap_or_else(|| panic!("no RBAC line logged:\n{out}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("leases.coordination.k8s.io"), "{line}");
    assert!(line.contains("namespace \"mooncake\""), "{line}");
    assert_eq!(
        out.matches("forbids verb \"create\"").count(),
        1,
        "logged on every retry:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_is_retried_and_never_claimed() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let e = election_at(&url, TIMINGS);
    let err = e.leader().await.unwrap_err();
    assert_eq!(err.code, ErrorCode::K8S_LEASE_OPERATION_ERROR);
    assert!(err.context.contains(&url), "{err}");
    let mut campaign = Box::pin(e.campaign("a:1"));
    assert!(timeout(TIMINGS.lease * 2, &mut campaign).await.is_err());
    // The server comes up on that port: the campaign goes through.
    let standin = StandIn::new();
    standin.add_token(TOKEN, "u");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(k8s_standin::run(listener, standin.clone(), None));
    let l = timeout(GUARD, campaign).await.unwrap().unwrap();
    assert!(l.is_held());
    l.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_file_is_read_again() {
    let api = api().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let cfg = ClusterConfig {
        auth: Auth::TokenFile(token.clone()),
        ..config(&api.url)
    };
    let e = K8sElection::new(&cfg, lease(), TIMINGS).unwrap();
    let mut l = timeout(GUARD, e.campaign("a:1")).await.unwrap().unwrap();
    // Rotation: the kubelet writes a new token; the old one stops working.
    std::fs::write(&token, "n3w-token").unwrap();
    api.standin.add_token("n3w-token", "u");
    api.standin.revoke_token(TOKEN);
    let before = api.standin.requests();
    // Still the leader several lease durations later: the renewals got 401,
    // re-read the file and went through.
    assert!(
        timeout(TIMINGS.lease * 3, l.lost()).await.is_err(),
        "lost leadership over a token rotation"
    );
    assert!(api.standin.requests() > before + 3);
    l.resign().await.unwrap();
    assert_eq!(spec(&api)["holderIdentity"], "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_the_cluster_ca() {
    let ca = TestCa::generate();
    let standin = StandIn::new();
    standin.add_token(TOKEN, "u");
    let url = k8s_standin::spawn(standin.clone(), Some(ca.acceptor())).await;
    let trusted = ClusterConfig {
        ca_pem: Some(ca.ca_pem.clone().into_bytes()),
        ..config(&url)
    };
    let e = K8sElection::new(&trusted, lease(), TIMINGS).unwrap();
    let l = timeout(GUARD, e.campaign("tls:1")).await.unwrap().unwrap();
    assert_eq!(e.leader().await.unwrap().as_deref(), Some("tls:1"));
    l.resign().await.unwrap();
    // Another CA's server is not trusted; skipping verification is explicit.
    let other = TestCa::generate();
    let wrong = ClusterConfig {
        ca_pem: Some(other.ca_pem.into_bytes()),
        ..config(&url)
    };
    let err = K8sElection::new(&wrong, lease(), TIMINGS)
        .unwrap()
        .leader()
        .await
        .unwrap_err();
    assert!(err.context.to_lowercase().contains("certificate"), "{err}");
    let insecure = ClusterConfig {
        insecure_skip_tls_verify: true,
        ..wrong
    };
    let e = K8sElection::new(&insecure, lease(), TIMINGS).unwrap();
    assert_eq!(e.leader().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_a_clear_error() {
    let api = api().await;
    let cfg = ClusterConfig {
        auth: Auth::Token("nope".into()),
        ..config(&api.url)
    };
    let err = K8sElection::new(&cfg, lease(), TIMINGS)
        .unwrap()
        .leader()
        .await
        .unwrap_err();
    assert!(err.context.contains("401 Unauthorized"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_labels_are_set_and_removed() {
    let api = api().await;
    api.standin.add_pod(NS, "master-0");
    let e = election(&api);
    let role = "mooncake.io/store-role";
    e.label_pod(NS, "master-0", role, Some("leader"))
        .await
        .unwrap();
    let pod = api.standin.object(Kind::Pod, NS, "master-0").unwrap();
    assert_eq!(pod["metadata"]["labels"][role], "leader");
    assert_eq!(
        pod["metadata"]["labels"]["app"], "mooncake-master",
        "other labels kept"
    );
    e.label_pod(NS, "master-0", role, None).await.unwrap();
    let pod = api.standin.object(Kind::Pod, NS, "master-0").unwrap();
    assert!(pod["metadata"]["labels"].get(role).is_none(), "{pod}");
    let err = e.label_pod(NS, "missing", role, None).await.unwrap_err();
    assert!(err.context.contains("404"), "{err}");
    api.standin.deny("patch", "pods");
    let err = e
        .label_pod(NS, "master-0", role, Some("leader"))
        .await
        .unwrap_err();
    assert!(
        err.context
            .contains(r#"forbids verb "patch" on resource "pods""#),
        "{err}"
    );
}
