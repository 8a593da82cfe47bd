//! `transfer_engine_c.h` over [`mooncake_transfer::TransferEngine`].
//!
//! Handles are looked up ([`crate::handles`]); pointers are read through
//! [`crate::ffi`]; the bytes a request moves are checked by the engine
//! against registered memory before anything moves (a source outside it is
//! `ERR_ADDRESS_NOT_REGISTERED`, a target range outside the peer's buffers
//! an error too), and memory is registered only when this process maps it
//! writable ([`crate::maps`]).

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::{
    BatchId, EngineConfig, Notify, Opcode, SegmentHandle, TransferEngine, TransferRequest,
};
use parking_lot::Mutex;

use crate::codes::{self, ERR_INVALID_ARGUMENT, STATUS_INVALID_ARGUMENT};
use crate::ffi;
use crate::handles::Registry;
use crate::types::{
    BufferEntry, NicLoadStat, NotifyMsg, TransferRequestC, TransferStatusC, INVALID_BATCH,
    LOCAL_SEGMENT, OPCODE_READ, OPCODE_WRITE,
};
use crate::{guard, init_logging};
use mooncake_common::maps::{self, Access};

/// `transfer_engine_t`: the engine and what the C layer tracks of it.
struct CEngine {
    engine: TransferEngine,
    /// The handle of this engine's own segment (`LOCAL_SEGMENT`), opened
    /// on first use.
    own: OnceLock<SegmentHandle>,
    /// Segments opened through this handle, refreshed by `syncSegmentCache`.
    opened: Mutex<BTreeSet<SegmentHandle>>,
    /// Batches allocated and not freed: `enableGracefulShutdown` makes
    /// `destroyTransferEngine` wait for them.
    batches: Mutex<BTreeSet<BatchId>>,
    graceful: AtomicBool,
}

static ENGINES: Registry<CEngine> = Registry::new(1);

/// The transports this engine runs: TCP between hosts, shared memory on
/// the same host, both always on.
static TRANSPORTS: [&str; 2] = ["tcp", "shm"];

fn invalid(msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorCode::ERR_INVALID_ARGUMENT, msg)
}

impl CEngine {
    /// The engine's handle of C segment id `id` (`LOCAL_SEGMENT` is its own).
    fn segment(&self, id: i64) -> Result<SegmentHandle> {
        if id == i64::from(LOCAL_SEGMENT) {
            if let Some(&h) = self.own.get() {
                return Ok(h);
            }
            let h = self.engine.open_segment(&self.engine.local_server_name())?;
            return Ok(*self.own.get_or_init(|| h));
        }
        u64::try_from(id).map_err(|_| invalid(format!("bad segment id {id}")))
    }

    fn requests(
        &self,
        entries: *const TransferRequestC,
        count: usize,
    ) -> Result<Vec<TransferRequest>> {
        let raw = ffi::array(entries, count)
            .ok_or_else(|| invalid("null, misaligned or oversize request array"))?;
        raw.iter()
            .map(|r| {
                let opcode = match r.opcode {
                    OPCODE_READ => Opcode::Read,
                    OPCODE_WRITE => Opcode::Write,
                    op => return Err(invalid(format!("bad opcode {op}"))),
                };
                let length = usize::try_from(r.length)
                    .map_err(|_| invalid(format!("length {} too large", r.length)))?;
                Ok(TransferRequest {
                    opcode,
                    source: r.source as usize,
                    target_id: self.segment(i64::from(r.target_id))?,
                    target_offset: r.target_offset,
                    length,
                })
            })
            .collect()
    }
}

fn notify_of(m: &NotifyMsg) -> Option<Notify> {
    Some(Notify {
        name: ffi::string(m.name)?,
        msg: ffi::string(m.msg)?,
    })
}

/// A segment id (`segment_id_t`) for the engine's handle.
fn segment_id(h: SegmentHandle) -> Result<i32> {
    i32::try_from(h)
        .map_err(|_| Error::new(ErrorCode::ERR_TOO_MANY_REQUESTS, "segment ids exhausted"))
}

