//! Copy/move task flags: how many tasks are kept and when they time out,
//! and the hot-key fan-out that queues copy tasks of its own.

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! tasks_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    dynamic_replication_admission_qps_threshold: Float = "0.8", Full, "Per-key access frequency threshold for dynamic MEMORY replication"
        => dynamic_replication_admission_qps_threshold: f64 = positive_float;
    dynamic_replication_heat_window_seconds: Int = "10", Full, "Heat observation window for dynamic MEMORY replication (0 counts as 1)"
        => dynamic_replication_heat_window_seconds: u64 = u32_seconds;
    dynamic_replication_max_memory_replicas: Int = "2", Full, "Maximum MEMORY replicas allowed for one dynamically replicated key (0 counts as 1)"
        => dynamic_replication_max_memory_replicas: usize = count;
    dynamic_replication_mode: Str = "off", Full, "Dynamic MEMORY replica fanout mode: off, observe, or enforce"
        => dynamic_replication_mode: HotKeyMode = hot_key_mode;
    max_retry_attempts: Int = "10", NotImplemented, "Maximum number of retry attempts for failed tasks";
    max_total_finished_tasks: Int = "10000", Full, "Maximum number of finished tasks to keep in memory"
        => max_total_finished_tasks: usize = count;
    max_total_pending_tasks: Int = "10000", Full, "Maximum number of pending tasks to keep in memory"
        => max_total_pending_tasks: usize = count;
    max_total_processing_tasks: Int = "10000", Full, "Maximum number of processing tasks to keep in memory"
        => max_total_processing_tasks: usize = count;
    pending_task_timeout_sec: Int = "300", Full, "Timeout in seconds for pending tasks (0 = no timeout)"
        => pending_task_timeout: Option<Duration> = seconds_or_never;
    processing_task_timeout_sec: Int = "300", Full, "Timeout in seconds for processing tasks (0 = no timeout)"
        => processing_task_timeout: Option<Duration> = seconds_or_never;
    } };
}
