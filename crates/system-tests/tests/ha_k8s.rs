//! HA on a Kubernetes Lease with real processes: three `mooncake_master
//! --enable_ha --ha_backend_type=k8s` on the API stand-in (`k8s-standin`,
//! served from this test process, reached through a kubeconfig), with the
//! default timings (lease 5 s, renew deadline 3 s, retry 1 s).
//!
//! Waits are bounded hang guards, never speed checks: failover times are
//! printed (run with `--nocapture` to see them), not asserted. The one
//! clock check is the property itself: a leader cut off from the API stops
//! serving before its last renewal's lease could run out. "Never two
//! serving at once" is watched throughout by RPC probes ([`Watch`]).

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use common::load::{check, storage_client, under_load, Load};
use common::{
    code, eventually, free_port, metadata_server, value, MasterPorts, Proc, MASTER, WAIT,
};
use k8s_standin::{Kind, StandIn};
use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::ha::k8s::config::{Auth, ClusterConfig};
use mooncake_store::ha::k8s::record::{parse_micro_time, LeaseRecord};
use mooncake_store::ha::k8s::{K8sElection, LeaseRef, Timings, RECORD_ANNOTATION};
use mooncake_store::master_client::DEFAULT_CLUSTER_ID;
use mooncake_store::MasterClient;

const NS: &str = "mooncake";
const TOKEN: &str = "t0ken";

/// The API stand-in on a runtime of its own, and a kubeconfig for it.
struct Api {
    standin: StandIn,
    url: String,
    kubeconfig: PathBuf,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Api {
    fn start() -> Api {
        Self::on(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
    }

    /// Serves on `listener` (bound by the caller, maybe long before).
    fn on(listener: std::net::TcpListener) -> Api {
        let url = format!("http://{}", listener.local_addr().unwrap());
        let api = Self::pointing_at(&url);
        let standin = api.standin.clone();
        api.rt.spawn(async move {
            listener.set_nonblocking(true).unwrap();
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            let _ = k8s_standin::run(l, standin, None).await;
        });
        api
    }

    /// A kubeconfig for `url`, and a stand-in not yet serving.
    fn pointing_at(url: &str) -> Api {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let standin = StandIn::new();
        standin.add_token(TOKEN, "system:serviceaccount:mooncake:mooncake-master");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: {url}\n\
                 users:\n- name: s\n  user:\n    token: {TOKEN}\ncontexts:\n- name: s\n  context:\n    \
                 cluster: s\n    user: s\ncurrent-context: s\n"
            ),
        )
        .unwrap();
        Api {
            standin,
            url: url.to_string(),
            kubeconfig,
            rt,
            _dir: dir,
        }
    }

    fn lease(&self, name: &str) -> Option<LeaseRecord> {
        let l = self.standin.object(Kind::Lease, NS, name)?;
        Some(LeaseRecord::from_spec(l.get("spec")))
    }

    fn holder(&self, name: &str) -> String {
        self.lease(name).map(|r| r.holder).unwrap_or_default()
    }

    fn leader_label(&self, pod: &str) -> Option<String> {
        let p = self.standin.object(Kind::Pod, NS, pod)?;
        p["metadata"]["labels"]["mooncake.io/store-role"]
            .as_str()
            .map(str::to_string)
    }

    /// The election on lease `name` as this process would run it.
    fn election(&self, name: &str, timings: Timings) -> K8sElection {
        let config = ClusterConfig {
            server: self.url.clone(),
            ca_pem: None,
            insecure_skip_tls_verify: false,
            auth: Auth::Token(TOKEN.into()),
        };
        K8sElection::new(
            &config,
            LeaseRef::parse(&format!("{NS}/{name}")).unwrap(),
            timings,
        )
        .unwrap()
    }
}

/// The stand-in store clients of this process find leaders through: their
/// `$KUBECONFIG` is this process's, so every test that runs a client here
/// shares it (each on a lease of its own).
fn shared_api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let api = Api::start();
        std::env::set_var("KUBECONFIG", &api.kubeconfig);
        api
    })
}

