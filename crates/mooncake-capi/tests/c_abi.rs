//! The C ABI from C: the headers against the library's exports and the
//! structs' layout, and C programs written against the reference's API
//! compiled with the system C compiler (`cc`) and run as processes.
//!
//! Cargo builds this crate's library for the test with all its crate
//! types, so `libmooncake_capi.so` is in `target/<profile>/deps/`, where
//! `mooncake.pc` (written by the build script to `target/<profile>/`)
//! points. The store program needs
//! `mooncake_master` there too: `cargo test --workspace` builds it; alone,
//! `cargo build -p mooncake-cli --bin mooncake_master` first.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use mooncake_capi::types;
use test_support::ports::{free_port, MasterPorts};
use test_support::process::wait_port;

/// `target/<profile>`: the parent of the test executable's `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own executable");
    let deps = exe.parent().expect("executable in a directory");
    deps.parent().unwrap_or(deps).to_path_buf()
}

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// Fails loudly when there is no C compiler: the C programs are the point.
fn cc() -> &'static str {
    let ok = Command::new("cc")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "no C compiler: `cc` is missing, so the C ABI cannot be tested; install one (e.g. gcc)"
    );
    "cc"
}

/// The compiler and linker flags of `mooncake.pc`, `${libdir}` expanded:
/// how a C program finds the headers and the library.
fn pc_flags() -> (Vec<String>, String) {
    let pc_path = profile_dir().join("mooncake.pc");
    let pc = std::fs::read_to_string(&pc_path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (written by the crate's build script)",
            pc_path.display()
        )
    });
    let var = |name: &str| {
        pc.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in mooncake.pc"))
            .to_owned()
    };
    let (libdir, includedir) = (var("libdir"), var("includedir"));
    let field = |name: &str| {
        pc.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("{name}: in mooncake.pc"))
            .replace("${libdir}", &libdir)
            .replace("${includedir}", &includedir)
    };
    let mut flags: Vec<String> = field("Cflags")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    flags.extend(field("Libs").split_whitespace().map(str::to_owned));
    (flags, libdir)
}

/// Compiles `sources` (under `tests/c/`, or absolute) into `out` against
/// the headers and the library, warnings as errors.
fn compile(sources: &[PathBuf], out: &Path) {
    let (flags, libdir) = pc_flags();
    let lib = Path::new(&libdir).join("libmooncake_capi.so");
    assert!(lib.is_file(), "{} is missing", lib.display());
    let status = Command::new(cc())
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(out)
        .args(sources)
        .args(&flags)
        .arg(format!("-Wl,-rpath,{libdir}"))
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed for {sources:?}");
}

fn c_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
}

/// The functions a header declares: declarations start at column 0 with
/// their return type and hold the name before the first `(`.
fn declared(header: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(include_dir().join(header)).expect("header");
    text.lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_alphabetic()))
        .filter(|l| {
            !l.starts_with("typedef") && !l.starts_with("struct") && !l.starts_with("extern")
        })
        .filter_map(|l| {
            let head = &l[..l.find('(')?];
            let name = head.rsplit([' ', '*']).next()?;
            Some(name.to_owned())
        })
        .collect()
}

fn kill_on_drop(child: Child) -> impl Drop {
    struct Guard(Child);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    Guard(child)
}

/// Waits for `child` up to `limit`; its exit code and output.
fn finish(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let (tx, rx) = mpsc::channel();
    let mut out = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        let _ = tx.send(s);
    });
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
            return (status.code(), out);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_declared_function_is_exported_and_nothing_else() {
    let mut want = declared("transfer_engine_c.h");
    let store = declared("store_c.h");
    assert_eq!(want.len(), 27, "transfer_engine_c.h: {want:?}");
    assert_eq!(store.len(), 19, "store_c.h: {store:?}");
    want.extend(store);

    // Every declared function links, with the header's prototype in scope.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("symbols.c");
    let mut c = String::from("#include \"transfer_engine_c.h\"\n#include \"store_c.h\"\n#include <stdio.h>\nint main(void) {\n    void *fns[] = {\n");
    for f in &want {
        c.push_str(&format!("        (void *)&{f},\n"));
    }
    c.push_str("    };\n    printf(\"%zu\\n\", sizeof fns / sizeof fns[0]);\n    return 0;\n}\n");
    std::fs::write(&src, c).unwrap();
    let exe = dir.path().join("symbols");
    compile(&[src], &exe);
    let out = Command::new(&exe).output().expect("run symbols");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        want.len().to_string()
    );

    // And the library exports no function the headers do not declare.
    let (_, libdir) = pc_flags();
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(Path::new(&libdir).join("libmooncake_capi.so"))
        .output()
        .expect("nm");
    assert!(nm.status.success(), "nm failed");
    let exported: BTreeSet<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T").then(|| name.to_owned())
        })
        .collect();
    assert_eq!(exported, want, "exported functions vs declared ones");
}

