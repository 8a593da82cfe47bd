//! The shared-filesystem tier as the master keeps it (`--root_fs_dir`).
//!
//! A file copy is a copy in the [`DiskTable`](super::ssd_tier::DiskTable)
//! owned by [`SHARED_FS`], so it is replicated, snapshotted and replayed
//! like an SSD copy, and an object with one carries `ON_DISK`. What lives
//! here is volatile: which storage clients mounted the tier ("writers"),
//! their queues of objects to write, and the keys with a write or a delete
//! in flight. A key is in at most one of those at a time, cluster-wide, so
//! two writers never race on one path and a delete never hits a newer file.
//!
//! Lock order: object shard → `DiskTable` locks → `writers` → `state`.

use std::collections::{HashMap, HashSet, VecDeque};

use parking_lot::{Mutex, RwLock};

use super::leases::CopyLease;
use crate::master::config::policy::FilePolicy;
use crate::types::{ClientId, OffloadTask};

/// The owner of every file copy in the `DiskTable`: no client id is 0.
pub(crate) const SHARED_FS: ClientId = 0;

/// What is in flight for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Busy {
    /// Queued for, or being written by, `writer`; `size` bytes reserved.
    /// `stale`: the object changed since (the file will not be its copy).
    Write {
        writer: ClientId,
        size: u64,
        stale: bool,
    },
    /// Its file is to be deleted (by any writer).
    Delete,
}

#[derive(Default)]
struct State {
    queues: HashMap<ClientId, VecDeque<OffloadTask>>,
    busy: HashMap<Box<str>, Busy>,
    deletes: Vec<String>,
    /// Bytes of writes queued or in flight.
    reserved: u64,
    /// The leases of the writes handed out, given back when reported.
    lent: HashMap<Box<str>, CopyLease>,
}

#[derive(Default)]
pub(crate) struct FileTier {
    pub(crate) policy: FilePolicy,
    writers: RwLock<HashSet<ClientId>>,
    state: Mutex<State>,
}

impl FileTier {
    /// Forgets every writer and write (a standby about to load its
    /// leader's snapshot over what it held).
    pub(crate) fn clear(&self) {
        self.writers.write().clear();
        *self.state.lock() = State::default();
    }

