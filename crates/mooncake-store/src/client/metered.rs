//! A [`ClientImpl`] that times and counts the data calls of another, for
//! [`ClientMetrics`]; everything else passes straight through.

use std::sync::Arc;
use std::time::Instant;

use mooncake_common::Result;

use super::metrics::{ClientMetrics, Outcome};
use super::staging::StagingBuf;
use super::{BufferHandle, ClientImpl, DestFn, Payload, RangeRead, WriteCmd};
use crate::types::{ClientId, ReplicaDesc, TaskId, TaskInfo};

pub(crate) struct Metered {
    pub inner: Arc<dyn ClientImpl>,
    pub metrics: Arc<ClientMetrics>,
}

/// `single` for one key, `batch` for several.
fn name(n: usize, single: &'static str, batch: &'static str) -> &'static str {
    if n == 1 {
        single
    } else {
        batch
    }
}

impl Metered {
    /// Records a call whose per-key outcomes carry the bytes moved.
    fn reads<T>(
        &self,
        op: &'static str,
        n: usize,
        t: Instant,
        results: &[Result<T>],
        size: impl Fn(&T) -> u64,
    ) {
        let (ok, bytes) = results
            .iter()
            .filter_map(|r| r.as_ref().ok().map(&size))
            .fold((0u64, 0u64), |(n, b), s| (n + 1, b + s));
        let outcome = Outcome {
            ok,
            failed: results.len() as u64 - ok,
            bytes,
        };
        self.metrics
            .observe_op(false, op, n != 1, outcome, t.elapsed());
    }
}

impl ClientImpl for Metered {
    // Sessions are reached through the real client itself (not counted).
    fn as_real(&self) -> Option<&super::real::RealClient> {
        self.inner.as_real()
    }
    fn client_id(&self) -> ClientId {
        self.inner.client_id()
    }
    fn hostname(&self) -> String {
        self.inner.hostname()
    }
    fn health_check(&self) -> Result<()> {
        self.inner.health_check()
    }
    fn close(&self) -> Result<()> {
        self.inner.close()
    }
    fn register_buffer(&self, addr: usize, len: usize) -> Result<()> {
        self.inner.register_buffer(addr, len)
    }
    fn unregister_buffer(&self, addr: usize) -> Result<()> {
        self.inner.unregister_buffer(addr)
    }
    fn alloc_from_mem_pool(&self, size: usize) -> Result<usize> {
        self.inner.alloc_from_mem_pool(size)
    }
    fn free_to_mem_pool(&self, addr: usize) -> Result<()> {
        self.inner.free_to_mem_pool(addr)
    }
    fn local_buffer_size(&self) -> u64 {
        self.inner.local_buffer_size()
    }
    fn lease_local_buffer(&self, len: usize) -> Result<Option<StagingBuf>> {
        self.inner.lease_local_buffer(len)
    }

    fn write(
        &self,
        keys: &[String],
        payloads: Vec<Payload<'_>>,
        cmd: &WriteCmd<'_>,
    ) -> Vec<Result<()>> {
        // One key (the usual call) needs no vector of lengths.
        let single = match payloads.as_slice() {
            [p] => Some(p.len()),
            _ => None,
        };
        let lens: Vec<u64> = match single {
            Some(_) => Vec::new(),
            None => payloads.iter().map(Payload::len).collect(),
        };
        let t = Instant::now();
        let results = self.inner.write(keys, payloads, cmd);
        let (mut ok, mut bytes) = (0, 0);
        for (i, r) in results.iter().enumerate() {
            if r.is_ok() {
                ok += 1;
                bytes += single.unwrap_or_else(|| lens.get(i).copied().unwrap_or(0));
            }
        }
        let failed = results.len() as u64 - ok;
        self.metrics.observe_op(
            true,
            cmd.op_name(keys.len()),
            keys.len() != 1,
            Outcome { ok, failed, bytes },
            t.elapsed(),
        );
        results
    }

    fn read_into(&self, keys: &[String], dests: &[Vec<(usize, usize)>]) -> Vec<Result<u64>> {
        let t = Instant::now();
        let results = self.inner.read_into(keys, dests);
        let op = name(keys.len(), "get_into", "batch_get_into");
        self.reads(op, keys.len(), t, &results, |n| *n);
        results
    }

    fn read_values(&self, keys: &[String], heap: bool) -> Vec<Result<BufferHandle>> {
        let t = Instant::now();
        let results = self.inner.read_values(keys, heap);
        let op = if heap {
            name(keys.len(), "get", "get_batch")
        } else {
            name(keys.len(), "get_buffer", "batch_get_buffer")
        };
        self.reads(op, keys.len(), t, &results, |h| h.size() as u64);
        results
    }

    fn read_values_with(&self, keys: &[String], dest: &mut DestFn<'_>) -> Vec<Result<usize>> {
        let t = Instant::now();
        let results = self.inner.read_values_with(keys, dest);
        self.reads(
            name(keys.len(), "get", "get_batch"),
            keys.len(),
            t,
            &results,
            |n| *n as u64,
        );
        results
    }

    fn read_ranges(&self, reqs: &[RangeRead]) -> Vec<Result<u64>> {
        let t = Instant::now();
        let results = self.inner.read_ranges(reqs);
        self.reads("get_into_ranges", reqs.len(), t, &results, |n| *n);
        results
    }

    fn get_size(&self, keys: &[String]) -> Vec<Result<u64>> {
        self.inner.get_size(keys)
    }
    fn is_exist(&self, keys: &[String]) -> Result<Vec<Result<bool>>> {
        self.inner.is_exist(keys)
    }
    fn remove(&self, keys: &[String], force: bool) -> Result<Vec<Result<()>>> {
        self.inner.remove(keys, force)
    }
    fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        self.inner.remove_by_regex(pattern, force)
    }
    fn remove_all(&self, force: bool) -> Result<u64> {
        self.inner.remove_all(force)
    }
    fn replica_desc(&self, keys: &[String]) -> Result<Vec<Result<Vec<ReplicaDesc>>>> {
        self.inner.replica_desc(keys)
    }
    fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<TaskId> {
        self.inner.create_copy_task(key, targets)
    }
    fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<TaskId> {
        self.inner.create_move_task(key, source, target)
    }
    fn query_task(&self, id: TaskId) -> Result<TaskInfo> {
        self.inner.query_task(id)
    }
    fn batch_replica_clear(&self, keys: &[String], segment_name: &str) -> Result<Vec<String>> {
        self.inner.batch_replica_clear(keys, segment_name)
    }
}
