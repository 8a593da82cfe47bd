//! The only module that reads or writes through the raw pointers a C caller
//! passes, or allocates memory the caller frees. Everything else in the
//! crate is safe code over what these helpers return.
//!
//! What a C library can check, these helpers check: null pointers, sizes
//! whose byte count overflows, misaligned pointers, counts past
//! [`MAX_COUNT`]. What it cannot check (a non-null pointer to freed memory)
//! is the caller's side of the header's contract, as in every C API: a
//! non-null `char *` is a NUL-terminated string, a non-null array pointer
//! holds `count` elements, an out-pointer is writable, all for the duration
//! of the call. The bytes a transfer or a store call moves are different:
//! they are checked against registered memory (by the engine and the store
//! client) or against this process's mappings ([`crate::maps`]) before a
//! byte moves.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr};

use parking_lot::Mutex;

use crate::types::NotifyMsg;

/// Most elements an array argument may have: a count past it is a caller's
/// bug (an uninitialised size), refused before anything is allocated.
pub(crate) const MAX_COUNT: usize = 1 << 22;

/// A C string argument as UTF-8; `None` when null or not UTF-8.
pub(crate) fn string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, so by the header's contract a NUL-terminated string
    // that stays valid for this call; it is copied out before returning.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().ok().map(str::to_owned)
}

/// A copy of the `count` elements at `p`; `None` when `p` is null (with a
/// non-zero count), misaligned, or the count is past [`MAX_COUNT`].
pub(crate) fn array<T: Copy>(p: *const T, count: usize) -> Option<Vec<T>> {
    if count == 0 {
        return Some(Vec::new());
    }
    if p.is_null() || count > MAX_COUNT || !p.is_aligned() {
        return None;
    }
    // SAFETY: non-null and aligned, `count * size_of::<T>()` is small
    // (MAX_COUNT elements of at most a few words); by the header's contract
    // the caller's array holds `count` initialised elements for this call.
    // T is a plain C type (integers, pointers, repr(C) structs of them), for
    // which every bit pattern is valid.
    Some(unsafe { std::slice::from_raw_parts(p, count) }.to_vec())
}

/// The `len` bytes at `addr`, which [`mooncake_common::maps::accessible`] (or the
/// engine's registration table) found readable just before.
pub(crate) fn bytes_at<'a>(addr: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: every caller checks first that `addr..addr+len` is mapped
    // readable in this process (see each call site); the slice is used only
    // for the duration of the exported call that made it, and the header
    // makes that memory the caller's to keep mapped meanwhile.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// Writes `v` to the out-pointer `p`; false when null or misaligned.
pub(crate) fn put<T>(p: *mut T, v: T) -> bool {
    if p.is_null() || !p.is_aligned() {
        return false;
    }
    // SAFETY: non-null and aligned; by the header's contract an
    // out-pointer points to a writable `T`.
    unsafe { p.write(v) };
    true
}

/// Writes `vals` to the caller's array at `p` (of `vals.len()` elements);
/// false when null or misaligned.
pub(crate) fn put_array<T: Copy>(p: *mut T, vals: &[T]) -> bool {
    if vals.is_empty() {
        return true;
    }
    if p.is_null() || !p.is_aligned() {
        return false;
    }
    // SAFETY: non-null and aligned; by the header's contract an output
    // array holds as many elements as the call's `count`, which is
    // `vals.len()` (one result per input element).
    unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), p, vals.len()) };
    true
}

/// Writes `s` NUL-terminated into the caller's `buf` of `len` bytes. When it
/// does not fit: with `truncate`, as much as fits (NUL-terminated, as
/// `snprintf` does), else nothing. Returns whether all of `s` fit; false
/// too when `buf` is null or `len` 0.
pub(crate) fn put_str(buf: *mut c_char, len: usize, s: &str, truncate: bool) -> bool {
    if buf.is_null() || len == 0 {
        return false;
    }
    let fits = s.len() < len;
    if !fits && !truncate {
        return false;
    }
    let n = s.len().min(len - 1);
    // SAFETY: `buf` is non-null and, by the header's contract, `len`
    // writable bytes; we write `n + 1 <= len` of them.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    fits
}

/// The notify arrays handed out by [`notify_array`] and not yet freed, by
/// address, with their length: `freeNotifsMsgBuf` frees only these.
static NOTIFY_ARRAYS: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

/// A `malloc`ed copy of `bytes` with a NUL after it (cut at an inner NUL).
fn c_copy(bytes: &[u8]) -> *mut c_char {
    let bytes = bytes.split(|&b| b == 0).next().unwrap_or_default();
    // SAFETY: malloc of a non-zero size; a null result is checked.
    let p = unsafe { libc::malloc(bytes.len() + 1) }.cast::<c_char>();
    if !p.is_null() {
        // SAFETY: `p` holds `bytes.len() + 1` bytes, freshly allocated.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), bytes.len());
            *p.add(bytes.len()) = 0;
        }
    }
    p
}

