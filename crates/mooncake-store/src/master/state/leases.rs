//! Leases and pins: which objects removal and eviction must leave alone.
//!
//! - Every read grants a lease of `default_kv_lease_ttl`: until it runs out,
//!   `remove` fails with `OBJECT_HAS_LEASE` (unless forced) and eviction
//!   skips the object, so a reader never loses the bytes it is copying.
//! - A soft pin lasts `default_kv_soft_pin_ttl` after the last access; soft
//!   pinned objects are evicted only when nothing else frees enough (and only
//!   with `allow_evict_soft_pinned_objects`).
//! - A hard pin is permanent: never evicted; only an explicit forced remove,
//!   or `remove_all`, drops the object.
//!
//! A check for existence is not a use: it leases nothing and leaves the
//! object's place in the eviction order, so callers that poll `exist`
//! (prefix lookups) do not keep objects from being evicted; a read leases
//! what it reads.
//!
//! Leases and soft-pin deadlines are volatile: reads change them on the
//! leader only, and no `Mutation` carries them (see `service`).

use std::sync::atomic::{AtomicU32, Ordering};

use super::frequency;
use super::objects::ObjectMeta;
use crate::master::config::policy::LeasePolicy;

/// Reads and writes so far (wrapping): a use stamps the object with the
/// next count, so eviction can order objects used within the same
/// millisecond exactly (`eviction::Rank`).
static USES: AtomicU32 = AtomicU32::new(0);

/// The count the next use will get.
pub(crate) fn uses_now() -> u32 {
    USES.load(Ordering::Relaxed)
}

impl LeasePolicy {
    /// A read: grant (or extend) the lease and refresh the soft pin.
    pub(crate) fn on_read(&self, obj: &mut ObjectMeta, now: u64) {
        obj.lease_until = obj.lease_until.max(now.saturating_add(self.lease_ttl));
        frequency::count_read(obj);
        self.touch(obj, now);
    }

    /// The lease alone, as a read of another member of the object's group
    /// grants it (the member itself was not used: its soft pin stays).
    pub(crate) fn lease(&self, obj: &mut ObjectMeta, now: u64) {
        obj.lease_until = obj.lease_until.max(now.saturating_add(self.lease_ttl));
    }

    /// Less than half a lease is left on `obj`: a read of its group
    /// refreshes the group's.
    pub(crate) fn is_stale(&self, obj: &ObjectMeta, now: u64) -> bool {
        obj.lease_until <= now.saturating_add(self.lease_ttl / 2)
    }

    /// A completed write: the object is fresh for LRU purposes, unleased.
    pub(crate) fn on_write(&self, obj: &mut ObjectMeta, now: u64) {
        obj.lease_until = obj.lease_until.max(now);
        obj.reads = 0;
        self.touch(obj, now);
    }

    /// A tier copy is about to read the object from its owner's segment:
    /// lease it against removal, upsert and eviction until the copy is
    /// reported, then [`CopyLease::release`] gives the lease back. The copy's
    /// lease ends one millisecond before a read's granted at the same
    /// instant would, so any read leased after this one leaves a different
    /// `lease_until` behind (a lease of under 2 ms cannot be told apart and
    /// is kept to its end). Copying is not a use: the soft pin stays.
    pub(crate) fn lend_for_copy(&self, obj: &mut ObjectMeta, now: u64) -> CopyLease {
        let before = obj.lease_until;
        let releasable = self.lease_ttl >= 2;
        let ttl = if releasable {
            self.lease_ttl - 1
        } else {
            self.lease_ttl
        };
        let until = now.saturating_add(ttl);
        obj.lease_until = before.max(until);
        CopyLease {
            before,
            held: obj.lease_until,
            releasable,
        }
    }

    fn touch(&self, obj: &mut ObjectMeta, now: u64) {
        obj.used = USES.fetch_add(1, Ordering::Relaxed);
        if obj.has_soft_pin() {
            obj.soft_pin_until = now.saturating_add(self.soft_pin_ttl);
        }
    }
}

/// The lease a tier copy holds on its object while the owner copies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyLease {
    /// The object's lease before the copy's.
    before: u64,
    /// `lease_until` as the copy left it.
    held: u64,
    releasable: bool,
}

impl CopyLease {
    /// The copy was reported (written or failed): the object gets its
    /// earlier lease back, unless a read leased it since (then `lease_until`
    /// moved past `held`, and that read's lease stays). Giving back also
    /// restores the object's place in the LRU order, which the copy did not
    /// change. Without this the object would stay unevictable for a whole
    /// lease after its copy landed, and a full memory tier would drain at
    /// one segment per lease TTL.
    pub(crate) fn release(self, obj: &mut ObjectMeta) {
        if self.releasable && obj.lease_until == self.held {
            obj.lease_until = self.before;
        }
    }
}

