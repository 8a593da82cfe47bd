//! One nemesis run: the cluster, the load, the faults, the final check.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::client::Client;
use mooncake_store::types::ReplicaPolicy;
use test_support::process::spawn_until_line;
use test_support::Proc;

use super::checker::{judge, Expect, Found, History, Tally};
use super::coordination::{Backend, Coordination};
use super::load::{self, Pulse};
use super::masters::{can_mount, Master};
use super::plan::{Fault, Kind, Plan, Target};

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub backend: Backend,
    pub seed: u64,
    pub rounds: usize,
    /// How soon after a fault heals the cluster must acknowledge a put
    /// again, and how soon it must be whole again (every master running,
    /// both standbys in sync): a hang guard, generous for a loaded
    /// machine; the worst times seen are reported.
    pub bound: Duration,
    /// The kinds of fault drawn (all by default; the full disk only
    /// where the harness may mount file systems).
    pub kinds: Vec<Kind>,
    /// Before the final check, break the promise behind the load's back
    /// (one acknowledged key removed, another rewritten with other bytes)
    /// to show that the check catches a lost and a wrong value.
    pub tamper: bool,
}

impl Config {
    pub fn new(backend: Backend, seed: u64, rounds: usize) -> Config {
        Config {
            backend,
            seed,
            rounds,
            bound: Duration::from_secs(60),
            kinds: Kind::ALL.to_vec(),
            tamper: false,
        }
    }
}

/// What a run saw.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub backend: &'static str,
    pub seed: u64,
    pub rounds: usize,
    pub faults: BTreeMap<&'static str, usize>,
    /// Kinds left out, and why.
    pub skipped: Vec<String>,
    pub acked_puts: u64,
    pub acked_removes: u64,
    pub good_reads: u64,
    /// Keys whose final state was checked.
    pub checked: u64,
    /// Acknowledged puts gone (at the end, or found absent by a remove).
    pub lost: Vec<String>,
    /// Reads (during the run or at the end) that returned other bytes.
    pub wrong: Vec<String>,
    /// Acknowledged removes that came back.
    pub back: Vec<String>,
    /// Reads of an acknowledged key that found nothing during the run.
    pub missing_reads: u64,
    /// Masters that exited by themselves after a fault (restarted).
    pub exited: usize,
    /// Longest time without an acknowledged put.
    pub worst_unavailable: Duration,
    /// Longest time from a fault's end to the next acknowledged put.
    pub worst_recovery: Duration,
}

impl Summary {
    /// Whether every promise held.
    pub fn clean(&self) -> bool {
        self.lost.is_empty() && self.wrong.is_empty() && self.back.is_empty()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        write!(
            f,
            "nemesis: backend={} seed={} rounds={} faults[{}] acked puts={} removes={} reads={} checked={} lost={} wrong={} back={} missing_reads={} exited={} worst_unavailability={:.2}s worst_recovery={:.2}s",
            self.backend,
            self.seed,
            self.rounds,
            faults.join(" "),
            self.acked_puts,
            self.acked_removes,
            self.good_reads,
            self.checked,
            self.lost.len(),
            self.wrong.len(),
            self.back.len(),
            self.missing_reads,
            self.exited,
            self.worst_unavailable.as_secs_f64(),
            self.worst_recovery.as_secs_f64(),
        )?;
        for s in &self.skipped {
            write!(f, " (skipped {s})")?;
        }
        Ok(())
    }
}