/// A `malloc`ed array of `items` as `notify_msg_t`s (strings `malloc`ed
/// too, as the reference allocates them); null when empty or out of memory.
pub(crate) fn notify_array(items: &[(String, String)]) -> *mut NotifyMsg {
    if items.is_empty() {
        return std::ptr::null_mut();
    }
    let size = std::mem::size_of::<NotifyMsg>() * items.len();
    // SAFETY: malloc of a non-zero size; a null result is checked.
    let arr = unsafe { libc::malloc(size) }.cast::<NotifyMsg>();
    if arr.is_null() {
        return arr;
    }
    for (i, (name, msg)) in items.iter().enumerate() {
        let entry = NotifyMsg {
            name: c_copy(name.as_bytes()),
            msg: c_copy(msg.as_bytes()),
        };
        // SAFETY: `arr` holds `items.len()` entries; `i` is below that.
        unsafe { arr.add(i).write(entry) };
    }
    NOTIFY_ARRAYS
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(arr as usize, items.len());
    arr
}

/// Frees an array from [`notify_array`] of `size` entries: 0, or -1 (and
/// nothing freed) for an address it did not hand out or a wrong size. A
/// null array is 0, as `free(NULL)` is.
pub(crate) fn free_notify_array(arr: *mut NotifyMsg, size: c_int) -> c_int {
    if arr.is_null() {
        return 0;
    }
    let mut arrays = NOTIFY_ARRAYS.lock();
    let Some(map) = arrays.as_mut() else {
        return -1;
    };
    match map.get(&(arr as usize)) {
        Some(&n) if usize::try_from(size) == Ok(n) => {
            map.remove(&(arr as usize));
        }
        _ => return -1,
    }
    drop(arrays);
    let n = size as usize;
    for i in 0..n {
        // SAFETY: `arr` came from `notify_array` with `n` entries (checked
        // above and removed from the table, so it is freed once); the
        // strings are the `malloc`ed copies it made (or null, which free
        // accepts). A caller that replaced them owns that mistake, as with
        // the reference.
        unsafe {
            let e = arr.add(i).read();
            libc::free(e.name.cast());
            libc::free(e.msg.cast());
        }
    }
    // SAFETY: `arr` is the `malloc`ed array, freed once (see above).
    unsafe { libc::free(arr.cast()) };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_arrays() {
        assert_eq!(string(std::ptr::null()), None);
        assert_eq!(string(c"abc".as_ptr()).as_deref(), Some("abc"));
        assert_eq!(string(c"\xff".as_ptr()), None, "not UTF-8");
        let v = [1u64, 2, 3];
        assert_eq!(array(v.as_ptr(), 3), Some(v.to_vec()));
        assert_eq!(array(std::ptr::null::<u64>(), 0), Some(vec![]));
        assert_eq!(array(std::ptr::null::<u64>(), 1), None);
        assert_eq!(array(v.as_ptr(), MAX_COUNT + 1), None, "oversize count");
        let misaligned = (v.as_ptr() as usize + 1) as *const u64;
        assert_eq!(array(misaligned, 1), None);
    }

    #[test]
    fn out_pointers_and_strings() {
        let mut x = 0u32;
        assert!(put(&mut x, 7));
        assert_eq!(x, 7);
        assert!(!put(std::ptr::null_mut::<u32>(), 1));
        let mut buf = [1 as c_char; 6];
        assert!(put_str(buf.as_mut_ptr(), 6, "hello", false));
        assert_eq!(string(buf.as_ptr()).as_deref(), Some("hello"));
        assert!(!put_str(buf.as_mut_ptr(), 6, "hello!", false));
        assert_eq!(string(buf.as_ptr()).as_deref(), Some("hello"), "untouched");
        assert!(!put_str(buf.as_mut_ptr(), 4, "hello", true));
        assert_eq!(string(buf.as_ptr()).as_deref(), Some("hel"), "truncated");
        assert!(!put_str(std::ptr::null_mut(), 4, "x", true));
        assert!(!put_str(buf.as_mut_ptr(), 0, "", true));
    }

    #[test]
    fn notify_arrays_are_freed_once() {
        let items = vec![
            ("a".to_owned(), "m1".to_owned()),
            ("b".into(), "x\0y".into()),
        ];
        let arr = notify_array(&items);
        assert!(!arr.is_null());
        // SAFETY (test): `arr` holds 2 entries just built.
        let second = unsafe { arr.add(1).read() };
        assert_eq!(string(second.msg).as_deref(), Some("x"), "cut at the NUL");
        assert_eq!(free_notify_array(arr, 1), -1, "wrong size");
        assert_eq!(free_notify_array(arr, 2), 0);
        assert_eq!(free_notify_array(arr, 2), -1, "already freed");
        let mut bogus = NotifyMsg {
            name: std::ptr::null_mut(),
            msg: std::ptr::null_mut(),
        };
        assert_eq!(free_notify_array(&mut bogus, 1), -1, "not ours");
        assert_eq!(free_notify_array(std::ptr::null_mut(), 3), 0);
        assert!(notify_array(&[]).is_null());
    }
}