    pub(crate) fn new(policy: FilePolicy) -> Self {
        FileTier {
            policy,
            ..Default::default()
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.policy.fsdir.is_some()
    }

    /// The file of `key` (the tier is on).
    pub(crate) fn path(&self, key: &str) -> Option<String> {
        let fsdir = self.policy.fsdir.as_deref()?;
        Some(crate::tier::shared_fs::object_file(fsdir, key))
    }

    pub(crate) fn mount(&self, writer: ClientId) {
        self.writers.write().insert(writer);
    }

    pub(crate) fn is_writer(&self, client: ClientId) -> bool {
        self.writers.read().contains(&client)
    }

    /// `writer` is gone: its queue goes, its writes in flight are forgotten
    /// (the objects may be queued again with another writer).
    pub(crate) fn unmount(&self, writer: ClientId) {
        if !self.writers.write().remove(&writer) {
            return;
        }
        let mut st = self.state.lock();
        st.queues.remove(&writer);
        let mut freed = 0;
        st.busy.retain(|_, b| match *b {
            Busy::Write {
                writer: w, size, ..
            } if w == writer => {
                freed += size;
                false
            }
            _ => true,
        });
        st.reserved -= freed;
    }

    /// Queues `task` for `writer` unless the key is busy, the queue holds
    /// `limit` tasks, or (`room`: bytes the tier may still take, `None`:
    /// any write fits because the tier evicts) the write does not fit.
    pub(crate) fn queue_write(
        &self,
        writer: ClientId,
        task: OffloadTask,
        limit: usize,
        room: Option<u64>,
    ) -> bool {
        let mut st = self.state.lock();
        if st.busy.contains_key(task.key.as_str()) {
            return false;
        }
        if room.is_some_and(|r| st.reserved.saturating_add(task.size) > r) {
            return false;
        }
        let queue = st.queues.entry(writer).or_default();
        if queue.len() >= limit {
            return false;
        }
        queue.push_back(task.clone());
        st.reserved += task.size;
        let busy = Busy::Write {
            writer,
            size: task.size,
            stale: false,
        };
        st.busy.insert(task.key.into(), busy);
        true
    }

    /// Up to `max` of `writer`'s queued writes and every pending delete
    /// (they stay busy until reported).
    pub(crate) fn take(&self, writer: ClientId, max: usize) -> (Vec<OffloadTask>, Vec<String>) {
        let mut st = self.state.lock();
        let deletes = std::mem::take(&mut st.deletes);
        let tasks = match st.queues.get_mut(&writer) {
            Some(q) => {
                let n = max.min(q.len());
                q.drain(..n).collect()
            }
            None => Vec::new(),
        };
        (tasks, deletes)
    }

    /// The write of `key` handed out holds `lease` on the object.
    pub(crate) fn lent(&self, key: &str, lease: CopyLease) {
        self.state.lock().lent.insert(key.into(), lease);
    }

    /// The lease the write of `key` held, for the caller to give back.
    pub(crate) fn take_lease(&self, key: &str) -> Option<CopyLease> {
        self.state.lock().lent.remove(key)
    }

    /// `writer`'s write of `key` ended (written, failed or found stale);
    /// false when the object changed while it was written.
    pub(crate) fn write_done(&self, writer: ClientId, key: &str) -> bool {
        let mut st = self.state.lock();
        st.lent.remove(key);
        match st.busy.get(key).copied() {
            Some(Busy::Write {
                writer: w,
                size,
                stale,
            }) if w == writer => {
                st.busy.remove(key);
                st.reserved -= size;
                !stale
            }
            _ => true,
        }
    }

    /// `key` was removed or is being written anew: a file of it in flight
    /// is of the old object.
    pub(crate) fn object_changed(&self, key: &str) {
        if !self.enabled() {
            return;
        }
        if let Some(Busy::Write { stale, .. }) = self.state.lock().busy.get_mut(key) {
            *stale = true;
        }
    }

    /// Asks the writers to delete `key`'s file; the key stays busy (no new
    /// write of it) until a writer reports the file gone.
    pub(crate) fn queue_delete(&self, key: &str) {
        let mut st = self.state.lock();
        if let Some(Busy::Write { size, .. }) = st.busy.get(key).copied() {
            st.reserved -= size;
        }
        st.busy.insert(key.into(), Busy::Delete);
        st.deletes.push(key.to_string());
    }

    /// A writer deleted `key`'s file.
    pub(crate) fn deleted(&self, key: &str) {
        let mut st = self.state.lock();
        if st.busy.get(key) == Some(&Busy::Delete) {
            st.busy.remove(key);
        }
    }

    /// Bytes of writes queued or in flight.
    pub(crate) fn reserved(&self) -> u64 {
        self.state.lock().reserved
    }

    /// Whether `key` has a write or a delete in flight.
    pub(crate) fn is_busy(&self, key: &str) -> bool {
        self.state.lock().busy.contains_key(key)
    }

    #[cfg(test)]
    pub(crate) fn busy_len(&self) -> usize {
        self.state.lock().busy.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(key: &str, size: u64) -> OffloadTask {
        OffloadTask {
            key: key.into(),
            size,
            address: 0,
            idle_ms: 0,
        }
    }

    #[test]
    fn a_key_is_written_or_deleted_by_one_writer_at_a_time() {
        let t = FileTier::default();
        t.mount(1);
        t.mount(2);
        assert!(t.queue_write(1, task("k", 10), 8, None));
        assert!(!t.queue_write(2, task("k", 10), 8, None), "busy with 1");
        assert_eq!(t.reserved(), 10);
        let (tasks, deletes) = t.take(1, 8);
        assert_eq!((tasks.len(), deletes.len()), (1, 0));
        t.write_done(2, "k");
        assert_eq!(t.reserved(), 10, "not 2's write");
        assert!(t.write_done(1, "k"));
        assert_eq!(t.reserved(), 0);
        t.queue_delete("k");
        assert!(!t.queue_write(2, task("k", 10), 8, None), "delete pending");
        let (_, deletes) = t.take(2, 8);
        assert_eq!(deletes, ["k"]);
        assert!(
            !t.queue_write(2, task("k", 10), 8, None),
            "delete in flight"
        );
        t.deleted("k");
        assert!(t.queue_write(2, task("k", 10), 8, None));
    }

    #[test]
    fn a_write_of_a_changed_object_ends_stale() {
        let t = FileTier::new(FilePolicy {
            fsdir: Some("/d".into()),
            ..FilePolicy::default()
        });
        t.mount(1);
        assert!(t.queue_write(1, task("k", 10), 8, None));
        t.object_changed("k");
        assert!(!t.write_done(1, "k"));
        t.object_changed("j");
        assert!(t.write_done(1, "j"), "nothing in flight");
    }

    #[test]
    fn room_and_queue_limits_hold_and_a_lost_writer_frees_its_reservations() {
        let t = FileTier::default();
        t.mount(1);
        assert!(t.queue_write(1, task("a", 60), 8, Some(100)));
        assert!(!t.queue_write(1, task("b", 50), 8, Some(100)), "no room");
        assert!(t.queue_write(1, task("b", 40), 8, Some(100)));
        assert!(!t.queue_write(1, task("c", 0), 2, None), "queue full");
        t.unmount(1);
        assert_eq!((t.reserved(), t.busy_len()), (0, 0));
        assert!(!t.is_writer(1));
    }
}
