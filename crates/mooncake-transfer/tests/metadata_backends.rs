//! Every metadata backend against a real server: etcd, redis, and the HTTP
//! server (library). One test per server instance runs the shared contract
//! cases in sequence, so each started server is killed when its test ends.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_transfer::metadata::http_server::{self, MetadataServer};
use mooncake_transfer::metadata::redis::{RedisOptions, RedisStore};
use mooncake_transfer::metadata::{
    connect, segment_key, MetadataStore, MetadataStoreExt, MetadataUri,
};
use test_support::services;

/// A key prefix unique to this run, so tests sharing an external server
/// never see each other's keys.
fn prefix(name: &str) -> String {
    format!(
        "mooncake-test/{}/{}/{name}",
        std::process::id(),
        rand::random::<u32>()
    )
}

fn open(conn: &str) -> Arc<dyn MetadataStore> {
    connect(&MetadataUri::parse(conn).unwrap()).unwrap_or_else(|e| panic!("connect {conn}: {e}"))
}

/// The contract every backend honours.
fn contract(store: &Arc<dyn MetadataStore>, p: &str) {
    // Missing key, put, get, overwrite, delete, delete again.
    let key = format!("{p}/a");
    assert_eq!(store.get(&key).unwrap(), None);
    store.put(&key, b"one").unwrap();
    assert_eq!(store.get(&key).unwrap().as_deref(), Some(&b"one"[..]));
    store.put(&key, b"two, longer").unwrap();
    assert_eq!(
        store.get(&key).unwrap().as_deref(),
        Some(&b"two, longer"[..])
    );
    store.delete(&key).unwrap();
    assert_eq!(store.get(&key).unwrap(), None);
    store.delete(&key).unwrap();

    // Empty value is a value, not a missing key.
    let empty = format!("{p}/empty");
    store.put(&empty, b"").unwrap();
    assert_eq!(store.get(&empty).unwrap().as_deref(), Some(&b""[..]));
    store.delete(&empty).unwrap();

    // Binary-safe: every byte value, NULs and invalid UTF-8 included.
    let bin: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let bin_key = format!("{p}/bin");
    store.put(&bin_key, &bin).unwrap();
    assert_eq!(store.get(&bin_key).unwrap().unwrap(), bin);
    store.delete(&bin_key).unwrap();

    // Keys with characters that need escaping in a URL.
    let odd = format!("{p}/odd key &x=1+2%20?#/ü");
    store.put(&odd, b"odd").unwrap();
    assert_eq!(store.get(&odd).unwrap().as_deref(), Some(&b"odd"[..]));
    assert_eq!(store.get(&format!("{p}/odd key ")).unwrap(), None);
    store.delete(&odd).unwrap();

    // Keys are distinct values, not prefixes of each other.
    store.put(&format!("{p}/k"), b"k").unwrap();
    store.put(&format!("{p}/k2"), b"k2").unwrap();
    assert_eq!(
        store.get(&format!("{p}/k")).unwrap().as_deref(),
        Some(&b"k"[..])
    );
    store.delete(&format!("{p}/k")).unwrap();
    assert_eq!(
        store.get(&format!("{p}/k2")).unwrap().as_deref(),
        Some(&b"k2"[..])
    );
    store.delete(&format!("{p}/k2")).unwrap();

    // A 1 MiB JSON document (a large segment descriptor), through the JSON helper.
    let buffers: Vec<serde_json::Value> = (0..20_000)
        .map(|i| serde_json::json!({"name": format!("cpu:{i}"), "addr": 140_000_000_000u64 + i * 4096, "length": 4096}))
        .collect();
    let desc = serde_json::json!({"name": p, "protocol": "tcp", "buffers": buffers});
    let big_key = segment_key(&format!("{p}-segment"));
    store.put_json(&big_key, &desc).unwrap();
    let raw = store.get(&big_key).unwrap().unwrap();
    assert!(
        raw.len() >= 1 << 20,
        "descriptor is only {} bytes",
        raw.len()
    );
    assert_eq!(
        store
            .get_json::<serde_json::Value>(&big_key)
            .unwrap()
            .unwrap(),
        desc
    );
    store.delete(&big_key).unwrap();

    // Malformed JSON is ERR_MALFORMED_JSON, not a panic.
    let bad_json = format!("{p}/bad-json");
    store.put(&bad_json, b"{not json").unwrap();
    let e = store.get_json::<serde_json::Value>(&bad_json).unwrap_err();
    assert_eq!(e.code, ErrorCode::ERR_MALFORMED_JSON);
    store.delete(&bad_json).unwrap();

    // Many threads at once, each on its own keys.
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (store, p) = (store.clone(), p.to_string());
            std::thread::spawn(move || {
                for i in 0..20 {
                    let key = format!("{p}/t{t}/{i}");
                    let value = format!("{t}-{i}").into_bytes();
                    store.put(&key, &value).unwrap();
                    assert_eq!(store.get(&key).unwrap().unwrap(), value);
                    store.delete(&key).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }

    // From tokio: spawn_blocking threads, and even straight on an async task
    // (blocks that worker, but must work and must not panic).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (s, key) = (store.clone(), format!("{p}/tokio"));
    rt.block_on(async move {
        let (s2, k2) = (s.clone(), key.clone());
        tokio::task::spawn_blocking(move || s2.put(&k2, b"from spawn_blocking").unwrap())
            .await
            .unwrap();
        let (s3, k3) = (s.clone(), key.clone());
        let got = tokio::spawn(async move { s3.get(&k3).unwrap() })
            .await
            .unwrap();
        assert_eq!(got.as_deref(), Some(&b"from spawn_blocking"[..]));
        s.delete(&key).unwrap();
    });
    // Dropping the last handle inside an async context must not panic.
    let s = store.clone();
    rt.block_on(async move { drop(s) });
}

/// Runs `f` on a thread and fails the test if it does not finish within a
/// generous bound (a hang guard, not a speed check).
fn finishes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} hung"))
}

