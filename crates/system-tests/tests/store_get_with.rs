//! `Client::get_with`: a whole object into caller memory allocated once its
//! size is known, from the own segment (one copy) and from another node's
//! segment (through staging), against a real `mooncake_master`.

use mooncake_common::{Error, ErrorCode};
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::ReplicaPolicy;
use test_support::ports::MasterPorts;
use test_support::process::{field, spawn_until_line, Proc};

static MASTER: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| mooncake_system_tests::program("mooncake_master"));

fn master() -> (Proc, String, String) {
    let mut args = MasterPorts::ANY.args();
    args.extend(
        [
            "--rpc_address=127.0.0.1",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            "--metrics_host=127.0.0.1",
        ]
        .map(String::from),
    );
    let (proc, line) = spawn_until_line(&MASTER, &args, "listening");
    let rpc = field(&line, "rpc").unwrap().to_string();
    let meta = format!("http://{}/metadata", field(&line, "metadata").unwrap());
    (proc, rpc, meta)
}

fn client(rpc: &str, meta: &str, segment: u64) -> Client {
    Client::setup(&ClientConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: meta.into(),
        global_segment_size: segment,
        local_buffer_size: 8 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: rpc.into(),
        ..ClientConfig::default()
    })
    .unwrap()
}

fn read(c: &Client, key: &str) -> Result<(Vec<u8>, usize), Error> {
    let mut buf = Vec::new();
    let mut calls = 0;
    let n = c.get_with(key, |size| {
        calls += 1;
        buf.resize(size, 0xee);
        Ok(buf.as_mut_slice())
    })?;
    assert_eq!(calls, 1);
    Ok((buf, n))
}

#[test]
fn reads_own_and_remote_replicas_into_caller_memory() {
    let (_master, rpc, meta) = master();
    let owner = client(&rpc, &meta, 64 << 20);
    let reader = client(&rpc, &meta, 0);
    let value: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    owner
        .put("gw/k", &value, &ReplicaPolicy::default())
        .unwrap();

    for c in [&owner, &reader] {
        let (got, n) = read(c, "gw/k").unwrap();
        assert_eq!(n, value.len());
        assert!(got == value, "bytes differ");
    }

    // A missing key never asks for memory.
    for c in [&owner, &reader] {
        let e = c
            .get_with("gw/missing", |_| -> Result<&mut [u8], Error> {
                panic!("dest asked for a missing key")
            })
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::OBJECT_NOT_FOUND);
        assert_eq!(
            c.get_with("", |_| -> Result<&mut [u8], Error> { panic!("empty key") })
                .unwrap_err()
                .code,
            ErrorCode::OBJECT_NOT_FOUND
        );
    }

    // A destination of the wrong size, or one that fails, is refused.
    let mut small = vec![0u8; 10];
    assert_eq!(
        owner
            .get_with("gw/k", |_| Ok(small.as_mut_slice()))
            .unwrap_err()
            .code,
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        reader
            .get_with("gw/k", |_| Err(Error::new(
                ErrorCode::BUFFER_OVERFLOW,
                "no room"
            )))
            .unwrap_err()
            .code,
        ErrorCode::BUFFER_OVERFLOW
    );
    // Still readable afterwards.
    assert!(read(&reader, "gw/k").unwrap().0 == value);
}

/// Reads a batch through `get_batch_with` from both clients: own segment,
/// same-host shared memory (or TCP through staging when the environment
/// forces it), a missing key in the middle, an empty value.
fn batch_reads(rpc: &str, meta: &str) {
    let owner = client(rpc, meta, 64 << 20);
    let reader = client(rpc, meta, 0);
    let cfg = ReplicaPolicy::default();
    let values: Vec<Vec<u8>> = [1usize, 4096, 1 << 20, 3_000_001]
        .iter()
        .enumerate()
        .map(|(s, &n)| (0..n).map(|i| (i * 13 + s) as u8).collect())
        .collect();
    let mut keys: Vec<String> = Vec::new();
    for (i, v) in values.iter().enumerate() {
        keys.push(format!("gb/{i}"));
        owner.put(&keys[i], v, &cfg).unwrap();
    }
    keys.insert(2, "gb/missing".into());
    for c in [&owner, &reader] {
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        let mut calls = 0;
        let got = c.get_batch_with(&keys, |sizes| {
            calls += 1;
            bufs = sizes.iter().map(|s| vec![0xee; s.unwrap_or(0)]).collect();
            Ok(bufs
                .iter_mut()
                .zip(sizes)
                .map(|(b, s)| s.map(|_| b.as_mut_slice()))
                .collect())
        });
        assert_eq!(calls, 1);
        assert_eq!(got.len(), keys.len());
        assert_eq!(
            got[2].as_ref().unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
        let found: Vec<usize> = (0..keys.len()).filter(|&i| i != 2).collect();
        for (&i, v) in found.iter().zip(&values) {
            assert_eq!(*got[i].as_ref().unwrap(), v.len());
            assert!(bufs[i] == *v, "key {} differs", keys[i]);
        }
        // Destinations of the wrong size fail the batch, nothing is written out of bounds.
        let mut small = vec![vec![0u8; 3]; keys.len()];
        let got = c.get_batch_with(&keys, |_| {
            Ok(small.iter_mut().map(|b| Some(b.as_mut_slice())).collect())
        });
        for (i, r) in got.iter().enumerate() {
            let want = if i == 2 {
                ErrorCode::OBJECT_NOT_FOUND
            } else {
                ErrorCode::INVALID_PARAMS
            };
            assert_eq!(r.as_ref().unwrap_err().code, want, "key {}", keys[i]);
        }
        // Only missing keys: no destination asked.
        let got = c.get_batch_with(
            &["gb/nope".to_string()],
            |_| -> Result<Vec<Option<&mut [u8]>>, Error> { panic!("dest asked for missing keys") },
        );
        assert_eq!(
            got[0].as_ref().unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
    }
}

#[test]
fn batch_reads_into_caller_memory() {
    let (_master, rpc, meta) = master();
    batch_reads(&rpc, &meta);
}

/// The same with shared memory and memcpy off: remote replicas come over
/// TCP through the staging pool. Runs in a child process because the
/// transport switches are read from the environment.
#[test]
fn batch_reads_into_caller_memory_over_tcp() {
    if std::env::var_os("MC_GET_WITH_CHILD").is_some() {
        let (_master, rpc, meta) = master();
        batch_reads(&rpc, &meta);
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "batch_reads_into_caller_memory_over_tcp",
            "--nocapture",
        ])
        .env("MC_GET_WITH_CHILD", "1")
        .env("MC_FORCE_TCP", "1")
        .env("MC_STORE_MEMCPY", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "the child ran the test"
    );
}
