//! The structs of the two headers, laid out as C lays them out (`repr(C)`);
//! `tests/c_abi.rs` checks their sizes and offsets against the C compiler's.

use std::ffi::{c_char, c_int, c_void};

/// `struct transfer_request`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TransferRequestC {
    pub opcode: c_int,
    pub source: *mut c_void,
    pub target_id: i32,
    pub target_offset: u64,
    pub length: u64,
}

/// `struct notify_msg` (`notify_msg_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NotifyMsg {
    pub name: *mut c_char,
    pub msg: *mut c_char,
}

/// `struct transfer_status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TransferStatusC {
    pub status: c_int,
    pub transferred_bytes: u64,
}

/// `struct buffer_entry` (`buffer_entry_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BufferEntry {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `struct nic_load_stat` (`nic_load_stat_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NicLoadStat {
    pub device_name: [c_char; 64],
    pub inflight_bytes: u64,
    pub ewma_bandwidth_bps: f64,
}

/// `struct mooncake_replicate_config` (`mooncake_replicate_config_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ReplicateConfigC {
    pub replica_num: usize,
    pub with_soft_pin: c_int,
    pub with_hard_pin: c_int,
    pub preferred_segments: *const *const c_char,
    pub preferred_segments_count: usize,
}

/// `OPCODE_READ`, `OPCODE_WRITE`.
pub const OPCODE_READ: c_int = 0;
pub const OPCODE_WRITE: c_int = 1;
/// `LOCAL_SEGMENT`: this engine's own segment.
pub const LOCAL_SEGMENT: i32 = 0;
/// `INVALID_BATCH`: what `allocateBatchID` returns on failure.
pub const INVALID_BATCH: u64 = u64::MAX;
