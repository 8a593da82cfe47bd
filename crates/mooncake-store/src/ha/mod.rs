//! High availability: which master leads. Masters of one cluster campaign
//! for leadership through a coordination service; at most one holds it at a
//! time, through a lease it must keep renewing. Clients and standbys follow
//! the leader's value (its RPC address).
//!
//! [`LeaderElection`] is the seam; [`etcd`] and [`redis`] implement it. A
//! won election is a [`Leadership`] handle, the same for every backend: its
//! holder task (spawned by the backend) renews the lease, flags loss, and
//! gives the lease up on [`Leadership::resign`] or when the handle is
//! dropped.

pub mod etcd;
pub mod redis;

use std::future::Future;
use std::pin::Pin;

use mooncake_common::Result;
use tokio::sync::{oneshot, watch};

/// A boxed future, so [`LeaderElection`] stays object-safe (the backend is
/// picked at run time by `--ha_backend_type`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Leader election for the masters of one cluster.
pub trait LeaderElection: Send + Sync + 'static {
    /// Waits until `candidate` (the caller's RPC address) leads. While it
    /// waits its candidacy is kept alive; dropping the future withdraws it.
    fn campaign<'a>(&'a self, candidate: &'a str) -> BoxFuture<'a, Result<Leadership>>;

    /// The current leader's value, if there is a leader.
    fn leader(&self) -> BoxFuture<'_, Result<Option<String>>>;

    /// Follows the leader: the receiver holds the current leader (`None`
    /// between leaders) and is updated on every change, until dropped.
    fn observe(&self) -> BoxFuture<'_, Result<watch::Receiver<Option<String>>>>;
}

/// Asks the holder task to give leadership up; it answers once done.
pub type ResignRequest = oneshot::Sender<Result<()>>;

/// Leadership won by [`LeaderElection::campaign`].
///
/// Dropping it gives leadership up too (without waiting); use
/// [`resign`](Self::resign) to wait until others can take over.
pub struct Leadership {
    candidate: String,
    lost: watch::Receiver<bool>,
    resign: Option<oneshot::Sender<ResignRequest>>,
}

impl Leadership {
    /// For backends: a handle over the holder task's channels. The task sets
    /// `lost` to true when leadership ends, and gives it up when `resign`
    /// fires or is dropped.
    pub fn new(
        candidate: String,
        lost: watch::Receiver<bool>,
        resign: oneshot::Sender<ResignRequest>,
    ) -> Leadership {
        Leadership {
            candidate,
            lost,
            resign: Some(resign),
        }
    }

    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// Whether leadership is still held, as far as this process knows.
    pub fn is_held(&self) -> bool {
        !*self.lost.borrow() && self.lost.has_changed().is_ok()
    }

    /// Resolves once leadership is lost (lease expired, key deleted, or the
    /// coordination service unreachable for too long). A leader that sees
    /// this must stop acting as leader at once.
    pub async fn lost(&mut self) {
        // An error means the holder task is gone, which also ends leadership.
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    /// Gives leadership up and waits until the coordination service has
    /// released it, so another candidate can win right away.
    pub async fn resign(mut self) -> Result<()> {
        let Some(resign) = self.resign.take() else {
            return Ok(());
        };
        let (done_tx, done_rx) = oneshot::channel();
        if resign.send(done_tx).is_err() {
            return Ok(()); // holder already gone: nothing left to give up
        }
        done_rx.await.unwrap_or(Ok(()))
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("candidate", &self.candidate)
            .field("held", &self.is_held())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resign_asks_the_holder_and_waits() {
        let (lost_tx, lost_rx) = watch::channel(false);
        let (resign_tx, resign_rx) = oneshot::channel::<ResignRequest>();
        let l = Leadership::new("a:1".into(), lost_rx, resign_tx);
        assert!(l.is_held());
        assert_eq!(l.candidate(), "a:1");
        let holder = tokio::spawn(async move {
            let done = resign_rx.await.unwrap();
            lost_tx.send_replace(true);
            done.send(Ok(())).unwrap();
        });
        l.resign().await.unwrap();
        holder.await.unwrap();
    }

    #[tokio::test]
    async fn dropping_the_handle_releases_the_holder() {
        let (resign_tx, resign_rx) = oneshot::channel::<ResignRequest>();
        drop(Leadership::new(
            "a".into(),
            watch::channel(false).1,
            resign_tx,
        ));
        assert!(resign_rx.await.is_err());
    }

    #[tokio::test]
    async fn lost_resolves_when_holder_flags_or_vanishes() {
        let (lost_tx, lost_rx) = watch::channel(false);
        let mut l = Leadership::new("a".into(), lost_rx, oneshot::channel().0);
        lost_tx.send_replace(true);
        l.lost().await;
        assert!(!l.is_held());

        let (lost_tx, lost_rx) = watch::channel(false);
        let mut l = Leadership::new("a".into(), lost_rx, oneshot::channel().0);
        drop(lost_tx);
        l.lost().await;
        assert!(!l.is_held());
        // Resigning after the holder is gone is not an error.
        l.resign().await.unwrap();
    }
}
