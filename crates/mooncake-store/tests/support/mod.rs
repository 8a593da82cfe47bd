//! What the election tests of every backend share.

use std::time::Duration;

use mooncake_store::ha::LeaderElection;
use test_support::FreezeProxy;

/// The partition scenario, the same for every election backend: `a`,
/// connected only through `proxy`, leads; the proxy freezes, so A's renewals
/// hang rather than fail and its lease expires at the service; `b` wins
/// (within `guard`). By then A must already have stopped believing it leads.
pub async fn partitioned_leader_gives_up(
    a: &dyn LeaderElection,
    b: &dyn LeaderElection,
    proxy: &FreezeProxy,
    guard: Duration,
) {
    let la = a.campaign("10.0.0.1:50051").await.unwrap();
    proxy.freeze();
    let lb = tokio::time::timeout(guard, b.campaign("10.0.0.2:50051"))
        .await
        .expect("b never won")
        .unwrap();
    assert!(!la.is_held(), "two leaders: A still leads while B won");
    lb.resign().await.unwrap();
}
