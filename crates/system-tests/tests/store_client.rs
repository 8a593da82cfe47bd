//! The store client against real processes: `mooncake_master`, a
//! `mooncake_http_metadata_server`, storage nodes run as `mooncake_client`
//! processes, and in-test pure clients. Ports are free loopback ports; every
//! wait is bounded.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::{ReplicaPolicy, WriteOptions, MAX_KEY_LEN};
use mooncake_store::{MasterClient, MooncakeStore};

static UMBRELLA: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| mooncake_system_tests::program("mooncake"));

mod common;
use common::*;

#[test]
fn two_storage_nodes_and_a_pure_client() {
    let cluster = Cluster::start(&["--allow_force_remove_all"]);
    let a = cluster.storage("32MB");
    let b = cluster.storage("32MB");
    let client = cluster.pure_client();
    let cfg = ReplicaPolicy::default();

    // Single put/get, replicas on distinct segments.
    client.put("k1", &value("k1", 1000), &cfg).unwrap();
    assert_eq!(client.get("k1").unwrap(), value("k1", 1000));
    let two = ReplicaPolicy {
        replica_num: 2,
        ..Default::default()
    };
    client.put("k2", &value("k2", 300_000), &two).unwrap();
    let mut expected = vec![a.segment.clone(), b.segment.clone()];
    expected.sort();
    assert_eq!(segments_of(&client, "k2"), expected);
    assert_eq!(client.get("k2").unwrap(), value("k2", 300_000));
    assert_eq!(
        code(client.put("k2", b"again", &cfg)),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );

    // Sizes, existence, parts, upsert, buffers.
    assert_eq!(client.get_size("k2").unwrap(), 300_000);
    assert!(client.is_exist("k1").unwrap());
    assert!(!client.is_exist("nope").unwrap());
    let keys: Vec<String> = ["k1", "nope", "k2"].map(String::from).to_vec();
    let exist: Vec<bool> = client
        .batch_is_exist(&keys)
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(exist, [true, false, true]);
    client
        .put_parts("parts", &[b"Hello, ", b"World!"], &cfg)
        .unwrap();
    assert_eq!(client.get("parts").unwrap(), b"Hello, World!");
    client
        .put(
            "parts",
            b"replaced, longer value",
            WriteOptions::upsert(&cfg),
        )
        .unwrap();
    assert_eq!(client.get("parts").unwrap(), b"replaced, longer value");
    client
        .put("fresh", b"inserted", WriteOptions::upsert(&cfg))
        .unwrap();
    assert_eq!(&*client.get_buffer("fresh").unwrap(), b"inserted");

    // Batches: one bad key fails alone.
    let bkeys: Vec<String> = (0..20).map(|i| format!("batch-{i}")).collect();
    let vals: Vec<Vec<u8>> = bkeys.iter().map(|k| value(k, 4096 + k.len())).collect();
    let refs: Vec<&[u8]> = vals.iter().map(Vec::as_slice).collect();
    for r in client.put_batch(&bkeys, &refs, &two).unwrap() {
        r.unwrap();
    }
    let mut with_missing = bkeys.clone();
    with_missing.push("missing".into());
    let got = client.get_batch(&with_missing);
    for (i, r) in got.iter().take(20).enumerate() {
        assert_eq!(r.as_ref().unwrap(), &vals[i]);
    }
    assert_eq!(
        got[20].as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    let handles = client.batch_get_buffer(&bkeys[..3]);
    assert_eq!(handles[2].as_ref().unwrap().as_slice(), vals[2].as_slice());

    // Zero copy through registered memory.
    let mut src = value("zc", 1 << 20);
    let mut dst = vec![0u8; 1 << 20];
    client
        .register_buffer(src.as_mut_ptr() as usize, src.len())
        .unwrap();
    client
        .register_buffer(dst.as_mut_ptr() as usize, dst.len())
        .unwrap();
    client
        .put_from("zc", src.as_ptr() as usize, src.len(), &two)
        .unwrap();
    assert_eq!(
        client
            .get_into("zc", dst.as_mut_ptr() as usize, dst.len())
            .unwrap(),
        1 << 20
    );
    assert_eq!(dst, src);
    // Multi-buffer put: value is the concatenation; read it back scattered.
    let (s, d) = (src.as_ptr() as usize, dst.as_mut_ptr() as usize);
    let mk = vec!["multi".to_string()];
    for r in client
        .batch_put_from_multi_buffers(&mk, &[vec![s, s + 100]], &[vec![10, 20]], &cfg)
        .unwrap()
    {
        r.unwrap();
    }
    dst.fill(0);
    let r = client
        .batch_get_into_multi_buffers(&mk, &[vec![d + 1000, d]], &[vec![5, 100]], true)
        .unwrap();
    assert_eq!(*r[0].as_ref().unwrap(), 30);
    assert_eq!(&dst[1000..1005], &src[..5]);
    assert_eq!(&dst[..5], &src[5..10]);
    assert_eq!(&dst[5..25], &src[100..120]);
    // Metadata + data.
    client
        .put_from_with_metadata("meta", s + 64, s, 100, 16, &cfg)
        .unwrap();
    let mut expect = src[..16].to_vec();
    expect.extend_from_slice(&src[64..164]);
    assert_eq!(client.get("meta").unwrap(), expect);
    // Ranged reads with one bad fragment that fails alone.
    dst.fill(0);
    let res = client.get_into_ranges(
        &[d],
        &[vec!["zc".to_string(), "missing".to_string()]],
        &[vec![vec![0, 16, 1 << 20], vec![0]]],
        &[vec![vec![128, 4096, 0], vec![0]]],
        &[vec![vec![8, 12, 4], vec![4]]],
    );
    assert_eq!(*res[0][0][0].as_ref().unwrap(), 8);
    assert_eq!(*res[0][0][1].as_ref().unwrap(), 12);
    assert_eq!(
        res[0][0][2].as_ref().unwrap_err().code,
        ErrorCode::BUFFER_OVERFLOW
    );
    assert_eq!(
        res[0][1][0].as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(&dst[..8], &src[128..136]);
    assert_eq!(&dst[16..28], &src[4096..4108]);
    // Batch zero copy.
    let zk: Vec<String> = (0..4).map(|i| format!("zc-{i}")).collect();
    let addrs: Vec<usize> = (0..4).map(|i| s + i * 1000).collect();
    for r in client
        .batch_put_from(&zk, &addrs, &[1000; 4], &cfg)
        .unwrap()
    {
        r.unwrap();
    }
    let daddrs: Vec<usize> = (0..4).map(|i| d + i * 1000).collect();
    dst.fill(0);
    for r in client.batch_get_into(&zk, &daddrs, &[1000; 4]).unwrap() {
        assert_eq!(r.unwrap(), 1000);
    }
    assert_eq!(&dst[..4000], &src[..4000]);
    client.unregister_buffer(s).unwrap();
    client.unregister_buffer(d).unwrap();

    // A second pure client sees the same data; removal is visible to all.
    let other = cluster.pure_client();
    assert_eq!(other.get("k2").unwrap(), value("k2", 300_000));
    eventually("lease on k1 expires", || client.remove("k1", false).is_ok());
    assert_eq!(code(other.get("k1")), ErrorCode::OBJECT_NOT_FOUND);
    let removed = client.batch_remove(&bkeys[..2], true).unwrap();
    assert!(removed.iter().all(Result::is_ok));
    assert_eq!(client.remove_by_regex("^batch-1[0-9]$", true).unwrap(), 10);
    assert!(client.remove_all(true).unwrap() > 0);
    assert!(!other.is_exist("k2").unwrap());
    client.health_check().unwrap();
    client.close().unwrap();
    assert_eq!(
        code(client.get("k2")),
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
    );
    drop((a, b));
}

#[test]
fn killed_storage_node_loses_only_its_objects() {
    let cluster = Cluster::start(&[]);
    let mut a = cluster.storage("16MB");
    let b = cluster.storage("16MB");
    let client = cluster.pure_client();
    for i in 0..10 {
        client
            .put(
                &format!("a-{i}"),
                &value(&format!("a-{i}"), 5000),
                &pinned_to(&a.segment),
            )
            .unwrap();
        client
            .put(
                &format!("b-{i}"),
                &value(&format!("b-{i}"), 5000),
                &pinned_to(&b.segment),
            )
            .unwrap();
    }
    assert_eq!(segments_of(&client, "a-0"), vec![a.segment.clone()]);
    assert_eq!(segments_of(&client, "b-0"), vec![b.segment.clone()]);
    a.proc.kill9();
    // After client_ttl the master drops the dead node's objects...
    eventually("a-* disappear", || !client.is_exist("a-0").unwrap());
    for i in 0..10 {
        assert_eq!(
            code(client.get(&format!("a-{i}"))),
            ErrorCode::OBJECT_NOT_FOUND
        );
        // ...and the others stay readable.
        let k = format!("b-{i}");
        assert_eq!(client.get(&k).unwrap(), value(&k, 5000));
    }
    // New puts land on the survivor.
    client
        .put("after", b"still working", &ReplicaPolicy::default())
        .unwrap();
    assert_eq!(segments_of(&client, "after"), vec![b.segment.clone()]);
}

/// Child half of `client_killed_mid_put`: starts a put and hangs.
#[test]
fn child_mid_put() {
    let Ok(master) = std::env::var("MOONCAKE_TEST_CHILD_MASTER") else {
        return;
    };
    let m = MasterClient::connect(&master).unwrap();
    let id: u128 = 0xdead_beef;
    let _ = m.ping(id);
    m.put_start(id, "half-written", 12 << 20, &WriteOptions::default())
        .unwrap();
    println!("put started");
    loop {
        let _ = m.ping(id);
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn client_killed_mid_put() {
    let cluster = Cluster::start(&[]);
    let _s = cluster.storage("16MB");
    let client = cluster.pure_client();
    let (mut child, _) = {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "child_mid_put",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MOONCAKE_TEST_CHILD_MASTER", &cluster.master_addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut c = cmd.spawn().unwrap();
        let out = c.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.contains("put started") {
                    let _ = tx.send(());
                }
            }
        });
        let p = Proc(c);
        rx.recv_timeout(WAIT).expect("child never started its put");
        (p, ())
    };
    // The half-written object is invisible, and its 12 of 16 MB are taken.
    assert!(!client.is_exist("half-written").unwrap());
    let c = code(client.get("half-written"));
    assert!(
        matches!(
            c,
            ErrorCode::OBJECT_NOT_FOUND | ErrorCode::REPLICA_IS_NOT_READY
        ),
        "{c:?}"
    );
    child.kill9();
    // Once the master gives up on the dead client the space comes back.
    let big = value("big", 12 << 20);
    eventually("space of the dead put is reclaimed", || {
        client.put("big", &big, &ReplicaPolicy::default()).is_ok()
    });
    assert_eq!(client.get("big").unwrap(), big);
    assert!(!client.is_exist("half-written").unwrap());
    assert_eq!(
        code(client.get("half-written")),
        ErrorCode::OBJECT_NOT_FOUND
    );
}

#[test]
fn eviction_never_drops_pinned_objects() {
    let cluster = Cluster::start(&[
        "--eviction_high_watermark_ratio=0.8",
        "--eviction_ratio=0.2",
    ]);
    let _s = cluster.storage("16MB");
    let client = cluster.pure_client();
    let pin = ReplicaPolicy {
        with_hard_pin: true,
        ..Default::default()
    };
    for i in 0..4 {
        let k = format!("pinned-{i}");
        client.put(&k, &value(&k, 1 << 20), &pin).unwrap();
    }
    // Far more than fits: puts may fail while eviction catches up, never the pinned data.
    let mut stored = 0;
    for i in 0..60 {
        let k = format!("filler-{i}");
        let v = value(&k, 1 << 20);
        let deadline = Instant::now() + WAIT;
        loop {
            match client.put(&k, &v, &ReplicaPolicy::default()) {
                Ok(()) => {
                    stored += 1;
                    break;
                }
                Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("{k}: {e}"),
            }
        }
    }
    assert_eq!(stored, 60);
    let survivors = (0..60)
        .filter(|i| client.is_exist(&format!("filler-{i}")).unwrap())
        .count();
    assert!(survivors < 60, "something was evicted");
    for i in 0..4 {
        let k = format!("pinned-{i}");
        assert_eq!(client.get(&k).unwrap(), value(&k, 1 << 20), "{k}");
    }
}

#[test]
fn bad_inputs_get_codes_and_the_master_keeps_serving() {
    let cluster = Cluster::start(&[]);
    // No segment mounted yet.
    let client = cluster.pure_client();
    let cfg = ReplicaPolicy::default();
    let c = code(client.put("k", b"v", &cfg));
    assert!(
        matches!(
            c,
            ErrorCode::SEGMENT_NOT_FOUND | ErrorCode::NO_AVAILABLE_HANDLE
        ),
        "{c:?}"
    );
    let _s = cluster.storage("16MB");

    // Codes as the reference answers them: an empty key is INVALID_PARAMS to
    // write and "not found" to read; a value larger than the local buffer is
    // INVALID_PARAMS before the master is asked.
    assert_eq!(code(client.put("", b"v", &cfg)), ErrorCode::INVALID_PARAMS);
    assert_eq!(code(client.get_size("")), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(code(client.remove("", false)), ErrorCode::OBJECT_NOT_FOUND);
    assert!(!client.is_exist("").unwrap());
    assert_eq!(
        code(client.put("over-buffer", &vec![1u8; 65 << 20], &cfg)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(client.put(&"k".repeat(MAX_KEY_LEN + 1), b"v", &cfg)),
        ErrorCode::INVALID_KEY
    );
    assert_eq!(code(client.put("k", b"", &cfg)), ErrorCode::INVALID_PARAMS);
    assert_eq!(code(client.get("")), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(code(client.get("missing")), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(
        code(client.get_size("missing")),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(client.remove("missing", false)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    // Larger than any segment; larger than any value.
    let mut buf = vec![7u8; 4096];
    let addr = buf.as_mut_ptr() as usize;
    client.register_buffer(addr, 1024).unwrap();
    assert_eq!(
        code(client.put("huge", &vec![1u8; 20 << 20], &cfg)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    assert_eq!(
        code(client.put_from("huge", addr, (1usize << 40) + 1, &cfg)),
        ErrorCode::INVALID_PARAMS
    );
    // Mismatched batch lengths.
    let keys = vec!["a".to_string(), "b".to_string()];
    assert_eq!(
        code(client.put_batch(&keys, &[b"x"], &cfg)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(client.batch_get_into(&keys, &[addr], &[8, 8])),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(client.batch_put_from(&keys, &[addr, addr], &[8], &cfg)),
        ErrorCode::INVALID_PARAMS
    );
    let shaped = client.get_into_ranges(
        &[addr],
        &[vec!["a".into()]],
        &[vec![vec![0, 1]]],
        &[vec![vec![0]]],
        &[vec![vec![1]]],
    );
    assert!(shaped[0][0]
        .iter()
        .all(|r| r.as_ref().unwrap_err().code == ErrorCode::INVALID_PARAMS));
    // Unregistered pointers, for writes and reads.
    let mut private = vec![0u8; 64];
    let p = private.as_mut_ptr() as usize;
    assert_eq!(
        code(client.put_from("k", p, 64, &cfg)),
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED
    );
    client.put("k", &[3u8; 100], &cfg).unwrap();
    assert_eq!(
        code(client.get_into("k", p, 64)),
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED
    );
    assert_eq!(
        code(client.put_from("k2", addr + 1000, 100, &cfg)),
        ErrorCode::BUFFER_OVERFLOW
    );
    // get_into with a buffer too small: an error and no byte written anywhere.
    assert_eq!(
        code(client.get_into("k", addr, 99)),
        ErrorCode::BUFFER_OVERFLOW
    );
    assert!(
        buf.iter().all(|&b| b == 7),
        "get_into wrote despite the error"
    );
    assert_eq!(client.get_into("k", addr, 100).unwrap(), 100);
    assert!(buf[..100].iter().all(|&b| b == 3) && buf[100..].iter().all(|&b| b == 7));
    assert!(private.iter().all(|&b| b == 0));
    assert_eq!(
        code(client.unregister_buffer(p)),
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED
    );
    assert_eq!(
        code(client.register_buffer(0, 10)),
        ErrorCode::INVALID_PARAMS
    );
    // A storage-only node refuses plain puts and gets with a code.
    let storage_only = Client::setup(&cluster.config(4 << 20, 0)).unwrap();
    assert_eq!(
        code(storage_only.put("so", b"v", &cfg)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(code(storage_only.get("k")), ErrorCode::INVALID_PARAMS);
    // A malformed frame to the master is refused; the master keeps serving.
    {
        use std::io::Write;
        let mut s = TcpStream::connect(&cluster.master_addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(&[5, 0, 0, 0, 1, 250, 1, 2, 3]).unwrap();
        // An error answer or a closed connection; either way no hang.
        let mut answer = Vec::new();
        let _ = mooncake_store::proto::frame::read_frame(&mut s, &mut answer);
    }
    client.health_check().unwrap();
    assert_eq!(client.get("k").unwrap(), vec![3u8; 100]);
    storage_only.close().unwrap();
    client.unregister_buffer(addr).unwrap();
}

#[test]
fn concurrent_put_get_remove_match_a_model() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let cluster = Cluster::start(&[]);
    let _s = cluster.storage("64MB");
    let client = cluster.pure_client();
    const KEYS: usize = 12;
    // Every value names its key and version, so a torn or foreign read shows.
    fn versioned(key: usize, version: u32) -> Vec<u8> {
        let mut v = format!("key{key}:v{version}:").into_bytes();
        let len = 1000 + (version as usize * 7919) % 20000;
        while v.len() < len {
            v.push((v.len() as u32 ^ version) as u8);
        }
        v
    }
    let written: Arc<Mutex<HashMap<usize, Vec<Vec<u8>>>>> = Arc::default();
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let c = client.clone();
            let written = written.clone();
            std::thread::spawn(move || {
                for i in 0..150u32 {
                    let key = ((t * 7 + i * 3) as usize) % KEYS;
                    let name = format!("c-{key}");
                    match (t + i) % 3 {
                        0 => {
                            let v = versioned(key, t * 1000 + i);
                            written
                                .lock()
                                .unwrap()
                                .entry(key)
                                .or_default()
                                .push(v.clone());
                            match c.put(&name, &v, &ReplicaPolicy::default()) {
                                Ok(()) => {}
                                // Stored already, or another thread's put in flight.
                                Err(e) => assert!(
                                    matches!(
                                        e.code,
                                        ErrorCode::OBJECT_ALREADY_EXISTS
                                            | ErrorCode::OBJECT_REPLICA_BUSY
                                    ),
                                    "{e}"
                                ),
                            }
                        }
                        1 => match c.get(&name) {
                            Ok(v) => {
                                let ok = written
                                    .lock()
                                    .unwrap()
                                    .get(&key)
                                    .is_some_and(|vs| vs.contains(&v));
                                assert!(ok, "get {name} returned bytes nobody put");
                            }
                            // Missing, or a put of it is in flight: never partial bytes.
                            Err(e) => assert!(
                                matches!(
                                    e.code,
                                    ErrorCode::OBJECT_NOT_FOUND | ErrorCode::REPLICA_IS_NOT_READY
                                ),
                                "{e}"
                            ),
                        },
                        _ => match c.remove(&name, false) {
                            Ok(()) => {}
                            Err(e) => assert!(
                                matches!(
                                    e.code,
                                    ErrorCode::OBJECT_NOT_FOUND
                                        | ErrorCode::OBJECT_HAS_LEASE
                                        | ErrorCode::REPLICA_IS_NOT_READY
                                ),
                                "{e}"
                            ),
                        },
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Quiesced: a sequential model must now match exactly.
    let mut model: HashMap<String, Vec<u8>> = HashMap::new();
    for key in 0..KEYS {
        let name = format!("c-{key}");
        if let Ok(v) = client.get(&name) {
            model.insert(name, v);
        }
    }
    for step in 0..60u32 {
        let key = format!("c-{}", (step as usize * 5) % KEYS);
        if step % 2 == 0 {
            let v = versioned(99, step);
            let r = client.put(&key, &v, &ReplicaPolicy::default());
            if model.contains_key(&key) {
                assert_eq!(code(r), ErrorCode::OBJECT_ALREADY_EXISTS);
            } else {
                r.unwrap();
                model.insert(key.clone(), v);
            }
        } else {
            let r = client.remove(&key, true);
            if model.remove(&key).is_some() {
                r.unwrap();
            } else {
                assert_eq!(code(r), ErrorCode::OBJECT_NOT_FOUND);
            }
        }
        for k in 0..KEYS {
            let name = format!("c-{k}");
            match model.get(&name) {
                Some(v) => assert_eq!(&client.get(&name).unwrap(), v),
                None => assert_eq!(code(client.get(&name)), ErrorCode::OBJECT_NOT_FOUND),
            }
        }
    }
}

/// The Rust API example (mooncake-store's `examples/basic_usage.rs`), run
/// as a user runs it, against a cluster.
#[test]
fn rust_api_example_runs() {
    let cluster = Cluster::start(&["--allow_force_remove_all"]);
    let out = Command::new(mooncake_system_tests::store_example("basic_usage"))
        .env("MOONCAKE_MASTER", &cluster.master_addr)
        .env("MC_METADATA_SERVER", &cluster.metadata)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn rust_api_answers_the_reference_codes() {
    use mooncake_store::{ReplicateConfig, StoreError};
    let cluster = Cluster::start(&["--allow_force_remove_all"]);
    let store = MooncakeStore::new().unwrap();
    assert!(matches!(
        store.health_check(),
        Err(StoreError::OperationFailed(1))
    ));
    store
        .setup(
            "127.0.0.1",
            &cluster.metadata,
            16 << 20,
            16 << 20,
            "tcp",
            "mlx5_0",
            &cluster.master_addr,
        )
        .unwrap();
    store.health_check().unwrap();
    assert!(store.get_hostname().unwrap().starts_with("127.0.0.1:"));
    let zero = ReplicateConfig::default();
    assert_eq!(store.put("k0", b"v", Some(&zero)).unwrap_err().code(), -600);
    store.put("k", b"first", None).unwrap();
    store.put("k", b"second", None).unwrap();
    assert_eq!(store.get("k").unwrap(), b"first", "first write wins");
    let e = store.get("absent").unwrap_err();
    assert_eq!(e.code(), ErrorCode::OBJECT_NOT_FOUND.code());
    let mut buf = [0u8; 8];
    let ptr = buf.as_mut_ptr().cast();
    // Unregistered destination: INVALID_PARAMS; too small: INVALID_PARAMS.
    assert_eq!(
        unsafe { store.get_into("k", ptr, 8) }.unwrap_err().code(),
        -600
    );
    unsafe { store.register_buffer(ptr, 8).unwrap() };
    assert_eq!(
        unsafe { store.get_into("k", ptr, 2) }.unwrap_err().code(),
        -600
    );
    assert_eq!(unsafe { store.get_into("k", ptr, 8) }.unwrap(), 5);
    let got = unsafe { store.batch_get_into(&["k", "absent"], &[ptr, ptr], &[8, 8]) };
    assert_eq!(got.unwrap(), [5, -704]);
    unsafe { store.unregister_buffer(ptr).unwrap() };
    assert_eq!(store.remove_by_regex("^nothing", false).unwrap(), 0);
    assert_eq!(store.remove_all(true).unwrap(), 1);
    drop(cluster);
    assert!(matches!(
        store.health_check(),
        Err(StoreError::OperationFailed(2))
    ));
}

#[test]
fn mooncake_up_serves_embedded_and_dummy_clients() {
    let args = [
        "up",
        "--rpc_port=0",
        "--http_metadata_server_port=0",
        "--metrics_port=0",
        "--port=0",
        "--global_segment_size=32MB",
    ];
    let mut child = Command::new(&*UMBRELLA)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut up = Proc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let field = |line: &str, name: &str| {
        line.split(name)
            .nth(1)
            .map(|v| v.split_whitespace().next().unwrap().to_owned())
    };
    let (mut master, mut metadata, mut dummy) = (None, None, None);
    while master.is_none() || metadata.is_none() || dummy.is_none() {
        let line = rx
            .recv_timeout(WAIT)
            .expect("mooncake up printed no banner");
        master = master.or_else(|| field(&line, "master_server_address ="));
        metadata = metadata.or_else(|| field(&line, "metadata_server       ="));
        dummy = dummy.or_else(|| field(&line, "dummy clients connect to"));
    }
    let config = ClientConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.unwrap(),
        global_segment_size: 0,
        local_buffer_size: 16 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: master.unwrap(),
        ..ClientConfig::default()
    };
    let client = Client::setup(&config).unwrap();
    client
        .put(
            "up-key",
            b"served by mooncake up",
            &ReplicaPolicy::default(),
        )
        .unwrap();
    let dummy = Client::setup_dummy(1 << 20, 4 << 20, &dummy.unwrap()).unwrap();
    assert_eq!(dummy.get("up-key").unwrap(), b"served by mooncake up");
    drop(dummy);
    client.close().unwrap();
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(up.0.id() as i32, libc::SIGINT) }, 0);
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = up.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "mooncake up did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}