/// Runs `f` on the engine behind `engine`; `bad` for a bad handle or a panic.
fn with<R: Copy>(engine: *mut c_void, bad: R, f: impl FnOnce(&CEngine) -> R) -> R {
    guard(bad, || match ENGINES.get(engine) {
        Some(e) => f(&e),
        None => {
            tracing::warn!("invalid transfer_engine_t {engine:p}");
            bad
        }
    })
}

/// The engine `createTransferEngine` starts: `ip_or_host_name` is where
/// peers reach it (and, when an IP address, where it listens), `rpc_port`
/// its port (0: a free one).
fn config(metadata: &str, name: &str, ip_or_host: &str, rpc_port: u64) -> Result<EngineConfig> {
    let mut config = EngineConfig::new(metadata, name);
    let port = u16::try_from(rpc_port).map_err(|_| invalid(format!("rpc_port {rpc_port}")))?;
    if port != 0 {
        config.rpc_port = Some(port);
    }
    if !ip_or_host.trim().is_empty() && config.rpc_bind_address.is_none() {
        config.rpc_bind_address = Some(ip_or_host.trim().to_owned());
    }
    Ok(config)
}

#[no_mangle]
pub extern "C" fn createTransferEngine(
    metadata_conn_string: *const c_char,
    local_server_name: *const c_char,
    ip_or_host_name: *const c_char,
    rpc_port: u64,
    auto_discover: c_int,
) -> *mut c_void {
    init_logging();
    // Topology discovery finds RDMA NICs; on TCP and shared memory there is
    // nothing to discover, so `auto_discover` changes nothing.
    let _ = auto_discover;
    guard(std::ptr::null_mut(), || {
        let (Some(meta), Some(name)) = (
            ffi::string(metadata_conn_string),
            ffi::string(local_server_name),
        ) else {
            tracing::error!("createTransferEngine: null or non-UTF-8 string");
            return std::ptr::null_mut();
        };
        let ip = ffi::string(ip_or_host_name).unwrap_or_default();
        match config(&meta, &name, &ip, rpc_port).and_then(TransferEngine::new) {
            Ok(engine) => ENGINES.insert(CEngine {
                engine,
                own: OnceLock::new(),
                opened: Mutex::new(BTreeSet::new()),
                batches: Mutex::new(BTreeSet::new()),
                graceful: AtomicBool::new(false),
            }),
            Err(e) => {
                tracing::error!("createTransferEngine: {e}");
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn destroyTransferEngine(engine: *mut c_void) {
    guard((), || {
        let Some(e) = ENGINES.remove(engine) else {
            return;
        };
        if e.graceful.load(Ordering::Acquire) {
            let live: Vec<BatchId> = e.batches.lock().iter().copied().collect();
            for b in live {
                let _ = e.engine.wait_batch(b);
            }
        }
        e.engine.shutdown();
    })
}

#[no_mangle]
pub extern "C" fn enableGracefulShutdown(engine: *mut c_void) {
    with(engine, (), |e| e.graceful.store(true, Ordering::Release))
}

/// 0: there is no NIC topology to discover on TCP and shared memory.
#[no_mangle]
pub extern "C" fn discoverTopology(engine: *mut c_void) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |_| 0)
}

#[no_mangle]
pub extern "C" fn getLocalIpAndPort(
    engine: *mut c_void,
    buf_out: *mut c_char,
    buf_len: usize,
) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        let s = format!("{}:{}", e.engine.hostname(), e.engine.rpc_port());
        if ffi::put_str(buf_out, buf_len, &s, true) {
            0
        } else {
            ERR_INVALID_ARGUMENT
        }
    })
}

/// A non-null `transport_t` for a transport this engine runs, null for
/// any other (RDMA, NVLink, ... are not built).
#[no_mangle]
pub extern "C" fn installTransport(
    engine: *mut c_void,
    proto: *const c_char,
    args: *mut *mut c_void,
) -> *mut c_void {
    let _ = args;
    with(engine, std::ptr::null_mut(), |_| {
        let proto = ffi::string(proto).unwrap_or_default();
        match TRANSPORTS.iter().position(|&t| t == proto) {
            // A token for the transport: a stable, non-null address of ours.
            Some(i) => std::ptr::addr_of!(TRANSPORTS[i]) as *mut c_void,
            None => {
                tracing::error!("installTransport: no {proto:?} transport in this build");
                std::ptr::null_mut()
            }
        }
    })
}

