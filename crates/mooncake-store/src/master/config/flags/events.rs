//! The KV-event publisher's flags (`crate::master::events`).

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! events_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    enable_kv_events: Bool = "false", Full, "Enable RFC #1527 KV cache event publisher over ZMQ"
        => enable_kv_events: bool = boolean;
    kv_events_backend_id: Str = "", Full, "backend_id for published KV events (cache owner identity)"
        => kv_events_backend_id: String = text;
    kv_events_bind_endpoint: Str = "", Full, "ZMQ PUB bind endpoint for KV events, e.g. tcp://0.0.0.0:5557"
        => kv_events_bind_endpoint: String = text;
    kv_events_emit_legacy_compat: Bool = "true", Full, "Include vLLM/SGLang-compatible type/block_hashes fields"
        => kv_events_emit_legacy_compat: bool = boolean;
    kv_events_emit_object_key: Bool = "true", Full, "Include Mooncake object_key in published KV events"
        => kv_events_emit_object_key: bool = boolean;
    kv_events_queue_capacity: Int = "65536", Full, "Maximum pending KV events; oldest events are dropped when the queue is full (0 = unbounded)"
        => kv_events_queue_capacity: usize = count;
    kv_events_replay_endpoint: Str = "", Full, "ZMQ ROUTER bind endpoint answering requests for missed batches (vLLM's replay protocol), e.g. tcp://0.0.0.0:5558; empty: none"
        => kv_events_replay_endpoint: String = text;
    kv_events_replay_buffer: Int = "10000", Full, "Sent batches the replay endpoint keeps"
        => kv_events_replay_buffer: usize = count;
    } };
}