/// Polls `cond` every 50 ms until it holds or `bound` passes.
fn within(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Cluster {
    coord: Coordination,
    masters: Vec<Master>,
    master_bin: String,
    cluster: String,
}

impl Cluster {
    fn leader(&self) -> Option<usize> {
        let leading: Vec<usize> = (0..self.masters.len())
            .filter(|&i| self.masters[i].role().as_deref() == Some("leader"))
            .collect();
        (leading.len() == 1).then(|| leading[0])
    }

    /// Restarts the masters that exited; returns how many.
    fn restart_exited(&mut self) -> usize {
        let mut n = 0;
        for m in &mut self.masters {
            if !m.running() {
                m.proc = None;
                m.spawn(&self.master_bin, &self.coord, &self.cluster);
                n += 1;
            }
        }
        n
    }

    /// Whether every master runs and the leader records both standbys.
    fn whole(&mut self) -> bool {
        self.masters.iter_mut().all(|m| m.running())
            && self
                .leader()
                .is_some_and(|l| self.masters[l].in_sync() == 2)
    }

    /// The master `target` names now.
    fn resolve(&self, target: Target) -> Option<usize> {
        let l = self.leader()?;
        match target {
            Target::Leader => Some(l),
            Target::Standby(i) => (0..3).filter(|&s| s != l).nth(i),
        }
    }

    fn logs(&self) -> String {
        self.masters
            .iter()
            .map(|m| {
                format!(
                    "--- master {} (rpc {}):\n{}",
                    m.index,
                    m.rpc,
                    m.log_tail(30)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn inject(&mut self, fault: &Fault, who: usize) {
        let m = &mut self.masters[who];
        match fault.kind {
            Kind::Kill => {
                m.kill9();
                std::thread::sleep(fault.lasts);
                m.spawn(&self.master_bin, &self.coord, &self.cluster);
            }
            Kind::Pause => {
                m.signal(libc::SIGSTOP);
                std::thread::sleep(fault.lasts);
                m.signal(libc::SIGCONT);
            }
            Kind::Partition => {
                m.relay.freeze();
                std::thread::sleep(fault.lasts);
                m.relay.thaw();
            }
            Kind::Coordination => self.coord.outage(fault.lasts),
            Kind::DiskFull => {
                m.fill_disk();
                std::thread::sleep(fault.lasts);
                m.free_disk();
            }
        }
    }
}

/// Runs `cfg`: `Ok` with what it saw (the caller asserts
/// [`Summary::clean`]), `Err` when the cluster did not serve again or
/// become whole within the bound (with the masters' logs).
pub fn run(cfg: &Config) -> Result<Summary, String> {
    let dir = tempfile::Builder::new()
        .prefix("mooncake-nemesis-")
        .tempdir()
        .expect("run directory");
    let result = run_in(cfg, dir.path());
    let keep = std::env::var_os("MOONCAKE_NEMESIS_KEEP_LOGS").is_some_and(|v| v == "1");
    // A tampered run is unclean on purpose: nothing to look at.
    let failed = !result.as_ref().is_ok_and(|s| s.clean() || cfg.tamper);
    if keep || failed {
        let kept = dir.keep();
        println!("nemesis: logs kept in {}", kept.display());
    }
    result
}

fn run_in(cfg: &Config, dir: &std::path::Path) -> Result<Summary, String> {
    let mut summary = Summary {
        backend: cfg.backend.name(),
        seed: cfg.seed,
        ..Summary::default()
    };
    println!(
        "nemesis: backend={} seed={} rounds={} (rerun: scripts/nemesis.sh --backend {} --seed {} --rounds {})",
        cfg.backend.name(),
        cfg.seed,
        cfg.rounds,
        cfg.backend.name(),
        cfg.seed,
        cfg.rounds
    );
    let mount = can_mount();
    let coord = Coordination::start(cfg.backend, dir);
    assert!(!cfg.kinds.is_empty(), "a run needs a kind of fault");
    let cluster = match cfg.backend {
        Backend::K8s => mooncake_store::master_client::DEFAULT_CLUSTER_ID.to_string(),
        b => format!("nemesis-{}-{}", b.name(), std::process::id()),
    };
    let masters: Vec<Master> = (0..3).map(|i| Master::new(i, dir, &coord, mount)).collect();
    let mut kinds = cfg.kinds.clone();
    if kinds.contains(&Kind::DiskFull) && !masters.iter().all(|m| m.own_fs) {
        kinds.retain(|k| *k != Kind::DiskFull);
        let why = "disk_full: the log file systems need root to mount (tmpfs)";
        println!("nemesis: SKIPPED {why}");
        summary.skipped.push(why.into());
    }
    if kinds.is_empty() {
        return Ok(summary);
    }
    let mut c = Cluster {
        coord,
        masters,
        master_bin: crate::program("mooncake_master"),
        cluster,
    };
    if cfg.backend == Backend::K8s {
        // The store clients of this process find the leader on the Lease.
        let kubeconfig = dir.join("kubeconfig");
        c.coord.write_kubeconfig(&kubeconfig, &c.coord.addr);
        std::env::set_var("KUBECONFIG", &kubeconfig);
    }
    let (_meta, metadata) = metadata_server();

    // The first master exits when the coordination service, just started,
    // does not answer its probe in time (a loaded machine): start it again.
    let within_start = within(cfg.bound, || {
        if !c.masters[0].running() {
            c.masters[0].proc = None;
            c.masters[0].spawn(&c.master_bin, &c.coord, &c.cluster);
        }
        c.leader() == Some(0)
    });
    if !within_start {
        return Err(format!("the first master never led\n{}", c.logs()));
    }
    for i in 1..3 {
        c.masters[i].spawn(&c.master_bin, &c.coord, &c.cluster);
    }
    if !within(cfg.bound * 2, || c.whole()) {
        return Err(format!("the cluster never became whole\n{}", c.logs()));
    }

    let address = c.coord.client_address();
    let clients: Vec<Client> = (0..2)
        .map(|_| load::client(&address, &c.cluster, &metadata))
        .collect();
    let pulse = Pulse::new();
    let started = Instant::now();
    let mut plan = Plan::new(cfg.seed, &kinds);
    let outcome = std::thread::scope(|s| {
        let tasks: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, client)| {
                let pulse = &pulse;
                s.spawn(move || load::run(client, &format!("t{i}"), pulse))
            })
            .collect();
        let faults = rounds(cfg, &mut c, &mut plan, &pulse, started, &mut summary);
        pulse.stop.store(true, Ordering::SeqCst);
        let mut history = History::default();
        for t in tasks {
            history.merge(t.join().expect("load task"));
        }
        faults.map(|()| history)
    });
    let history = outcome?;
    summary.rounds = cfg.rounds;
    summary.acked_puts = history.acked_puts;
    summary.acked_removes = history.acked_removes;
    summary.good_reads = history.good_reads;
    summary.missing_reads = pulse.missing_reads.load(Ordering::SeqCst);
    summary.worst_unavailable = pulse.worst_gap();
    summary.lost.extend(history.vanished.iter().cloned());
    summary.wrong.extend(history.wrong_reads.iter().cloned());
    if cfg.tamper {
        tamper(&clients[0], &history);
    }
    let tally = final_check(&clients[0], &history, cfg.bound);
    summary.checked = tally.checked;
    summary.lost.extend(tally.lost);
    summary.wrong.extend(tally.wrong);
    summary.back.extend(tally.back);
    println!("{summary}");
    if !summary.clean() {
        println!(
            "nemesis: lost {:?} wrong {:?} back {:?}",
            &summary.lost[..summary.lost.len().min(20)],
            &summary.wrong[..summary.wrong.len().min(20)],
            &summary.back[..summary.back.len().min(20)]
        );
    }
    drop(clients);
    Ok(summary)
}

/// The faults, one at a time: inject, heal, wait for a put, make whole.
fn rounds(
    cfg: &Config,
    c: &mut Cluster,
    plan: &mut Plan,
    pulse: &Pulse,
    started: Instant,
    summary: &mut Summary,
) -> Result<(), String> {
    if !within(cfg.bound, || pulse.put_since(started)) {
        return Err(format!("no put acknowledged at the start\n{}", c.logs()));
    }
    for round in 0..cfg.rounds {
        let fault = plan.next_fault();
        let Some(who) = c.resolve(fault.target) else {
            return Err(format!("round {round}: no single leader\n{}", c.logs()));
        };
        let at = Instant::now();
        c.inject(&fault, who);
        let healed = Instant::now();
        *summary.faults.entry(fault.kind.name()).or_default() += 1;
        if !within(cfg.bound, || pulse.put_since(healed)) {
            return Err(format!(
                "round {round}: {fault} (master {who}): no put acknowledged within {:?} after it ended (seed {})\n{}",
                cfg.bound,
                cfg.seed,
                c.logs()
            ));
        }
        let recovery = healed.elapsed();
        summary.worst_recovery = summary.worst_recovery.max(recovery);
        let mut exited = 0;
        let whole = within(cfg.bound * 2, || {
            exited += c.restart_exited();
            c.whole()
        });
        summary.exited += exited;
        if !whole {
            return Err(format!(
                "round {round}: {fault} (master {who}): the cluster was not whole again within {:?} (seed {})\n{}",
                cfg.bound * 2,
                cfg.seed,
                c.logs()
            ));
        }
        let whom = match fault.kind {
            Kind::Coordination => String::new(),
            _ => format!(" (master {who})"),
        };
        println!(
            "nemesis round {round}: {fault}{whom}; a put {:.2}s after it ended; whole {:.2}s after it began{}",
            recovery.as_secs_f64(),
            at.elapsed().as_secs_f64(),
            if exited > 0 {
                format!("; {exited} master(s) had exited and were restarted")
            } else {
                String::new()
            }
        );
    }
    // Load through the whole cluster once more before the end, and removes
    // among it (a slow machine may not have reached them yet).
    let now = Instant::now();
    let served = within(cfg.bound * 4, || {
        pulse.put_since(now) && pulse.acked_removes.load(Ordering::SeqCst) > 0
    });
    if !served {
        return Err(format!(
            "no put (or no remove at all) acknowledged at the end\n{}",
            c.logs()
        ));
    }
    Ok(())
}

/// Removes the first acknowledged live key (lost) and puts other bytes
/// under the second (wrong), recording nothing.
fn tamper(client: &Client, history: &History) {
    let mut acked: Vec<&String> = history
        .keys
        .iter()
        .filter(|(_, ops)| ops.expect() == Expect::Value)
        .map(|(k, _)| k)
        .collect();
    acked.sort();
    assert!(acked.len() >= 2, "tamper: fewer than two acknowledged keys");
    for key in &acked[..2] {
        client.remove(key, true).expect("tamper: remove");
    }
    let other = super::checker::value_of("tampered");
    client
        .put(acked[1], &other, &ReplicaPolicy::default())
        .expect("tamper: put");
    println!(
        "nemesis: tampered: {} removed, {} rewritten",
        acked[0], acked[1]
    );
}

/// Reads every key the load touched and judges it.
fn final_check(client: &Client, history: &History, bound: Duration) -> Tally {
    // One bound for the whole check: a cluster that cannot serve a key
    // fails each of them quickly once it is spent.
    let deadline = Instant::now() + bound;
    let mut tally = Tally::default();
    let mut absent: Vec<&String> = Vec::new();
    for (key, ops) in &history.keys {
        match ops.expect() {
            Expect::Absent => absent.push(key),
            expect => {
                let found = read(client, key, expect, deadline);
                tally.add(key, judge(key, ops, &found));
            }
        }
    }
    for chunk in absent.chunks(500) {
        let keys: Vec<String> = chunk.iter().map(|k| k.to_string()).collect();
        let exist = loop {
            match client.batch_is_exist(&keys) {
                Ok(v) if v.iter().all(|r| r.is_ok()) => break v,
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
                other => panic!("final check: batch_is_exist keeps failing: {other:?}"),
            }
        };
        for (key, e) in chunk.iter().zip(exist) {
            let found = if e == Ok(true) {
                read(client, key, Expect::Absent, deadline)
            } else {
                Found::Absent
            };
            tally.add(key, judge(key, &history.keys[*key], &found));
        }
    }
    tally
}

/// The final read of `key`: retried while the answer is neither its bytes
/// nor "not found" (a replica not ready yet, a leader changing), until
/// `deadline` where the key must hold a value (2 s at least), for 2 s
/// where it may be absent (a put left in flight stays unreadable until it
/// is discarded).
fn read(client: &Client, key: &str, expect: Expect, deadline: Instant) -> Found {
    let brief = Instant::now() + Duration::from_secs(2);
    let deadline = match expect {
        Expect::Value => deadline.max(brief),
        _ => brief,
    };
    loop {
        match client.get(key) {
            Ok(bytes) => return Found::Bytes(bytes),
            Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => return Found::Absent,
            Err(e) if Instant::now() >= deadline => {
                println!("nemesis: final read of {key}: {e}");
                return Found::Absent;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A `mooncake_http_metadata_server` on a free port, and its URL.
fn metadata_server() -> (Proc, String) {
    let (meta, line) = spawn_until_line(
        &crate::program("mooncake_http_metadata_server"),
        &["-port=0".into(), "--host=127.0.0.1".into()],
        "listening on",
    );
    let addr = line.trim().rsplit(' ').next().expect("address").to_owned();
    (meta, format!("http://{addr}/metadata"))
}
