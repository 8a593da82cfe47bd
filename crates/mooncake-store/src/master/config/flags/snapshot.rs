//! Snapshot flags: periodic snapshots of the metadata, where they go, restore.

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! snapshot_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    enable_snapshot: Bool = "false", Full, "Enable periodic snapshot of master data"
        => enable_snapshot: bool = boolean;
    enable_snapshot_restore: Bool = "false", Full, "enable restore from snapshot"
        => enable_snapshot_restore: bool = boolean;
    snapshot_backup_dir: Str = "", Full, "Optional local directory for snapshot and restore backup. If empty, local backup is disabled"
        => snapshot_backup_dir: String = text;
    snapshot_catalog_backend_connstring: Str = "", NotImplemented, "Deprecated alias of --snapshot_catalog_store_connstring";
    snapshot_catalog_backend_type: Str = "", NotImplemented, "Deprecated alias of --snapshot_catalog_store_type";
    snapshot_catalog_store_connstring: Str = "", NotImplemented, "Optional connection string for snapshot catalog store";
    snapshot_catalog_store_type: Str = "", NotImplemented, "Snapshot catalog store type: ''/'embedded' or 'redis' ('payload' is...";
    snapshot_child_timeout_seconds: Int = "300", NotImplemented, "Timeout for snapshot child process in seconds";
    snapshot_interval_seconds: Duration = "600", Full, "Interval in second between periodic snapshots of master data"
        => snapshot_interval: Duration = positive_seconds;
    snapshot_object_store_type: Str = "", Full, "Snapshot object store type: 'local' for local filesystem (MOONCAKE_SNAPSHOT_LOCAL_PATH), 's3' for S3 storage (MOONCAKE_AWS_*)"
        => snapshot_object_store_type: String = snapshot_store;
    snapshot_payload_backend_type: Str = "", Full, "Deprecated alias of --snapshot_object_store_type"
        => snapshot_payload_backend_type: String = snapshot_store;
    snapshot_payload_store_type: Str = "", Full, "Deprecated alias of --snapshot_object_store_type"
        => snapshot_payload_store_type: String = snapshot_store;
    snapshot_retention_count: Int = "2", Full, "Number of recent snapshots to keep (older snapshots will be automatically deleted)"
        => snapshot_retention_count: usize = positive_count;
    snapshot_backend_type: Str = "", Full, "Snapshot backend: local or s3 (older spelling of --snapshot_object_store_type)"
        => snapshot_backend_type: String = snapshot_store;
    } };
}
