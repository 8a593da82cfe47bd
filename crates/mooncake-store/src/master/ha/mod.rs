//! HA mode (`--enable_ha`): masters of one cluster campaign through the
//! coordination service ([`crate::ha`]); the winner binds its ports and
//! serves, the others wait as standbys. A leader that loses its lease (it
//! stopped renewing, or the coordination service is out of reach) stops
//! serving at once and campaigns again, so two masters never serve one
//! cluster together.
//!
//! Without `--enable_oplog` a new leader starts with empty metadata, as the
//! reference's does without snapshots: clients find it through the
//! coordination service, see their heartbeat answered with
//! `CLIENT_NOT_FOUND` and mount their segments again.
//!
//! With `--enable_oplog` the metadata is replicated (`super::replication`,
//! and `failover` for the standby's life): every master serves its admin
//! HTTP from the start, follows the leader as a hot standby, and on
//! promotion serves the state it followed.

pub(in crate::master) mod compaction;
pub(in crate::master) mod failover;
pub mod follower;
pub(in crate::master) mod recovery;
mod takeover;

use std::future::Future;
use std::pin::pin;

use mooncake_common::Result;

use self::failover::CAMPAIGN_RETRY;
use super::{MasterConfig, MasterServer};
use crate::ha::LEASE_TTL;

/// The address published for clients: `--rpc_address` unless it is a
/// wildcard, else this host's name; with the RPC port.
pub(crate) fn advertised_address(config: &MasterConfig) -> String {
    let host = match config.rpc_address.as_str() {
        "" | "0.0.0.0" | "::" | "[::]" => gethostname::gethostname().to_string_lossy().into_owned(),
        h => h.to_string(),
    };
    format!("{host}:{}", config.rpc_listen_port())
}

/// Campaigns, serves while leading, campaigns again after a loss (and
/// after a failed campaign, once the coordination service answers), until
/// `shutdown` resolves. `on_bound` sees each term's freshly bound server.
pub async fn serve_ha<F, B>(config: MasterConfig, shutdown: F, mut on_bound: B) -> Result<()>
where
    F: Future<Output = ()>,
    B: FnMut(&MasterServer),
{
    config.validate()?;
    let backend = config.ha_backend()?;
    let me = advertised_address(&config);
    let mut shutdown = pin!(shutdown);
    let label = super::config::leader_label::spawn(&config)?;
    let election = tokio::select! {
        e = backend.connect(&config.cluster_id, LEASE_TTL) => e?,
        _ = &mut shutdown => return Ok(()),
    };
    if config.enable_oplog {
        return self::failover::serve_replicated(config, election, me, shutdown, on_bound).await;
    }
    tracing::info!(candidate = %me, cluster = %config.cluster_id, "standby: campaigning for leadership");
    loop {
        let campaign = tokio::select! {
            l = election.campaign(&me) => l,
            _ = &mut shutdown => return Ok(()),
        };
        let mut leadership = match campaign {
            Ok(l) => l,
            Err(e) => {
                // The coordination service is out of reach (restarting,
                // partitioned): a standby waits it out rather than exit.
                tracing::warn!("campaign failed: {e}; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(CAMPAIGN_RETRY) => continue,
                    _ = &mut shutdown => return Ok(()),
                }
            }
        };
        tracing::info!(leader = %me, "elected leader: serving");
        let server = match MasterServer::bind(config.clone()).await {
            Ok(s) => s,
            Err(e) => {
                let _ = leadership.resign().await;
                return Err(e);
            }
        };
        server.lead(leadership.term(), leadership.held_until());
        on_bound(&server);
        if let Some(l) = &label {
            l.set(true);
        }
        let mut lost = false;
        server
            .serve(async {
                tokio::select! {
                    _ = leadership.lost() => lost = true,
                    _ = &mut shutdown => {}
                }
            })
            .await?;
        if let Some(l) = &label {
            l.set(false);
        }
        if !lost {
            // Hand over at once rather than after the lease runs out. If the
            // coordination service cannot be told, the lease still runs
            // out: the shutdown itself went well.
            if let Err(e) = leadership.resign().await {
                tracing::warn!(
                    "could not resign ({e}); a standby takes over once the lease expires"
                );
            }
            if let Some(l) = label {
                if let Err(e) = l.clear(CAMPAIGN_RETRY * 2).await {
                    tracing::warn!("{e}");
                }
            }
            return Ok(());
        }
        tracing::warn!("leadership lost: stopped serving; campaigning again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_common::ErrorCode;

    #[test]
    fn advertises_a_reachable_host() {
        let mut c = MasterConfig::default();
        c.set("rpc_port", "50051").unwrap();
        assert!(!advertised_address(&c).starts_with("0.0.0.0"));
        assert!(advertised_address(&c).ends_with(":50051"));
        c.set("rpc_address", "10.1.2.3").unwrap();
        assert_eq!(advertised_address(&c), "10.1.2.3:50051");
    }

    #[test]
    fn ha_settings_are_checked() {
        let mut c = MasterConfig::default();
        c.validate().unwrap();
        c.set("enable_ha", "true").unwrap();
        assert_eq!(c.validate().unwrap_err().code, ErrorCode::INVALID_PARAMS);
        c.set("etcd_endpoints", "127.0.0.1:2379").unwrap();
        c.set("rpc_port", "0").unwrap();
        c.set("port", "0").unwrap();
        assert_eq!(c.validate().unwrap_err().code, ErrorCode::INVALID_PARAMS);
        c.set("rpc_port", "50051").unwrap();
        c.validate().unwrap();
        c.set("etcd_endpoints", "redis://a:1;redis://b:1").unwrap();
        assert_eq!(c.validate().unwrap_err().code, ErrorCode::INVALID_PARAMS);
        assert_eq!(
            c.set("ha_backend_type", "zookeeper").unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        // k8s: the Lease from --ha_backend_connstring only.
        c.set("etcd_endpoints", "127.0.0.1:2379").unwrap();
        c.set("ha_backend_type", "k8s").unwrap();
        let e = c.validate().unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        assert!(e.context.contains("--ha_backend_connstring"), "{e}");
        for bad in ["a/b/c", "/lease", "ns/", "Upper/l"] {
            c.set("ha_backend_connstring", bad).unwrap();
            let e = c.validate().unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{bad}");
            assert!(e.context.contains("<namespace>/<lease>"), "{e}");
        }
        c.set("ha_backend_connstring", "mooncake/store").unwrap();
        c.validate().unwrap();
        c.set("ha_backend_connstring", "store").unwrap();
        c.validate().unwrap();
        // client-go's rules on the timings.
        c.set("k8s_renew_deadline_sec", "5").unwrap();
        assert_eq!(c.validate().unwrap_err().code, ErrorCode::INVALID_PARAMS);
        c.set("k8s_renew_deadline_sec", "1500ms").unwrap();
        c.set("k8s_retry_period_sec", "500ms").unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.set("k8s_lease_duration_sec", "2500ms").unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        // Half a pod name.
        c.set("pod_name", "master-0").unwrap();
        c.set("pod_namespace", "").unwrap();
        if std::env::var_os("POD_NAMESPACE").is_none() {
            assert_eq!(c.validate().unwrap_err().code, ErrorCode::INVALID_PARAMS);
        }
        c.set("pod_namespace", "mooncake").unwrap();
        c.validate().unwrap();
    }
}
