//! The dummy client: holds no segment and no engine; forwards every call to
//! the real client (`mooncake_client`) on this host.
//!
//! At setup it creates one shared region: `mem_pool_size` bytes for
//! [`alloc_from_mem_pool`](super::Client::alloc_from_mem_pool) followed by a
//! `local_buffer_size` staging pool. Calls name memory as offsets into the
//! region, and the real client reads and writes those pages directly, so
//! object bytes never cross the socket. Caller buffers outside the region
//! (registered with `register_buffer`) are copied through the staging pool.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use super::dummy_proto::{
    unexpected, DummyRequest, DummyResponse, RangeItem, ReadItem, Span, WriteItem,
};
use super::registry::BufferRegistry;
use super::shm::ShmRegion;
use super::staging::{Region, StagingBuf, StagingPool};
use super::validate::validate_value_len;
use super::{Backend, BufferHandle};
use super::{Payload, RangeRead};
use crate::proto::frame::{decode_payload, encode_frame, read_frame_within, write_frames};
use crate::types::{ClientId, ReplicaDesc, TaskId, TaskInfo, WriteOptions};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the dummy waits for the service before a call fails with
/// `RPC_FAIL` (and its connection is dropped).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    /// Connect and `Hello` (the reference gives up after about 6 s).
    pub hello: Duration,
    /// Any other call, which may wait for the master and a transfer.
    pub call: Duration,
}

impl Timeouts {
    /// A call may take two master round trips (30 s each at most) and
    /// transfers bounded by `MC_TRANSFER_TIMEOUT`, as the service sees them.
    pub fn from_env() -> Timeouts {
        let mut engine = mooncake_transfer::EngineConfig::defaults("", "");
        engine.apply_env(|k| std::env::var(k).ok());
        Timeouts {
            hello: Duration::from_secs(6),
            call: Duration::from_secs(60) + 2 * engine.transfer_timeout,
        }
    }
}

/// A window `[off, off+len)` of the shared region.
struct SubRegion {
    parent: Arc<ShmRegion>,
    off: usize,
    len: usize,
}

impl Region for SubRegion {
    fn addr(&self) -> usize {
        self.parent.addr() + self.off
    }
    fn size(&self) -> usize {
        self.len
    }
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    buf: Vec<u8>,
    /// The answer deadline; the socket's read timeout matches it.
    timeout: Duration,
}

pub(crate) struct DummyClient {
    server: String,
    region: Arc<ShmRegion>,
    pool: Option<StagingPool>,
    staging: Option<StagingPool>,
    registry: BufferRegistry,
    pool_allocs: Mutex<HashMap<usize, StagingBuf>>,
    idle: Mutex<Vec<Conn>>,
    timeouts: Timeouts,
    session: u64,
    client_id: ClientId,
    hostname: String,
    closed: AtomicBool,
}

fn rpc_fail(what: impl std::fmt::Display) -> Error {
    Error::new(ErrorCode::RPC_FAIL, what.to_string())
}

fn open_conn(server: &str, timeout: Duration) -> Result<Conn> {
    use std::net::ToSocketAddrs;
    let addr = server
        .to_socket_addrs()
        .map_err(|e| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("bad server address {server:?}: {e}"),
            )
        })?
        .next()
        .ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("{server:?} resolves to nothing"),
            )
        })?;
    let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT.min(timeout))
        .map_err(|e| rpc_fail(format!("{server}: {e}")))?;
    let _ = stream.set_nodelay(true);
    let read = stream.try_clone().map_err(rpc_fail)?;
    let mut conn = Conn {
        reader: BufReader::new(read),
        writer: BufWriter::new(stream),
        buf: Vec::new(),
        timeout,
    };
    conn.set_timeout(timeout)?;
    Ok(conn)
}

