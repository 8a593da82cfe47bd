//! `tebench`: the reference's transfer-engine benchmark, with the flags that
//! mean something on CPU memory over TCP and shared memory. Both engines
//! (`--backend=classic|tent`) run the same cases, so their tables compare.
//!
//! Roles as in the reference: an empty `--target_seg_name` makes a target
//! (registers `--total_buffer_size` bytes of DRAM and serves until killed),
//! a set one an initiator (sweeps threads × block size × batch size, each
//! case a 1 s warmup and `--duration` seconds measured, one table row per
//! case). Flags that need GPUs, RDMA or TENT's QoS scheduling are refused
//! by name rather than accepted and ignored.

mod run;
mod stats;

pub use run::run;
pub use stats::{format_row, header, CaseStats};

use mooncake_common::gflags;
use mooncake_common::{Error, ErrorCode, Result};

use crate::bench::Backend;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpType {
    Read,
    Write,
    /// A WRITE then a READ of the same blocks, both recorded.
    Mix,
    /// WRITEs of data derived from the target address (for `ReadVerify`).
    WriteSeed,
    /// READs checked against the data `WriteSeed` wrote.
    ReadVerify,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Flags {
    pub seg_name: String,
    pub target_seg_names: Vec<String>,
    pub op_type: OpType,
    pub check_consistency: bool,
    pub total_buffer_size: u64,
    pub start_block_size: u64,
    pub max_block_size: u64,
    pub start_batch_size: u64,
    pub max_batch_size: u64,
    pub duration_s: u64,
    pub start_num_threads: usize,
    pub max_num_threads: usize,
    pub target_offset: u64,
    pub target_range_size: u64,
    pub request_interval_us: u64,
    pub metadata_type: String,
    pub metadata_url_list: String,
    pub rpc_server_port: u16,
    pub backend: Backend,
}

impl Default for Flags {
    /// The reference's defaults.
    fn default() -> Flags {
        Flags {
            seg_name: String::new(),
            target_seg_names: Vec::new(),
            op_type: OpType::Read,
            check_consistency: false,
            total_buffer_size: 1 << 30,
            start_block_size: 4096,
            max_block_size: 1 << 26,
            start_batch_size: 1,
            max_batch_size: 1,
            duration_s: 5,
            start_num_threads: 1,
            max_num_threads: 1,
            target_offset: 0,
            target_range_size: 0,
            request_interval_us: 0,
            metadata_type: "p2p".into(),
            metadata_url_list: String::new(),
            rpc_server_port: 0,
            backend: Backend::Tent,
        }
    }
}

impl Flags {
    pub fn is_target(&self) -> bool {
        self.target_seg_names.is_empty()
    }

    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Classic => "classic",
            Backend::Tent => "tent",
        }
    }

    /// The engine's metadata connection string for `--metadata_type`.
    pub fn metadata_server(&self) -> String {
        let url = self.metadata_url_list.trim();
        match self.metadata_type.as_str() {
            "p2p" => "P2PHANDSHAKE".into(),
            _ if url.contains("://") => url.into(),
            t => format!("{t}://{url}"),
        }
    }
}

const BOOL_FLAGS: &[&str] = &["check_consistency", "notifi", "deadline_bw_arbitration"];

fn bad(m: String) -> Error {
    Error::new(ErrorCode::ERR_INVALID_ARGUMENT, m)
}

/// Refuses a flag this machine cannot honour unless it has its default.
fn refuse(key: &str, value: &str, default: &[&str], why: &str) -> Result<()> {
    if default.iter().any(|d| d.eq_ignore_ascii_case(value.trim())) {
        return Ok(());
    }
    Err(bad(format!("--{key}={value} is not supported: {why}")))
}

/// Parses the reference's gflags command line (`argv` without the program).
pub fn parse(argv: &[String]) -> Result<Flags> {
    let args = gflags::normalize(
        std::iter::once("tebench".to_string()).chain(argv.iter().cloned()),
        BOOL_FLAGS,
    );
    let mut f = Flags::default();
    let mut it = args.into_iter().skip(1);
    while let Some(arg) = it.next() {
        let Some(body) = arg.strip_prefix("--") else {
            return Err(bad(format!("unexpected argument {arg:?}")));
        };
        let (key, value) = match body.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (
                body.to_string(),
                it.next()
                    .ok_or_else(|| bad(format!("--{body} needs a value")))?,
            ),
        };
        set(&mut f, &key, &value)?;
    }
    validate(&f)?;
    Ok(f)
}

