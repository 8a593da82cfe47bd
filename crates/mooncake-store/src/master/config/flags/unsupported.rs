//! Flags of reference features not implemented here (CXL, NoF, the mmap
//! arena) and the KV-event flags the
//! reference itself deprecated (no event carries them): accepted with
//! their value checked, a non-default value is logged.

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! unsupported_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    cxl_path: Str = "/dev/dax0.0", NotImplemented, "DAX device path for CXL memory";
    cxl_size: Int = "8589934592", NotImplemented, "CXL memory size in bytes";
    enable_cxl: Bool = "false", NotImplemented, "Whether to enable CXL memory support";
    enable_metadata_cleanup_on_timeout: Bool = "false", NotImplemented, "Enable cleanup of HTTP metadata (mooncake/ram/*, mooncake/rpc_meta/...";
    kv_events_additional_salt: Str = "", NotImplemented, "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_block_size: Int = "0", NotImplemented, "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_dp_rank: Int = "0", NotImplemented, "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_lora_name: Str = "", NotImplemented, "Deprecated: not emitted on events (no LoRA context in master)";
    kv_events_model_name: Str = "", NotImplemented, "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_tenant_id: Str = "default", NotImplemented, "Deprecated: tenant_id comes from each object on events";
    nof_eviction_high_watermark_ratio: Float = "0.9", NotImplemented, "Ratio of high watermark trigger eviction in NoF SSD";
    nof_eviction_ratio: Float = "0.05", NotImplemented, "Ratio of objects to evict when NoF SSD space is full";
    nof_heartbeat_failures_threshold: Int = "3", NotImplemented, "Consecutive NoF heartbeat failures required before unmounting a NoF...";
    nof_heartbeat_interval_sec: Int = "10", NotImplemented, "How often master probes each mounted NoF segment";
    nof_heartbeat_probe_timeout_ms: Int = "1000", NotImplemented, "Timeout in milliseconds for a single NoF heartbeat probe";
    mmap_arena_pool_size: Int = "8589934592", NotImplemented, "Arena allocator pool size in bytes";
    use_mmap_arena_allocator: Bool = "false", NotImplemented, "Enable the lock-free mmap arena allocator for mmap buffers";
    } };
}
