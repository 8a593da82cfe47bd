//! `tent_bench`: the two ends of a throughput run, with either engine
//! (`--backend=classic|tent`), for the link tests and docs/benchmarks.md.
//!
//! - server: starts a TENT engine on `addresses`, registers `buffer_size`
//!   bytes, prints `READY <segment name> <buffer address>`, and serves
//!   until its stdin closes;
//! - client: writes `block_size` blocks (a new pattern each round) to the
//!   server's buffer for `seconds`, reading each back and comparing when
//!   `verify`; each round that moved bytes prints `R <unix ms> <bytes>`,
//!   every `window_ms` it prints `W <unix ms> <bytes>`, each
//!   failed round `ERR <unix ms> <error>`, with TENT each change of a
//!   path's rotation `P <unix ms> <endpoint> up|down` and at the end the
//!   slices each path carried `S <endpoint> <slices>`; at the very end
//!   `DONE <bytes> <rounds> <errors> <mismatches>`.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{EngineConfig, Opcode, TransferEngine, TransferRequest};

use crate::{TentConfig, TentEngine};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Classic,
    Tent,
}

#[derive(Clone, Debug)]
pub struct BenchArgs {
    pub server: bool,
    pub backend: Backend,
    pub addresses: Vec<String>,
    pub peer: String,
    pub peer_buffer: u64,
    pub buffer_size: usize,
    pub block_size: usize,
    pub seconds: f64,
    pub window_ms: u64,
    pub verify: bool,
    /// Client threads, each with its own blocks (the reference's `--threads`).
    pub threads: usize,
}

/// Either engine, as the benchmarks use it (`tent_bench` and `tebench`).
pub(crate) enum Engine {
    Classic(TransferEngine),
    Tent(TentEngine),
}

impl Engine {
    fn start(args: &BenchArgs) -> Result<Engine> {
        let first = args
            .addresses
            .first()
            .cloned()
            .unwrap_or("127.0.0.1".into());
        Engine::start_with(args.backend, "P2PHANDSHAKE", &first, &args.addresses, None)
    }

    /// An engine named `name` on `metadata` (`P2PHANDSHAKE` or a URI);
    /// `addresses` are TENT's paths (empty: one path) or the classic
    /// engine's bind address (its first).
    pub(crate) fn start_with(
        backend: Backend,
        metadata: &str,
        name: &str,
        addresses: &[String],
        rpc_port: Option<u16>,
    ) -> Result<Engine> {
        match backend {
            Backend::Tent => {
                let mut c = TentConfig::from_env(metadata, name, |k| std::env::var(k).ok())?;
                c.addresses = addresses.to_vec();
                Ok(Engine::Tent(TentEngine::new(c)?))
            }
            Backend::Classic => {
                let mut c = EngineConfig::new(metadata, name);
                c.rpc_bind_address = addresses.first().cloned();
                if rpc_port.is_some() {
                    c.rpc_port = rpc_port;
                }
                Ok(Engine::Classic(TransferEngine::new(c)?))
            }
        }
    }

    /// The engine that holds the published descriptors (TENT's first path).
    pub(crate) fn primary(&self) -> &TransferEngine {
        match self {
            Engine::Classic(e) => e,
            Engine::Tent(e) => e.primary(),
        }
    }

    pub(crate) fn name(&self) -> String {
        match self {
            Engine::Classic(e) => e.local_server_name(),
            Engine::Tent(e) => e.local_server_name(),
        }
    }

    pub(crate) fn register(&self, addr: usize, len: usize, remote: bool) -> Result<()> {
        match self {
            Engine::Classic(e) => e.register_local_memory(addr, len, "cpu:0", remote),
            Engine::Tent(e) => e.register_local_memory(addr, len, "cpu:0", remote),
        }
    }

    pub(crate) fn unregister(&self, addr: usize) {
        let _ = match self {
            Engine::Classic(e) => e.unregister_local_memory(addr),
            Engine::Tent(e) => e.unregister_local_memory(addr),
        };
    }

    pub(crate) fn open(&self, name: &str) -> Result<u64> {
        match self {
            Engine::Classic(e) => e.open_segment(name),
            Engine::Tent(e) => e.open_segment(name),
        }
    }

