//! The SSD tier: objects that leave a storage client's memory segment live on
//! in files on its local disk, durable before they are acknowledged.
//!
//! Layout:
//! - [`config`]: every `MOONCAKE_OFFLOAD_*` variable, parsed in one place;
//! - [`format`]: the on-disk formats (bucket metadata, object files) and their
//!   bounded, non-panicking decoders;
//! - [`io`]: aligned buffers, `O_DIRECT` files with a clean fallback, the
//!   `psync` and `io_uring` engines, atomic file commits;
//! - [`bucket`] and [`file_per_key`]: the two layouts' writers;
//! - [`read`]: checksum-verified reads of one object, a range, or a batch;
//! - [`readahead`]: windows read ahead of values read one at a time in order;
//! - [`scan`]: the restart scan that keeps complete objects and drops torn ones;
//! - [`index`]: the in-memory key → location map with fifo/lru/none eviction
//!   in two phases;
//! - [`disk_tier`]: [`DiskTier`], the facade that ties them together;
//! - [`shared_fs`]: the shared-filesystem tier's paths and object files;
//! - [`fs_group`]: its group writer (a round of files, durable together),
//!   and [`fs_spare`]: the deleted files it reuses.
//!
//! Nothing here reads a clock: times (for LRU) come in as arguments.

pub mod bucket;
pub mod config;
pub mod disk_tier;
pub mod file_per_key;
pub mod format;
pub mod fs_group;
pub mod fs_spare;
pub mod index;
pub mod io;
pub mod read;
pub mod readahead;
pub mod scan;
pub mod shared_fs;
pub mod unit_files;

pub use config::{EvictionPolicy, StorageBackend, TierConfig};
pub use disk_tier::{tier_identity, Committed, DiskTier, StageOutcome, TierUsage, WriteError};
pub use index::{EvictionBatch, ObjectLocation};
pub use scan::{ScanProblem, ScanReport, Verify};

use mooncake_common::ErrorCode;
use std::path::PathBuf;

/// What went wrong in the tier. [`TierError::code`] gives the reference's number.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt {what}")]
    Corrupt { what: String },
    #[error("object not found in the disk tier")]
    NotFound,
    /// The tier is at its size or key limit and may not evict: the caller
    /// keeps the object where it is and retries later (back-pressure).
    #[error("disk tier full: {0}")]
    Full(String),
    #[error("buffer of {got} bytes for an object of {want}")]
    BufferSize { want: u64, got: u64 },
    #[error("invalid tier configuration: {0}")]
    Config(String),
    #[error("{0}")]
    Invalid(String),
}

impl TierError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TierError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// The reference's error number for this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            TierError::Io { op, .. } => match *op {
                "open" | "create" => ErrorCode::FILE_OPEN_FAIL,
                "read" | "stat" | "list" => ErrorCode::FILE_READ_FAIL,
                _ => ErrorCode::FILE_WRITE_FAIL,
            },
            TierError::Corrupt { .. } => ErrorCode::FILE_READ_FAIL,
            TierError::NotFound => ErrorCode::OBJECT_NOT_FOUND,
            TierError::Full(_) => ErrorCode::NO_AVAILABLE_HANDLE,
            TierError::BufferSize { .. } => ErrorCode::FILE_INVALID_BUFFER,
            TierError::Config(_) | TierError::Invalid(_) => ErrorCode::INVALID_PARAMS,
        }
    }
}

pub type Result<T, E = TierError> = std::result::Result<T, E>;