#[test]
fn etcd_backend() {
    let etcd = services::etcd();
    let store = open(&format!("etcd://{}", etcd.addr));
    contract(&store, &prefix("etcd"));
    // A bare host:port is etcd too, and sees the same data.
    let bare = open(&etcd.addr);
    let key = format!("{}/shared", prefix("etcd-bare"));
    store.put(&key, b"v").unwrap();
    assert_eq!(bare.get(&key).unwrap().as_deref(), Some(&b"v"[..]));
    bare.delete(&key).unwrap();
    // A dead endpoint in the list does not matter while another answers.
    let dead = format!("127.0.0.1:{}", services::free_port());
    let multi = open(&format!("etcd://{dead};{}", etcd.addr));
    multi.put(&key, b"multi").unwrap();
    assert_eq!(store.get(&key).unwrap().as_deref(), Some(&b"multi"[..]));
    multi.delete(&key).unwrap();
}

#[test]
fn etcd_keys_are_stored_verbatim() {
    let etcd = services::etcd();
    let store = open(&etcd.addr);
    let name = prefix("verbatim").replace('/', "_");
    store.put(&segment_key(&name), b"{}").unwrap();
    // Read back with the raw etcd client: the key is exactly mooncake/ram/<name>.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let raw = rt.block_on(async {
        let mut c = etcd_client::Client::connect([format!("http://{}", etcd.addr)], None)
            .await
            .unwrap();
        let resp = c.get(format!("mooncake/ram/{name}"), None).await.unwrap();
        resp.kvs().first().map(|kv| kv.value().to_vec())
    });
    assert_eq!(raw.as_deref(), Some(&b"{}"[..]));
    store.delete(&segment_key(&name)).unwrap();
}

#[test]
fn redis_backend() {
    let redis = services::redis();
    // Through the options API so the environment (read by connect()) cannot
    // interfere; redis_env.rs covers the env vars.
    let store: Arc<dyn MetadataStore> =
        Arc::new(RedisStore::connect_with(&redis.addr, &RedisOptions::default()).unwrap());
    contract(&store, &prefix("redis"));

    // Keys are plain redis strings, as the reference stores them.
    let key = segment_key(&prefix("redis-raw").replace('/', "_"));
    store.put(&key, b"raw").unwrap();
    let mut raw = redis::Client::open(format!("redis://{}", redis.addr))
        .unwrap()
        .get_connection()
        .unwrap();
    let v: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query(&mut raw).unwrap();
    assert_eq!(v.as_deref(), Some(&b"raw"[..]));
    store.delete(&key).unwrap();
}

#[test]
fn redis_reconnects_after_connection_loss() {
    // A server of our own: this kills every other client on it.
    let redis = services::start_redis(&[]);
    let store = RedisStore::connect_with(&redis.addr, &RedisOptions::default()).unwrap();
    let key = "mooncake/ram/reconnect";
    store.put(key, b"raw").unwrap();
    let mut raw = redis::Client::open(format!("redis://{}", redis.addr))
        .unwrap()
        .get_connection()
        .unwrap();
    // The store's connection is killed under it: the next call reconnects.
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
        .query(&mut raw)
        .unwrap();
    assert!(killed >= 1);
    assert_eq!(store.get(key).unwrap().as_deref(), Some(&b"raw"[..]));
    store.delete(key).unwrap();
}

