//! The Conductor's numbers for docs/benchmarks.md: ingest from 8 publishers
//! until the index holds 1 M blocks (in process, then over real ZMQ sockets
//! into the service's subscriptions), memory per block, and the latency of a
//! 32 k-token query over that index, in process and over HTTP.
//!
//!     cargo bench -p mooncake-conductor --bench indexer
//!
//! `CONDUCTOR_BENCH_BLOCKS` changes the index size (default 1,000,000).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_conductor::config::Registration;
use mooncake_conductor::decode::decode_batch;
use mooncake_conductor::encode::{batch, Style};
use mooncake_conductor::event::{Event, Medium, Stored};
use mooncake_conductor::index::Kind;
use mooncake_conductor::Conductor;

const PUBLISHERS: usize = 8;
const BLOCK: usize = 16;
const BLOCKS_PER_EVENT: usize = 16;
const EVENTS_PER_BATCH: usize = 8;
const QUERY_TOKENS: usize = 32 * 1024;

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// A cheap deterministic token stream (xorshift).
struct Tokens(u64);

impl Tokens {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % 150_000) as u32
    }
}

/// This thread's CPU time: on a shared machine the wall time of a
/// microsecond call includes whole scheduler slices spent waiting for a core.
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e6
}

fn reg(i: usize) -> Registration {
    Registration {
        endpoint: format!("inproc://bench-{i}"),
        replay_endpoint: None,
        kind: "vLLM".into(),
        modelname: "bench".into(),
        lora_name: None,
        tenant_id: None,
        instance_id: format!("vllm-{i}"),
        block_size: BLOCK as u32,
        dp_rank: 0,
        additionalsalt: None,
        hash_profile: None,
        cache_group: None,
    }
}