impl Conn {
    fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        let s = self.writer.get_ref();
        s.set_read_timeout(Some(timeout))
            .and_then(|()| s.set_write_timeout(Some(timeout)))
            .map_err(rpc_fail)?;
        self.timeout = timeout;
        Ok(())
    }

    /// One call. Any failure leaves the stream out of step: the caller
    /// drops the connection.
    fn call(&mut self, req: &DummyRequest) -> Result<DummyResponse> {
        let mut out = Vec::new();
        encode_frame(req, &mut out)
            .map_err(|e| Error::new(ErrorCode::SERIALIZE_FAIL, e.to_string()))?;
        write_frames(&mut self.writer, &out).map_err(rpc_fail)?;
        read_frame_within(&mut self.reader, &mut self.buf, self.timeout, false)
            .map_err(|e| rpc_fail(format!("no answer from the store service: {e}")))?;
        Ok(decode_payload::<DummyResponse>(&self.buf)?)
    }
}

fn session_of(resp: DummyResponse) -> Result<(u64, ClientId, String)> {
    match resp {
        DummyResponse::Session {
            session,
            client_id,
            hostname,
        } => Ok((session, client_id, hostname)),
        DummyResponse::Unit { result: Err(e) } => Err(e),
        other => Err(unexpected(&other)),
    }
}

impl DummyClient {
    pub fn connect(
        mem_pool_size: u64,
        local_buffer_size: u64,
        server: &str,
    ) -> Result<DummyClient> {
        Self::connect_with(
            mem_pool_size,
            local_buffer_size,
            server,
            Timeouts::from_env(),
        )
    }

    pub(crate) fn connect_with(
        mem_pool_size: u64,
        local_buffer_size: u64,
        server: &str,
        timeouts: Timeouts,
    ) -> Result<DummyClient> {
        let to_usize = |v: u64| {
            usize::try_from(v).map_err(|_| Error::new(ErrorCode::INVALID_PARAMS, "size too large"))
        };
        let (pool_len, staging_len) = (to_usize(mem_pool_size)?, to_usize(local_buffer_size)?);
        let total = pool_len
            .checked_add(staging_len)
            .filter(|&t| t > 0)
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::INVALID_PARAMS,
                    "mem_pool_size + local_buffer_size must be > 0",
                )
            })?;
        let region = Arc::new(ShmRegion::create(total)?);
        let hello = open_conn(server, timeouts.hello).and_then(|mut conn| {
            let r = conn.call(&DummyRequest::Hello {
                shm_name: region.name().to_owned(),
                region_len: total as u64,
                pid: std::process::id(),
                fd: region.raw_fd(),
            });
            let session = r.and_then(session_of)?;
            conn.set_timeout(timeouts.call)?;
            Ok((conn, session))
        });
        let (conn, (session, client_id, hostname)) = hello?;
        let sub = |off, len| -> Option<StagingPool> {
            (len > 0).then(|| {
                StagingPool::new(
                    Box::new(SubRegion {
                        parent: region.clone(),
                        off,
                        len,
                    }),
                    Duration::from_secs(30),
                )
            })
        };
        Ok(DummyClient {
            server: server.to_owned(),
            pool: sub(0, pool_len),
            staging: sub(pool_len, staging_len),
            region,
            registry: BufferRegistry::new(),
            pool_allocs: Mutex::new(HashMap::new()),
            idle: Mutex::new(vec![conn]),
            timeouts,
            session,
            client_id,
            hostname,
            closed: AtomicBool::new(false),
        })
    }

    fn call(&self, req: &DummyRequest) -> Result<DummyResponse> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "client is closed",
            ));
        }
        let conn = self.idle.lock().pop();
        let mut conn = match conn {
            Some(c) => c,
            None => {
                let mut c = open_conn(&self.server, self.timeouts.call)?;
                session_of(c.call(&DummyRequest::Attach {
                    session: self.session,
                })?)?;
                c
            }
        };
        let resp = conn.call(req)?; // a failed connection is dropped here
        if !self.closed.load(Ordering::Relaxed) {
            self.idle.lock().push(conn);
        }
        Ok(resp)
    }

    /// The region offset of `[addr, addr+len)`, if it lies in the region.
    fn span(&self, addr: usize, len: usize) -> Option<Span> {
        let base = self.region.addr();
        let end = addr.checked_add(len)?;
        (addr >= base && end <= base + self.region.size()).then(|| Span {
            off: (addr - base) as u64,
            len: len as u64,
        })
    }

    fn staging_pool(&self) -> Result<&StagingPool> {
        self.staging.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                "local_buffer_size is 0: no staging pool",
            )
        })
    }

    fn stage(&self, len: usize) -> Result<(StagingBuf, Span)> {
        let buf = self.staging_pool()?.allocate(len as u64)?;
        let span = self
            .span(buf.addr(), len)
            .expect("staging lies in the region");
        Ok((buf, span))
    }

    /// A caller buffer as a span: in place when it is in the shared region,
    /// otherwise through a staging buffer (which the caller keeps alive).
    fn span_or_stage(&self, addr: usize, len: usize) -> Result<(Span, Option<StagingBuf>)> {
        if len > 0 {
            if let Some(s) = self.span(addr, len) {
                return Ok((s, None));
            }
        }
        self.registry.check(addr, len)?;
        let (buf, span) = self.stage(len)?;
        Ok((span, Some(buf)))
    }
}

