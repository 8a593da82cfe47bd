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
//! Leases and soft-pin deadlines are volatile: reads change them on the
//! leader only, and no `Mutation` carries them (see `service`).

use super::objects::ObjectMeta;
use super::policy::LeasePolicy;

impl LeasePolicy {
    /// A read: grant (or extend) the lease and refresh the soft pin.
    pub(crate) fn on_read(&self, obj: &mut ObjectMeta, now: u64) {
        obj.lease_until = obj.lease_until.max(now.saturating_add(self.lease_ttl));
        self.touch(obj, now);
    }

    /// A completed write: the object is fresh for LRU purposes, unleased.
    pub(crate) fn on_write(&self, obj: &mut ObjectMeta, now: u64) {
        obj.lease_until = obj.lease_until.max(now);
        self.touch(obj, now);
    }

    fn touch(&self, obj: &mut ObjectMeta, now: u64) {
        if obj.has_soft_pin() {
            obj.soft_pin_until = now.saturating_add(self.soft_pin_ttl);
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
    use crate::master::objects::{flags, Replicas};

    fn obj(flags: u8) -> ObjectMeta {
        ObjectMeta {
            size: 1,
            lease_until: 0,
            soft_pin_until: 0,
            replicas: Replicas::Many(Box::new([])),
            pending: None,
            flags,
        }
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
}
