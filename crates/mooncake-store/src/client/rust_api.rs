//! The reference's Rust crate (`mooncake_store::MooncakeStore`, its
//! `mooncake-store/rust/`): the same types, methods and signatures, so code
//! written against it (its `examples/basic_usage.rs`, which builds here as
//! `examples/basic_usage.rs`) compiles unchanged. A thin layer over
//! [`Client`]; failures carry the numbers the reference's calls return.
//!
//! ```no_run
//! use mooncake_store::{MooncakeStore, ReplicateConfig};
//! let store = MooncakeStore::new()?;
//! store.setup("node1", "http://10.0.0.1:8080/metadata", 512 << 20, 128 << 20, "tcp", "", "10.0.0.1:50051")?;
//! store.put("my-key", b"hello, mooncake!", None)?;
//! let config = ReplicateConfig { replica_num: 2, with_soft_pin: true, ..Default::default() };
//! store.put("replicated-key", b"replicated value", Some(&config))?;
//! assert!(store.is_exist("my-key")?);
//! assert_eq!(store.get("my-key")?, b"hello, mooncake!");
//! assert_eq!(store.remove_by_regex("^replicated-", true)?, 1);
//! store.remove("my-key", false)?;
//! # Ok::<(), mooncake_store::StoreError>(())
//! ```

use std::ffi::{c_void, NulError};
use std::sync::OnceLock;

use mooncake_common::{Error, ErrorCode};

use super::{Client, ClientConfig};
use crate::types;

/// Why a call failed (the reference's variants, less those of its
/// shared-library loading, which this crate does not do).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A string argument holds a NUL byte (the reference passes C strings).
    #[error("string argument contains null byte: {0}")]
    InvalidString(#[from] NulError),
    /// The call returned this code: a store error code (`-704` object not
    /// found, `-800` transfer failed, ...), `-1` before `setup` or for a
    /// failed `setup`.
    #[error("store operation failed with code {0}")]
    OperationFailed(i32),
    /// Kept for the reference's signature; a missing key is
    /// `OperationFailed(-704)` there and here.
    #[error("key not found")]
    NotFound,
    /// Slices of different lengths handed to a batch call.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl StoreError {
    /// The numeric code (`-600` for the argument errors, `-704` for `NotFound`).
    pub fn code(&self) -> i32 {
        match self {
            StoreError::OperationFailed(c) => *c,
            StoreError::NotFound => ErrorCode::OBJECT_NOT_FOUND.code(),
            StoreError::InvalidString(_) | StoreError::InvalidArgument(_) => {
                ErrorCode::INVALID_PARAMS.code()
            }
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        tracing::debug!("{e}");
        StoreError::OperationFailed(store_code(&e))
    }
}

/// The number the reference's store returns for a failure: a destination
/// smaller than the object, a bad key or an unregistered destination are
/// INVALID_PARAMS; a cluster without a segment to place an object in is
/// NO_AVAILABLE_HANDLE; any other engine failure (`ERR_*`: a peer's segment
/// not published, a refused connection, ...) is TRANSFER_FAIL, as the
/// reference's store reports every failed open, submit or transfer. The
/// engine's own numbers would read as store codes (`ERR_METADATA` -200 is
/// `NO_AVAILABLE_HANDLE`).
pub fn store_code(e: &Error) -> i32 {
    match e.code {
        ErrorCode::BUFFER_OVERFLOW
        | ErrorCode::INVALID_KEY
        | ErrorCode::ERR_ADDRESS_NOT_REGISTERED
        | ErrorCode::ERR_INVALID_ARGUMENT => ErrorCode::INVALID_PARAMS.code(),
        ErrorCode::SEGMENT_NOT_FOUND => ErrorCode::NO_AVAILABLE_HANDLE.code(),
        c if c.name().starts_with("ERR_") => ErrorCode::TRANSFER_FAIL.code(),
        c => c.code(),
    }
}

/// A store call's 0 or [`store_code`], as the reference's bindings return
/// it: a put of a key that exists succeeds and keeps the stored value
/// ("first write wins").
pub fn store_status(r: Result<(), Error>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) if e.code == ErrorCode::OBJECT_ALREADY_EXISTS => 0,
        Err(e) => {
            tracing::debug!("{e}");
            store_code(&e)
        }
    }
}

