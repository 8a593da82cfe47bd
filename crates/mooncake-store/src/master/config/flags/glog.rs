//! The reference's glog flags: accepted, no effect (logging is `--log_level`/`RUST_LOG`).

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! glog_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    alsologtoemail: Str = "", Ignored, "log messages go to these email addresses in addition to logfiles";
    alsologtostderr: Bool = "false", Ignored, "log messages go to stderr in addition to logfiles";
    colorlogtostderr: Bool = "false", Ignored, "color messages logged to stderr (if supported by terminal)";
    drop_log_memory: Bool = "true", Ignored, "Drop in-memory buffers of log contents. Logs can grow very quickly...";
    log_backtrace_at: Str = "", Ignored, "Emit a backtrace when logging at file:linenum.";
    log_dir: Str = "", Ignored, "If specified, logfiles are written into this directory instead of t...";
    log_link: Str = "", Ignored, "Put additional links to the log files in this directory";
    log_prefix: Bool = "true", Ignored, "Prepend the log prefix to the start of each log line";
    logbuflevel: Int = "0", Ignored, "Buffer log messages logged at this level or lower (-1 means don't b...";
    logbufsecs: Int = "30", Ignored, "Buffer log messages for at most this many seconds";
    logemaillevel: Int = "999", Ignored, "Email log messages logged at this level or higher (0 means email al...";
    logfile_mode: Int = "436", Ignored, "Log file mode/permissions.";
    logmailer: Str = "/bin/mail", Ignored, "Mailer used to send logging email";
    logtostderr: Bool = "false", Ignored, "log messages go to stderr instead of logfiles";
    max_log_size: Int = "1800", Ignored, "approx. maximum log file size (in MB). A value of 0 will be silentl...";
    minloglevel: Int = "0", Ignored, "Messages logged at a lower level than this don't actually get logge...";
    stderrthreshold: Int = "2", Ignored, "log messages at or above this level are copied to stderr in additio...";
    stop_logging_if_full_disk: Bool = "false", Ignored, "Stop attempting to log to disk if the disk is full.";
    symbolize_stacktrace: Bool = "true", Ignored, "Symbolize the stack trace in the tombstone";
    v: Int = "0", Ignored, "Show all VLOG(m) messages for m <= this. Overridable by --vmodule.";
    vmodule: Str = "", Ignored, "per-module verbose level. Argument is a comma-separated list of <mo...";
    } };
}
