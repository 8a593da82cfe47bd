//! Leader routing for Services: the serving leader's pod carries
//! `mooncake.io/store-role=leader`, so a Service selecting that label
//! reaches the current leader, as the reference's label reconciler does.
//! The label is set with a JSON merge patch and removed with a patch to
//! `null`; a failed patch is retried every retry period until the pod
//! matches what is wanted, and a newer wish replaces an older one.

use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use tokio::sync::watch;

use super::K8sElection;

/// The label a leader's pod carries, and its value.
pub const LEADER_LABEL: &str = "mooncake.io/store-role";
pub const LEADER_VALUE: &str = "leader";

/// The pod a master runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl PodRef {
    /// The pod named by `--pod_name`/`--pod_namespace`, or else by
    /// `$POD_NAME`/`$POD_NAMESPACE` (`env`). None when neither names a
    /// pod; half a name is `INVALID_PARAMS`.
    pub fn resolve(
        name: &str,
        namespace: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<PodRef>> {
        let pick = |flag: &str, var: &str| {
            let flag = flag.trim();
            if flag.is_empty() {
                env(var).map(|v| v.trim().to_string()).unwrap_or_default()
            } else {
                flag.to_string()
            }
        };
        let (name, namespace) = (pick(name, "POD_NAME"), pick(namespace, "POD_NAMESPACE"));
        match (name.is_empty(), namespace.is_empty()) {
            (true, true) => Ok(None),
            (false, false) => Ok(Some(PodRef { namespace, name })),
            _ => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "leader labelling needs both the pod's name and namespace \
                     (--pod_name/$POD_NAME {name:?}, --pod_namespace/$POD_NAMESPACE {namespace:?})"
                ),
            )),
        }
    }
}

/// Keeps a pod's leader label in line with whether this master serves.
/// The background task stops when the handle is dropped.
pub struct LeaderLabel {
    want: watch::Sender<bool>,
    applied: watch::Receiver<Option<bool>>,
}

impl LeaderLabel {
    /// Starts with the label removed: a pod restarted after a crash may
    /// still carry it.
    pub fn spawn(election: K8sElection, pod: PodRef) -> LeaderLabel {
        let (want, want_rx) = watch::channel(false);
        let (applied_tx, applied) = watch::channel(None);
        tokio::spawn(reconcile(election, pod, want_rx, applied_tx));
        LeaderLabel { want, applied }
    }

    /// Labels the pod (`serving`) or removes the label.
    pub fn set(&self, serving: bool) {
        self.want.send_replace(serving);
    }

    /// Removes the label and waits, up to `within`, until the pod no
    /// longer carries it.
    pub async fn clear(mut self, within: Duration) -> Result<()> {
        self.set(false);
        match tokio::time::timeout(within, self.applied.wait_for(|a| *a == Some(false))).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::new(
                ErrorCode::K8S_LEASE_OPERATION_ERROR,
                format!("the leader label could not be removed within {within:?}"),
            )),
        }
    }
}

async fn reconcile(
    election: K8sElection,
    pod: PodRef,
    mut want: watch::Receiver<bool>,
    applied: watch::Sender<Option<bool>>,
) {
    let mut complained = None::<String>;
    loop {
        let wanted = *want.borrow_and_update();
        if *applied.borrow() != Some(wanted) {
            let value = wanted.then_some(LEADER_VALUE);
            match election
                .label_pod(&pod.namespace, &pod.name, LEADER_LABEL, value)
                .await
            {
                Ok(()) => {
                    complained = None;
                    tracing::info!(pod = %pod.name, namespace = %pod.namespace, leader = wanted, "pod leader label updated");
                    applied.send_replace(Some(wanted));
                }
                Err(e) => {
                    if complained.as_deref() != Some(e.context.as_str()) {
                        tracing::warn!(pod = %pod.name, "pod leader label: {e}; retrying");
                        complained = Some(e.context.clone());
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(election.timings().retry) => continue,
                        changed = want.changed() => if changed.is_err() { return } else { continue },
                    }
                }
            }
        }
        if want.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn pod_from_flags_or_environment() {
        assert_eq!(PodRef::resolve("", "", env(&[])).unwrap(), None);
        let pod = |ns: &str, n: &str| {
            Some(PodRef {
                namespace: ns.into(),
                name: n.into(),
            })
        };
        assert_eq!(
            PodRef::resolve("m-0", "mc", env(&[])).unwrap(),
            pod("mc", "m-0")
        );
        let vars = [("POD_NAME", "m-1"), ("POD_NAMESPACE", "prod")];
        assert_eq!(
            PodRef::resolve("", "", env(&vars)).unwrap(),
            pod("prod", "m-1")
        );
        // Flags win over the environment.
        assert_eq!(
            PodRef::resolve("m-2", "", env(&vars)).unwrap(),
            pod("prod", "m-2")
        );
        for (name, ns, vars) in [
            ("m-0", "", &[][..]),
            ("", "mc", &[][..]),
            ("", "", &[("POD_NAME", "m-1")][..]),
        ] {
            let e = PodRef::resolve(name, ns, env(vars)).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
            assert!(e.context.contains("--pod_namespace"), "{e}");
        }
    }
}