/// A byte or object count, or the [`store_code`] of the failure.
pub fn store_count<N: TryInto<i64>>(r: Result<N, Error>) -> i64 {
    match r {
        Ok(n) => n.try_into().unwrap_or(i64::MAX),
        Err(e) => {
            tracing::debug!("{e}");
            i64::from(store_code(&e))
        }
    }
}

/// An existence check as the bindings return it: 1 exists, 0 missing (also
/// a key that cannot exist), -1 when the cluster could not answer.
pub fn store_exist(r: Result<bool, Error>) -> i32 {
    match r {
        Ok(true) => 1,
        Ok(false) => 0,
        Err(e)
            if matches!(
                e.code,
                ErrorCode::OBJECT_NOT_FOUND | ErrorCode::INVALID_KEY | ErrorCode::INVALID_PARAMS
            ) =>
        {
            0
        }
        Err(_) => -1,
    }
}

/// Replication of one put, as the reference's crate has it. Unlike the
/// store's own [`types::ReplicaPolicy`], the derived default has
/// `replica_num: 0`, which puts refuse (`-600`), as the reference's do.
#[derive(Debug, Clone, Default)]
pub struct ReplicateConfig {
    pub replica_num: usize,
    pub with_soft_pin: bool,
    pub with_hard_pin: bool,
    /// Segments to place replicas on first, in order.
    pub preferred_segments: Vec<String>,
}

impl ReplicateConfig {
    fn to_store(&self) -> types::ReplicaPolicy {
        types::ReplicaPolicy {
            replica_num: self.replica_num,
            with_soft_pin: self.with_soft_pin,
            with_hard_pin: self.with_hard_pin,
            preferred_segments: self.preferred_segments.clone(),
            ..types::ReplicaPolicy::default()
        }
    }
}

/// A store handle: `new`, then `setup`, then the calls.
#[derive(Default)]
pub struct MooncakeStore {
    client: OnceLock<Client>,
}

/// What calls before `setup` return (the reference's C layer answers -1).
const NOT_SET_UP: i32 = -1;

fn check_str(s: &str) -> Result<(), StoreError> {
    if s.contains('\0') {
        // Build the reference's error value for a NUL inside a C string.
        return Err(std::ffi::CString::new(s).unwrap_err().into());
    }
    Ok(())
}

fn keys_of(keys: &[&str]) -> Result<Vec<String>, StoreError> {
    keys.iter()
        .map(|k| check_str(k).map(|()| (*k).to_owned()))
        .collect()
}

fn same_lengths(count: usize, others: &[usize]) -> Result<(), StoreError> {
    if others.iter().any(|&n| n != count) {
        return Err(StoreError::InvalidArgument(
            "keys, buffers, and sizes must have the same length".into(),
        ));
    }
    Ok(())
}

/// A put of a key that exists keeps the stored value and succeeds, as in
/// the reference.
fn put_status(r: mooncake_common::Result<()>) -> Result<(), StoreError> {
    match r {
        Err(e) if e.code == ErrorCode::OBJECT_ALREADY_EXISTS => Ok(()),
        r => Ok(r?),
    }
}

impl MooncakeStore {
    pub fn new() -> Result<MooncakeStore, StoreError> {
        Ok(MooncakeStore::default())
    }

    /// Connects to the master and mounts `global_segment_size` bytes. A
    /// failure is `OperationFailed(-1)`, or `-600` for a bad argument.
    #[allow(clippy::too_many_arguments)]
    pub fn setup(
        &self,
        local_hostname: &str,
        metadata_server: &str,
        global_segment_size: u64,
        local_buffer_size: u64,
        protocol: &str,
        device_name: &str,
        master_server_addr: &str,
    ) -> Result<(), StoreError> {
        for s in [
            local_hostname,
            metadata_server,
            protocol,
            device_name,
            master_server_addr,
        ] {
            check_str(s)?;
        }
        if self.client.get().is_some() {
            return Err(StoreError::OperationFailed(NOT_SET_UP));
        }
        let config = ClientConfig {
            local_hostname: local_hostname.into(),
            metadata_server: metadata_server.into(),
            global_segment_size,
            local_buffer_size,
            protocol: protocol.into(),
            device_name: device_name.into(),
            master_server_address: master_server_addr.into(),
            ..ClientConfig::default()
        };
        let client = Client::setup(&config).map_err(|e| {
            tracing::error!("store setup failed: {e}");
            StoreError::OperationFailed(if e.code == ErrorCode::INVALID_PARAMS {
                ErrorCode::INVALID_PARAMS.code()
            } else {
                NOT_SET_UP
            })
        })?;
        self.client
            .set(client)
            .map_err(|_| StoreError::OperationFailed(NOT_SET_UP))
    }

