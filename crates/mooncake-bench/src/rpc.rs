//! Master round trips with no data path: what one metadata call costs, for
//! comparison with the raw loopback ping-pong of [`crate::baseline`].

use std::time::Instant;

use mooncake_common::{ErrorCode, Result};
use mooncake_store::master_client::MasterClient;
use serde::Serialize;

use crate::cluster;
use crate::stats::{self, summarize, Summary};

#[derive(Debug, Clone, Serialize)]
pub struct RpcResult {
    pub call: &'static str,
    pub threads: usize,
    #[serde(flatten)]
    pub summary: Summary,
    /// Calls per second over all threads (wall clock).
    pub total_ops_s: f64,
}

type Call = fn(&MasterClient, u128, usize);

fn ping(m: &MasterClient, id: u128, _: usize) {
    let _ = m.ping(id);
}

fn exist(m: &MasterClient, _: u128, i: usize) {
    let _ = m.exist_key(&format!("rpc/missing/{i}"));
}

fn replica_list(m: &MasterClient, _: u128, i: usize) {
    let _ = m.get_replica_list(&format!("rpc/missing/{i}"));
}

/// `calls` calls of each kind against a fresh `mooncake_master`, spread over
/// `threads` threads.
pub fn run(calls: usize, threads: usize) -> Result<Vec<RpcResult>> {
    let master = cluster::start_master(&[], &[])?;
    let client = MasterClient::connect(&master.rpc)?;
    let id: u128 = 0x6d6f6f6e_63616b65;
    match client.ping(id) {
        Ok(()) => {}
        Err(e) if e.code == ErrorCode::CLIENT_NOT_FOUND => {}
        Err(e) => return Err(e),
    }
    let kinds: [(&'static str, Call); 3] = [
        ("ping", ping),
        ("exist_key (missing)", exist),
        ("get_replica_list (missing)", replica_list),
    ];
    let mut out = Vec::new();
    for (name, call) in kinds {
        for i in 0..200 {
            call(&client, id, i);
        }
        let per = calls.div_ceil(threads);
        let wall = Instant::now();
        let mut lat: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    let client = client.clone();
                    s.spawn(move || {
                        let mut lat = Vec::with_capacity(per);
                        for i in 0..per {
                            let t0 = Instant::now();
                            call(&client, id, i);
                            lat.push(t0.elapsed().as_nanos() as u64);
                        }
                        lat
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let secs = wall.elapsed().as_secs_f64();
        let n = lat.len();
        out.push(RpcResult {
            call: name,
            threads,
            summary: summarize(&mut lat, 0, 1),
            total_ops_s: n as f64 / secs,
        });
        eprintln!("  {name}: {n} calls, {:.0} calls/s", n as f64 / secs);
    }
    Ok(out)
}

/// Calls per second and p50 per case, drawn.
pub fn charts(results: &[RpcResult]) -> Vec<crate::svg::Bars> {
    let rows = |f: fn(&RpcResult) -> f64| {
        results
            .iter()
            .map(|r| (format!("{} x{}", r.call, r.threads), f(r)))
            .collect()
    };
    vec![
        crate::svg::Bars::new("Master round trips", "calls/s", rows(|r| r.total_ops_s)),
        crate::svg::Bars::new("Round trip p50", "µs", rows(|r| r.summary.p50_us)),
    ]
}

pub fn render(results: &[RpcResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                r.call.to_string(),
                r.threads.to_string(),
                r.summary.n.to_string(),
                format!("{:.1}", r.summary.p50_us),
                format!("{:.1}", r.summary.p99_us),
                format!("{:.0}", r.total_ops_s),
            ]
        })
        .collect();
    stats::table(
        &["call", "threads", "calls", "p50 µs", "p99 µs", "calls/s"],
        &rows,
    )
}