/// TCP and shared memory cannot be taken out of a running engine:
/// `ERR_INVALID_ARGUMENT` for them and for any other name.
#[no_mangle]
pub extern "C" fn uninstallTransport(engine: *mut c_void, proto: *const c_char) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |_| {
        let proto = ffi::string(proto).unwrap_or_default();
        tracing::error!("uninstallTransport({proto:?}): the engine's transports are fixed");
        ERR_INVALID_ARGUMENT
    })
}

fn open(e: &CEngine, name: *const c_char, fresh: bool) -> i32 {
    let Some(name) = ffi::string(name) else {
        return ERR_INVALID_ARGUMENT;
    };
    // The reference strips leading slashes from segment names.
    let name = name.trim_start_matches('/');
    if name.is_empty() {
        return ERR_INVALID_ARGUMENT;
    }
    let opened = e.engine.open_segment(name).and_then(|h| {
        if fresh {
            e.engine.refresh_segment(h)?;
        }
        e.opened.lock().insert(h);
        segment_id(h)
    });
    opened.unwrap_or_else(|err| {
        tracing::warn!("openSegment({name}): {err}");
        codes::engine_code(&err)
    })
}

#[no_mangle]
pub extern "C" fn openSegment(engine: *mut c_void, segment_name: *const c_char) -> i32 {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        open(e, segment_name, false)
    })
}

#[no_mangle]
pub extern "C" fn openSegmentNoCache(engine: *mut c_void, segment_name: *const c_char) -> i32 {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        open(e, segment_name, true)
    })
}

#[no_mangle]
pub extern "C" fn closeSegment(engine: *mut c_void, segment_id: i32) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        if segment_id == LOCAL_SEGMENT {
            return 0;
        }
        let r = e.segment(i64::from(segment_id)).and_then(|h| {
            e.engine.close_segment(h)?;
            e.opened.lock().remove(&h);
            Ok(())
        });
        codes::engine_status(r)
    })
}

/// 0: there are no EFA endpoints to warm up (as the reference without EFA).
#[no_mangle]
pub extern "C" fn warmupEfaSegment(engine: *mut c_void, segment_name: *const c_char) -> c_int {
    let _ = segment_name;
    with(engine, ERR_INVALID_ARGUMENT, |_| 0)
}

/// Withdraws this engine's own segment from the metadata service, so peers
/// can no longer open it; any other name is `ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub extern "C" fn removeLocalSegment(engine: *mut c_void, segment_name: *const c_char) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        let name = ffi::string(segment_name).unwrap_or_default();
        let name = name.trim_start_matches('/');
        if name.is_empty() || name != e.engine.local_server_name() {
            return ERR_INVALID_ARGUMENT;
        }
        codes::engine_status(e.engine.remove_local_segment())
    })
}

fn register(e: &CEngine, addr: usize, len: usize, location: &str, remote: bool) -> c_int {
    if len == 0 || !maps::accessible(addr, len, Access::Write) {
        tracing::warn!(
            "registerLocalMemory: {addr:#x}+{len} is not writable memory of this process"
        );
        return ERR_INVALID_ARGUMENT;
    }
    codes::engine_status(e.engine.register_local_memory(addr, len, location, remote))
}

fn location_or_any(p: *const c_char) -> String {
    ffi::string(p)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "*".into())
}

#[no_mangle]
pub extern "C" fn registerLocalMemory(
    engine: *mut c_void,
    addr: *mut c_void,
    length: usize,
    location: *const c_char,
    remote_accessible: c_int,
) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        register(
            e,
            addr as usize,
            length,
            &location_or_any(location),
            remote_accessible != 0,
        )
    })
}

