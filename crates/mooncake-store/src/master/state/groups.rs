//! Object groups (`ReplicateConfig.group_ids`): which objects belong
//! together. A read of one member leases them all, and eviction takes a
//! group only when none of its members is leased, then all of them that may
//! go (`service::tick`).
//!
//! A side table, so an ungrouped object costs nothing: each grouped key
//! (one shared allocation) maps to a small group index; each group keeps
//! its interned name (tenant-scoped, as keys are) and its members. An
//! object joins its group when its first version is put (`ObjectOp::Group`,
//! replicated like every change) and leaves it when it leaves the object
//! map (`ObjectMap`), whatever removed it.
//!
//! The lock is a leaf: taken under an object shard's lock, never the other
//! way round (callers copy what they need out of it first).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

/// The object groups; see the module docs.
#[derive(Default)]
pub(crate) struct Groups {
    inner: RwLock<Inner>,
    /// Grouped keys: calls on a master without groups skip the lock.
    members: AtomicUsize,
}

#[derive(Default)]
struct Inner {
    of_key: HashMap<Arc<str>, u32>,
    slots: Vec<Option<Group>>,
    free: Vec<u32>,
    by_name: HashMap<Arc<str>, u32>,
}

struct Group {
    name: Arc<str>,
    members: HashSet<Arc<str>>,
}

/// Which group each grouped key is in, copied at one instant (an eviction
/// round ranks groups with it).
#[derive(Default)]
pub(crate) struct Grouping {
    of_key: HashMap<Arc<str>, u32>,
    /// Members of each group, by index.
    sizes: Vec<usize>,
}

impl Grouping {
    /// The index of `key`'s group.
    pub(crate) fn group_of(&self, key: &str) -> Option<u32> {
        if self.of_key.is_empty() {
            return None;
        }
        self.of_key.get(key).copied()
    }

    /// How many members group `g` has.
    pub(crate) fn size(&self, g: u32) -> usize {
        self.sizes.get(g as usize).copied().unwrap_or(0)
    }
}

impl Groups {
    fn any(&self) -> bool {
        self.members.load(Ordering::Relaxed) > 0
    }

    /// `key` joins `group` (leaving the one it was in, if another).
    pub(crate) fn join(&self, key: &str, group: &str) {
        let mut g = self.inner.write();
        if let Some(&i) = g.of_key.get(key) {
            if g.slots[i as usize].as_ref().map(|s| &*s.name) == Some(group) {
                return;
            }
            drop(g);
            self.forget(key);
            g = self.inner.write();
        }
        let inner = &mut *g;
        let i = match inner.by_name.get(group) {
            Some(&i) => i,
            None => {
                let name: Arc<str> = group.into();
                let slot = Some(Group {
                    name: name.clone(),
                    members: HashSet::new(),
                });
                let i = match inner.free.pop() {
                    Some(i) => {
                        inner.slots[i as usize] = slot;
                        i
                    }
                    None => {
                        inner.slots.push(slot);
                        (inner.slots.len() - 1) as u32
                    }
                };
                inner.by_name.insert(name, i);
                i
            }
        };
        let key: Arc<str> = key.into();
        let group = inner.slots[i as usize].as_mut().expect("live slot");
        group.members.insert(key.clone());
        inner.of_key.insert(key, i);
        self.members.fetch_add(1, Ordering::Relaxed);
    }

    /// `key` left the object map: it leaves its group, and a group left
    /// empty goes.
    pub(crate) fn forget(&self, key: &str) {
        if !self.any() {
            return;
        }
        let mut g = self.inner.write();
        let inner = &mut *g;
        let Some(i) = inner.of_key.remove(key) else {
            return;
        };
        self.members.fetch_sub(1, Ordering::Relaxed);
        let slot = &mut inner.slots[i as usize];
        let group = slot.as_mut().expect("live slot");
        group.members.remove(key);
        if group.members.is_empty() {
            inner.by_name.remove(&group.name);
            *slot = None;
            inner.free.push(i);
        }
    }

    /// The name of `key`'s group.
    pub(crate) fn group_of(&self, key: &str) -> Option<Arc<str>> {
        if !self.any() {
            return None;
        }
        let g = self.inner.read();
        let i = *g.of_key.get(key)?;
        g.slots[i as usize].as_ref().map(|s| s.name.clone())
    }

    /// Every member of `key`'s group, `key` too (empty when ungrouped).
    pub(crate) fn members_with(&self, key: &str) -> Vec<Arc<str>> {
        if !self.any() {
            return Vec::new();
        }
        let g = self.inner.read();
        let Some(&i) = g.of_key.get(key) else {
            return Vec::new();
        };
        let group = g.slots[i as usize].as_ref().expect("live slot");
        group.members.iter().cloned().collect()
    }

    /// Who is in which group, now.
    pub(crate) fn grouping(&self) -> Grouping {
        if !self.any() {
            return Grouping::default();
        }
        let g = self.inner.read();
        Grouping {
            of_key: g.of_key.clone(),
            sizes: g
                .slots
                .iter()
                .map(|s| s.as_ref().map_or(0, |s| s.members.len()))
                .collect(),
        }
    }

    /// Every group with its members, in name order (members sorted): what
    /// an image records.
    #[cfg(test)]
    pub(crate) fn export(&self) -> Vec<(Arc<str>, Vec<Arc<str>>)> {
        Self::export_of(&self.inner.read())
    }

    /// [`Groups::export`], or `None` while the groups are busy.
    #[allow(clippy::type_complexity)]
    pub(crate) fn try_export(&self) -> Option<Vec<(Arc<str>, Vec<Arc<str>>)>> {
        Some(Self::export_of(&*self.inner.try_read()?))
    }

    fn export_of(g: &Inner) -> Vec<(Arc<str>, Vec<Arc<str>>)> {
        let mut out: Vec<(Arc<str>, Vec<Arc<str>>)> = g
            .slots
            .iter()
            .flatten()
            .map(|s| {
                let mut m: Vec<Arc<str>> = s.members.iter().cloned().collect();
                m.sort_unstable();
                (s.name.clone(), m)
            })
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Forgets every group.
    pub(crate) fn clear(&self) {
        *self.inner.write() = Inner::default();
        self.members.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_join_leave_and_empty_groups_go() {
        let g = Groups::default();
        assert!(g.members_with("a").is_empty());
        g.join("a", "g");
        g.join("b", "g");
        g.join("c", "h");
        assert_eq!(g.group_of("a").as_deref(), Some("g"));
        let mut m = g.members_with("b");
        m.sort_unstable();
        assert_eq!(m, vec![Arc::from("a"), Arc::from("b")]);
        let grouping = g.grouping();
        let ga = grouping.group_of("a").unwrap();
        assert_eq!(grouping.group_of("b"), Some(ga));
        assert_eq!(grouping.size(ga), 2);
        assert_ne!(grouping.group_of("c"), Some(ga));
        assert_eq!(grouping.group_of("x"), None);

        g.forget("a");
        g.forget("b");
        assert_eq!(g.group_of("b"), None);
        // The empty group's index is reused; its name is free again.
        g.join("d", "i");
        g.join("e", "g");
        assert_eq!(g.members_with("e"), vec![Arc::from("e")]);
        // Moving a key leaves its old group.
        g.join("c", "g");
        assert_eq!(g.export().len(), 2, "h went with its last member");
        assert_eq!(
            g.export()[0],
            (Arc::from("g"), vec![Arc::from("c"), Arc::from("e")])
        );
        g.clear();
        assert!(g.export().is_empty());
        assert_eq!(g.group_of("c"), None);
    }
}
