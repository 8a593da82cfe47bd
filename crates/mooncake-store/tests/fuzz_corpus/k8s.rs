//! Seeds for the Kubernetes Lease and kubeconfig targets.

use super::*;

/// A Lease as the API server returns it.
fn lease(record: &LeaseRecord, version: &str) -> Vec<u8> {
    serde_json::to_vec_pretty(&json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "mooncake-master",
            "namespace": "default",
            "resourceVersion": version,
            "uid": "5f0c2a4e-1b7c-4d7e-9a0e-3c1f2b9d8e70",
            "creationTimestamp": "2024-01-01T00:00:00Z",
        },
        "spec": record.to_spec(),
    }))
    .unwrap()
}

fn lease_seeds() -> Seeds {
    let now = UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
    let held = LeaseRecord::acquired("10.0.0.1:50051", 5, 3, now);
    let renewed = held.renewed(5, now + Duration::from_secs(1));
    let released = renewed.released(now + Duration::from_secs(2));
    let mut seeds = Seeds::new();
    seeds.insert("held".into(), lease(&held, "100"));
    seeds.insert("renewed".into(), lease(&renewed, "101"));
    seeds.insert("released".into(), lease(&released, "102"));
    seeds.insert(
        "no_spec".into(),
        br#"{"kind":"Lease","metadata":{"resourceVersion":"1"}}"#.to_vec(),
    );
    seeds.insert(
        "status_conflict".into(),
        serde_json::to_vec(&json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "Operation cannot be fulfilled on leases.coordination.k8s.io \"mooncake-master\": the object has been modified",
            "reason": "Conflict", "code": 409,
        }))
        .unwrap(),
    );
    seeds.insert(
        "offset_time".into(),
        b"2024-02-29T23:59:59.999999999+05:30".to_vec(),
    );
    seeds
}

/// Kubeconfigs: the fuzz target only loads files without path separators
/// (but for `http(s)://`), escapes or tags, so these have none.
fn kubeconfig_seeds() -> Seeds {
    let mut seeds = Seeds::new();
    seeds.insert(
        "token".into(),
        b"apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
contexts:
- name: dev
  context:
    cluster: c
    user: u
users:
- name: u
  user:
    token: abc.def
"
        .to_vec(),
    );
    seeds.insert(
        "client_cert_data".into(),
        b"current-context: prod
clusters:
- name: prod
  cluster:
    server: https://k8s.example:443
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
contexts:
- name: prod
  context: {cluster: prod, user: admin}
users:
- name: admin
  user:
    client-certificate-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
    client-key-data: LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCg==
"
        .to_vec(),
    );
    seeds.insert(
        "files_and_basic".into(),
        b"current-context: a
clusters:
- {name: a, cluster: {server: http://h:8080, certificate-authority: ca.crt}}
contexts:
- {name: a, context: {cluster: a, user: b}}
users:
- {name: b, user: {username: admin, password: secret, tokenFile: token}}
"
        .to_vec(),
    );
    seeds.insert(
        "exec_plugin".into(),
        b"current-context: a
clusters: [{name: a, cluster: {server: https://h}}]
contexts: [{name: a, context: {cluster: a, user: e}}]
users: [{name: e, user: {exec: {command: aws, args: [eks, get-token]}}}]
"
        .to_vec(),
    );
    seeds
}

#[test]
fn k8s_seeds() {
    let kubeconfigs = kubeconfig_seeds();
    for (name, text) in &kubeconfigs {
        let rest = String::from_utf8_lossy(text)
            .replace("https://", "")
            .replace("http://", "");
        assert!(
            !rest.contains(['/', '\\', '!']),
            "{name}: the target would skip it"
        );
    }
    check_or_write("mooncake-store", "k8s_lease", &lease_seeds());
    check_or_write("mooncake-store", "kubeconfig", &kubeconfigs);
}