#[test]
fn redis_password_and_db_index() {
    let redis = services::start_redis(&["--requirepass", "s3cret"]);
    let opts = RedisOptions {
        password: Some("s3cret".into()),
        db: Some(3),
    };
    let store: Arc<dyn MetadataStore> =
        Arc::new(RedisStore::connect_with(&redis.addr, &opts).unwrap());
    contract(&store, &prefix("redis-auth"));
    store.put("mooncake/ram/db3", b"in db 3").unwrap();

    // The value landed in database 3, not 0.
    let url = |db: u8| format!("redis://:s3cret@{}/{db}", redis.addr);
    let mut db3 = redis::Client::open(url(3))
        .unwrap()
        .get_connection()
        .unwrap();
    let mut db0 = redis::Client::open(url(0))
        .unwrap()
        .get_connection()
        .unwrap();
    let in3: Option<Vec<u8>> = redis::cmd("GET")
        .arg("mooncake/ram/db3")
        .query(&mut db3)
        .unwrap();
    let in0: Option<Vec<u8>> = redis::cmd("GET")
        .arg("mooncake/ram/db3")
        .query(&mut db0)
        .unwrap();
    assert_eq!((in3.as_deref(), in0), (Some(&b"in db 3"[..]), None));

    // Password also accepted in the address.
    let from_url = RedisStore::connect_with(
        &format!(":s3cret@{}/3", redis.addr),
        &RedisOptions::default(),
    )
    .unwrap();
    assert_eq!(
        from_url.get("mooncake/ram/db3").unwrap().as_deref(),
        Some(&b"in db 3"[..])
    );

    // No or wrong password: ERR_METADATA at connect, not at first use.
    for opts in [
        RedisOptions::default(),
        RedisOptions {
            password: Some("wrong".into()),
            db: None,
        },
    ] {
        let e = RedisStore::connect_with(&redis.addr, &opts).err().unwrap();
        assert_eq!(e.code, ErrorCode::ERR_METADATA, "{opts:?}: {e}");
    }
}

#[test]
fn http_backend_with_library_server() {
    let server = MetadataServer::spawn("127.0.0.1", 0).unwrap();
    let store = open(&server.url());
    contract(&store, &prefix("http"));
    // The handle sees what clients wrote.
    store
        .put(
            "mooncake/rpc_meta/n0",
            br#"{"ip_or_host_name":"h","rpc_port":1}"#,
        )
        .unwrap();
    assert!(server.store().get_bytes("mooncake/rpc_meta/n0").is_some());

    // A URL that is not the metadata endpoint is refused at connect.
    let e = connect(&MetadataUri::Http(
        server.url().replace("/metadata", "/other"),
    ))
    .err()
    .unwrap();
    assert_eq!(e.code, ErrorCode::ERR_METADATA);
    server.stop();
    assert_eq!(
        store.get("mooncake/rpc_meta/n0").unwrap_err().code,
        ErrorCode::ERR_METADATA
    );
}

#[test]
fn http_client_survives_server_restart() {
    let server = MetadataServer::spawn("127.0.0.1", 0).unwrap();
    let port = server.local_addr().port();
    let store = open(&server.url());
    store.put("k", b"v").unwrap();
    server.stop();
    // Same port, new (empty) server: the pooled connection is dead, the
    // client must notice and reconnect.
    let server = MetadataServer::spawn("127.0.0.1", port).unwrap();
    assert_eq!(store.get("k").unwrap(), None);
    store.put("k", b"again").unwrap();
    assert_eq!(store.get("k").unwrap().as_deref(), Some(&b"again"[..]));
    server.stop();
}

#[test]
fn http_server_protocol() {
    let server = MetadataServer::spawn("127.0.0.1", 0).unwrap();
    let url = server.url();
    let http = reqwest::blocking::Client::new();
    let text = |r: reqwest::Result<reqwest::blocking::Response>| {
        let r = r.unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let key = [("key", "x")];

    assert_eq!(
        text(http.get(&url).query(&key).send()),
        (404, "metadata not found".into())
    );
    assert_eq!(text(http.delete(&url).query(&key).send()).0, 404);
    assert_eq!(
        text(http.put(&url).query(&key).body("{\"a\":1}").send()).0,
        200
    );
    let r = http.get(&url).query(&key).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.text().unwrap(), "{\"a\":1}");
    assert_eq!(text(http.delete(&url).query(&key).send()).0, 200);

    // Missing or empty key: 400 with a message that says what to do.
    for req in [
        http.get(&url).send(),
        http.get(&url).query(&[("key", "")]).send(),
        http.delete(&url).send(),
    ] {
        let (status, body) = text(req);
        assert_eq!(status, 400);
        assert!(body.contains("key"), "{body}");
    }
    assert_eq!(text(http.put(&url).body("v").send()).0, 400);
    // Unknown path and unsupported verb.
    assert_eq!(
        text(
            http.get(url.replace("/metadata", "/nope"))
                .query(&key)
                .send()
        )
        .0,
        404
    );
    assert_eq!(text(http.post(&url).query(&key).body("v").send()).0, 405);
    server.stop();
}

