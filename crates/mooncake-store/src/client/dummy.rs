//! The dummy client: holds no segment and no engine; forwards every call to
//! the real client (`mooncake_client`) on this host, over the service's
//! Unix socket when it can prove the socket is that service's, else over
//! TCP (see [`session`]).
//!
//! At setup it creates one shared region: `mem_pool_size` bytes for
//! [`alloc_from_mem_pool`](super::Client::alloc_from_mem_pool) followed by a
//! `local_buffer_size` staging pool. Calls name memory as offsets into the
//! region, and the real client reads and writes those pages directly, so
//! object bytes never cross the socket. Caller buffers outside the region
//! (registered with `register_buffer`) are copied through the staging pool.

use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};

use super::dummy_proto::{
    unexpected, Batch, DummyRequest, DummyResponse, RangeItem, ReadItem, Span, WriteItem,
};
use super::registry::BufferRegistry;
use super::registry::PoolAllocations;
use super::shm::ShmRegion;
use super::staging::{Region, StagingBuf, StagingPool};
use super::validate::validate_value_len;
use super::{BufferHandle, ClientImpl};
use super::{Payload, RangeRead, WriteCmd};
use crate::rpc::AnyStream;
use crate::rpc::Pool;
use crate::types::{ClientId, ReplicaDesc, TaskId, TaskInfo};
pub use session::DummyTransport;
use session::{Service, Timeouts};

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

/// Unwraps the answer variant a call expects.
macro_rules! answer {
    ($resp:expr, $variant:ident) => {
        match $resp {
            DummyResponse::$variant { result } => result,
            other => Err(unexpected(&other)),
        }
    };
}

pub(crate) struct DummyClient {
    region: Arc<ShmRegion>,
    pool: Option<StagingPool>,
    staging: Option<StagingPool>,
    registry: BufferRegistry,
    pool_allocs: PoolAllocations,
    conns: Pool<Service, AnyStream>,
    client_id: ClientId,
    hostname: String,
}

impl DummyClient {
    pub(crate) fn connect(
        mem_pool_size: u64,
        local_buffer_size: u64,
        server: &str,
        transport: DummyTransport,
    ) -> Result<DummyClient> {
        Self::connect_with(
            mem_pool_size,
            local_buffer_size,
            server,
            transport,
            Timeouts::from_env(),
        )
    }