impl Backend for DummyClient {
    fn client_id(&self) -> ClientId {
        self.client_id
    }

    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    fn health_check(&self) -> Result<()> {
        match self.call(&DummyRequest::Health {})? {
            DummyResponse::Unit { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::SeqCst);
        self.idle.lock().clear();
        Ok(())
    }

    fn register_buffer(&self, addr: usize, len: usize) -> Result<()> {
        self.registry.register(addr, len)
    }

    fn unregister_buffer(&self, addr: usize) -> Result<()> {
        self.registry.unregister(addr).map(|_| ())
    }

    fn alloc_from_mem_pool(&self, size: usize) -> Result<usize> {
        let pool = self.pool.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                "mem_pool_size is 0: no memory pool",
            )
        })?;
        let buf = pool.allocate(size as u64)?;
        let addr = buf.addr();
        self.pool_allocs.lock().insert(addr, buf);
        Ok(addr)
    }

    fn free_to_mem_pool(&self, addr: usize) -> Result<()> {
        self.pool_allocs
            .lock()
            .remove(&addr)
            .map(drop)
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("{addr:#x} was not allocated from the memory pool"),
                )
            })
    }

    fn write(
        &self,
        keys: &[String],
        payloads: Vec<Payload<'_>>,
        opts: &WriteOptions,
    ) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = Vec::with_capacity(keys.len());
        let (mut items, mut owners, mut held) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (key, p)) in keys.iter().zip(&payloads).enumerate() {
            let parts: Result<Vec<Span>> = match p {
                Payload::Bytes(slices) => {
                    let len: usize = slices.iter().map(|s| s.len()).sum();
                    validate_value_len(len as u64)
                        .and_then(|()| self.stage(len))
                        .map(|(mut buf, span)| {
                            let dst = buf.as_mut_slice();
                            let mut off = 0;
                            for s in slices {
                                dst[off..off + s.len()].copy_from_slice(s);
                                off += s.len();
                            }
                            held.push(buf);
                            vec![span]
                        })
                }
                Payload::Mem(parts) => parts
                    .iter()
                    .map(|&(a, l)| {
                        let (span, staged) = self.span_or_stage(a, l)?;
                        if let Some(mut buf) = staged {
                            // SAFETY: `registry.check` in span_or_stage
                            // confirmed `[a, a+l)` is caller-registered memory.
                            let src = unsafe { std::slice::from_raw_parts(a as *const u8, l) };
                            buf.as_mut_slice().copy_from_slice(src);
                            held.push(buf);
                        }
                        Ok(span)
                    })
                    .collect(),
            };
            match parts {
                Ok(parts) => {
                    items.push(WriteItem {
                        key: key.clone(),
                        parts,
                    });
                    owners.push(i);
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if items.is_empty() {
            return results;
        }
        let answer = self.call(&DummyRequest::Write {
            upsert: opts.upsert,
            config: opts.config.clone(),
            items,
        });
        drop(held);
        spread(answer, owners, &mut results, |r| match r {
            DummyResponse::Units { result } => result,
            other => Err(unexpected(&other)),
        });
        results
    }

    fn read_into(&self, keys: &[String], dests: &[Vec<(usize, usize)>]) -> Vec<Result<u64>> {
        let mut results: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        let (mut items, mut owners, mut copy_back) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (key, d)) in keys.iter().zip(dests).enumerate() {
            let mut staged = Vec::new();
            let spans: Result<Vec<Span>> = d
                .iter()
                .enumerate()
                .map(|(part, &(a, l))| {
                    let (span, buf) = self.span_or_stage(a, l)?;
                    if let Some(buf) = buf {
                        staged.push((part, buf));
                    }
                    Ok(span)
                })
                .collect();
            match spans {
                Ok(spans) => {
                    items.push(ReadItem {
                        key: key.clone(),
                        dests: spans,
                    });
                    owners.push(i);
                    copy_back.push((i, staged));
                    results.push(Ok(0));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if items.is_empty() {
            return results;
        }
        let answer = self.call(&DummyRequest::ReadInto { items });
        spread(answer, owners, &mut results, |r| match r {
            DummyResponse::Counts { result } => result,
            other => Err(unexpected(&other)),
        });
        // Staged parts: copy the bytes the object filled back to the caller.
        for (i, staged) in copy_back {
            let Ok(size) = results[i] else { continue };
            let filled = filled_lens(size, &dests[i]);
            for (part, buf) in staged {
                // Parts are matched by index, never by address: two parts may
                // share an address and differ in length.
                let n = filled[part].min(buf.len());
                // SAFETY: the destination part was checked against the
                // registry in span_or_stage; `n` ≤ both the part's length and
                // the staging buffer's.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        buf.addr() as *const u8,
                        dests[i][part].0 as *mut u8,
                        n,
                    )
                };
            }
        }
        results
    }

    fn read_values(&self, keys: &[String], _heap: bool) -> Vec<Result<BufferHandle>> {
        let sizes = self.get_size(keys);
        let mut results: Vec<Result<BufferHandle>> = Vec::with_capacity(keys.len());
        let (mut items, mut owners, mut bufs) = (Vec::new(), Vec::new(), Vec::new());
        for (i, size) in sizes.into_iter().enumerate() {
            match size.and_then(|s| self.stage(s as usize)) {
                Ok((buf, span)) => {
                    items.push(ReadItem {
                        key: keys[i].clone(),
                        dests: vec![span],
                    });
                    owners.push(i);
                    bufs.push(Some(buf));
                    results.push(Err(Error::new(ErrorCode::INTERNAL_ERROR, "unanswered")));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if items.is_empty() {
            return results;
        }
        let mut counts: Vec<Result<u64>> = vec![Ok(0); owners.len()];
        spread(
            self.call(&DummyRequest::ReadInto { items }),
            (0..owners.len()).collect(),
            &mut counts,
            |r| match r {
                DummyResponse::Counts { result } => result,
                other => Err(unexpected(&other)),
            },
        );
        for ((count, i), buf) in counts.into_iter().zip(owners).zip(bufs) {
            results[i] = count.map(|_| BufferHandle::staged(buf.expect("one buffer per item")));
        }
        results
    }

    fn read_ranges(&self, reqs: &[RangeRead]) -> Vec<Result<u64>> {
        let mut results: Vec<Result<u64>> = Vec::with_capacity(reqs.len());
        let (mut items, mut owners, mut copy_back) = (Vec::new(), Vec::new(), Vec::new());
        let pool_allocs = self.pool_allocs.lock();
        for (n, r) in reqs.iter().enumerate() {
            let item = if let Some(span) = self.span(r.buffer, 1) {
                // In the shared region: the buffer ends where its pool
                // allocation (or the region) ends.
                let len = match pool_allocs.get(&r.buffer) {
                    Some(b) => b.len() as u64,
                    None => self.region.size() as u64 - span.off,
                };
                Ok((
                    RangeItem {
                        buffer: Span { off: span.off, len },
                        key: r.key.clone(),
                        dst_off: r.dst_off,
                        src_off: r.src_off,
                        len: r.len as u64,
                    },
                    None,
                ))
            } else {
                let dst = r.buffer.checked_add(r.dst_off as usize);
                let checked = match dst {
                    Some(dst) if r.len > 0 => self
                        .registry
                        .check(r.buffer, 1)
                        .and_then(|()| self.registry.check(dst, r.len)),
                    _ => Err(Error::new(ErrorCode::INVALID_PARAMS, "bad fragment")),
                };
                checked.and_then(|()| self.stage(r.len)).map(|(buf, span)| {
                    let item = RangeItem {
                        buffer: span,
                        key: r.key.clone(),
                        dst_off: 0,
                        src_off: r.src_off,
                        len: r.len as u64,
                    };
                    (item, Some((r.buffer + r.dst_off as usize, buf)))
                })
            };
            match item {
                Ok((item, staged)) => {
                    items.push(item);
                    owners.push(n);
                    copy_back.push(staged);
                    results.push(Ok(0));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        drop(pool_allocs);
        if items.is_empty() {
            return results;
        }
        let answer = self.call(&DummyRequest::ReadRanges { items });
        let owners_copy = owners.clone();
        spread(answer, owners, &mut results, |r| match r {
            DummyResponse::Counts { result } => result,
            other => Err(unexpected(&other)),
        });
        for (n, staged) in owners_copy.into_iter().zip(copy_back) {
            if let (Ok(_), Some((dst, buf))) = (&results[n], staged) {
                // SAFETY: `[dst, dst+len)` was checked against the registry above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        buf.addr() as *const u8,
                        dst as *mut u8,
                        buf.len(),
                    )
                };
            }
        }
        results
    }

    fn get_size(&self, keys: &[String]) -> Vec<Result<u64>> {
        let mut out = vec![Ok(0); keys.len()];
        spread(
            self.call(&DummyRequest::GetSize {
                keys: keys.to_vec(),
            }),
            (0..keys.len()).collect(),
            &mut out,
            |r| match r {
                DummyResponse::Counts { result } => result,
                other => Err(unexpected(&other)),
            },
        );
        out
    }

    fn is_exist(&self, keys: &[String]) -> Result<Vec<Result<bool>>> {
        match self.call(&DummyRequest::IsExist {
            keys: keys.to_vec(),
        })? {
            DummyResponse::Bools { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    fn remove(&self, keys: &[String], force: bool) -> Result<Vec<Result<()>>> {
        match self.call(&DummyRequest::Remove {
            keys: keys.to_vec(),
            force,
        })? {
            DummyResponse::Units { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        match self.call(&DummyRequest::RemoveByRegex {
            pattern: pattern.to_owned(),
            force,
        })? {
            DummyResponse::Count { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    fn remove_all(&self, force: bool) -> Result<u64> {
        match self.call(&DummyRequest::RemoveAll { force })? {
            DummyResponse::Count { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    fn replica_desc(&self, keys: &[String]) -> Result<Vec<Result<Vec<ReplicaDesc>>>> {
        match self.call(&DummyRequest::ReplicaDesc {
            keys: keys.to_vec(),
        })? {
            DummyResponse::Replicas { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<TaskId> {
        match self.call(&DummyRequest::CreateCopyTask {
            key: key.to_owned(),
            targets: targets.to_vec(),
        })? {
            DummyResponse::Task { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<TaskId> {
        match self.call(&DummyRequest::CreateMoveTask {
            key: key.to_owned(),
            source: source.to_owned(),
            target: target.to_owned(),
        })? {
            DummyResponse::Task { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    fn query_task(&self, id: TaskId) -> Result<TaskInfo> {
        match self.call(&DummyRequest::QueryTask { id })? {
            DummyResponse::TaskState { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    fn batch_replica_clear(&self, keys: &[String], segment_name: &str) -> Result<Vec<String>> {
        match self.call(&DummyRequest::BatchReplicaClear {
            keys: keys.to_vec(),
            segment_name: segment_name.to_owned(),
        })? {
            DummyResponse::Keys { result } => result,
            other => Err(unexpected(&other)),
        }
    }
}

/// How many bytes of a `size`-byte object land in each destination part,
/// filled in order (each at most the part's length).
fn filled_lens(size: u64, parts: &[(usize, usize)]) -> Vec<usize> {
    let mut left = size;
    parts
        .iter()
        .map(|&(_, len)| {
            let n = left.min(len as u64);
            left -= n;
            n as usize
        })
        .collect()
}

/// Spreads a batch answer over `results[owners[i]]`; a failed call or a
/// short answer fails every owner.
fn spread<T>(
    answer: Result<DummyResponse>,
    owners: Vec<usize>,
    results: &mut [Result<T>],
    pick: impl FnOnce(DummyResponse) -> Result<Vec<Result<T>>>,
) {
    match answer.and_then(pick) {
        Ok(v) if v.len() == owners.len() => {
            for (r, i) in v.into_iter().zip(owners) {
                results[i] = r;
            }
        }
        Ok(v) => {
            let e = Error::new(
                ErrorCode::RPC_FAIL,
                format!("answer for {} of {} items", v.len(), owners.len()),
            );
            for i in owners {
                results[i] = Err(e.clone());
            }
        }
        Err(e) => {
            for i in owners {
                results[i] = Err(e.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::mpsc;

    use super::*;
    use crate::proto::frame::read_frame;

    /// A store service that answers `Hello` (when `hello`) and then never
    /// answers anything, on any connection.
    fn wedged_service(hello: bool) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let mut keep = Vec::new();
            for (n, s) in l.incoming().enumerate() {
                let Ok(mut s) = s else { return };
                if hello && n == 0 {
                    let mut buf = Vec::new();
                    read_frame(&mut s, &mut buf).unwrap();
                    let mut out = Vec::new();
                    let answer = DummyResponse::Session {
                        session: 1,
                        client_id: 7,
                        hostname: "wedged".into(),
                    };
                    encode_frame(&answer, &mut out).unwrap();
                    write_frames(&mut s, &out).unwrap();
                }
                keep.push(s);
            }
        });
        addr
    }

    /// Runs `f` on a thread; panics if it has not returned in 60 s.
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("call still blocked: no timeout")
    }

    const SHORT: Timeouts = Timeouts {
        hello: Duration::from_millis(300),
        call: Duration::from_millis(300),
    };

    #[test]
    fn silent_service_fails_setup_with_rpc_fail() {
        let addr = wedged_service(false);
        let r = bounded(move || DummyClient::connect_with(4096, 4096, &addr, SHORT).map(drop));
        assert_eq!(r.unwrap_err().code, ErrorCode::RPC_FAIL);
    }

    #[test]
    fn service_wedged_mid_session_fails_calls_with_rpc_fail() {
        let addr = wedged_service(true);
        let dummy = Arc::new(DummyClient::connect_with(4096, 4096, &addr, SHORT).unwrap());
        assert_eq!(dummy.hostname(), "wedged");
        for _ in 0..2 {
            // The first call times out on the Hello connection (dropped);
            // the second on a fresh one whose Attach gets no answer.
            let d = dummy.clone();
            let r = bounded(move || d.health_check());
            assert_eq!(r.unwrap_err().code, ErrorCode::RPC_FAIL);
            assert!(
                dummy.idle.lock().is_empty(),
                "a timed-out connection was kept"
            );
        }
        let d = dummy.clone();
        let sizes = bounded(move || d.get_size(&["k".into()]));
        assert_eq!(sizes[0].as_ref().unwrap_err().code, ErrorCode::RPC_FAIL);
    }

    #[test]
    fn parts_fill_in_order_and_never_past_their_length() {
        // Same address, different lengths: each part keeps its own length.
        assert_eq!(filled_lens(110, &[(0x1000, 100), (0x1000, 10)]), [100, 10]);
        assert_eq!(filled_lens(105, &[(0x1000, 100), (0x1000, 10)]), [100, 5]);
        assert_eq!(filled_lens(50, &[(1, 100), (2, 10), (3, 0)]), [50, 0, 0]);
        // An object larger than the parts (refused upstream) stays capped.
        assert_eq!(filled_lens(u64::MAX, &[(1, 7), (2, 9)]), [7, 9]);
        assert!(filled_lens(0, &[]).is_empty());
    }
}
