//! HA failover time on a Kubernetes Lease: three `mooncake_master
//! --ha_backend_type=k8s` on the API stand-in (`k8s-standin`, served from
//! this process), default timings (lease 5 s, renew deadline 3 s, retry
//! 1 s), a store client on `k8s://<namespace>/<lease>` putting in a loop.
//! Per round the leader is stopped (`kill -9` or SIGTERM) and the time to
//! the first put through the new leader is taken from the signal.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::MasterClient;
use serde::Serialize;

use crate::cluster;

const NS: &str = "bench";
/// Hang guard of every wait.
const GUARD: Duration = Duration::from_secs(60);

fn err(msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, msg)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Stop {
    Kill9,
    Sigterm,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::Kill9 => "kill -9",
            Stop::Sigterm => "SIGTERM",
        }
    }

    fn signal(self) -> i32 {
        match self {
            Stop::Kill9 => libc::SIGKILL,
            Stop::Sigterm => libc::SIGTERM,
        }
    }
}

/// One stop of the leader: seconds from the signal to the first put.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub stop: Stop,
    pub first_put_s: f64,
}

/// A master process, killed when dropped.
struct Master {
    child: Child,
    port: u16,
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| err(e.to_string()))?;
    Ok(l.local_addr().map_err(|e| err(e.to_string()))?.port())
}

fn start_master(kubeconfig: &Path, lease: &str, log: &Path) -> Result<Master> {
    let (exe, mut args) = cluster::program("mooncake_master")?;
    let port = free_port()?;
    args.extend([
        "--enable_ha".to_string(),
        "--ha_backend_type=k8s".into(),
        format!("--ha_backend_connstring={NS}/{lease}"),
        format!("--rpc_port={port}"),
        "--rpc_address=127.0.0.1".into(),
        "--rpc_thread_num=1".into(),
        "--metrics_host=127.0.0.1".into(),
        "--metrics_port=0".into(),
        "--client_ttl=2".into(),
    ]);
    let stderr = std::fs::File::create(log).map_err(|e| err(format!("{}: {e}", log.display())))?;
    let child = Command::new(exe)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| err(format!("cannot start mooncake_master: {e}")))?;
    Ok(Master { child, port })
}

fn serves(port: u16) -> bool {
    let ms = Duration::from_millis;
    MasterClient::connect_with_timeouts(&format!("127.0.0.1:{port}"), ms(300), ms(500))
        .and_then(|m| m.exist_key("probe"))
        .is_ok()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > GUARD {
            return Err(err(format!("never happened: {what}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The stand-in on a runtime of its own, and a kubeconfig pointing at it.
struct Api {
    _rt: tokio::runtime::Runtime,
    kubeconfig: std::path::PathBuf,
}

fn start_api(dir: &Path) -> Result<Api> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| err(e.to_string()))?;
    let url = rt.block_on(k8s_standin::spawn(k8s_standin::StandIn::new(), None));
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: {url}\n\
             users:\n- name: s\n  user: {{}}\ncontexts:\n- name: s\n  context:\n    cluster: s\n    \
             user: s\ncurrent-context: s\n"
        ),
    )
    .map_err(|e| err(e.to_string()))?;
    Ok(Api {
        _rt: rt,
        kubeconfig,
    })
}

/// `rounds` stops of each kind, each on a fresh lease with three masters.
pub fn run(rounds: usize, mut progress: impl FnMut(&Round)) -> Result<Vec<Round>> {
    let dir = cluster::work_dir()?;
    let api = start_api(&dir)?;
    // The client in this process finds the API server as the masters do.
    std::env::set_var("KUBECONFIG", &api.kubeconfig);
    let (_meta, metadata) = metadata_server(&dir)?;
    let mut out = Vec::new();
    for (i, stop) in (0..rounds).flat_map(|i| [(i, Stop::Kill9), (i, Stop::Sigterm)]) {
        let lease = format!(
            "failover-{}-{i}",
            if stop == Stop::Kill9 { "kill" } else { "term" }
        );
        let mut masters = (0..3)
            .map(|m| {
                start_master(
                    &api.kubeconfig,
                    &lease,
                    &dir.join(format!("{lease}-{m}.log")),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let mut leader = 0;
        wait_for("a master leads", || {
            leader = (0..3).find(|&m| serves(masters[m].port)).unwrap_or(3);
            leader < 3
        })?;
        let client = Client::setup(&ClientConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: metadata.clone(),
            global_segment_size: 16 << 20,
            local_buffer_size: 16 << 20,
            protocol: "tcp".into(),
            device_name: String::new(),
            master_server_address: format!("k8s://{NS}/{lease}"),
            ..ClientConfig::default()
        })?;
        let value = vec![7u8; 4096];
        client.put("before", &value, &Default::default())?;
        let old = &mut masters[leader];
        let signalled = Instant::now();
        // SAFETY: kill(2) on the pid of our own unreaped child.
        unsafe { libc::kill(old.child.id() as i32, stop.signal()) };
        // Puts start once the old leader is gone, so that none lands on it.
        let _ = old.child.wait();
        wait_for("a put through the new leader", || {
            client.put("after", &value, &Default::default()).is_ok()
        })?;
        let round = Round {
            stop,
            first_put_s: signalled.elapsed().as_secs_f64(),
        };
        progress(&round);
        out.push(round);
    }
    Ok(out)
}

fn metadata_server(dir: &Path) -> Result<(cluster::Proc, String)> {
    let (exe, mut args) = cluster::program("mooncake_http_metadata_server")?;
    args.extend(["--port=0".to_string(), "--host=127.0.0.1".into()]);
    let (proc, line) = cluster::Proc::spawn(
        "mooncake_http_metadata_server",
        &exe,
        args,
        &[],
        dir.join("metadata.log"),
        "listening on",
    )?;
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_owned();
    Ok((proc, format!("http://{addr}/metadata")))
}

/// Median, min and max per kind of stop, as a Markdown table.
/// Each round's time to the first put through the new leader, drawn.
pub fn charts(rounds: &[Round]) -> Vec<crate::svg::Bars> {
    let rows = rounds
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("{} #{}", r.stop.name(), i + 1), r.first_put_s))
        .collect();
    vec![crate::svg::Bars::new(
        "Leader stopped: time to the first put",
        "s",
        rows,
    )]
}

pub fn render(rounds: &[Round]) -> String {
    let mut rows = Vec::new();
    for stop in [Stop::Kill9, Stop::Sigterm] {
        let mut t: Vec<f64> = rounds
            .iter()
            .filter(|r| r.stop == stop)
            .map(|r| r.first_put_s)
            .collect();
        if t.is_empty() {
            continue;
        }
        t.sort_by(f64::total_cmp);
        rows.push(vec![
            stop.name().to_string(),
            t.len().to_string(),
            format!("{:.2}", t[t.len() / 2]),
            format!("{:.2}", t[0]),
            format!("{:.2}", t[t.len() - 1]),
        ]);
    }
    crate::stats::table(
        &[
            "leader stopped by",
            "rounds",
            "first put, median s",
            "min s",
            "max s",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_median_min_max_per_stop() {
        let r = |stop, s| Round {
            stop,
            first_put_s: s,
        };
        let t = render(&[
            r(Stop::Kill9, 6.0),
            r(Stop::Kill9, 5.5),
            r(Stop::Kill9, 7.0),
            r(Stop::Sigterm, 1.1),
        ]);
        assert!(t.contains("| kill -9 | 3 | 6.00 | 5.50 | 7.00 |"), "{t}");
        assert!(t.contains("| SIGTERM | 1 | 1.10 | 1.10 | 1.10 |"), "{t}");
    }
}
