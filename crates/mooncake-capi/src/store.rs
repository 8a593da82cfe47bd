//! `store_c.h` over the store [`Client`].
//!
//! Return values are the reference's: 0 (or a size or count) on success, a
//! negative store error code on failure, -1 for a bad handle, a null
//! argument, or a store not set up. The buffers of `put_from`, `get_into`
//! and the batch forms must be registered (`mooncake_store_register_buffer`)
//! and the client checks every range against them; `mooncake_store_put`'s
//! value and registered buffers are checked against this process's
//! mappings ([`crate::maps`]).

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use mooncake_common::{ErrorCode, Result};
use mooncake_store::types::ReplicaPolicy;
use mooncake_store::{Client, ClientConfig};

use crate::codes::{self, exist, store_count, store_status};
use crate::ffi;
use crate::handles::Registry;
use crate::types::ReplicateConfigC;
use crate::{guard, init_logging};
use mooncake_common::maps::{self, Access};

/// `mooncake_store_t`: a client once set up.
struct CStore {
    client: OnceLock<Client>,
}

static STORES: Registry<CStore> = Registry::new(2);

/// A bad handle, a null argument, or a store not set up.
const FAILED: c_int = -1;
/// `INVALID_PARAMS` (checked against [`ErrorCode`] in the tests).
const INVALID_PARAMS: c_int = -600;

/// Runs `f` on the set-up client behind `store`; `FAILED` (as `R`) when the
/// handle is bad, the store not set up, or `f` panics.
fn with<R: From<i32>>(store: *mut c_void, f: impl FnOnce(&Client) -> R) -> R {
    guard(R::from(FAILED), || match STORES.get(store) {
        Some(s) => match s.client.get() {
            Some(c) => f(c),
            None => {
                tracing::warn!("mooncake_store_t {store:p} is not set up");
                R::from(FAILED)
            }
        },
        None => {
            tracing::warn!("invalid mooncake_store_t {store:p}");
            R::from(FAILED)
        }
    })
}

/// The replication of a put: the store's default for a null config.
fn policy(config: *const ReplicateConfigC) -> Option<ReplicaPolicy> {
    if config.is_null() {
        return Some(ReplicaPolicy::default());
    }
    let c = ffi::array(config, 1)?.remove(0);
    let names = ffi::array(c.preferred_segments, c.preferred_segments_count)?;
    Some(ReplicaPolicy {
        replica_num: c.replica_num,
        with_soft_pin: c.with_soft_pin != 0,
        with_hard_pin: c.with_hard_pin != 0,
        // Null entries are skipped, as the reference skips them.
        preferred_segments: names.into_iter().filter_map(ffi::string).collect(),
        ..ReplicaPolicy::default()
    })
}

fn keys(keys: *const *const c_char, count: usize) -> Option<Vec<String>> {
    ffi::array(keys, count)?
        .into_iter()
        .map(ffi::string)
        .collect()
}

/// A batch call's answer: its per-key results copied to the caller's
/// `results_out`, 0; or -1 when that array cannot take them.
fn results_to<T: Copy>(results_out: *mut T, results: &[T]) -> c_int {
    if ffi::put_array(results_out, results) {
        0
    } else {
        FAILED
    }
}

