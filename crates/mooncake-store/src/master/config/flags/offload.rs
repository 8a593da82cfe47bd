//! Storage tier flags: the SSD offload tier, promotion back to memory, and
//! the shared-file tier.

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! offload_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    enable_disk_eviction: Bool = "true", Full, "Shared-filesystem tier: when full, drop its oldest files (false: puts back off with -200 instead)"
        => enable_disk_eviction: bool = boolean;
    enable_offload: Bool = "false", Full, "Enable offload availability: storage clients may mount an SSD tier and objects are copied there"
        => enable_offload: bool = boolean;
    global_file_segment_size: Int = "9223372036854775807", Full, "Size of global NFS/3FS segment in bytes (the shared-filesystem tier's capacity)"
        => global_file_segment_size: usize = count;
    offload_cap_ratio: Float = "0.5", Full, "Per-cycle offload cap as a fraction of offloading_queue_limit"
        => offload_cap_ratio: f64 = ratio;
    offload_force_evict: Bool = "false", Full, "Force-evict objects exceeding offload cap without disk offload"
        => offload_force_evict: bool = boolean;
    offload_on_evict: Bool = "false", Full, "Defer LOCAL_DISK offload to eviction time instead of PutEnd"
        => offload_on_evict: bool = boolean;
    offloading_queue_limit: Int = "50000", Full, "Maximum number of objects allowed in the offloading queue per local disk owner"
        => offloading_queue_limit: usize = count;
    promotion_admission_threshold: Int = "2", Full, "Reads of a disk-only key before it is promoted (1 = on the first)"
        => promotion_admission_threshold: usize = count;
    promotion_max_per_heartbeat: Int = "1", Full, "Max promotion tasks handed to a client per round of its offload heartbeat (10 s unless the tier sends its own)"
        => promotion_max_per_heartbeat: usize = count;
    promotion_on_hit: Bool = "false", Full, "Promote LOCAL_DISK-only keys to MEMORY on read access"
        => promotion_on_hit: bool = boolean;
    promotion_queue_limit: Int = "50000", Full, "Max in-flight promotion tasks"
        => promotion_queue_limit: usize = count;
    quota_bytes: Int = "0", Full, "Quota for storage backend in bytes (0 = use default 90% of capacity)"
        => quota_bytes: usize = count;
    root_fs_dir: Str = "", Full, "Root directory of the shared-filesystem tier (every client mounts it at this path; empty = off)"
        => root_fs_dir: String = text;
    } };
}