impl ObjectMeta {
    /// A reader may still be using the object.
    pub(crate) fn is_leased(&self, now: u64) -> bool {
        self.lease_until > now
    }

    /// The soft pin is set and was refreshed recently enough.
    pub(crate) fn is_soft_pinned(&self, now: u64) -> bool {
        self.has_soft_pin() && self.soft_pin_until > now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::state::objects::{flags, Replicas};

    fn obj(flags: u8) -> ObjectMeta {
        ObjectMeta {
            size: 1,
            lease_until: 0,
            soft_pin_until: 0,
            replicas: Replicas::Many(Box::new([])),
            pending: None,
            flags,
            used: 0,
            reads: 0,
        }
    }

    #[test]
    fn reads_count_and_a_write_starts_them_over() {
        let p = LeasePolicy {
            lease_ttl: 100,
            soft_pin_ttl: 1000,
        };
        let mut o = obj(flags::COMPLETE);
        p.on_write(&mut o, 0);
        p.on_read(&mut o, 1);
        p.on_read(&mut o, 2);
        assert_eq!(o.reads, 2);
        // A group member's lease and a tier copy are not reads of it.
        p.lease(&mut o, 3);
        p.lend_for_copy(&mut o, 4).release(&mut o);
        assert_eq!(o.reads, 2);
        p.on_write(&mut o, 5);
        assert_eq!(o.reads, 0, "an upsert is a new value");
    }

    #[test]
    fn leases_extend_and_expire() {
        let p = LeasePolicy {
            lease_ttl: 100,
            soft_pin_ttl: 1000,
        };
        let mut o = obj(flags::COMPLETE);
        p.on_write(&mut o, 10);
        assert!(!o.is_leased(10));
        p.on_read(&mut o, 20);
        assert!(o.is_leased(119));
        assert!(!o.is_leased(120));
        // A later read extends; an earlier clock never shortens.
        p.on_read(&mut o, 50);
        assert!(o.is_leased(149));
        p.on_read(&mut o, 0);
        assert!(o.is_leased(149));
    }

    #[test]
    fn soft_pin_follows_access() {
        let p = LeasePolicy {
            lease_ttl: 100,
            soft_pin_ttl: 1000,
        };
        let mut plain = obj(flags::COMPLETE);
        p.on_read(&mut plain, 0);
        assert!(!plain.is_soft_pinned(1));
        let mut pinned = obj(flags::COMPLETE | flags::SOFT_PIN);
        p.on_write(&mut pinned, 0);
        assert!(pinned.is_soft_pinned(999));
        assert!(!pinned.is_soft_pinned(1000));
        p.on_read(&mut pinned, 900);
        assert!(pinned.is_soft_pinned(1899));
    }

    #[test]
    fn a_copy_lease_is_given_back_unless_a_read_came_after_it() {
        let p = LeasePolicy {
            lease_ttl: 100,
            soft_pin_ttl: 1000,
        };
        // Unread object: the copy leases it, the release makes it evictable.
        let mut o = obj(0);
        o.lease_until = 7;
        let l = p.lend_for_copy(&mut o, 20);
        assert!(o.is_leased(20) && o.is_leased(118) && !o.is_leased(119));
        l.release(&mut o);
        assert_eq!(o.lease_until, 7);
        // A read at the copy's own instant, after it: the read's lease stays.
        let mut o = obj(0);
        let l = p.lend_for_copy(&mut o, 20);
        p.on_read(&mut o, 20);
        l.release(&mut o);
        assert!(o.is_leased(119));
        // A read later on: stays.
        let mut o = obj(0);
        let l = p.lend_for_copy(&mut o, 20);
        p.on_read(&mut o, 50);
        l.release(&mut o);
        assert!(o.is_leased(149));
        // A read's lease from before the copy outlasting the copy's is kept.
        let mut o = obj(0);
        p.on_read(&mut o, 20);
        let l = p.lend_for_copy(&mut o, 20);
        l.release(&mut o);
        assert!(o.is_leased(119));
        // A lease too short to tell apart is kept to its end.
        let short = LeasePolicy {
            lease_ttl: 1,
            soft_pin_ttl: 1000,
        };
        let mut o = obj(0);
        let l = short.lend_for_copy(&mut o, 20);
        l.release(&mut o);
        assert!(o.is_leased(20));
    }
}