#[test]
fn structs_have_the_c_layout() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("layout.c");
    std::fs::write(
        &src,
        r#"#include <stddef.h>
#include <stdio.h>
#include "transfer_engine_c.h"
#include "store_c.h"
#define S(t) printf(#t " %zu\n", sizeof(t))
#define O(t, f) printf(#t "." #f " %zu\n", offsetof(t, f))
int main(void) {
    S(transfer_request_t); O(transfer_request_t, source); O(transfer_request_t, target_id);
    O(transfer_request_t, target_offset); O(transfer_request_t, length);
    S(notify_msg_t); O(notify_msg_t, msg);
    S(transfer_status_t); O(transfer_status_t, transferred_bytes);
    S(buffer_entry_t); O(buffer_entry_t, length);
    S(nic_load_stat_t); O(nic_load_stat_t, inflight_bytes); O(nic_load_stat_t, ewma_bandwidth_bps);
    S(mooncake_replicate_config_t); O(mooncake_replicate_config_t, with_soft_pin);
    O(mooncake_replicate_config_t, with_hard_pin); O(mooncake_replicate_config_t, preferred_segments);
    O(mooncake_replicate_config_t, preferred_segments_count);
    printf("INVALID_BATCH %llu\n", (unsigned long long)INVALID_BATCH);
    printf("LOCAL_SEGMENT %d\n", LOCAL_SEGMENT);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("layout");
    compile(&[src], &exe);
    let out = Command::new(&exe).output().expect("run layout");
    let c = String::from_utf8_lossy(&out.stdout).into_owned();
    use std::mem::{offset_of, size_of};
    use types::*;
    let rust = [
        ("transfer_request_t", size_of::<TransferRequestC>()),
        (
            "transfer_request_t.source",
            offset_of!(TransferRequestC, source),
        ),
        (
            "transfer_request_t.target_id",
            offset_of!(TransferRequestC, target_id),
        ),
        (
            "transfer_request_t.target_offset",
            offset_of!(TransferRequestC, target_offset),
        ),
        (
            "transfer_request_t.length",
            offset_of!(TransferRequestC, length),
        ),
        ("notify_msg_t", size_of::<NotifyMsg>()),
        ("notify_msg_t.msg", offset_of!(NotifyMsg, msg)),
        ("transfer_status_t", size_of::<TransferStatusC>()),
        (
            "transfer_status_t.transferred_bytes",
            offset_of!(TransferStatusC, transferred_bytes),
        ),
        ("buffer_entry_t", size_of::<BufferEntry>()),
        ("buffer_entry_t.length", offset_of!(BufferEntry, length)),
        ("nic_load_stat_t", size_of::<NicLoadStat>()),
        (
            "nic_load_stat_t.inflight_bytes",
            offset_of!(NicLoadStat, inflight_bytes),
        ),
        (
            "nic_load_stat_t.ewma_bandwidth_bps",
            offset_of!(NicLoadStat, ewma_bandwidth_bps),
        ),
        ("mooncake_replicate_config_t", size_of::<ReplicateConfigC>()),
        (
            "mooncake_replicate_config_t.with_soft_pin",
            offset_of!(ReplicateConfigC, with_soft_pin),
        ),
        (
            "mooncake_replicate_config_t.with_hard_pin",
            offset_of!(ReplicateConfigC, with_hard_pin),
        ),
        (
            "mooncake_replicate_config_t.preferred_segments",
            offset_of!(ReplicateConfigC, preferred_segments),
        ),
        (
            "mooncake_replicate_config_t.preferred_segments_count",
            offset_of!(ReplicateConfigC, preferred_segments_count),
        ),
    ];
    let mut expected: String = rust.iter().map(|(n, v)| format!("{n} {v}\n")).collect();
    expected.push_str(&format!(
        "INVALID_BATCH {INVALID_BATCH}\nLOCAL_SEGMENT {LOCAL_SEGMENT}\n"
    ));
    assert_eq!(c, expected);
}

#[test]
fn pkg_config_agrees_with_the_file() {
    let (flags, _) = pc_flags();
    let out = match Command::new("pkg-config")
        .args(["--cflags", "--libs", "mooncake"])
        .env("PKG_CONFIG_PATH", profile_dir())
        .output()
    {
        Ok(o) => o,
        Err(_) => {
            eprintln!("pkg-config is not installed: mooncake.pc was read directly only");
            return;
        }
    };
    assert!(
        out.status.success(),
        "pkg-config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(got, flags.into_iter().collect::<BTreeSet<_>>());
}

/// Runs `exe server`, then `exe client <segment> <addr> <len> <extra>` with
/// what the server printed; the client's exit code and output, and the
/// server's lines after `READY`.
fn server_and_client(exe: &Path, extra: &[&str]) -> (Option<i32>, String, Vec<String>) {
    let mut server = Command::new(exe)
        .arg("server")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start server");
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let ready = lines
        .next()
        .expect("server's READY line")
        .expect("read server stdout");
    let fields: Vec<&str> = ready.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "{ready}");
    assert_eq!(fields[0], "READY", "{ready}");
    let server = kill_on_drop(server);
    let client = Command::new(exe)
        .args(["client", fields[1], fields[2], fields[3]])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start client");
    let (code, out) = finish(client, Duration::from_secs(240));
    // The server ends once the client said bye (or is killed on a failure).
    let rest: Vec<String> = if code == Some(0) {
        lines.map_while(Result::ok).collect()
    } else {
        Vec::new()
    };
    drop(server);
    (code, out, rest)
}

#[test]
fn two_processes_write_read_and_notify_through_the_c_api() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("te_demo");
    compile(&[c_source("te_demo.c")], &exe);
    let (code, out, server) = server_and_client(&exe, &[]);
    assert_eq!(code, Some(0), "client: {out}");
    assert!(out.contains("client OK"), "{out}");
    assert!(
        server.iter().any(|l| l == "server OK"),
        "server said {server:?}"
    );
}

