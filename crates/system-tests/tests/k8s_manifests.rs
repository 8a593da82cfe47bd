//! The files of `deploy/k8s/` say what the programs accept: the masters'
//! and storage clients' arguments parse (with the downward-API variables
//! substituted as the kubelet does), the masters elect on the k8s backend,
//! and the Role grants what the election and the leader label use.

use std::path::PathBuf;

use clap::Parser;
use mooncake_store::ha::ElectionBackend;
use serde::Deserialize;
use serde_yaml::Value;

fn manifest(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/k8s")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// `command` + `args` of the workload's first container, `$(VAR)` expanded.
fn argv(workload: &Value) -> Vec<String> {
    let c = &workload["spec"]["template"]["spec"]["containers"][0];
    let words = |k: &str| -> Vec<String> {
        c[k].as_sequence()
            .map(|s| s.iter().map(|w| w.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let vars = [
        ("$(POD_NAMESPACE)", "mooncake"),
        ("$(POD_NAME)", "mooncake-master-0"),
        ("$(POD_IP)", "10.1.2.3"),
    ];
    let mut argv = words("command");
    argv.extend(words("args").into_iter().map(|mut a| {
        for (k, v) in vars {
            a = a.replace(k, v);
        }
        assert!(!a.contains("$("), "unexpanded variable in {a:?}");
        a
    }));
    argv
}

#[test]
fn masters_parse_and_elect_on_the_lease() {
    let deployment = &manifest("masters.yaml")[0];
    assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(3));
    let config = mooncake_cli::master::parse(argv(deployment)).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(config.enable_ha);
    match config.ha_backend().unwrap() {
        ElectionBackend::K8s(lease, timings) => {
            assert_eq!(lease.to_string(), "mooncake/mooncake-master");
            assert_eq!(timings, Default::default());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(config.rpc_address, "10.1.2.3");
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap();
    let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"POD_NAME") && names.contains(&"POD_NAMESPACE"));
}

#[test]
fn the_storage_client_finds_the_leader_through_the_lease() {
    let ds = &manifest("storage-daemonset.yaml")[0];
    let argv = argv(ds);
    assert_eq!(argv[0], "mooncake_client");
    let args = mooncake_cli::client::Args::try_parse_from(&argv).unwrap();
    assert_eq!(args.master_server_address, "k8s://mooncake/mooncake-master");
    assert!(matches!(
        ElectionBackend::parse(&args.master_server_address, false).unwrap(),
        ElectionBackend::K8s(..)
    ));
}

#[test]
fn the_role_grants_what_the_masters_use() {
    let rbac = manifest("rbac.yaml");
    let role = rbac
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "mooncake-master")
        .unwrap();
    let grants = |group: &str, resource: &str| -> Vec<String> {
        role["rules"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter(|r| {
                r["apiGroups"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .any(|g| g == group)
                    && r["resources"]
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .any(|x| x == resource)
            })
            .flat_map(|r| r["verbs"].as_sequence().unwrap().clone())
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let leases = grants("coordination.k8s.io", "leases");
    for verb in ["get", "create", "update"] {
        assert!(leases.iter().any(|v| v == verb), "leases {verb}");
    }
    assert!(grants("", "pods").iter().any(|v| v == "patch"));
    let service = &manifest("service.yaml")[0];
    assert_eq!(
        service["spec"]["selector"]["mooncake.io/store-role"].as_str(),
        Some("leader")
    );
}