    /// The underlying [`Client`], for the calls the reference's crate lacks.
    pub fn client(&self) -> Result<&Client, StoreError> {
        self.client
            .get()
            .ok_or(StoreError::OperationFailed(NOT_SET_UP))
    }

    /// `Ok` when the master answers; `OperationFailed(2)` when it does not,
    /// `OperationFailed(1)` before `setup` (the reference's numbers).
    pub fn health_check(&self) -> Result<(), StoreError> {
        let client = self.client.get().ok_or(StoreError::OperationFailed(1))?;
        client
            .health_check()
            .map_err(|_| StoreError::OperationFailed(2))
    }

    pub fn put(
        &self,
        key: &str,
        value: &[u8],
        config: Option<&ReplicateConfig>,
    ) -> Result<(), StoreError> {
        check_str(key)?;
        let cfg = config.map_or_else(types::ReplicaPolicy::default, ReplicateConfig::to_store);
        put_status(self.client()?.put(key, value, &cfg))
    }

    /// Stores `size` bytes at `buffer`, a buffer given to
    /// [`register_buffer`](Self::register_buffer) first.
    ///
    /// # Safety
    /// `buffer` must point to `size` readable bytes for the whole call.
    pub unsafe fn put_from(
        &self,
        key: &str,
        buffer: *mut c_void,
        size: usize,
        config: Option<&ReplicateConfig>,
    ) -> Result<(), StoreError> {
        check_str(key)?;
        let cfg = config.map_or_else(types::ReplicaPolicy::default, ReplicateConfig::to_store);
        put_status(self.client()?.put_from(key, buffer as usize, size, &cfg))
    }

    /// Reads the object into `buffer` (registered first); returns its size.
    ///
    /// # Safety
    /// `buffer` must point to `size` writable bytes for the whole call.
    pub unsafe fn get_into(
        &self,
        key: &str,
        buffer: *mut c_void,
        size: usize,
    ) -> Result<i64, StoreError> {
        check_str(key)?;
        let n = self.client()?.get_into(key, buffer as usize, size)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        check_str(key)?;
        Ok(self.client()?.get(key)?)
    }

    pub fn is_exist(&self, key: &str) -> Result<bool, StoreError> {
        check_str(key)?;
        Ok(self.client()?.is_exist(key)?)
    }

    pub fn get_size(&self, key: &str) -> Result<i64, StoreError> {
        check_str(key)?;
        let n = self.client()?.get_size(key)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// The `host:port` this client is known by.
    pub fn get_hostname(&self) -> Result<String, StoreError> {
        Ok(self.client()?.get_hostname())
    }

    pub fn remove(&self, key: &str, force: bool) -> Result<(), StoreError> {
        check_str(key)?;
        Ok(self.client()?.remove(key, force)?)
    }

    /// Removes every key matching the regular expression; returns how many.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<i64, StoreError> {
        check_str(pattern)?;
        let n = self.client()?.remove_by_regex(pattern, force)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Removes every key (leased ones too with `force`); returns how many.
    pub fn remove_all(&self, force: bool) -> Result<i64, StoreError> {
        let n = self.client()?.remove_all(force)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Registers memory for `put_from`/`get_into` and the batch forms.
    ///
    /// # Safety
    /// `buffer` must point to `size` bytes that stay mapped until
    /// [`unregister_buffer`](Self::unregister_buffer) (or the store drops).
    pub unsafe fn register_buffer(
        &self,
        buffer: *mut c_void,
        size: usize,
    ) -> Result<(), StoreError> {
        Ok(self.client()?.register_buffer(buffer as usize, size)?)
    }

    /// # Safety
    /// `buffer` must be an address given to `register_buffer`.
    pub unsafe fn unregister_buffer(&self, buffer: *mut c_void) -> Result<(), StoreError> {
        Ok(self.client()?.unregister_buffer(buffer as usize)?)
    }

    /// One code per key: 0 stored (or already there), else the failure's.
    ///
    /// # Safety
    /// Each `buffers[i]` must point to `sizes[i]` readable, registered bytes.
    pub unsafe fn batch_put_from(
        &self,
        keys: &[&str],
        buffers: &[*mut c_void],
        sizes: &[usize],
        config: Option<&ReplicateConfig>,
    ) -> Result<Vec<i32>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        same_lengths(keys.len(), &[buffers.len(), sizes.len()])?;
        let keys = keys_of(keys)?;
        let addrs: Vec<usize> = buffers.iter().map(|&b| b as usize).collect();
        let cfg = config.map_or_else(types::ReplicaPolicy::default, ReplicateConfig::to_store);
        let results = self.client()?.batch_put_from(&keys, &addrs, sizes, &cfg)?;
        Ok(results
            .into_iter()
            .map(|r| match put_status(r) {
                Ok(()) => 0,
                Err(e) => e.code(),
            })
            .collect())
    }

    /// Per key the bytes read, or the failure's code.
    ///
    /// # Safety
    /// Each `buffers[i]` must point to `sizes[i]` writable, registered bytes.
    pub unsafe fn batch_get_into(
        &self,
        keys: &[&str],
        buffers: &[*mut c_void],
        sizes: &[usize],
    ) -> Result<Vec<i64>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        same_lengths(keys.len(), &[buffers.len(), sizes.len()])?;
        let keys = keys_of(keys)?;
        let addrs: Vec<usize> = buffers.iter().map(|&b| b as usize).collect();
        let results = self.client()?.batch_get_into(&keys, &addrs, sizes)?;
        Ok(results
            .into_iter()
            .map(|r| match r {
                Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
                Err(e) => i64::from(store_code(&e)),
            })
            .collect())
    }

