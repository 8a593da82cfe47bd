//! The seed's Rust API shape (`mooncake_store::MooncakeStore`): create a
//! handle, `setup` it, then put/get byte slices. A thin layer over
//! [`Client`]; errors carry the reference's numeric code.
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
//! store.remove("my-key", false)?;
//! # Ok::<(), mooncake_store::StoreError>(())
//! ```

use std::sync::OnceLock;

use mooncake_common::{Error, ErrorCode};

use super::{Client, ClientConfig};
use crate::types::ReplicateConfig;

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A store operation returned this error code (e.g. `OBJECT_NOT_FOUND`).
    #[error("operation failed: {0}")]
    OperationFailed(Error),
    /// `setup` failed, or a call came before `setup`.
    #[error("setup failed: {0}")]
    SetupError(String),
    /// A bad argument (an empty key, a null buffer…).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl StoreError {
    /// The reference's numeric error code.
    pub fn code(&self) -> i32 {
        match self {
            StoreError::OperationFailed(e) => e.code.code(),
            StoreError::SetupError(_) => ErrorCode::INTERNAL_ERROR.code(),
            StoreError::InvalidArgument(_) => ErrorCode::INVALID_PARAMS.code(),
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        StoreError::OperationFailed(e)
    }
}

pub type StoreResult<T> = std::result::Result<T, StoreError>;

/// A store handle in the seed's shape.
#[derive(Default)]
pub struct MooncakeStore {
    client: OnceLock<Client>,
}

impl MooncakeStore {
    pub fn new() -> StoreResult<MooncakeStore> {
        Ok(MooncakeStore::default())
    }

    /// Connects to the master and mounts `global_segment_size` bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn setup(
        &self,
        local_hostname: &str,
        metadata_server: &str,
        global_segment_size: u64,
        local_buffer_size: u64,
        protocol: &str,
        device_name: &str,
        master_server_address: &str,
    ) -> StoreResult<()> {
        let config = ClientConfig {
            local_hostname: local_hostname.into(),
            metadata_server: metadata_server.into(),
            global_segment_size,
            local_buffer_size,
            protocol: protocol.into(),
            device_name: device_name.into(),
            master_server_address: master_server_address.into(),
            ..ClientConfig::default()
        };
        if self.client.get().is_some() {
            return Err(StoreError::SetupError("already set up".into()));
        }
        let client = Client::setup(&config).map_err(|e| StoreError::SetupError(e.to_string()))?;
        self.client
            .set(client)
            .map_err(|_| StoreError::SetupError("already set up".into()))
    }

    /// The underlying [`Client`], for the calls this shape lacks.
    pub fn client(&self) -> StoreResult<&Client> {
        self.client
            .get()
            .ok_or_else(|| StoreError::SetupError("call setup first".into()))
    }

    pub fn put(
        &self,
        key: &str,
        value: &[u8],
        config: Option<&ReplicateConfig>,
    ) -> StoreResult<()> {
        let default = ReplicateConfig::default();
        Ok(self.client()?.put(key, value, config.unwrap_or(&default))?)
    }

    pub fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        Ok(self.client()?.get(key)?)
    }

    /// Reads the object into `buf`; returns its size. The buffer is
    /// registered for the duration of the call.
    pub fn get_into(&self, key: &str, buf: &mut [u8]) -> StoreResult<usize> {
        if buf.is_empty() {
            return Err(StoreError::InvalidArgument("empty buffer".into()));
        }
        let client = self.client()?;
        let addr = buf.as_mut_ptr() as usize;
        client.register_buffer(addr, buf.len())?;
        let r = client.get_into(key, addr, buf.len());
        let _ = client.unregister_buffer(addr);
        Ok(r? as usize)
    }

    pub fn is_exist(&self, key: &str) -> StoreResult<bool> {
        Ok(self.client()?.is_exist(key)?)
    }

    pub fn get_size(&self, key: &str) -> StoreResult<u64> {
        Ok(self.client()?.get_size(key)?)
    }

    pub fn remove(&self, key: &str, force: bool) -> StoreResult<()> {
        Ok(self.client()?.remove(key, force)?)
    }
}

impl Drop for MooncakeStore {
    fn drop(&mut self) {
        if let Some(c) = self.client.get() {
            let _ = c.close();
        }
    }
}
