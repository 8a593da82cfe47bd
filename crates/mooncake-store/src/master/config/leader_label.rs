//! The k8s backend's leader label for this master's pod
//! ([`crate::ha::k8s::label`]): set while it serves, removed when it stops
//! and at every start, when the pod is named (`--pod_name`/`$POD_NAME`,
//! `--pod_namespace`/`$POD_NAMESPACE`).

use mooncake_common::Result;

use super::MasterConfig;
use crate::ha::k8s::label::{LeaderLabel, PodRef};
use crate::ha::k8s::K8sElection;
use crate::ha::ElectionBackend;

/// The pod to label, if the k8s backend is used and a pod is named.
pub(crate) fn pod(config: &MasterConfig) -> Result<Option<PodRef>> {
    if !matches!(config.ha_backend()?, ElectionBackend::K8s(..)) {
        return Ok(None);
    }
    PodRef::resolve(&config.pod_name, &config.pod_namespace, |k| {
        std::env::var(k).ok()
    })
}

/// Starts the label's reconciler (on the current runtime); None when
/// there is no pod to label.
pub(crate) fn spawn(config: &MasterConfig) -> Result<Option<LeaderLabel>> {
    let backend = config.ha_backend()?;
    let ElectionBackend::K8s(lease, timings) = backend else {
        if !config.pod_name.is_empty() || !config.pod_namespace.is_empty() {
            tracing::warn!("--pod_name/--pod_namespace label pods of the k8s HA backend only");
        }
        return Ok(None);
    };
    let Some(pod) = pod(config)? else {
        return Ok(None);
    };
    tracing::info!(pod = %pod.name, namespace = %pod.namespace, "labelling this pod while it leads");
    let election = K8sElection::connect(lease, timings)?;
    Ok(Some(LeaderLabel::spawn(election, pod)))
}
