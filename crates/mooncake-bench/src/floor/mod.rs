//! The floor phases of `mooncake-bench ha`: the same client, process and
//! thread topology as a replicated master with no state machine behind it
//! (`model`). The leader and its standbys are
//! this executable re-run in a hidden mode (`--floor-process`), so each is
//! a process of its own, as the masters are.

use std::io::Write;
use std::net::SocketAddr;

use mooncake_common::{Error, ErrorCode, Result};

pub(crate) use self::model::{FloorClient, Mode, Quorum};
use crate::cluster::{field, work_dir, Proc};

mod leader;
mod model;
mod standby;

/// First argument that turns this executable into a floor process.
const FLOOR_PROCESS: &str = "--floor-process";
/// What a floor process prints once it serves.
const READY: &str = "floor process ready";

fn err(what: String) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, what)
}

/// `argv` = `[_, "--floor-process", "leader", MODE, QUORUM]` or
/// `[_, "--floor-process", "standby", LEADER, ID]`: runs that process until
/// it is stopped; `None` for any other command line.
pub(crate) fn run_as_floor(argv: &[String]) -> Option<i32> {
    if argv.get(1).map(String::as_str) != Some(FLOOR_PROCESS) {
        return None;
    }
    let args: Vec<&str> = argv[2..].iter().map(String::as_str).collect();
    let outcome = match args.as_slice() {
        ["leader", mode, quorum] => {
            Mode::parse(mode).and_then(|m| Quorum::parse(quorum).and_then(|q| lead(m, q)))
        }
        ["standby", leader, id] => leader
            .parse::<SocketAddr>()
            .map_err(|e| err(format!("leader address {leader}: {e}")))
            .and_then(|addr| {
                ready(&format!("standby={id}"));
                standby::run_standby(addr, id)
            }),
        _ => Err(err(format!(
            "{FLOOR_PROCESS}: leader MODE QUORUM | standby ADDR ID"
        ))),
    };
    match outcome {
        Ok(()) => Some(0),
        Err(e) => {
            eprintln!("floor process: {e}");
            Some(1)
        }
    }
}

fn ready(fields: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{READY} {fields}");
    let _ = out.flush();
}

/// Serves as the floor's leader until the process is stopped.
fn lead(mode: Mode, quorum: Quorum) -> Result<()> {
    let leader = leader::serve_leader(mode, quorum)?;
    let (rpc, standbys) = leader.addresses();
    ready(&format!("rpc={rpc} standbys={standbys}"));
    loop {
        std::thread::park();
    }
}

/// A floor of one mode and quorum: its processes, stopped when dropped.
pub(crate) struct Floor {
    /// Where its leader serves clients.
    rpc: String,
    _procs: Vec<Proc>,
}

impl Floor {
    pub(crate) fn start(mode: Mode, quorum: Quorum) -> Result<Floor> {
        let exe = std::env::current_exe().map_err(|e| err(format!("own executable: {e}")))?;
        let dir = work_dir()?;
        let name = format!("floor-{}-{}", mode.name(), quorum.name());
        let args = [FLOOR_PROCESS, "leader", mode.name(), quorum.name()];
        let (leader, line) = Proc::spawn(
            &name,
            &exe,
            args,
            &[],
            dir.join(format!("{name}.log")),
            READY,
        )?;
        let rpc = field(&line, "rpc").ok_or_else(|| err(format!("{name}: {line}")))?;
        let standbys = field(&line, "standbys").ok_or_else(|| err(format!("{name}: {line}")))?;
        let mut procs = vec![leader];
        if mode.replicates() {
            for i in 0..quorum.standbys() {
                let id = format!("{name}-standby-{i}");
                let args = [FLOOR_PROCESS, "standby", standbys, id.as_str()];
                let log = dir.join(format!("{id}.log"));
                procs.push(Proc::spawn(&id, &exe, args, &[], log, READY)?.0);
            }
        }
        Ok(Floor {
            rpc: rpc.to_string(),
            _procs: procs,
        })
    }

    pub(crate) fn address(&self) -> &str {
        &self.rpc
    }
}