/// The throughput program of docs/c-abi.md keeps building and running (a
/// short run; the measurement is by hand).
#[test]
fn the_throughput_program_runs() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("te_bench");
    compile(&[c_source("te_bench.c")], &exe);
    let (code, out, _) = server_and_client(&exe, &["0.01"]);
    assert_eq!(code, Some(0), "client: {out}");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 6, "{out}");
    for row in rows {
        let gbs: f64 = row.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(gbs > 0.0, "{row}");
    }
}

#[test]
fn the_store_api_against_a_master() {
    let master_bin = profile_dir().join("mooncake_master");
    assert!(
        master_bin.is_file(),
        "{} is missing; build it first: cargo build -p mooncake-cli --bin mooncake_master \
         (cargo test --workspace does)",
        master_bin.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("store_demo");
    compile(&[c_source("store_demo.c")], &exe);

    let ports = MasterPorts {
        rpc: free_port(),
        metrics: free_port(),
        metadata: free_port(),
    };
    let master = Command::new(&master_bin)
        .args(ports.args())
        .args(["--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start mooncake_master");
    let master = kill_on_drop(master);
    wait_port(ports.rpc);

    let store = Command::new(&exe)
        .arg(format!("127.0.0.1:{}", ports.rpc))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start store_demo");
    let (code, out) = finish(store, Duration::from_secs(240));
    assert_eq!(code, Some(0), "store_demo: {out}");
    assert!(out.contains("store OK"), "{out}");
    drop(master);
}