#[no_mangle]
pub extern "C" fn mooncake_store_create() -> *mut c_void {
    init_logging();
    guard(std::ptr::null_mut(), || {
        STORES.insert(CStore {
            client: OnceLock::new(),
        })
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_destroy(store: *mut c_void) {
    guard((), || {
        if let Some(s) = STORES.remove(store) {
            if let Some(c) = s.client.get() {
                if let Err(e) = c.close() {
                    tracing::warn!("mooncake_store_destroy: {e}");
                }
            }
        }
    })
}

/// Joins the cluster with `config`; 0, -600 for bad arguments, -1 for any
/// other failure (or a store already set up).
fn setup(store: *mut c_void, config: Result<ClientConfig>) -> c_int {
    guard(FAILED, || {
        let Some(s) = STORES.get(store) else {
            return FAILED;
        };
        if s.client.get().is_some() {
            tracing::error!("mooncake_store_t {store:p} is already set up");
            return FAILED;
        }
        match config.and_then(|c| Client::setup(&c)) {
            Ok(client) => match s.client.set(client) {
                Ok(()) => 0,
                Err(dup) => {
                    // Another thread set it up meanwhile.
                    let _ = dup.close();
                    FAILED
                }
            },
            Err(e) => {
                tracing::error!("mooncake_store setup failed: {e}");
                if e.code == ErrorCode::INVALID_PARAMS {
                    INVALID_PARAMS
                } else {
                    FAILED
                }
            }
        }
    })
}

fn str_or(p: *const c_char, fallback: &str) -> String {
    ffi::string(p).unwrap_or_else(|| fallback.to_owned())
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn mooncake_store_setup(
    store: *mut c_void,
    local_hostname: *const c_char,
    metadata_server: *const c_char,
    global_segment_size: u64,
    local_buffer_size: u64,
    protocol: *const c_char,
    device_name: *const c_char,
    master_server_addr: *const c_char,
) -> c_int {
    init_logging();
    let config = ClientConfig::from_env().map(|base| ClientConfig {
        local_hostname: str_or(local_hostname, ""),
        metadata_server: str_or(metadata_server, ""),
        global_segment_size,
        local_buffer_size,
        protocol: str_or(protocol, "tcp"),
        device_name: str_or(device_name, ""),
        master_server_address: str_or(master_server_addr, "127.0.0.1:50051"),
        ..base
    });
    setup(store, config)
}

/// Sets up from the `MC_*`/`MOONCAKE_*` environment (master, metadata
/// server, host name), with this protocol, device and segment size.
#[no_mangle]
pub extern "C" fn mooncake_store_init_all(
    store: *mut c_void,
    protocol: *const c_char,
    device_name: *const c_char,
    mount_segment_size: u64,
) -> c_int {
    init_logging();
    let config = ClientConfig::from_env().map(|base| ClientConfig {
        protocol: str_or(protocol, "tcp"),
        device_name: str_or(device_name, ""),
        global_segment_size: mount_segment_size,
        ..base
    });
    setup(store, config)
}

/// 0 healthy, 1 not set up, 2 master unreachable, -1 bad handle.
#[no_mangle]
pub extern "C" fn mooncake_store_health_check(store: *mut c_void) -> c_int {
    guard(FAILED, || match STORES.get(store) {
        None => FAILED,
        Some(s) => match s.client.get() {
            None => 1,
            Some(c) => match c.health_check() {
                Ok(()) => 0,
                Err(_) => 2,
            },
        },
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_put(
    store: *mut c_void,
    key: *const c_char,
    value: *const c_void,
    size: usize,
    config: *const ReplicateConfigC,
) -> c_int {
    with(store, |c| {
        let (Some(key), Some(cfg)) = (ffi::string(key), policy(config)) else {
            return FAILED;
        };
        if value.is_null() && size > 0 {
            return FAILED;
        }
        let addr = value as usize;
        if size > 0 && !maps::accessible(addr, size, Access::Read) {
            tracing::warn!("mooncake_store_put: {addr:#x}+{size} is not readable memory");
            return INVALID_PARAMS;
        }
        store_status(c.put(&key, ffi::bytes_at(addr, size), &cfg))
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_put_from(
    store: *mut c_void,
    key: *const c_char,
    buffer: *mut c_void,
    size: usize,
    config: *const ReplicateConfigC,
) -> c_int {
    with(store, |c| {
        let (Some(key), Some(cfg)) = (ffi::string(key), policy(config)) else {
            return FAILED;
        };
        if buffer.is_null() && size > 0 {
            return FAILED;
        }
        store_status(c.put_from(&key, buffer as usize, size, &cfg))
    })
}

/// The keys, addresses and sizes of a batch call; `None` for a null array
/// or entry (a null buffer with a non-zero size included).
fn batch(
    keys_p: *const *const c_char,
    buffers: *const *mut c_void,
    sizes: *const usize,
    count: usize,
) -> Option<(Vec<String>, Vec<usize>, Vec<usize>)> {
    let keys = keys(keys_p, count)?;
    let addrs: Vec<usize> = ffi::array(buffers, count)?
        .into_iter()
        .map(|b| b as usize)
        .collect();
    let sizes = ffi::array(sizes, count)?;
    if addrs.iter().zip(&sizes).any(|(&a, &s)| a == 0 && s > 0) {
        return None;
    }
    Some((keys, addrs, sizes))
}

#[no_mangle]
pub extern "C" fn mooncake_store_batch_put_from(
    store: *mut c_void,
    keys: *const *const c_char,
    buffers: *const *mut c_void,
    sizes: *const usize,
    count: usize,
    config: *const ReplicateConfigC,
    results_out: *mut c_int,
) -> c_int {
    with(store, |c| {
        let (Some((keys, addrs, sizes)), Some(cfg)) =
            (batch(keys, buffers, sizes, count), policy(config))
        else {
            return FAILED;
        };
        if results_out.is_null() {
            return FAILED;
        }
        let results: Vec<c_int> = match c.batch_put_from(&keys, &addrs, &sizes, &cfg) {
            Ok(v) => v.into_iter().map(store_status).collect(),
            Err(e) => vec![codes::store_code(&e); count],
        };
        results_to(results_out, &results)
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_get_into(
    store: *mut c_void,
    key: *const c_char,
    buffer: *mut c_void,
    size: usize,
) -> i64 {
    with(store, |c| {
        let Some(key) = ffi::string(key) else {
            return i64::from(FAILED);
        };
        if buffer.is_null() && size > 0 {
            return i64::from(FAILED);
        }
        store_count(c.get_into(&key, buffer as usize, size))
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_batch_get_into(
    store: *mut c_void,
    keys: *const *const c_char,
    buffers: *const *mut c_void,
    sizes: *const usize,
    count: usize,
    results_out: *mut i64,
) -> c_int {
    with(store, |c| {
        let Some((keys, addrs, sizes)) = batch(keys, buffers, sizes, count) else {
            return FAILED;
        };
        if results_out.is_null() {
            return FAILED;
        }
        let results: Vec<i64> = match c.batch_get_into(&keys, &addrs, &sizes) {
            Ok(v) => v.into_iter().map(store_count).collect(),
            Err(e) => vec![i64::from(codes::store_code(&e)); count],
        };
        results_to(results_out, &results)
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_is_exist(store: *mut c_void, key: *const c_char) -> c_int {
    with(store, |c| match ffi::string(key) {
        Some(key) => exist(c.is_exist(&key)),
        None => FAILED,
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_batch_is_exist(
    store: *mut c_void,
    keys_p: *const *const c_char,
    count: usize,
    results_out: *mut c_int,
) -> c_int {
    with(store, |c| {
        let Some(keys) = keys(keys_p, count) else {
            return FAILED;
        };
        if results_out.is_null() {
            return FAILED;
        }
        let results: Vec<c_int> = if keys.is_empty() {
            Vec::new()
        } else {
            match c.batch_is_exist(&keys) {
                Ok(v) => v.into_iter().map(exist).collect(),
                Err(_) => vec![-1; count],
            }
        };
        results_to(results_out, &results)
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_get_size(store: *mut c_void, key: *const c_char) -> i64 {
    with(store, |c| match ffi::string(key) {
        Some(key) => store_count(c.get_size(&key)),
        None => i64::from(FAILED),
    })
}

/// 0, or -1 when `buf_out` is null or too small (nothing written then).
#[no_mangle]
pub extern "C" fn mooncake_store_get_hostname(
    store: *mut c_void,
    buf_out: *mut c_char,
    buf_len: usize,
) -> c_int {
    with(store, |c| {
        if ffi::put_str(buf_out, buf_len, &c.get_hostname(), false) {
            0
        } else {
            FAILED
        }
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_remove(
    store: *mut c_void,
    key: *const c_char,
    force: c_int,
) -> c_int {
    with(store, |c| match ffi::string(key) {
        Some(key) => store_status(c.remove(&key, force != 0)),
        None => FAILED,
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_remove_by_regex(
    store: *mut c_void,
    pattern: *const c_char,
    force: c_int,
) -> i64 {
    with(store, |c| match ffi::string(pattern) {
        Some(p) => store_count(c.remove_by_regex(&p, force != 0)),
        None => i64::from(FAILED),
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_remove_all(store: *mut c_void, force: c_int) -> i64 {
    with(store, |c| store_count(c.remove_all(force != 0)))
}

#[no_mangle]
pub extern "C" fn mooncake_store_register_buffer(
    store: *mut c_void,
    buffer: *mut c_void,
    size: usize,
) -> c_int {
    with(store, |c| {
        let addr = buffer as usize;
        if addr == 0 || size == 0 {
            return FAILED;
        }
        if !maps::accessible(addr, size, Access::Write) {
            tracing::warn!(
                "mooncake_store_register_buffer: {addr:#x}+{size} is not writable memory"
            );
            return INVALID_PARAMS;
        }
        store_status(c.register_buffer(addr, size))
    })
}

#[no_mangle]
pub extern "C" fn mooncake_store_unregister_buffer(
    store: *mut c_void,
    buffer: *mut c_void,
) -> c_int {
    with(store, |c| {
        store_status(c.unregister_buffer(buffer as usize))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_bad_handles() {
        assert_eq!(INVALID_PARAMS, ErrorCode::INVALID_PARAMS.code());
        let bogus = 0x1234_5670 as *mut c_void;
        assert_eq!(mooncake_store_health_check(bogus), -1);
        assert_eq!(mooncake_store_health_check(std::ptr::null_mut()), -1);
        let s = mooncake_store_create();
        assert!(!s.is_null());
        assert_eq!(mooncake_store_health_check(s), 1, "not set up");
        assert_eq!(
            mooncake_store_put(s, c"k".as_ptr(), std::ptr::null(), 0, std::ptr::null()),
            -1
        );
        assert_eq!(mooncake_store_get_size(s, c"k".as_ptr()), -1);
        mooncake_store_destroy(s);
        assert_eq!(mooncake_store_health_check(s), -1, "destroyed");
        mooncake_store_destroy(s);
    }
}