    pub(crate) fn transfer(&self, r: &[TransferRequest]) -> Result<()> {
        match self {
            Engine::Classic(e) => e.transfer_sync(r),
            Engine::Tent(e) => e.transfer_sync(r),
        }
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Runs one end; lines go to `out`.
pub fn run(args: &BenchArgs, out: &mut dyn Write) -> Result<()> {
    let io = |e: std::io::Error| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string());
    if args.block_size == 0 || args.buffer_size < args.block_size {
        return Err(Error::new(
            ErrorCode::ERR_INVALID_ARGUMENT,
            "block size must be in 1..=buffer size",
        ));
    }
    let engine = Engine::start(args)?;
    if args.server {
        let buf = vec![0u8; args.buffer_size];
        engine.register(buf.as_ptr() as usize, buf.len(), true)?;
        writeln!(out, "READY {} {}", engine.name(), buf.as_ptr() as usize).map_err(io)?;
        out.flush().map_err(io)?;
        // Serve until the driver closes our stdin.
        for line in std::io::stdin().lock().lines() {
            if line.is_err() {
                break;
            }
        }
        drop(engine);
        drop(buf);
        return Ok(());
    }
    let seg = engine.open(&args.peer)?;
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    if let Engine::Tent(t) = &engine {
        watch_paths(t.clone(), seg, watching.clone());
    }
    let threads = args.threads.max(1);
    let slots = (args.buffer_size / args.block_size) as u64;
    if slots < threads as u64 {
        return Err(Error::new(
            ErrorCode::ERR_INVALID_ARGUMENT,
            "buffer size must hold a block per thread",
        ));
    }
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    let (mut total, mut rounds, mut errors, mut mismatches) = (0u64, 0u64, 0u64, 0u64);
    std::thread::scope(|scope| -> Result<()> {
        for k in 0..threads {
            let (tx, engine) = (tx.clone(), &engine);
            scope.spawn(move || client_thread(args, engine, seg, k as u64, slots, start, &tx));
        }
        drop(tx);
        let window = Duration::from_millis(args.window_ms.max(10));
        let mut window_end = start + window;
        let mut in_window = 0u64;
        for ev in rx {
            match ev {
                Event::Round { moved, mismatch } => {
                    rounds += 1;
                    total += moved;
                    in_window += moved;
                    mismatches += u64::from(mismatch);
                    if moved > 0 {
                        writeln!(out, "R {} {moved}", unix_ms()).map_err(io)?;
                    }
                }
                Event::Error(e) => {
                    errors += 1;
                    writeln!(out, "ERR {} {e}", unix_ms()).map_err(io)?;
                }
            }
            let now = Instant::now();
            while now >= window_end {
                writeln!(out, "W {} {in_window}", unix_ms()).map_err(io)?;
                in_window = 0;
                window_end += window;
            }
        }
        Ok(())
    })?;
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    if let Engine::Tent(t) = &engine {
        for p in t.path_info(seg)? {
            writeln!(out, "S {} {}", p.endpoint, p.completed_slices).map_err(io)?;
        }
    }
    writeln!(out, "DONE {total} {rounds} {errors} {mismatches}").map_err(io)?;
    out.flush().map_err(io)?;
    Ok(())
}

enum Event {
    Round { moved: u64, mismatch: bool },
    Error(Error),
}

/// One thread's rounds on its own blocks (slots `k`, `k + threads`, ...).
fn client_thread(
    args: &BenchArgs,
    engine: &Engine,
    seg: u64,
    k: u64,
    slots: u64,
    start: Instant,
    tx: &std::sync::mpsc::Sender<Event>,
) {
    let mut src = vec![0u8; args.block_size];
    let mut back = vec![0u8; args.block_size];
    for buf in [&src, &back] {
        if let Err(e) = engine.register(buf.as_ptr() as usize, buf.len(), false) {
            let _ = tx.send(Event::Error(e));
            return;
        }
    }
    let threads = args.threads.max(1) as u64;
    let mut round = 0u64;
    while start.elapsed().as_secs_f64() < args.seconds {
        let seed = (round * threads + k) as u8;
        for (i, b) in src.iter_mut().enumerate() {
            *b = (i as u8) ^ seed;
        }
        let slot = (k + round * threads) % (slots - slots % threads).max(threads);
        let remote = args.peer_buffer + slot * args.block_size as u64;
        let req = |op, local: usize| TransferRequest {
            opcode: op,
            source: local,
            target_id: seg,
            target_offset: remote,
            length: args.block_size,
        };
        let (mut moved, mut mismatch) = (0, false);
        let mut result = engine.transfer(&[req(Opcode::Write, src.as_ptr() as usize)]);
        if result.is_ok() {
            moved += args.block_size as u64;
            if args.verify {
                result = engine.transfer(&[req(Opcode::Read, back.as_mut_ptr() as usize)]);
                if result.is_ok() {
                    moved += args.block_size as u64;
                    mismatch = back != src;
                }
            }
        }
        if let Err(e) = result {
            let _ = tx.send(Event::Error(e));
        }
        let _ = tx.send(Event::Round { moved, mismatch });
        round += 1;
    }
    engine.unregister(src.as_ptr() as usize);
    engine.unregister(back.as_ptr() as usize);
}

/// Prints each change of a path's rotation (polled every 5 ms) until `on` clears.
fn watch_paths(t: TentEngine, seg: u64, on: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    std::thread::spawn(move || {
        let mut last: Vec<bool> = Vec::new();
        while on.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(info) = t.path_info(seg) {
                let now: Vec<bool> = info
                    .iter()
                    .map(|p| p.state == crate::health::PathState::Healthy)
                    .collect();
                for (i, p) in info.iter().enumerate() {
                    if last.get(i) != Some(&now[i]) {
                        let state = if now[i] { "up" } else { "down" };
                        println!("P {} {} {state}", unix_ms(), p.endpoint);
                    }
                }
                last = now;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

/// Parses `--key=value` / `--key value` flags (the reference's gflags style).
pub fn parse_args(argv: &[String]) -> Result<BenchArgs> {
    let bad = |m: String| Error::new(ErrorCode::ERR_INVALID_ARGUMENT, m);
    let mut a = BenchArgs {
        server: false,
        backend: Backend::Tent,
        addresses: vec!["127.0.0.1".into()],
        peer: String::new(),
        peer_buffer: 0,
        buffer_size: 64 << 20,
        block_size: 4 << 20,
        seconds: 5.0,
        window_ms: 250,
        verify: true,
        threads: 1,
    };
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let arg = arg.trim_start_matches('-');
        let (key, value) = match arg.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (
                arg.to_string(),
                it.next()
                    .cloned()
                    .ok_or_else(|| bad(format!("--{arg} needs a value")))?,
            ),
        };
        let num = |v: &str| -> Result<u64> {
            mooncake_common::size::parse_size(v).map_err(|e| bad(format!("--{key}={v}: {e}")))
        };
        match key.as_str() {
            "mode" | "role" => a.server = value == "server" || value == "target",
            "backend" => {
                a.backend = match value.as_str() {
                    "classic" => Backend::Classic,
                    "tent" => Backend::Tent,
                    v => return Err(bad(format!("--backend={v}: classic or tent"))),
                }
            }
            "addresses" => a.addresses = value.split(',').map(str::to_string).collect(),
            "peer" | "target_seg_name" => a.peer = value,
            "peer_buffer" => a.peer_buffer = num(&value)?,
            "buffer_size" | "total_buffer_size" => a.buffer_size = num(&value)? as usize,
            "block_size" => a.block_size = num(&value)? as usize,
            "seconds" | "duration" => {
                a.seconds = value
                    .parse()
                    .map_err(|_| bad(format!("--{key}={value}: not a number")))?
            }
            "window_ms" => a.window_ms = num(&value)?,
            "verify" => a.verify = value != "false" && value != "0",
            "threads" => a.threads = (num(&value)? as usize).clamp(1, 64),
            k => return Err(bad(format!("unknown flag --{k}"))),
        }
    }
    if !a.server && a.peer.is_empty() {
        return Err(bad("a client needs --peer".into()));
    }
    Ok(a)
}