fn main() {
    let total: usize = std::env::var("CONDUCTOR_BENCH_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let per_pub = total / PUBLISHERS;
    let c = Conductor::new(1337, Duration::from_secs(1));
    let subs: Vec<u32> = (0..PUBLISHERS)
        .map(|i| c.register(reg(i)).unwrap())
        .collect();

    // Each publisher's stream, encoded as vLLM does: prompts of 2048 blocks
    // (the first one of publisher 0 is the query's), stored 16 blocks per
    // event, 8 events per batch, each event chained to the previous one.
    let t0 = Instant::now();
    let mut streams: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut query_prompt: Vec<u32> = Vec::new();
    let mut event_count = 0;
    for p in 0..PUBLISHERS {
        let mut rng = Tokens(0x9E37_79B9_7F4A_7C15 ^ (p as u64 + 1));
        let mut payloads = Vec::new();
        let mut events = Vec::new();
        let mut next_hash = (p as u64) << 40;
        let mut blocks = 0;
        let mut parent: Option<u64> = None;
        while blocks < per_pub {
            let n = BLOCKS_PER_EVENT.min(per_pub - blocks);
            let tokens: Vec<u32> = (0..n * BLOCK).map(|_| rng.next()).collect();
            if p == 0 && query_prompt.len() < QUERY_TOKENS {
                query_prompt.extend_from_slice(&tokens);
            }
            let hashes: Vec<u64> = (0..n as u64).map(|i| next_hash + i).collect();
            next_hash += n as u64;
            events.push(Event::Stored(Stored {
                hashes: hashes.clone(),
                parent,
                tokens,
                block_size: Some(BLOCK as u32),
                medium: Medium::Gpu,
                lora: None,
                salt: None,
                tenant: None,
            }));
            blocks += n;
            event_count += 1;
            // A new prompt every 2048 blocks.
            parent = if blocks % 2048 == 0 {
                None
            } else {
                hashes.last().copied()
            };
            if events.len() == EVENTS_PER_BATCH {
                payloads.push(batch(Style::VllmArray, 1.0, &events, Some(0)));
                events.clear();
            }
        }
        if !events.is_empty() {
            payloads.push(batch(Style::VllmArray, 1.0, &events, Some(0)));
        }
        streams.push(payloads);
    }
    query_prompt.truncate(QUERY_TOKENS);
    let bytes: usize = streams.iter().flatten().map(Vec::len).sum();
    println!(
        "prepared {} batches ({:.1} MB) in {:.1} s",
        streams.iter().map(Vec::len).sum::<usize>(),
        bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );

    // Ingest: one thread per publisher, as the service runs them: decode,
    // then apply under the index's write lock.
    let rss0 = rss_bytes();
    let stored = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    std::thread::scope(|s| {
        for (p, payloads) in streams.iter().enumerate() {
            let (c, sub, stored) = (&c, subs[p], stored.clone());
            s.spawn(move || {
                for payload in payloads {
                    let b = decode_batch(Kind::Vllm, payload).unwrap();
                    let a = c.shared.index.write().apply(sub, &b).unwrap();
                    assert_eq!(a.rejected, 0);
                    stored.fetch_add(a.stored_blocks as usize, Ordering::Relaxed);
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    let blocks = stored.load(Ordering::Relaxed);
    let (len, approx) = {
        let ix = c.shared.index.read();
        (ix.len(), ix.approx_bytes())
    };
    let rss = rss_bytes().saturating_sub(rss0);
    println!("ingest: {PUBLISHERS} publishers, {event_count} events, {blocks} blocks in {secs:.2} s: {:.0} events/s, {:.0} blocks/s", event_count as f64 / secs, blocks as f64 / secs);
    println!(
        "index: {len} blocks, estimate {:.1} bytes/block, RSS growth {:.1} bytes/block",
        approx as f64 / len as f64,
        rss as f64 / len as f64
    );
    zmq_ingest(&streams, event_count, len);
    drop(streams);

    // Query in process: hashing the prompt and the walk, then the walk alone.
    let ns = c
        .shared
        .index
        .read()
        .sub_info(subs[0])
        .unwrap()
        .namespace
        .clone();
    let hashes = c
        .shared
        .index
        .read()
        .prompt_hashes(&query_prompt, BLOCK as u32);
    let check = c.shared.index.read().query(&ns, None, &hashes);
    assert_eq!(
        check["vllm-0"].longest_matched as usize,
        QUERY_TOKENS / BLOCK,
        "the query prompt is indexed"
    );
    // Each case timed by the wall clock and by this thread's CPU time.
    let mut times: Vec<(Vec<Duration>, Vec<Duration>)> = vec![Default::default(); 3];
    let timed = |out: &mut (Vec<Duration>, Vec<Duration>), f: &dyn Fn()| {
        let (t, cpu) = (Instant::now(), cpu_now());
        f();
        out.1.push(cpu_now().saturating_sub(cpu));
        out.0.push(t.elapsed());
    };
    for _ in 0..2000 {
        timed(&mut times[0], &|| {
            let ix = c.shared.index.read();
            let h = ix.prompt_hashes(&query_prompt, BLOCK as u32);
            std::hint::black_box(ix.query(&ns, None, &h));
        });
        timed(&mut times[1], &|| {
            std::hint::black_box(c.shared.index.read().query(&ns, None, &hashes));
        });
        timed(&mut times[2], &|| {
            let ix = c.shared.index.read();
            std::hint::black_box(ix.query(&ns, Some("vllm-0"), &hashes[..64]));
        });
    }
    for (name, (wall, cpu)) in [
        "query 32k tokens (hash + walk)",
        "walk 2048 blocks",
        "walk 64 blocks, one instance",
    ]
    .iter()
    .zip(&mut times)
    {
        wall.sort();
        cpu.sort();
        println!(
            "{name}: wall p50 {:.1} µs, p99 {:.1} µs; on CPU p50 {:.1} µs, p99 {:.1} µs",
            pct(wall, 0.5),
            pct(wall, 0.99),
            pct(cpu, 0.5),
            pct(cpu, 0.99)
        );
    }

    // Over HTTP: the service's router on a loopback port.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let app = mooncake_conductor::http::router(c.clone());
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    let body =
        serde_json::json!({"model": "bench", "token_ids": query_prompt, "block_size": BLOCK})
            .to_string();
    let http = reqwest::blocking::Client::new();
    let url = format!("http://{addr}/query");
    let mut rtt = Vec::new();
    for i in 0..520 {
        let t = Instant::now();
        let r = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .unwrap();
        assert!(r.status().is_success());
        std::hint::black_box(r.bytes().unwrap());
        if i >= 20 {
            rtt.push(t.elapsed());
        }
    }
    rtt.sort();
    println!(
        "HTTP /query 32k tokens ({} KB body): p50 {:.1} µs, p99 {:.1} µs",
        body.len() / 1024,
        pct(&rtt, 0.5),
        pct(&rtt, 0.99)
    );
    let metrics = c.shared.metrics.render();
    for line in metrics.lines().filter(|l| {
        l.starts_with("conductor_query_latency_seconds_sum")
            || l.starts_with("conductor_query_latency_seconds_count")
    }) {
        println!("  {line}");
    }
    c.shutdown();
}

/// The same streams through the service: 8 PUB sockets on loopback, each
/// subscribed to by a registration (its SUB thread decodes and applies), all
/// sending at once; timed until the index holds every block.
fn zmq_ingest(streams: &[Vec<Vec<u8>>], event_count: usize, want: usize) {
    let c = Conductor::new(1337, Duration::from_secs(1));
    let ctx = zmq::Context::new();
    let mut pubs = Vec::new();
    for i in 0..streams.len() {
        let sock = ctx.socket(zmq::PUB).unwrap();
        // Unbounded: a publisher that outruns the subscriber must not drop
        // (a drop would be a gap, and the blocks stale).
        sock.set_sndhwm(0).unwrap();
        sock.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = sock.get_last_endpoint().unwrap().unwrap();
        let mut r = reg(i);
        r.endpoint = endpoint;
        c.register(r).unwrap();
        pubs.push(sock);
    }
    // A SUB socket hears nothing sent before its subscription reaches the
    // PUB socket: send empty batches until each subscription has one.
    let empty = batch(Style::VllmArray, 1.0, &[], Some(0));
    let mut seqs = vec![0u64; pubs.len()];
    let heard = |c: &Conductor, i: usize| c.instances()[i]["batches"].as_u64().unwrap_or(0) > 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, sock) in pubs.iter().enumerate() {
        while !heard(&c, i) {
            assert!(Instant::now() < deadline, "publisher {i} never heard");
            sock.send_multipart([&b""[..], &seqs[i].to_be_bytes()[..], &empty[..]], 0)
                .unwrap();
            seqs[i] += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let publishers = pubs.len();
    let t = Instant::now();
    // A socket is used by one thread at a time: each moves to its sender
    // and comes back, kept open until the index is full.
    let pubs: Vec<zmq::Socket> = std::thread::scope(|s| {
        let senders: Vec<_> = pubs
            .into_iter()
            .zip(streams)
            .zip(seqs)
            .map(|((sock, payloads), seq)| {
                s.spawn(move || {
                    for (n, payload) in payloads.iter().enumerate() {
                        let seq = seq + n as u64;
                        sock.send_multipart([&b""[..], &seq.to_be_bytes()[..], &payload[..]], 0)
                            .unwrap();
                    }
                    sock
                })
            })
            .collect();
        senders.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let sent = t.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(600);
    while c.shared.index.read().len() < want {
        assert!(Instant::now() < deadline, "the index never filled");
        std::thread::sleep(Duration::from_millis(2));
    }
    let secs = t.elapsed().as_secs_f64();
    let gaps: u64 = (0..publishers)
        .map(|i| c.instances()[i]["gaps"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(gaps, 0, "a publisher dropped batches");
    println!(
        "ingest over ZMQ: {} publishers, {event_count} events, {want} blocks in {secs:.2} s (sent in {sent:.2} s): {:.0} events/s, {:.0} blocks/s",
        publishers,
        event_count as f64 / secs,
        want as f64 / secs
    );
    c.shutdown();
    drop(pubs);
}