fn set(f: &mut Flags, key: &str, value: &str) -> Result<()> {
    let num = |v: &str| -> Result<u64> {
        mooncake_common::size::parse_size(v).map_err(|e| bad(format!("--{key}={v}: {e}")))
    };
    let boolean = |v: &str| gflags::parse_bool(v).map_err(|e| bad(format!("--{key}: {e}")));
    const GPU: &str = "this build moves host memory only (no GPU)";
    const TENT_QOS: &str = "TENT's QoS classes, intents and deadlines are not implemented here";
    match key {
        "seg_name" => f.seg_name = value.into(),
        "seg_type" => refuse(key, value, &["DRAM"], GPU)?,
        "seg_type_mix" => refuse(key, value, &["", "dram"], GPU)?,
        "target_seg_name" => {
            f.target_seg_names = value
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        }
        "op_type" => {
            f.op_type = match value {
                "read" => OpType::Read,
                "write" => OpType::Write,
                "mix" => OpType::Mix,
                "write_seed" => OpType::WriteSeed,
                "read_verify" => OpType::ReadVerify,
                v => {
                    return Err(bad(format!(
                        "--op_type={v}: read, write, mix, write_seed or read_verify"
                    )))
                }
            }
        }
        "check_consistency" => f.check_consistency = boolean(value)?,
        "total_buffer_size" => f.total_buffer_size = num(value)?,
        "start_block_size" => f.start_block_size = num(value)?,
        "max_block_size" => f.max_block_size = num(value)?,
        "start_batch_size" => f.start_batch_size = num(value)?,
        "max_batch_size" => f.max_batch_size = num(value)?,
        "duration" => f.duration_s = num(value)?,
        "start_num_threads" => f.start_num_threads = num(value)? as usize,
        "max_num_threads" => f.max_num_threads = num(value)? as usize,
        "target_offset" => f.target_offset = num(value)?,
        "target_range_size" => f.target_range_size = num(value)?,
        "request_interval_us" => f.request_interval_us = num(value)?,
        "metadata_type" => match value {
            "p2p" | "etcd" | "redis" | "http" => f.metadata_type = value.into(),
            v => {
                return Err(bad(format!(
                    "--metadata_type={v}: p2p, etcd, redis or http"
                )))
            }
        },
        "metadata_url_list" => f.metadata_url_list = value.into(),
        "rpc_server_port" => {
            f.rpc_server_port = value
                .parse()
                .map_err(|_| bad(format!("--rpc_server_port={value}: not a port")))?
        }
        "backend" => {
            f.backend = match value {
                "classic" => Backend::Classic,
                "tent" => Backend::Tent,
                v => return Err(bad(format!("--backend={v}: classic or tent"))),
            }
        }
        "local_gpu_id" | "target_gpu_id" => refuse(key, value, &["0"], GPU)?,
        "xport_type" => refuse(
            key,
            value,
            &[""],
            "the engines pick TCP or same-host shared memory themselves; \
             rdma, mnnvl, gds, iouring, sunrise_link and mpcomm need hardware this build lacks",
        )?,
        "notifi" => refuse(
            key,
            value,
            &["false"],
            "notifications are not benchmarked here",
        )?,
        "tent_transport_hint" | "tent_intent_type" => refuse(key, value, &["unspec"], TENT_QOS)?,
        "qos_classes" | "qos_classes_json" | "workload_classes_json" | "qos_output_jsonl" => {
            refuse(key, value, &[""], TENT_QOS)?
        }
        "qos_link_capacity_gbps" => refuse(key, value, &["0", "0.0"], TENT_QOS)?,
        "deadline_us" | "deadline_tight_threads" => refuse(key, value, &["0"], TENT_QOS)?,
        "deadline_bw_arbitration" => {
            refuse(key, value, &["false"], "it arbitrates RDMA bandwidth")?
        }
        k => return Err(bad(format!("unknown flag --{k}"))),
    }
    Ok(())
}