    pub(crate) fn connect_with(
        mem_pool_size: u64,
        local_buffer_size: u64,
        server: &str,
        transport: DummyTransport,
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
        let (conns, client_id, hostname) = session::open(server, transport, timeouts, &region)?;
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
            pool: sub(0, pool_len),
            staging: sub(pool_len, staging_len),
            region,
            registry: BufferRegistry::new(),
            pool_allocs: PoolAllocations::default(),
            conns,
            client_id,
            hostname,
        })
    }

    fn call(&self, req: &DummyRequest) -> Result<DummyResponse> {
        session::call(&self.conns, req)
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

    /// A payload's parts as spans of the region; bytes from outside it are
    /// copied into staging buffers, which go to `held` until the call ends.
    fn write_parts(&self, p: &Payload<'_>, held: &mut Vec<StagingBuf>) -> Result<Vec<Span>> {
        match p {
            Payload::Bytes(slices) => {
                let len: usize = slices.iter().map(|s| s.len()).sum();
                validate_value_len(len as u64)?;
                let (mut buf, span) = self.stage(len)?;
                let dst = buf.as_mut_slice();
                let mut off = 0;
                for s in slices {
                    dst[off..off + s.len()].copy_from_slice(s);
                    off += s.len();
                }
                held.push(buf);
                Ok(vec![span])
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
        }
    }

    /// A ranged read as the service sees it, and where a staged fragment
    /// must be copied once read.
    fn range_item(&self, r: &RangeRead) -> Result<(RangeItem, Option<(usize, StagingBuf)>)> {
        if let Some(span) = self.span(r.buffer, 1) {
            // In the shared region: the buffer ends where its pool
            // allocation (or the region) ends.
            let len = match self.pool_allocs.len_at(r.buffer) {
                Some(len) => len as u64,
                None => self.region.size() as u64 - span.off,
            };
            let item = RangeItem {
                buffer: Span { off: span.off, len },
                key: r.key.clone(),
                dst_off: r.dst_off,
                src_off: r.src_off,
                len: r.len as u64,
            };
            return Ok((item, None));
        }
        match r.buffer.checked_add(r.dst_off as usize) {
            Some(dst) if r.len > 0 => {
                self.registry.check(r.buffer, 1)?;
                self.registry.check(dst, r.len)?;
            }
            _ => return Err(Error::new(ErrorCode::INVALID_PARAMS, "bad fragment")),
        }
        let (buf, span) = self.stage(r.len)?;
        let item = RangeItem {
            buffer: span,
            key: r.key.clone(),
            dst_off: 0,
            src_off: r.src_off,
            len: r.len as u64,
        };
        Ok((item, Some((r.buffer + r.dst_off as usize, buf))))
    }

    /// Sends a batch's prepared items in one call (see [`Batch::finish`]).
    fn send<I, K, T: Default>(
        &self,
        batch: Batch<I, K, T>,
        request: impl FnOnce(Vec<I>) -> DummyRequest,
        pick: impl FnOnce(DummyResponse) -> Result<Vec<Result<T>>>,
    ) -> (Vec<Result<T>>, Vec<(usize, K)>) {
        batch.finish(|items| self.call(&request(items)).and_then(pick))
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

impl ClientImpl for DummyClient {
    fn client_id(&self) -> ClientId {
        self.client_id
    }

    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    fn health_check(&self) -> Result<()> {
        answer!(self.call(&DummyRequest::Health {})?, Unit)
    }

    fn close(&self) -> Result<()> {
        self.conns.close();
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
        Ok(self.pool_allocs.keep(pool.allocate(size as u64)?))
    }

    fn free_to_mem_pool(&self, addr: usize) -> Result<()> {
        self.pool_allocs.free(addr)
    }

    fn local_buffer_size(&self) -> u64 {
        self.staging.as_ref().map_or(0, StagingPool::capacity)
    }

    fn lease_local_buffer(&self, len: usize) -> Result<Option<StagingBuf>> {
        if self.conns.is_closed() {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "client is closed",
            ));
        }
        Ok(self.staging_pool()?.try_allocate(len as u64))
    }

    fn write(
        &self,
        keys: &[String],
        payloads: Vec<Payload<'_>>,
        cmd: &WriteCmd<'_>,
    ) -> Vec<Result<()>> {
        let mut held = Vec::new();
        let batch = Batch::prepare(keys.iter().zip(&payloads).map(|(key, p)| {
            let parts = self.write_parts(p, &mut held)?;
            let key = key.clone();
            Ok((WriteItem { key, parts }, ()))
        }));
        let config = cmd.opts.config.clone();
        let upsert = cmd.opts.upsert;
        let request = |items| DummyRequest::Write {
            upsert,
            config,
            items,
        };
        self.send(batch, request, |r| answer!(r, Units)).0
    }

    fn read_into(&self, keys: &[String], dests: &[Vec<(usize, usize)>]) -> Vec<Result<u64>> {
        let batch = Batch::prepare(keys.iter().zip(dests).map(|(key, d)| {
            let mut staged = Vec::new();
            let spans = d
                .iter()
                .enumerate()
                .map(|(part, &(a, l))| {
                    let (span, buf) = self.span_or_stage(a, l)?;
                    if let Some(buf) = buf {
                        staged.push((part, buf));
                    }
                    Ok(span)
                })
                .collect::<Result<Vec<Span>>>()?;
            let key = key.clone();
            Ok((ReadItem { key, dests: spans }, staged))
        }));
        let request = |items| DummyRequest::ReadInto { items };
        let (results, sent) = self.send(batch, request, |r| answer!(r, Counts));
        // Staged parts: copy the bytes the object filled back to the caller.
        for (i, staged) in sent {
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
        let batch = Batch::prepare(sizes.into_iter().zip(keys).map(|(size, key)| {
            let (buf, span) = self.stage(size? as usize)?;
            let key = key.clone();
            Ok((
                ReadItem {
                    key,
                    dests: vec![span],
                },
                buf,
            ))
        }));
        let request = |items| DummyRequest::ReadInto { items };
        let (counts, sent) = self.send(batch, request, |r| answer!(r, Counts));
        let mut bufs: Vec<Option<StagingBuf>> = counts.iter().map(|_| None).collect();
        for (i, buf) in sent {
            bufs[i] = Some(buf);
        }
        counts
            .into_iter()
            .zip(bufs)
            .map(|(count, buf)| {
                count.map(|_| BufferHandle::staged(buf.expect("a sent item has its buffer")))
            })
            .collect()
    }

    fn read_ranges(&self, reqs: &[RangeRead]) -> Vec<Result<u64>> {
        let batch = Batch::prepare(reqs.iter().map(|r| self.range_item(r)));
        let request = |items| DummyRequest::ReadRanges { items };
        let (results, sent) = self.send(batch, request, |r| answer!(r, Counts));
        for (n, staged) in sent {
            if let (Ok(_), Some((dst, buf))) = (&results[n], staged) {
                // SAFETY: `[dst, dst+len)` was checked against the registry
                // in `range_item`.
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
        let batch = Batch::prepare(keys.iter().map(|k| Ok((k.clone(), ()))));
        let request = |keys| DummyRequest::GetSize { keys };
        self.send(batch, request, |r| answer!(r, Counts)).0
    }

    fn is_exist(&self, keys: &[String]) -> Result<Vec<Result<bool>>> {
        answer!(
            self.call(&DummyRequest::IsExist {
                keys: keys.to_vec(),
            })?,
            Bools
        )
    }

    fn remove(&self, keys: &[String], force: bool) -> Result<Vec<Result<()>>> {
        answer!(
            self.call(&DummyRequest::Remove {
                keys: keys.to_vec(),
                force,
            })?,
            Units
        )
    }

    fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        answer!(
            self.call(&DummyRequest::RemoveByRegex {
                pattern: pattern.to_owned(),
                force,
            })?,
            Count
        )
    }

    fn remove_all(&self, force: bool) -> Result<u64> {
        answer!(self.call(&DummyRequest::RemoveAll { force })?, Count)
    }

    fn replica_desc(&self, keys: &[String]) -> Result<Vec<Result<Vec<ReplicaDesc>>>> {
        answer!(
            self.call(&DummyRequest::ReplicaDesc {
                keys: keys.to_vec(),
            })?,
            Replicas
        )
    }

    fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<TaskId> {
        answer!(
            self.call(&DummyRequest::CreateCopyTask {
                key: key.to_owned(),
                targets: targets.to_vec(),
            })?,
            Task
        )
    }

    fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<TaskId> {
        answer!(
            self.call(&DummyRequest::CreateMoveTask {
                key: key.to_owned(),
                source: source.to_owned(),
                target: target.to_owned(),
            })?,
            Task
        )
    }

    fn query_task(&self, id: TaskId) -> Result<TaskInfo> {
        answer!(self.call(&DummyRequest::QueryTask { id })?, TaskState)
    }

    fn batch_replica_clear(&self, keys: &[String], segment_name: &str) -> Result<Vec<String>> {
        answer!(
            self.call(&DummyRequest::BatchReplicaClear {
                keys: keys.to_vec(),
                segment_name: segment_name.to_owned(),
            })?,
            Keys
        )
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

mod session;
#[cfg(test)]
mod tests;
