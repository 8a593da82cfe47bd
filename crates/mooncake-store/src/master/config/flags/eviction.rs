//! Space reclamation flags: read leases, soft pins, eviction, and the
//! timeouts after which an unfinished put is discarded and its space reused.

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! eviction_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    default_kv_lease_ttl: Duration = "10000", Full, "Read lease granted on every read, ms (or 5s, 1m)"
        => default_kv_lease_ttl: Duration = millis;
    default_kv_soft_pin_ttl: Duration = "1800000", Full, "Soft pin lifetime after the last access, ms"
        => default_kv_soft_pin_ttl: Duration = millis;
    allow_evict_soft_pinned_objects: Bool = "true", Full, "Evict soft-pinned objects when nothing else is left"
        => allow_evict_soft_pinned_objects: bool = boolean;
    eviction_ratio: Float = "0.05", Full, "Share of capacity freed by one eviction round"
        => eviction_ratio: f64 = ratio;
    eviction_policy: Str = "frequency", Full, "Victim order (ours): lru (oldest lease first) or frequency (reads since the put count as later use)"
        => eviction_policy: EvictionPolicy = eviction_policy;
    eviction_high_watermark_ratio: Float = "0.9", Full, "Usage ratio that starts eviction"
        => eviction_high_watermark_ratio: f64 = ratio;
    put_start_discard_timeout_sec: Duration = "30", Full, "Seconds after which an unfinished put is discarded"
        => put_start_discard_timeout: Duration = seconds;
    put_start_release_timeout_sec: Duration = "600", Full, "Seconds after PutStart before a discarded put's space is reused"
        => put_start_release_timeout: Duration = seconds;
    max_kv_soft_pin_ttl: Str = "86400000", NotImplemented, "Maximum request-level soft pin TTL for kv objects. Supports raw mil...";
    } };
}
