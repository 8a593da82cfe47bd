//! Copy/move task flags: how many tasks are kept and when they time out.

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! tasks_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
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
