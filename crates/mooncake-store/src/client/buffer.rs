//! [`BufferHandle`]: an object's bytes a get hands back without copying them
//! to the caller.

use super::staging::StagingBuf;

/// An object's bytes held by the client: in its staging pool (freed when
/// the handle drops) or on the heap. Derefs to the bytes.
pub struct BufferHandle {
    ptr: usize,
    len: usize,
    keep: Keep,
}

enum Keep {
    Heap(#[allow(dead_code)] Box<[u8]>),
    Staged(#[allow(dead_code)] StagingBuf),
}

impl BufferHandle {
    pub(crate) fn heap(v: Vec<u8>) -> BufferHandle {
        let mut b = v.into_boxed_slice();
        BufferHandle {
            ptr: b.as_mut_ptr() as usize,
            len: b.len(),
            keep: Keep::Heap(b),
        }
    }

    pub(crate) fn staged(mut b: StagingBuf) -> BufferHandle {
        BufferHandle {
            ptr: b.as_mut_slice().as_mut_ptr() as usize,
            len: b.len(),
            keep: Keep::Staged(b),
        }
    }

    /// Address of the first byte (stable for the handle's life).
    pub fn ptr(&self) -> usize {
        self.ptr
    }

    pub fn size(&self) -> usize {
        self.len
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is owned by `keep` (a boxed slice or a
        // staging allocation) for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// The bytes as a vector (moves heap bytes, copies staged ones).
    pub fn into_vec(self) -> Vec<u8> {
        match self.keep {
            Keep::Heap(b) => b.into_vec(),
            Keep::Staged(ref _s) => self.as_slice().to_vec(),
        }
    }
}

impl std::ops::Deref for BufferHandle {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for BufferHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferHandle")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// A piece of the client's local buffer (its registered staging memory)
/// lent to the caller until dropped. The zero-copy calls (`put_from`,
/// `get_into`, ...) use it in place, without registering it. The memory
/// stays mapped while the lease lives, even after the client closes.
pub struct LocalLease {
    buf: StagingBuf,
}

impl LocalLease {
    pub(crate) fn new(buf: StagingBuf) -> LocalLease {
        LocalLease { buf }
    }

    /// Address of the first byte (64-byte aligned).
    pub fn addr(&self) -> usize {
        self.buf.addr()
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }
}

impl std::fmt::Debug for LocalLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalLease")
            .field("addr", &self.addr())
            .field("len", &self.len())
            .finish()
    }
}