    pub fn batch_is_exist(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let keys = keys_of(keys)?;
        self.client()?
            .batch_is_exist(&keys)?
            .into_iter()
            .map(|r| r.map_err(StoreError::from))
            .collect()
    }
}

impl Drop for MooncakeStore {
    fn drop(&mut self) {
        if let Some(c) = self.client.get() {
            let _ = c.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_codes_become_transfer_fail() {
        let code = |c| store_code(&Error::from(c));
        assert_eq!(code(ErrorCode::ERR_METADATA), -800);
        assert_eq!(code(ErrorCode::ERR_SOCKET), -800);
        assert_eq!(code(ErrorCode::ERR_ENDPOINT), -800);
        assert_eq!(code(ErrorCode::ERR_INVALID_ARGUMENT), -600);
        assert_eq!(code(ErrorCode::ERR_ADDRESS_NOT_REGISTERED), -600);
        assert_eq!(code(ErrorCode::NO_AVAILABLE_HANDLE), -200);
        assert_eq!(code(ErrorCode::SEGMENT_NOT_FOUND), -200);
        assert_eq!(code(ErrorCode::OBJECT_NOT_FOUND), -704);
        assert_eq!(code(ErrorCode::INTERNAL_ERROR), -1);
    }

    #[test]
    fn a_put_in_flight_is_no_success() {
        assert!(put_status(Ok(())).is_ok());
        assert!(put_status(Err(Error::from(ErrorCode::OBJECT_ALREADY_EXISTS))).is_ok());
        let busy = put_status(Err(Error::from(ErrorCode::OBJECT_REPLICA_BUSY)));
        assert_eq!(
            busy.unwrap_err().code(),
            ErrorCode::OBJECT_REPLICA_BUSY.code()
        );
    }

    #[test]
    fn the_four_field_config_maps_onto_the_stores() {
        let api = ReplicateConfig {
            replica_num: 2,
            with_soft_pin: true,
            with_hard_pin: false,
            preferred_segments: vec!["seg-0".into()],
        };
        let cfg = api.to_store();
        assert_eq!(cfg.replica_num, 2);
        assert!(cfg.with_soft_pin && !cfg.with_hard_pin);
        assert_eq!(cfg.preferred_segments, ["seg-0"]);
        assert_eq!(ReplicateConfig::default().replica_num, 0);
    }

    #[test]
    fn calls_before_setup_and_bad_arguments() {
        let store = MooncakeStore::new().unwrap();
        assert_eq!(store.get("k").unwrap_err().code(), -1);
        assert!(matches!(
            store.health_check(),
            Err(StoreError::OperationFailed(1))
        ));
        assert!(matches!(
            store.put("a\0b", b"v", None),
            Err(StoreError::InvalidString(_))
        ));
        let e = unsafe { store.batch_get_into(&["a", "b"], &[std::ptr::null_mut()], &[1, 2]) };
        assert!(matches!(e, Err(StoreError::InvalidArgument(_))));
        assert_eq!(store.batch_is_exist(&[]).unwrap(), Vec::<bool>::new());
    }
}