#[no_mangle]
pub extern "C" fn unregisterLocalMemory(engine: *mut c_void, addr: *mut c_void) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        codes::engine_status(e.engine.unregister_local_memory(addr as usize))
    })
}

#[no_mangle]
pub extern "C" fn registerLocalMemoryBatch(
    engine: *mut c_void,
    buffer_list: *mut BufferEntry,
    buffer_len: usize,
    location: *const c_char,
) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        let Some(list) = ffi::array(buffer_list.cast_const(), buffer_len) else {
            return ERR_INVALID_ARGUMENT;
        };
        let pairs: Vec<(usize, usize)> = list.iter().map(|b| (b.addr as usize, b.length)).collect();
        if pairs
            .iter()
            .any(|&(a, l)| l == 0 || !maps::accessible(a, l, Access::Write))
        {
            return ERR_INVALID_ARGUMENT;
        }
        let location = location_or_any(location);
        codes::engine_status(e.engine.register_local_memory_batch(&pairs, &location))
    })
}

#[no_mangle]
pub extern "C" fn unregisterLocalMemoryBatch(
    engine: *mut c_void,
    addr_list: *mut *mut c_void,
    addr_len: usize,
) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        let Some(list) = ffi::array(addr_list.cast_const(), addr_len) else {
            return ERR_INVALID_ARGUMENT;
        };
        let addrs: Vec<usize> = list.iter().map(|&a| a as usize).collect();
        codes::engine_status(e.engine.unregister_local_memory_batch(&addrs))
    })
}

#[no_mangle]
pub extern "C" fn allocateBatchID(engine: *mut c_void, batch_size: usize) -> u64 {
    with(engine, INVALID_BATCH, |e| {
        match e.engine.allocate_batch(batch_size) {
            Ok(id) => {
                e.batches.lock().insert(id);
                id
            }
            Err(err) => {
                tracing::warn!("allocateBatchID({batch_size}): {err}");
                INVALID_BATCH
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn submitTransfer(
    engine: *mut c_void,
    batch_id: u64,
    entries: *mut TransferRequestC,
    count: usize,
) -> c_int {
    with(engine, STATUS_INVALID_ARGUMENT, |e| {
        let r = e
            .requests(entries.cast_const(), count)
            .and_then(|q| e.engine.submit(batch_id, &q));
        codes::status_result(r)
    })
}

#[no_mangle]
pub extern "C" fn submitTransferWithNotify(
    engine: *mut c_void,
    batch_id: u64,
    entries: *mut TransferRequestC,
    count: usize,
    notify_msg: NotifyMsg,
) -> c_int {
    with(engine, STATUS_INVALID_ARGUMENT, |e| {
        let Some(notify) = notify_of(&notify_msg) else {
            return STATUS_INVALID_ARGUMENT;
        };
        let r = e
            .requests(entries.cast_const(), count)
            .and_then(|q| e.engine.submit_with_notify(batch_id, &q, notify));
        codes::status_result(r)
    })
}

#[no_mangle]
pub extern "C" fn getTransferStatus(
    engine: *mut c_void,
    batch_id: u64,
    task_id: usize,
    status: *mut TransferStatusC,
) -> c_int {
    with(engine, STATUS_INVALID_ARGUMENT, |e| {
        if status.is_null() {
            return STATUS_INVALID_ARGUMENT;
        }
        match e.engine.transfer_status(batch_id, task_id) {
            Ok(s) => {
                let out = TransferStatusC {
                    status: codes::transfer_state(s.state),
                    transferred_bytes: s.transferred_bytes,
                };
                if ffi::put(status, out) {
                    0
                } else {
                    STATUS_INVALID_ARGUMENT
                }
            }
            Err(err) => codes::status_code(&err),
        }
    })
}

#[no_mangle]
pub extern "C" fn freeBatchID(engine: *mut c_void, batch_id: u64) -> c_int {
    with(engine, STATUS_INVALID_ARGUMENT, |e| {
        let r = e.engine.free_batch(batch_id);
        if r.is_ok() {
            e.batches.lock().remove(&batch_id);
        }
        codes::status_result(r)
    })
}

/// The notifies received since the last call, as a `malloc`ed array for
/// `freeNotifsMsgBuf`; null and `*size == 0` when there are none, null and
/// `*size == -1` for a bad handle.
#[no_mangle]
pub extern "C" fn getNotifsFromEngine(engine: *mut c_void, size: *mut c_int) -> *mut NotifyMsg {
    guard(std::ptr::null_mut(), || {
        let Some(e) = ENGINES.get(engine) else {
            ffi::put(size, -1);
            return std::ptr::null_mut();
        };
        if size.is_null() {
            // Nowhere to say how many: keep them for a call that can.
            return std::ptr::null_mut();
        }
        let items: Vec<(String, String)> = e
            .engine
            .get_notifies()
            .into_iter()
            .map(|n| (n.name, n.msg))
            .collect();
        let arr = ffi::notify_array(&items);
        let n = if arr.is_null() { 0 } else { items.len() };
        ffi::put(size, c_int::try_from(n).unwrap_or(c_int::MAX));
        arr
    })
}

#[no_mangle]
pub extern "C" fn freeNotifsMsgBuf(msg: *mut NotifyMsg, size: c_int) -> c_int {
    guard(ERR_INVALID_ARGUMENT, || ffi::free_notify_array(msg, size))
}

#[no_mangle]
pub extern "C" fn genNotifyInEngine(
    engine: *mut c_void,
    target_id: u64,
    notify_msg: NotifyMsg,
) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        let Some(notify) = notify_of(&notify_msg) else {
            return ERR_INVALID_ARGUMENT;
        };
        let Ok(id) = i64::try_from(target_id) else {
            return ERR_INVALID_ARGUMENT;
        };
        codes::engine_status(e.segment(id).and_then(|h| e.engine.send_notify(h, notify)))
    })
}

/// Re-reads the descriptors of the segments opened through this handle.
#[no_mangle]
pub extern "C" fn syncSegmentCache(engine: *mut c_void) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        let opened: Vec<SegmentHandle> = e.opened.lock().iter().copied().collect();
        let mut rc = 0;
        for h in opened {
            if let Err(err) = e.engine.refresh_segment(h) {
                tracing::warn!("syncSegmentCache: segment {h}: {err}");
                rc = codes::engine_code(&err);
            }
        }
        rc
    })
}

