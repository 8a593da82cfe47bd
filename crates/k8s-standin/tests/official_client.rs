//! The stand-in against the official Kubernetes Python client, over HTTPS
//! with a bearer token: see `official_client.py` for the checks.
//!
//! It runs Debian's `/usr/bin/python3`, where the `python3-kubernetes`
//! package installs (`scripts/install-deps.sh --test` installs it; a venv
//! would not see Debian's dist-packages). Without the package the test
//! fails, saying so.

use std::process::Command;

use k8s_standin::{tls::TestCa, StandIn};

const PYTHON: &str = "/usr/bin/python3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_sees_a_real_api_server() {
    let probe = Command::new(PYTHON)
        .args(["-c", "import kubernetes"])
        .output()
        .expect("run /usr/bin/python3");
    assert!(
        probe.status.success(),
        "{PYTHON} cannot import kubernetes: install Debian's python3-kubernetes \
         (scripts/install-deps.sh --test): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let ca = TestCa::generate();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let standin = StandIn::new();
    standin.add_token("s3cret", "system:serviceaccount:mooncake:master");
    standin.add_pod("mooncake", "master-0");
    let url = k8s_standin::spawn(standin.clone(), Some(ca.acceptor())).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/official_client.py");
    let out = tokio::process::Command::new(PYTHON)
        .arg(script)
        .arg(&url)
        .arg("s3cret")
        .arg(&ca_file)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}\n{stderr}");
    // The script's writes landed in the stand-in.
    let lease = standin
        .object(k8s_standin::Kind::Lease, "mooncake", "leader")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "10.0.0.2:50051");
    assert_eq!(lease["spec"]["renewTime"], "2024-05-06T07:08:09.123456Z");
}
