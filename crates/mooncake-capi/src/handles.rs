//! The opaque handles C callers hold (`transfer_engine_t`,
//! `mooncake_store_t`). A handle is a number shaped like a pointer, never
//! an address: a call looks it up in its registry, so a null, forged,
//! destroyed or wrong-kind handle is an error code, never a dereference.
//! Numbers are never reused, and a call in flight holds an `Arc`, so a
//! handle destroyed meanwhile stays valid until that call returns.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;

use parking_lot::Mutex;

/// One kind of handle: the live values by number.
pub(crate) struct Registry<T> {
    /// Low bits of every handle of this kind (engine and store handles differ).
    tag: usize,
    state: Mutex<(usize, BTreeMap<usize, Arc<T>>)>,
}

impl<T> Registry<T> {
    pub(crate) const fn new(tag: usize) -> Self {
        Registry {
            tag,
            state: Mutex::new((0, BTreeMap::new())),
        }
    }

    /// A new handle for `value`.
    pub(crate) fn insert(&self, value: T) -> *mut c_void {
        let mut s = self.state.lock();
        s.0 += 1;
        // Room for the tag, and far from small integers a caller might pass.
        let h = ((s.0 + 0x1000) << 4) | self.tag;
        s.1.insert(h, Arc::new(value));
        h as *mut c_void
    }

    pub(crate) fn get(&self, h: *mut c_void) -> Option<Arc<T>> {
        self.state.lock().1.get(&(h as usize)).cloned()
    }

    /// Forgets `h`; its value drops once no call in flight holds it.
    pub(crate) fn remove(&self, h: *mut c_void) -> Option<Arc<T>> {
        self.state.lock().1.remove(&(h as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_looked_up_never_dereferenced() {
        static A: Registry<u32> = Registry::new(1);
        static B: Registry<u32> = Registry::new(2);
        let h = A.insert(5);
        assert_eq!(A.get(h).as_deref(), Some(&5));
        assert!(B.get(h).is_none(), "another kind");
        assert!(A.get(std::ptr::null_mut()).is_none());
        assert!(A.get(0xdead_beef as *mut c_void).is_none());
        let held = A.get(h).unwrap();
        assert!(A.remove(h).is_some());
        assert!(A.get(h).is_none(), "destroyed");
        assert_eq!(*held, 5, "a call in flight keeps its value");
        assert_ne!(A.insert(6), h, "numbers are not reused");
    }
}
