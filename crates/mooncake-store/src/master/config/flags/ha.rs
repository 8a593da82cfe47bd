//! High-availability flags: leader election backends (etcd, redis, k8s),
//! the replicated oplog, and the local write-ahead log.

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! ha_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    batch_oplog_retry_timeout_sec: Int = "180", NotImplemented, "Maximum time to retry transient batch OpLog standby errors.";
    enable_ha: Bool = "false", Full, "Campaign for leadership through the HA backend; serve only while leading"
        => enable_ha: bool = boolean;
    enable_oplog: Bool = "false", Full, "Log every metadata change: replicated with --enable_ha, else a local write-ahead log in --wal_dir (fdatasync before each acknowledgement)"
        => enable_oplog: bool = boolean;
    etcd_endpoints: Str = "", Full, "HA backend endpoints, separated by semicolon (etcd, or redis://host:port)"
        => etcd_endpoints: String = text;
    ha_allow_takeover_without_record: Bool = "false", Full, "Replicated HA: a master that finds no replication record (or a term not above one it followed: the coordination service lost its state) takes over anyway, losing what only the other masters held; off: it steps aside until an operator decides"
        => ha_allow_takeover_without_record: bool = boolean;
    ha_backend_connstring: Str = "", Full, "HA backend connection string; if unset, --etcd_endpoints is used"
        => ha_backend_connstring: String = text;
    ha_backend_type: Str = "etcd", Full, "HA backend type: etcd, redis or k8s"
        => ha_backend_type: String = ha_backend_type;
    ha_min_in_sync: Int = "1", Full, "Replicated HA: members (the leader included) of the recorded in-sync set needed for a write to be acknowledged; below it writes wait (and fail after the commit wait). 1: the leader alone may acknowledge"
        => ha_min_in_sync: usize = positive_count;
    ha_wal_sync_ack: Bool = "false", Full, "Replicated HA with a log directory: the leader answers a write only once its log entry is fdatasynced (survives the loss of every machine; costs the sync's latency)"
        => ha_wal_sync_ack: bool = boolean;
    k8s_lease_duration_sec: Duration = "5", Full, "k8s HA: seconds a standby waits after the last renewal it saw before taking the Lease"
        => k8s_lease_duration: Duration = whole_seconds;
    k8s_renew_deadline_sec: Duration = "3", Full, "k8s HA: the leader stops serving once no renewal got through for this long (s, or 2500ms)"
        => k8s_renew_deadline: Duration = seconds;
    k8s_retry_period_sec: Duration = "1", Full, "k8s HA: how often the leader renews and standbys retry (s, or 500ms)"
        => k8s_retry_period: Duration = seconds;
    oplog_batch_max_entries: Int = "1024", Full, "Most log entries sent to a standby in one batch"
        => oplog_batch_max_entries: usize = count;
    oplog_poll_interval_ms: Int = "1000", Full, "Longest an idle standby waits before asking its leader again"
        => oplog_poll_interval: Duration = millis;
    pod_name: Str = "", Full, "Pod name for K8s label-based routing (default: $POD_NAME)"
        => pod_name: String = text;
    pod_namespace: Str = "", Full, "Pod namespace for K8s label-based routing (default: $POD_NAMESPACE)"
        => pod_namespace: String = text;
    put_fence: Bool = "true", Full, "A master that logs (--enable_oplog) places puts in reserved space and answers one once its reservation is logged, before its own entry; false: every PutStart waits for its own entry (also MC_PUT_FENCE=0)"
        => put_fence: bool = boolean;
    wal_dir: Str = "", Full, "Directory of the local write-ahead log (default: $MOONCAKE_SNAPSHOT_LOCAL_PATH/mooncake_master_wal/<cluster_id>, and /<rpc_address>_<rpc_port> under it in HA mode; one per master)"
        => wal_dir: String = text;
    } };
}
