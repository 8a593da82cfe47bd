//! The coordination service of a nemesis run, always one the harness
//! started itself (so that it may restart it): etcd or redis on a data
//! directory of the run, or the Kubernetes API stand-in served from this
//! process.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_standin::StandIn;
use test_support::{free_port, Proc};

/// The election backends the nemesis runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Etcd,
    Redis,
    K8s,
}

impl Backend {
    pub const ALL: [Backend; 3] = [Backend::Etcd, Backend::Redis, Backend::K8s];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Etcd => "etcd",
            Backend::Redis => "redis",
            Backend::K8s => "k8s",
        }
    }

    pub fn parse(s: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == s)
    }
}

pub const K8S_NAMESPACE: &str = "mooncake";
const K8S_TOKEN: &str = "nemesis-token";

/// The Lease stand-in, served on a runtime of its own.
struct Api {
    standin: StandIn,
    url: String,
    _rt: tokio::runtime::Runtime,
}

pub struct Coordination {
    pub backend: Backend,
    /// `host:port` (etcd, redis) or the API's URL (Kubernetes).
    pub addr: String,
    dir: PathBuf,
    port: u16,
    peer_port: u16,
    proc: Option<Proc>,
    api: Option<Api>,
}

impl Coordination {
    /// Starts `backend`'s service with its data under `dir`.
    pub fn start(backend: Backend, dir: &Path) -> Coordination {
        let mut c = Coordination {
            backend,
            addr: String::new(),
            dir: dir.to_path_buf(),
            port: free_port(),
            peer_port: free_port(),
            proc: None,
            api: None,
        };
        match backend {
            Backend::Etcd | Backend::Redis => {
                c.addr = format!("127.0.0.1:{}", c.port);
                c.spawn();
            }
            Backend::K8s => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .expect("runtime");
                let standin = StandIn::new();
                standin.add_token(K8S_TOKEN, "system:serviceaccount:mooncake:mooncake-master");
                let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                let url = format!("http://{}", listener.local_addr().expect("address"));
                let si = standin.clone();
                rt.spawn(async move {
                    listener.set_nonblocking(true).expect("nonblocking");
                    let l = tokio::net::TcpListener::from_std(listener).expect("listener");
                    let _ = k8s_standin::run(l, si, None).await;
                });
                c.addr = url.trim_start_matches("http://").to_string();
                c.api = Some(Api {
                    standin,
                    url,
                    _rt: rt,
                });
            }
        }
        c
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", self.backend.name())))
            .expect("service log");
        let mut cmd;
        match self.backend {
            Backend::Etcd => {
                let client = format!("http://{}", self.addr);
                let peer = format!("http://127.0.0.1:{}", self.peer_port);
                cmd = Command::new("etcd");
                cmd.arg("--data-dir")
                    .arg(self.dir.join("etcd-data"))
                    .args(["--name", "nemesis"])
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer])
                    .args(["--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &format!("nemesis={peer}")]);
            }
            Backend::Redis => {
                // What docs/ha.md requires of redis: one instance, every
                // write fsynced to its append-only file.
                cmd = Command::new("redis-server");
                cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--appendonly", "yes", "--appendfsync", "always"])
                    .args(["--save", ""])
                    .arg("--dir")
                    .arg(&self.dir);
            }
            Backend::K8s => unreachable!("the stand-in is served in-process"),
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (scripts/install-deps.sh --test installs it)",
                    self.backend.name()
                )
            });
        self.proc = Some(Proc(child));
        let deadline = Instant::now() + Duration::from_secs(60);
        let sock = self.addr.parse().expect("address");
        while TcpStream::connect_timeout(&sock, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{} did not start on {}",
                self.backend.name(),
                self.addr
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The service goes away for `down`, then comes back with its data:
    /// etcd and redis are killed (`kill -9`) and restarted; the API
    /// stand-in holds every request unanswered meanwhile.
    pub fn outage(&mut self, down: Duration) {
        match &self.api {
            Some(api) => {
                api.standin.freeze();
                std::thread::sleep(down);
                api.standin.thaw();
            }
            None => {
                if let Some(mut p) = self.proc.take() {
                    p.kill9();
                }
                std::thread::sleep(down);
                self.spawn();
            }
        }
    }

    /// The master flags that reach this service at `addr` (a relay of it).
    pub fn master_flags(&self, addr: &str, pod: &str) -> Vec<String> {
        match self.backend {
            Backend::Etcd => vec![format!("--etcd_endpoints={addr}")],
            Backend::Redis => vec![format!("--etcd_endpoints=redis://{addr}")],
            Backend::K8s => vec![
                "--ha_backend_type=k8s".into(),
                format!("--ha_backend_connstring={K8S_NAMESPACE}/nemesis"),
                format!("--pod_name={pod}"),
                format!("--pod_namespace={K8S_NAMESPACE}"),
            ],
        }
    }

    /// Registers a master's pod (Kubernetes only).
    pub fn add_pod(&self, pod: &str) {
        if let Some(api) = &self.api {
            api.standin.add_pod(K8S_NAMESPACE, pod);
        }
    }

    /// A kubeconfig reaching the API at `addr` (`host:port`), written to
    /// `path`.
    pub fn write_kubeconfig(&self, path: &Path, addr: &str) {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: http://{addr}\n\
                 users:\n- name: s\n  user:\n    token: {K8S_TOKEN}\ncontexts:\n- name: s\n  context:\n    \
                 cluster: s\n    user: s\ncurrent-context: s\n"
            ),
        )
        .expect("kubeconfig");
    }

    /// The master address clients are given (`etcd://…`, `redis://…`,
    /// `k8s://…`).
    pub fn client_address(&self) -> String {
        match self.backend {
            Backend::Etcd => format!("etcd://{}", self.addr),
            Backend::Redis => format!("redis://{}", self.addr),
            Backend::K8s => format!("k8s://{K8S_NAMESPACE}/nemesis"),
        }
    }

    /// The API's URL (Kubernetes only).
    pub fn api_url(&self) -> Option<&str> {
        self.api.as_ref().map(|a| a.url.as_str())
    }
}