fn validate(f: &Flags) -> Result<()> {
    let pow2 = |name: &str, lo: u64, hi: u64| -> Result<()> {
        if lo == 0 || hi < lo {
            return Err(bad(format!(
                "--start_{name}={lo} --max_{name}={hi}: need 1 <= start <= max"
            )));
        }
        Ok(())
    };
    pow2("block_size", f.start_block_size, f.max_block_size)?;
    pow2("batch_size", f.start_batch_size, f.max_batch_size)?;
    pow2(
        "num_threads",
        f.start_num_threads as u64,
        f.max_num_threads as u64,
    )?;
    if f.max_num_threads > 1024 {
        return Err(bad("--max_num_threads: at most 1024".into()));
    }
    if f.duration_s == 0 {
        return Err(bad("--duration must be at least 1 second".into()));
    }
    if f.total_buffer_size == 0 {
        return Err(bad("--total_buffer_size must be positive".into()));
    }
    if f.check_consistency && matches!(f.op_type, OpType::WriteSeed | OpType::ReadVerify) {
        return Err(bad(
            "--check_consistency cannot be combined with --op_type=write_seed or read_verify"
                .into(),
        ));
    }
    if f.metadata_type != "p2p" && f.metadata_url_list.trim().is_empty() {
        return Err(bad(format!(
            "--metadata_type={} needs --metadata_url_list",
            f.metadata_type
        )));
    }
    if f.metadata_type != "p2p" && f.seg_name.trim().is_empty() {
        return Err(bad(format!(
            "--metadata_type={} needs --seg_name (this process's segment name)",
            f.metadata_type
        )));
    }
    if f.rpc_server_port != 0 && (f.metadata_type != "p2p" || f.backend == Backend::Tent) {
        return Err(bad(
            "--rpc_server_port is for --metadata_type=p2p with --backend=classic \
             (TENT picks a free port per path)"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Flags> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_are_the_references_and_make_a_target() {
        let f = p(&[]).unwrap();
        assert_eq!(f, Flags::default());
        assert!(f.is_target());
        assert_eq!(f.backend, Backend::Tent);
        assert_eq!(f.metadata_server(), "P2PHANDSHAKE");
    }

    #[test]
    fn initiator_flags_in_every_gflags_spelling() {
        let f = p(&[
            "--target_seg_name=a:1,b:2",
            "-backend",
            "classic",
            "--op_type=mix",
            "--check_consistency",
            "--duration=2",
            "--start_block_size=4K",
            "--max_block_size=1M",
            "--max_batch_size=4",
            "--max_num_threads=2",
            "--request_interval_us=10",
            "--seg_type=dram",
            "--nonotifi",
        ])
        .unwrap();
        assert_eq!(f.target_seg_names, ["a:1", "b:2"]);
        assert_eq!(f.backend, Backend::Classic);
        assert_eq!(f.op_type, OpType::Mix);
        assert!(f.check_consistency);
        assert_eq!((f.start_block_size, f.max_block_size), (4096, 1 << 20));
        assert_eq!((f.max_batch_size, f.max_num_threads), (4, 2));
        assert_eq!((f.duration_s, f.request_interval_us), (2, 10));
    }

    #[test]
    fn metadata_types_map_to_connection_strings() {
        let f = p(&[
            "--metadata_type=etcd",
            "--metadata_url_list=127.0.0.1:2379",
            "--seg_name=n",
        ])
        .unwrap();
        assert_eq!(f.metadata_server(), "etcd://127.0.0.1:2379");
        let f = p(&[
            "--metadata_type=http",
            "--metadata_url_list=http://h:8080/metadata",
            "--seg_name=n",
        ])
        .unwrap();
        assert_eq!(f.metadata_server(), "http://h:8080/metadata");
        assert!(p(&["--metadata_type=etcd", "--seg_name=n"]).is_err());
        assert!(p(&["--metadata_type=etcd", "--metadata_url_list=h:1"]).is_err());
        assert!(p(&["--metadata_type=zk"]).is_err());
    }

    #[test]
    fn hardware_flags_are_refused_by_name() {
        for (flag, name) in [
            ("--seg_type=VRAM", "seg_type"),
            ("--seg_type_mix=dram,vram", "seg_type_mix"),
            ("--xport_type=rdma", "xport_type"),
            ("--local_gpu_id=1", "local_gpu_id"),
            ("--target_gpu_id=-1", "target_gpu_id"),
            ("--notifi", "notifi"),
            ("--qos_classes=a:1:0:1", "qos_classes"),
            ("--tent_intent_type=checkpoint", "tent_intent_type"),
            ("--deadline_us=5", "deadline_us"),
            ("--deadline_bw_arbitration", "deadline_bw_arbitration"),
        ] {
            let e = p(&[flag]).unwrap_err().to_string();
            assert!(
                e.contains(name) && e.contains("not supported"),
                "{flag}: {e}"
            );
        }
        // Their defaults, spelled out, are fine.
        p(&[
            "--xport_type=",
            "--local_gpu_id=0",
            "--tent_intent_type=unspec",
        ])
        .unwrap();
    }

    #[test]
    fn bad_values_are_errors() {
        for args in [
            &["--backend=rdma"][..],
            &["--op_type=copy"],
            &["--duration=0"],
            &["--start_block_size=8K", "--max_block_size=4K"],
            &["--start_num_threads=0"],
            &["--total_buffer_size=0"],
            &["--op_type=read_verify", "--check_consistency"],
            &["--rpc_server_port=12345"],
            &["--rpc_server_port=x", "--backend=classic"],
            &["--bogus=1"],
            &["--target_seg_name"],
            &["stray"],
        ] {
            assert!(p(args).is_err(), "{args:?}");
        }
        p(&["--rpc_server_port=12345", "--backend=classic"]).unwrap();
    }
}
