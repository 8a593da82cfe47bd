//! The service as a process: publishers of each format on real ZMQ
//! sockets, the HTTP API, a gap recovered by replay and one that is not.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use mooncake_conductor::encode::{batch, Style};
use mooncake_conductor::event::{Event, Medium, Removed, Stored};
use mooncake_conductor::hash::{seq_hashes, DEFAULT_SEED};
use serde_json::{json, Value};
use test_support::process::{eventually, spawn_until_line, Proc};

/// The batches a publisher sent, by sequence number, for replay.
type Buffer = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

const BIN: &str = env!("CARGO_BIN_EXE_mooncake_conductor");

/// A publisher as vLLM's: PUB socket, sequence numbers from 0, and with a
/// replay endpoint a ROUTER answering from its buffer.
struct Publisher {
    sock: zmq::Socket,
    endpoint: String,
    replay_endpoint: Option<String>,
    style: Style,
    seq: u64,
    buffer: Buffer,
    stop: Arc<AtomicBool>,
    replayer: Option<JoinHandle<()>>,
}

impl Publisher {
    fn new(ctx: &zmq::Context, style: Style, replay: bool) -> Publisher {
        let sock = ctx.socket(zmq::PUB).unwrap();
        sock.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = sock.get_last_endpoint().unwrap().unwrap();
        let buffer: Buffer = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (mut replay_endpoint, mut replayer) = (None, None);
        if replay {
            let router = ctx.socket(zmq::ROUTER).unwrap();
            router.bind("tcp://127.0.0.1:*").unwrap();
            router.set_rcvtimeo(100).unwrap();
            replay_endpoint = Some(router.get_last_endpoint().unwrap().unwrap());
            let (buffer, stop) = (buffer.clone(), stop.clone());
            replayer = Some(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(req) = router.recv_multipart(0) else {
                        continue;
                    };
                    let [id, _empty, start] = &req[..] else {
                        continue;
                    };
                    let start = u64::from_be_bytes(start[..].try_into().unwrap());
                    for (seq, payload) in buffer.lock().unwrap().iter().filter(|(s, _)| *s >= start)
                    {
                        router
                            .send_multipart([&id[..], b"", &seq.to_be_bytes()[..], &payload[..]], 0)
                            .unwrap();
                    }
                    router
                        .send_multipart([&id[..], b"", &(-1i64).to_be_bytes()[..], b""], 0)
                        .unwrap();
                }
            }));
        }
        Publisher {
            sock,
            endpoint,
            replay_endpoint,
            style,
            seq: 0,
            buffer,
            stop,
            replayer,
        }
    }

    /// Publishes (or, with `drop`, only buffers, as if lost on the way).
    fn publish(&mut self, events: &[Event], drop: bool) {
        let payload = batch(self.style, 1.0, events, Some(0));
        let seq = self.seq;
        self.seq += 1;
        self.buffer.lock().unwrap().push((seq, payload.clone()));
        if !drop {
            self.sock
                .send_multipart([&b""[..], &seq.to_be_bytes(), &payload], 0)
                .unwrap();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.replayer.take() {
            t.join().unwrap();
        }
    }
}

struct Api {
    base: String,
    http: reqwest::blocking::Client,
}

impl Api {
    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(Value::Null))
    }

    fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    }

    fn get(&self, path: &str) -> String {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .unwrap()
            .text()
            .unwrap()
    }

    fn instance(&self, id: &str, ty: &str) -> Value {
        let all: Value = serde_json::from_str(&self.get("/instances")).unwrap();
        all.as_array()
            .unwrap()
            .iter()
            .find(|s| s["instance_id"] == id && s["type"] == ty)
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// Sends empty batches until the conductor has heard one: a SUB socket
    /// misses what is published before its subscription reaches the PUB.
    fn until_heard(&self, p: &mut Publisher, id: &str, ty: &str) {
        eventually(&format!("{id} heard"), || {
            p.publish(&[], false);
            self.instance(id, ty)["batches"].as_u64().unwrap_or(0) > 0
        });
    }

    fn query(&self, tokens: &[u32], extra: Value) -> Value {
        let mut body = json!({"model": "deepseek", "token_ids": tokens, "block_size": 2});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, v) = self.post("/query", body);
        assert_eq!(status, 200, "{v}");
        v
    }
}

fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>, medium: Medium) -> Event {
    Event::Stored(Stored {
        hashes,
        parent,
        tokens,
        block_size: Some(2),
        medium,
        lora: None,
        salt: None,
        tenant: None,
    })
}

fn start(config: &Value) -> (Proc, Api, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!(
        "conductor-test-{}-{}.json",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::write(&path, config.to_string()).unwrap();
    let args = vec![
        "--config".to_string(),
        path.display().to_string(),
        "--port".into(),
        "0".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--replay-timeout-ms".into(),
        "5000".into(),
    ];
    let (proc, line) = spawn_until_line(BIN, &args, "listening on");
    let addr = line.rsplit(' ').next().unwrap().to_string();
    let api = Api {
        base: format!("http://{addr}"),
        http: reqwest::blocking::Client::new(),
    };
    (proc, api, path)
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

const PROMPT: [u32; 6] = [101, 15, 100, 55, 89, 63];

#[test]
fn publishers_of_every_format_and_gaps() {
    let ctx = zmq::Context::new();
    let mut pool = Publisher::new(&ctx, Style::Mooncake, false);
    let mut vllm = Publisher::new(&ctx, Style::VllmArray, true);
    let mut vllm_map = Publisher::new(&ctx, Style::VllmMap, false);
    let mut sglang = Publisher::new(&ctx, Style::Sglang, false);
    // The master's pool is a static instance of the file, written as the
    // reference's: by name, the name standing for the instance.
    let config = json!({"http_server_port": 1, "kvevent_instance": {"vllm-1": {
        "endpoint": pool.endpoint, "type": "Mooncake", "modelname": "deepseek",
        "block_size": 2, "dp_rank": 0}}});
    let (_proc, api, cfg_path) = start(&config);
    let reg = |p: &Publisher, ty: &str, id: &str, dp: u32| {
        json!({"endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint, "type": ty, "modelname": "deepseek",
               "instance_id": id, "block_size": 2, "dp_rank": dp})
    };
    for (body, id) in [
        (reg(&vllm, "vLLM", "vllm-1", 0), "vllm-1"),
        (reg(&vllm_map, "vLLM", "vllm-1", 1), "vllm-1"),
        (reg(&sglang, "SGLang", "sglang-1", 0), "sglang-1"),
    ] {
        let (status, v) = api.post("/register", body);
        assert_eq!(
            (status, &v["status"], &v["instance_id"]),
            (200, &json!("registered successfully"), &json!(id)),
            "{v}"
        );
    }
    let (status, v) = api.post("/register", reg(&vllm, "vLLM", "vllm-1", 0));
    assert_eq!(status, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("already registered"));
    api.until_heard(&mut pool, "vllm-1", "Mooncake");
    api.until_heard(&mut vllm, "vllm-1", "vLLM");
    api.until_heard(&mut vllm_map, "vllm-1", "vLLM");
    api.until_heard(&mut sglang, "sglang-1", "SGLang");

    // The design document's example: H1 on GPU (dp0, dp1), CPU, DISK; H2 on
    // GPU (dp0) and CPU; H3 on DISK.
    let h = seq_hashes(&PROMPT, 2, DEFAULT_SEED);
    vllm.publish(
        &[stored(
            vec![0xa1, 0xa2],
            None,
            PROMPT[..4].to_vec(),
            Medium::Gpu,
        )],
        false,
    );
    vllm_map.publish(
        &[stored(vec![0xb1], None, PROMPT[..2].to_vec(), Medium::Gpu)],
        false,
    );
    pool.publish(
        &[
            stored(vec![h[0], h[1]], None, vec![], Medium::Cpu),
            stored(vec![h[0], h[2]], None, vec![], Medium::Disk),
        ],
        false,
    );
    sglang.publish(
        &[stored(
            vec![u64::MAX - 1, u64::MAX - 2, u64::MAX - 3],
            None,
            PROMPT.to_vec(),
            Medium::Gpu,
        )],
        false,
    );
    let want = json!({"default": {
        "vllm-1": {"longest_matched": 6, "GPU": 4, "DP": {"0": 4, "1": 2}, "CPU": 4, "DISK": 4},
        "sglang-1": {"longest_matched": 6, "GPU": 6, "DP": {"0": 6}, "CPU": 0, "DISK": 0}}});
    eventually("the example's answer", || {
        api.query(&PROMPT, json!({})) == want
    });
    // By hash, the same answer; one instance alone.
    let (status, v) = api.post(
        "/query_by_hash",
        json!({"model": "deepseek", "seq_hashes": h, "block_size": 2}),
    );
    assert_eq!((status, &v), (200, &want));
    let (_, v) = api.post("/query_by_hash", json!({"model": "deepseek", "block_hash": [h[0].to_string()], "block_size": 2, "instance_id": "sglang-1"}));
    assert_eq!(
        v,
        json!({"default": {"sglang-1": {"longest_matched": 2, "GPU": 2, "DP": {"0": 2}, "CPU": 0, "DISK": 0}}})
    );
    // Other namespaces see nothing.
    let none = api.query(&PROMPT, json!({"cache_salt": "x"}));
    assert_eq!(none["default"]["vllm-1"]["longest_matched"], 0, "{none}");
    assert_eq!(
        api.query(&PROMPT, json!({"tenant_id": "acme"})),
        json!({"acme": {}})
    );

    // A gap vLLM can replay: batch n is lost on the way, n+1 arrives.
    vllm.publish(
        &[Event::Removed(Removed {
            hashes: vec![0xa2],
            medium: Medium::Gpu,
            tenant: None,
        })],
        true,
    );
    vllm.publish(
        &[stored(
            vec![0xa3],
            Some(0xa2),
            PROMPT[4..].to_vec(),
            Medium::Gpu,
        )],
        false,
    );
    eventually("the replay", || {
        api.instance("vllm-1", "vLLM")["replays_recovered"] == 1
    });
    let v = api.query(&PROMPT, json!({"instance_id": "vllm-1"}));
    // H2 left dp0's GPU (replayed); H3 could not be placed (its parent was gone).
    assert_eq!(
        v["default"]["vllm-1"],
        json!({"longest_matched": 6, "GPU": 2, "DP": {"0": 2, "1": 2}, "CPU": 4, "DISK": 4}),
        "{v}"
    );
    assert_eq!(api.instance("vllm-1", "vLLM")["stale"], false);

    // A gap SGLang cannot replay (no replay endpoint): its blocks go stale.
    sglang.publish(&[], true);
    sglang.publish(&[], false);
    eventually("stale", || {
        api.instance("sglang-1", "SGLang")["stale"] == true
    });
    let v = api.query(&PROMPT, json!({"instance_id": "sglang-1"}));
    assert_eq!(v["default"]["sglang-1"]["longest_matched"], 0, "{v}");
    // Stored again after the gap: trusted again.
    sglang.publish(
        &[stored(
            vec![u64::MAX - 1],
            None,
            PROMPT[..2].to_vec(),
            Medium::Gpu,
        )],
        false,
    );
    eventually("re-stored", || {
        api.query(&PROMPT, json!({"instance_id": "sglang-1"}))["default"]["sglang-1"]
            ["longest_matched"]
            == 2
    });

    // Malformed events are counted, and the service keeps serving.
    vllm.sock
        .send_multipart([&b""[..], &vllm.seq.to_be_bytes(), b"\xc1not msgpack"], 0)
        .unwrap();
    vllm.seq += 1;
    eventually("counted", || {
        api.get("/metrics")
            .contains("conductor_undecodable_batches_total{publisher=\"vllm-1|default|0|vLLM\"} 1")
    });
    let metrics = api.get("/metrics");
    for needle in [
        "conductor_events_total{publisher=\"vllm-1|default|0|vLLM\",kind=\"stored\"}",
        "conductor_events_total{publisher=\"vllm-1|default|0|vLLM\",kind=\"rejected\"} 1",
        "conductor_sequence_gaps_total{publisher=\"sglang-1|default|0|SGLang\"} 1",
        "conductor_replays_total{publisher=\"vllm-1|default|0|vLLM\",outcome=\"recovered\"} 1",
        "conductor_replays_total{publisher=\"sglang-1|default|0|SGLang\",outcome=\"failed\"} 1",
        "conductor_index_blocks ",
        "conductor_query_latency_seconds_bucket",
    ] {
        assert!(metrics.contains(needle), "{needle} not in\n{metrics}");
    }

    // Bad bodies: 4xx with a message.
    for (path, body, code) in [
        ("/query", json!({"token_ids": [1], "block_size": 2}), 400),
        (
            "/query",
            json!({"model": "m", "token_ids": [-1], "block_size": 2}),
            400,
        ),
        (
            "/query",
            json!({"model": "m", "token_ids": [1], "block_size": 0}),
            400,
        ),
        (
            "/query",
            json!({"model": "m", "token_ids": [1], "block_size": 2, "lora_name": "a", "lora_id": 3}),
            400,
        ),
        (
            "/query",
            json!({"model": "deepseek", "token_ids": [1], "block_size": 2, "instance_id": "nobody"}),
            404,
        ),
        (
            "/query_by_hash",
            json!({"model": "m", "seq_hashes": ["zz"], "block_size": 2}),
            400,
        ),
        (
            "/register",
            json!({"endpoint": "tcp://127.0.0.1:1", "type": "TensorRT", "modelname": "m", "instance_id": "i", "block_size": 2, "dp_rank": 0}),
            400,
        ),
        (
            "/register",
            json!({"endpoint": "nonsense", "type": "vLLM", "modelname": "m", "instance_id": "i", "block_size": 2, "dp_rank": 0}),
            400,
        ),
        ("/unregister", json!({"instance_id": "nobody"}), 404),
    ] {
        let (status, v) = api.post(path, body.clone());
        assert_eq!(status, code, "{path} {body}: {v}");
        assert!(v["error"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    let (status, v) = api.post_raw("/query", "{not json");
    assert_eq!(status, 400, "{v}");

    // Unregistering drops the instance's blocks at once.
    let (status, v) = api.post(
        "/unregister",
        json!({"type": "vLLM", "instance_id": "vllm-1", "tenant_id": "default", "dp_rank": 1}),
    );
    assert_eq!(
        (status, v),
        (
            200,
            json!({"status": "unregistered successfully", "removed_instances": ["vllm-1|default|1"]})
        )
    );
    let v = api.query(&PROMPT, json!({"instance_id": "vllm-1"}));
    assert_eq!(v["default"]["vllm-1"]["DP"], json!({"0": 2}), "{v}");
    let (status, _) = api.post("/unregister", json!({"instance_id": "vllm-1"}));
    assert_eq!(status, 200);
    let v = api.query(&PROMPT, json!({}));
    assert!(v["default"].get("vllm-1").is_none(), "{v}");
    std::fs::remove_file(cfg_path).unwrap();
}

#[test]
fn bad_configuration_fails_at_start() {
    let path = std::env::temp_dir().join(format!("conductor-bad-{}.json", std::process::id()));
    std::fs::write(&path, r#"{"kvevent_instance": [{"endpoint": "tcp://127.0.0.1:1", "type": "nope", "modelname": "m", "instance_id": "i", "block_size": 2, "dp_rank": 0}]}"#).unwrap();
    let out = std::process::Command::new(BIN)
        .env("CONDUCTOR_CONFIG_PATH", &path)
        .args(["--port", "0"])
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kvevent_instance[0]") && err.contains("nope"),
        "{err}"
    );
    let out = std::process::Command::new(BIN)
        .env("CONDUCTOR_CONFIG_PATH", "/nonexistent/conductor.json")
        .args(["--port", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}
