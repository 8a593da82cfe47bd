//! The `k8s-standin` process, as process-level tests run it: the kubeconfig
//! it writes, TLS with its CA, token checks, pods, and the fault switches.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_serves_what_its_kubeconfig_says() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_k8s-standin"))
        .args([
            "--tls",
            "--token",
            "tok",
            "--pod",
            "mooncake/master-0",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _guard = Killed(child);
    let mut url = String::new();
    BufReader::new(stdout).read_line(&mut url).unwrap();
    let url = url.trim().to_string();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    let config = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(config.contains(&format!("server: {url}")), "{config}");
    assert!(config.contains("token: tok"), "{config}");
    let ca_line = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority: "))
        .unwrap_or_else(|| panic!("no CA in {config}"));
    let ca = std::fs::read(ca_line).unwrap();
    let http = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let pod = format!("{url}/api/v1/namespaces/mooncake/pods/master-0");
    let lease = format!("{url}/apis/coordination.k8s.io/v1/namespaces/mooncake/leases/l");
    let status = |r: reqwest::Response| r.status().as_u16();

    assert_eq!(status(http.get(&pod).send().await.unwrap()), 401);
    assert_eq!(
        status(http.get(&pod).bearer_auth("tok").send().await.unwrap()),
        200
    );
    assert_eq!(
        status(http.get(&lease).bearer_auth("tok").send().await.unwrap()),
        404
    );

    let control = |what: &str| http.post(format!("{url}/standin/{what}")).send();
    assert_eq!(
        status(control("deny?verb=get&resource=pods").await.unwrap()),
        200
    );
    let denied = http.get(&pod).bearer_auth("tok").send().await.unwrap();
    assert_eq!(denied.status().as_u16(), 403);
    let body: serde_json::Value = denied.json().await.unwrap();
    assert_eq!(body["reason"], "Forbidden");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("cannot get resource \"pods\""),
        "{body}"
    );
    control("allow?verb=get&resource=pods").await.unwrap();

    control("freeze").await.unwrap();
    let held = tokio::time::timeout(
        Duration::from_millis(500),
        http.get(&pod).bearer_auth("tok").send(),
    )
    .await;
    assert!(held.is_err(), "answered while frozen");
    control("thaw").await.unwrap();
    assert_eq!(
        status(http.get(&pod).bearer_auth("tok").send().await.unwrap()),
        200
    );
}