/// One `mooncake_master` process.
struct Master {
    proc: Proc,
    port: u16,
    pod: String,
    /// Its "listening on" lines (one per term as leader).
    up: mpsc::Receiver<String>,
    /// Its log (stderr).
    log: Arc<Mutex<Vec<String>>>,
}

impl Master {
    fn start(api: &Api, lease: &str, pod: &str, extra: &[&str]) -> Master {
        Self::start_on(api, lease, pod, free_port(), extra)
    }

    fn start_on(api: &Api, lease: &str, pod: &str, port: u16, extra: &[&str]) -> Master {
        let mut args = MasterPorts {
            rpc: port,
            ..MasterPorts::ANY
        }
        .args();
        args.extend([
            "--enable_ha".to_string(),
            "--ha_backend_type=k8s".into(),
            format!("--ha_backend_connstring={NS}/{lease}"),
            "--rpc_address=127.0.0.1".into(),
            "--rpc_thread_num=1".into(),
            "--metrics_host=127.0.0.1".into(),
            "--client_ttl=2".into(),
            format!("--pod_name={pod}"),
            format!("--pod_namespace={NS}"),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child = Command::new(&*MASTER)
            .args(&args)
            .env("KUBECONFIG", &api.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, up) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if line.contains("listening on") && tx.send(line).is_err() {
                    return;
                }
            }
        });
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stderr, sink) = (child.stderr.take().unwrap(), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                sink.lock().unwrap().push(line);
            }
        });
        Master {
            proc: Proc(child),
            port,
            pod: pod.to_string(),
            up,
            log,
        }
    }

    fn identity(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(self.proc.0.id() as i32, sig) }, 0);
    }

    /// Waits until the log has a line containing `what` (printing the log
    /// if it never does).
    fn wait_logged(&self, what: &str) {
        let start = Instant::now();
        while !self.logged(what) {
            if start.elapsed() > WAIT {
                let log = self.log.lock().unwrap().join("\n");
                panic!("never logged {what:?}; the log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn logged(&self, what: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(what))
    }
}

/// Whether the master on `port` answers an RPC now.
fn serves(port: u16) -> bool {
    let ms = Duration::from_millis;
    MasterClient::connect_with_timeouts(&format!("127.0.0.1:{port}"), ms(300), ms(500))
        .and_then(|m| m.exist_key("probe"))
        .is_ok()
}

/// Watches, until dropped, that no two masters serve at once. A round
/// probes every port, then again those that answered, in the same order:
/// two that answered both times served together between their answers (a
/// master that stopped cannot serve again within milliseconds: it must
/// win a new term first).
struct Watch {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn new(ports: Vec<u16>) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(AtomicUsize::new(0));
        let (s, m) = (stop.clone(), most.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let first: Vec<u16> = ports.iter().copied().filter(|p| serves(*p)).collect();
                let both = first.into_iter().filter(|p| serves(*p)).count();
                m.fetch_max(both, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Watch {
            stop,
            most,
            thread: Some(thread),
        }
    }

    /// Asserts that at most one master was ever seen serving.
    fn check(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        let most = self.most.load(Ordering::SeqCst);
        assert!(most <= 1, "{most} masters served at once");
    }
}

/// The one master of `masters` that serves, once exactly one does.
fn the_leader(masters: &[Master]) -> usize {
    let mut leader = None;
    eventually("exactly one master serves", || {
        let serving: Vec<usize> = (0..masters.len())
            .filter(|&i| serves(masters[i].port))
            .collect();
        leader = serving.first().copied();
        serving.len() == 1
    });
    leader.unwrap()
}

fn start_three(api: &Api, lease: &str, extra: &[&str]) -> Vec<Master> {
    for i in 0..3 {
        api.standin.add_pod(NS, &format!("{lease}-{i}"));
    }
    (0..3)
        .map(|i| Master::start(api, lease, &format!("{lease}-{i}"), extra))
        .collect()
}

fn store_client(master: &str) -> (Proc, Client) {
    let (meta, metadata) = metadata_server();
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
    (meta, client)
}

/// Puts `key` until it succeeds: how long that took.
fn first_put(client: &Client, key: &str) -> Duration {
    let (start, v) = (Instant::now(), value(key, 10_000));
    while client.put(key, &v, &Default::default()).is_err() {
        assert!(start.elapsed() < WAIT, "no put through a new leader");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[test]
fn three_start_together_one_wins_and_a_client_follows_it_across_kill_9() {
    let api = shared_api();
    let lease = "kill9";
    let mut masters = start_three(api, lease, &[]);
    let watch = Watch::new(masters.iter().map(|m| m.port).collect());
    let a = the_leader(&masters);
    // Created by one, raced for by all three (409 AlreadyExists for two).
    eventually("the lease names the leader", || {
        api.holder(lease) == masters[a].identity()
    });
    let term = api.lease(lease).unwrap().transitions;
    eventually("the leader's pod is labelled", || {
        api.leader_label(&masters[a].pod).as_deref() == Some("leader")
    });

    let addr = format!("k8s://{NS}/{lease}");
    let (_meta, client) = store_client(&addr);
    first_put(&client, "before");
    let killed = Instant::now();
    masters[a].proc.kill9();
    first_put(&client, "after");
    let took = killed.elapsed();
    println!(
        "k8s failover, kill -9 of the leader: first put after {:.2} s",
        took.as_secs_f64()
    );
    let b = the_leader(&masters);
    assert_ne!(a, b);
    assert_eq!(client.get("after").unwrap(), value("after", 10_000));
    // The new leader starts empty.
    assert_eq!(code(client.get("before")), ErrorCode::OBJECT_NOT_FOUND);
    let record = api.lease(lease).unwrap();
    assert_eq!(record.holder, masters[b].identity());
    assert_eq!(record.transitions, term + 1, "a new holder is a new term");
    eventually("the label follows the leader", || {
        api.leader_label(&masters[b].pod).as_deref() == Some("leader")
    });
    // A fresh client resolves the new leader directly.
    let m = MasterClient::connect(&addr).unwrap();
    assert!(m.exist_key("after").unwrap());
    watch.check();
}

#[test]
fn sigterm_hands_over_and_unlabels() {
    let api = shared_api();
    let lease = "sigterm";
    // A pod left labelled by an earlier run: the label goes at start, even
    // on a standby (someone else holds its lease).
    api.standin.add_pod(NS, "stale");
    let e = api.election("stale", Timings::default());
    let (held, _) = api
        .rt
        .block_on(e.campaign_with_term("someone-else:1"))
        .unwrap();
    api.rt
        .block_on(e.label_pod(NS, "stale", "mooncake.io/store-role", Some("leader")))
        .unwrap();
    let stale = Master::start(api, "stale", "stale", &[]);
    stale.wait_logged("pod leader label updated");
    assert_eq!(
        api.leader_label("stale"),
        None,
        "a label left from an earlier run is removed"
    );
    assert!(!serves(stale.port));
    drop(stale);
    api.rt.block_on(held.resign()).unwrap();

    let mut masters = start_three(api, lease, &[]);
    let watch = Watch::new(masters.iter().map(|m| m.port).collect());
    let a = the_leader(&masters);
    let (_meta, client) = store_client(&format!("k8s://{NS}/{lease}"));
    first_put(&client, "before");

    let stopped = Instant::now();
    masters[a].signal(libc::SIGTERM);
    // Puts start once it is gone, so that none lands on it.
    let status = masters[a].proc.0.wait().unwrap();
    let exited = stopped.elapsed();
    assert!(
        status.success(),
        "a SIGTERM'd master exits cleanly: {status:?}"
    );
    first_put(&client, "after");
    println!(
        "k8s failover, SIGTERM of the leader: it exited after {:.2} s, first put after {:.2} s",
        exited.as_secs_f64(),
        stopped.elapsed().as_secs_f64()
    );
    assert_eq!(client.get("after").unwrap(), value("after", 10_000));
    assert!(masters[a].logged("leader lease released"));
    let b = the_leader(&masters);
    assert_ne!(a, b);
    assert_eq!(api.holder(lease), masters[b].identity());
    assert_eq!(
        api.leader_label(&masters[a].pod),
        None,
        "unlabelled on exit"
    );
    eventually("the new leader's pod is labelled", || {
        api.leader_label(&masters[b].pod).as_deref() == Some("leader")
    });
    let others: Vec<&Master> = (0..3).filter(|&i| i != b).map(|i| &masters[i]).collect();
    assert!(others.iter().all(|m| api.leader_label(&m.pod).is_none()));
    watch.check();
}

#[test]
fn a_lease_renewed_by_someone_else_is_left_alone_then_taken_once_it_expires() {
    let api = Api::start();
    let lease = "foreign";
    // Someone else holds the lease and renews it, on a runtime of its own
    // whose shutdown stops the renewals without releasing the lease.
    let foreign_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let e = api.election(lease, Timings::default());
    let held = foreign_rt
        .block_on(e.campaign_with_term("someone-else:1"))
        .unwrap();
    let masters = start_three(&api, lease, &[]);
    let watch = Watch::new(masters.iter().map(|m| m.port).collect());
    // Two lease durations of renewals by the other holder.
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        assert!(
            masters.iter().all(|m| !serves(m.port)),
            "a master took a renewed lease"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(api.holder(lease), "someone-else:1");
    std::mem::forget(held.0); // its holder task dies with the runtime
    foreign_rt.shutdown_background();
    let a = the_leader(&masters);
    let record = api.lease(lease).unwrap();
    assert_eq!(record.holder, masters[a].identity());
    assert_eq!(record.transitions, held.1 + 1);
    watch.check();
}

#[test]
fn an_api_outage_stops_the_leader_before_its_lease_runs_out_and_a_leader_returns() {
    let api = Api::start();
    let lease = "outage";
    let masters = start_three(&api, lease, &[]);
    let watch = Watch::new(masters.iter().map(|m| m.port).collect());
    let a = the_leader(&masters);
    api.standin.freeze();
    // The last renewal that got through, as the API server stored it.
    let last = api.lease(lease).unwrap();
    let frozen = Instant::now();
    eventually("the cut-off leader stops serving", || {
        !serves(masters[a].port)
    });
    let stopped_at = SystemTime::now();
    println!(
        "k8s API frozen: the leader stopped serving after {:.2} s",
        frozen.elapsed().as_secs_f64()
    );
    let renewed = parse_micro_time(last.renew_time.as_deref().unwrap()).unwrap();
    let runs_out = renewed + Duration::from_secs(last.duration_secs as u64);
    assert!(
        stopped_at < runs_out,
        "the leader served past its lease ({stopped_at:?} >= {runs_out:?})"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        masters.iter().all(|m| !serves(m.port)),
        "nobody serves without the API"
    );
    api.standin.thaw();
    the_leader(&masters);
    watch.check();
}

#[test]
fn a_stopped_leader_is_fenced_after_it_resumes() {
    let api = Api::start();
    let lease = "sigstop";
    let masters = start_three(&api, lease, &[]);
    let a = the_leader(&masters);
    masters[a].signal(libc::SIGSTOP);
    let mut b = a;
    eventually("a standby takes over", || {
        b = (0..3)
            .find(|&i| i != a && serves(masters[i].port))
            .unwrap_or(a);
        b != a
    });
    masters[a].signal(libc::SIGCONT);
    eventually("the resumed master has given leadership up", || {
        masters[a].logged("giving leadership up")
    });
    // It stays a standby: the new leader's lease is renewed.
    let watch = Watch::new(masters.iter().map(|m| m.port).collect());
    std::thread::sleep(Duration::from_secs(3));
    assert!(!serves(masters[a].port));
    assert!(serves(masters[b].port));
    assert_eq!(api.holder(lease), masters[b].identity());
    watch.check();
}

#[test]
fn an_unreachable_api_server_means_retrying_and_serving_nothing() {
    // Nothing answers on the kubeconfig's port yet.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let away = Api::pointing_at(&format!("http://127.0.0.1:{port}"));
    let lease = "unreachable";
    let mut m = Master::start(&away, lease, "lonely", &[]);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(!serves(m.port), "served with no API server");
        assert!(m.proc.0.try_wait().unwrap().is_none(), "gave up");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(m.logged("campaign for lease"), "the failure is logged");
    // The API server comes up on that port: the master leads.
    let api = Api::on(std::net::TcpListener::bind(("127.0.0.1", port)).unwrap());
    api.standin.add_pod(NS, "lonely");
    m.up.recv_timeout(WAIT).expect("leads once the API answers");
    eventually("the lease names it", || api.holder(lease) == m.identity());
}

#[test]
fn an_rbac_denial_is_logged_with_verb_and_resource() {
    let api = Api::start();
    api.standin.deny("create", "leases");
    api.standin.add_pod(NS, "denied-0");
    let m = Master::start(&api, "denied", "denied-0", &[]);
    m.wait_logged(
        r#"forbids verb "create" on resource "leases.coordination.k8s.io" in namespace "mooncake""#,
    );
    assert!(!serves(m.port));
    api.standin.allow("create", "leases");
    m.up.recv_timeout(WAIT).expect("leads once allowed");
}

#[test]
fn bad_k8s_settings_exit_with_a_message() {
    let ok = "--ha_backend_connstring=ns/lease";
    for (args, says) in [
        (vec!["--etcd_endpoints=h:1"], "--ha_backend_connstring"),
        (vec!["--ha_backend_connstring=a/b/c"], "more than one '/'"),
        (vec!["--ha_backend_connstring=/lease"], "empty namespace"),
        (vec!["--ha_backend_connstring=ns/"], "empty namespace"),
        (
            vec![ok, "--k8s_lease_duration_sec=2500ms"],
            "whole number of seconds",
        ),
        (
            vec![ok, "--k8s_renew_deadline_sec=6"],
            "longer than the renew deadline",
        ),
        (vec![ok, "--pod_name=m-0"], "--pod_namespace"),
    ] {
        // A fixed RPC port (HA needs one), free should the master bind it.
        let mut argv = MasterPorts {
            rpc: free_port(),
            ..MasterPorts::ANY
        }
        .args();
        argv.extend(["--enable_ha", "--ha_backend_type=k8s"].map(String::from));
        argv.extend(args.into_iter().map(String::from));
        let out = Command::new(&*MASTER)
            .args(&argv)
            .env_remove("POD_NAMESPACE")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{argv:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("INVALID_PARAMS (-600)"), "{argv:?}: {err}");
        assert!(err.contains(says), "{argv:?}: {err}");
    }
    // A client address of the same form is checked the same way.
    let e = MasterClient::connect("k8s://a/b/c").err().unwrap();
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
}

#[test]
fn a_client_waits_for_a_leader_while_none_holds_the_lease() {
    let api = shared_api();
    let lease = "late";
    let addr = format!("k8s://{NS}/{lease}");
    // No master at all: setup fails, after polling, as the reference's does.
    assert_eq!(
        MasterClient::connect(&addr).err().unwrap().code,
        ErrorCode::RPC_FAIL
    );
    // A client polls while no master holds the lease, and finds the one
    // that wins meanwhile.
    api.standin.add_pod(NS, "late-0");
    let waiting = std::thread::spawn(move || MasterClient::connect(&addr));
    std::thread::sleep(Duration::from_millis(1000));
    let _m = Master::start(api, lease, "late-0", &[]);
    let client = waiting.join().unwrap().expect("found once it leads");
    assert!(!client.exist_key("x").unwrap());
}

/// The holder the Lease names may not listen yet (it won a moment ago):
/// a client setting up keeps trying it instead of failing at once.
#[test]
fn a_client_waits_for_the_holder_to_listen() {
    let api = shared_api();
    let lease = "not-yet";
    let port = free_port();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let held = rt
        .block_on(
            api.election(lease, Timings::default())
                .campaign_with_term(&format!("127.0.0.1:{port}")),
        )
        .unwrap();
    let addr = format!("k8s://{NS}/{lease}");
    let waiting = std::thread::spawn(move || MasterClient::connect(&addr));
    std::thread::sleep(Duration::from_millis(1500));
    // The holder starts listening (a plain master on the port it named).
    let _m = Proc(
        Command::new(&*MASTER)
            .args(
                MasterPorts {
                    rpc: port,
                    ..MasterPorts::ANY
                }
                .args(),
            )
            .arg("--rpc_address=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = waiting.join().unwrap().expect("found once it listens");
    assert!(!client.exist_key("x").unwrap());
    drop(held);
    rt.shutdown_background();
}

/// The replication record on the Lease: its term and how many standbys
/// it names.
fn recorded(api: &Api, lease: &str) -> Option<(i64, usize)> {
    let l = api.standin.object(Kind::Lease, NS, lease)?;
    let r = l["metadata"]["annotations"][RECORD_ANNOTATION].as_str()?;
    let term = r.lines().find_map(|l| l.strip_prefix("term="))?;
    let standbys = r.lines().filter(|l| l.starts_with("standby=")).count();
    Some((term.parse().ok()?, standbys))
}

/// `--enable_oplog` with the Lease as the election backend: the in-sync
/// set lives on the Lease, and two kill -9 of the leader under a
/// put/get/remove load lose nothing acknowledged.
#[test]
fn replicated_failover_on_the_lease_loses_nothing_acknowledged() {
    let api = shared_api();
    let lease = "replicated";
    let oplog = [
        "--enable_oplog=true",
        "--oplog_poll_interval_ms=200",
        "--default_kv_lease_ttl=200",
    ];
    let mut masters = start_three(api, lease, &oplog);
    let watch = Watch::new(masters.iter().map(|m| m.port).collect());
    let (_meta, metadata) = metadata_server();
    let client = storage_client(
        &format!("k8s://{NS}/{lease}"),
        DEFAULT_CLUSTER_ID,
        &metadata,
    );
    let load = Load::default();
    let (ledgers, ()) = under_load(&client, 3, &load, |start| {
        load.wait_puts(200);
        for round in 0..2 {
            let a = the_leader(&masters);
            eventually("both standbys recorded in sync on the lease", || {
                let term = api.lease(lease).unwrap().transitions;
                recorded(api, lease) == Some((term, 2))
            });
            load.killed(start);
            masters[a].proc.kill9();
            let killed = Instant::now();
            let b = loop {
                if let Some(b) = (0..3).find(|&i| i != a && serves(masters[i].port)) {
                    break b;
                }
                assert!(killed.elapsed() < WAIT, "no standby took over");
                std::thread::sleep(Duration::from_millis(10));
            };
            let promoted = killed.elapsed();
            load.wait_puts(100);
            println!(
                "k8s replicated, round {round}: kill -9 of master {a}; master {b} serves after {promoted:?}; first good put after {:?}, get after {:?}",
                load.since_kill(&load.first_put),
                load.since_kill(&load.first_get)
            );
            // Back empty, on its port: it catches up as a fresh standby.
            let (pod, port) = (masters[a].pod.clone(), masters[a].port);
            masters[a] = Master::start_on(api, lease, &pod, port, &oplog);
        }
        load.wait_puts(100);
    });
    let (present, removed) = check(&client, &load, &ledgers);
    println!("k8s replicated: checked {present} acknowledged puts and {removed} removes after 2 failovers");
    watch.check();
}