#[test]
fn http_server_on_callers_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The convenience: bind on this runtime, stop, wait.
        let server = MetadataServer::bind("127.0.0.1", 0).await.unwrap();
        let url = server.url();
        let v = tokio::task::spawn_blocking(move || {
            let store = open(&url);
            store.put("k", b"v").unwrap();
            store.get("k").unwrap()
        })
        .await
        .unwrap();
        assert_eq!(v.as_deref(), Some(&b"v"[..]));
        assert_eq!(server.store().len(), 1);
        server.shutdown().await.unwrap();

        // The primitive: serve() on a listener and a shutdown future we own.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/metadata", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(http_server::serve(listener, async move {
            let _ = stopped.await;
        }));
        let u = url.clone();
        tokio::task::spawn_blocking(move || open(&u).put("k", b"v").unwrap())
            .await
            .unwrap();
        stop.send(()).unwrap();
        served.await.unwrap().unwrap();
        let e =
            tokio::task::spawn_blocking(move || connect(&MetadataUri::Http(url)).err().unwrap())
                .await
                .unwrap();
        assert_eq!(e.code, ErrorCode::ERR_METADATA);
    });
}

#[test]
fn unreachable_servers_are_err_metadata() {
    // Nothing listens on these ports.
    let conns = [
        format!("http://127.0.0.1:{}/metadata", services::free_port()),
        format!("etcd://127.0.0.1:{}", services::free_port()),
        format!(
            "127.0.0.1:{};127.0.0.1:{}",
            services::free_port(),
            services::free_port()
        ),
        format!("redis://127.0.0.1:{}", services::free_port()),
    ];
    for conn in conns {
        let uri = MetadataUri::parse(&conn).unwrap();
        let e = finishes(&conn, move || {
            connect(&uri).err().expect("connected to nothing")
        });
        assert_eq!(e.code, ErrorCode::ERR_METADATA, "{conn}: {e}");
    }
    let e = connect(&MetadataUri::P2p).err().unwrap();
    assert_eq!(e.code, ErrorCode::ERR_METADATA);
}

#[test]
fn silent_servers_are_err_metadata() {
    // Accepts connections, never answers: every backend must give up on
    // its own instead of waiting forever.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let accepting = done.clone();
    let accepted = std::thread::spawn(move || {
        let mut held = Vec::new();
        listener.set_nonblocking(true).unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while !accepting.load(std::sync::atomic::Ordering::Relaxed)
            && std::time::Instant::now() < until
        {
            match listener.accept() {
                Ok((s, _)) => held.push(s),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    let conns = [
        format!("http://{addr}/metadata"),
        format!("etcd://{addr}"),
        format!("redis://{addr}"),
    ];
    let handles: Vec<_> = conns
        .into_iter()
        .map(|conn| {
            std::thread::spawn(move || {
                let uri = MetadataUri::parse(&conn).unwrap();
                let e = finishes(&conn, move || {
                    connect(&uri).err().expect("a silent server connected")
                });
                assert_eq!(e.code, ErrorCode::ERR_METADATA, "{conn}: {e}");
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    accepted.join().unwrap();
}

/// A minimal HTTP/1.1 metadata server that counts the connections it
/// accepts, to check that the client reuses one.
fn counting_server() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metadata", listener.local_addr().unwrap());
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                loop {
                    let mut request_line = String::new();
                    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut body_len = 0usize;
                    loop {
                        let mut line = String::new();
                        reader.read_line(&mut line).unwrap();
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            body_len = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; body_len];
                    reader.read_exact(&mut body).unwrap();
                    let (status, reply) = match request_line.split(' ').next() {
                        Some("PUT") => ("200 OK", "metadata updated"),
                        Some("DELETE") => ("200 OK", "metadata deleted"),
                        _ => ("404 Not Found", "metadata not found"),
                    };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{reply}",
                        reply.len()
                    );
                    conn.write_all(resp.as_bytes()).unwrap();
                }
            });
        }
    });
    (url, accepted)
}

#[test]
fn http_client_reuses_its_connection() {
    let (url, accepted) = counting_server();
    let store = open(&url); // the probe is the first request
    for i in 0..20 {
        let key = format!("k{i}");
        store.put(&key, b"v").unwrap();
        assert_eq!(store.get(&key).unwrap(), None);
        store.delete(&key).unwrap();
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one connection for 61 requests"
    );
}