/// No NICs on TCP: `*count` becomes 0. -1 for a null argument.
#[no_mangle]
pub extern "C" fn getNicLoadStats(
    engine: *mut c_void,
    stats: *mut NicLoadStat,
    count: *mut usize,
) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |_| {
        if stats.is_null() || !ffi::put(count, 0) {
            return ERR_INVALID_ARGUMENT;
        }
        0
    })
}

/// The segments this handle opened and the bytes each transport carried,
/// as text lines or (`json` non-zero) a JSON object.
#[no_mangle]
pub extern "C" fn showLinks(
    engine: *mut c_void,
    buf_out: *mut c_char,
    buf_len: usize,
    json: c_int,
) -> c_int {
    with(engine, ERR_INVALID_ARGUMENT, |e| {
        let opened: Vec<SegmentHandle> = e.opened.lock().iter().copied().collect();
        let names: Vec<String> = opened
            .iter()
            .filter_map(|&h| e.engine.segment_descriptor(h).ok())
            .map(|d| d.name.clone())
            .collect();
        let st = e.engine.transport_stats();
        let text = if json != 0 {
            let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
            format!(
                "{{\"segments\":[{}],\"bytes\":{{\"local\":{},\"shm\":{},\"tcp\":{}}}}}",
                quoted.join(","),
                st.local_bytes,
                st.shm_bytes,
                st.tcp_bytes
            )
        } else {
            let mut s = String::new();
            for n in &names {
                s.push_str(&format!("segment {n}\n"));
            }
            s.push_str(&format!(
                "bytes local={} shm={} tcp={}\n",
                st.local_bytes, st.shm_bytes, st.tcp_bytes
            ));
            s
        };
        if ffi::put_str(buf_out, buf_len, &text, true) {
            0
        } else {
            ERR_INVALID_ARGUMENT
        }
    })
}
