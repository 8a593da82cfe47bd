//! A Kubernetes API server's Lease answers, as the k8s election backend
//! reads them: the object's JSON, the election record in its spec, the
//! MicroTime strings in it, and the decisions taken on that record.
#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::within_budget;
use mooncake_store::ha::k8s::record::{
    decide, holder_at, micro_time, parse_micro_time, still_ours, LeaseRecord, Step,
};
use serde_json::Value;
use tokio::time::Instant;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        check_time(s);
    }
    // serde_json values: up to ~100 bytes of heap per byte (B-tree nodes).
    let Ok(object) = within_budget(data.len(), 256, || serde_json::from_slice::<Value>(data))
    else {
        return;
    };
    let record = LeaseRecord::from_spec(object.get("spec"));
    assert_eq!(LeaseRecord::from_spec(Some(&record.to_spec())), record);
    for t in [&record.acquire_time, &record.renew_time].into_iter().flatten() {
        check_time(t);
    }
    let wall = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for at in [UNIX_EPOCH, wall, wall + Duration::from_secs(1 << 40)] {
        if let Some(h) = holder_at(&record, at) {
            assert_eq!(h, record.holder);
        }
    }
    let _ = still_ours("me", record.transitions, &record);
    // A candidate reading this record now, and again much later.
    let now = Instant::now();
    let mut observed = None;
    for later in [Duration::ZERO, Duration::from_secs(1 << 20)] {
        match decide("me", &record, &mut observed, now + later, wall, 5) {
            Step::Wait { holder } => assert_eq!(holder, record.holder),
            Step::Take(next) => {
                assert_eq!(next.holder, "me");
                assert!(next.transitions > record.transitions);
            }
        }
    }
});

/// A time that parses prints in the canonical form, which parses back to
/// the same time (to the microsecond it keeps).
fn check_time(s: &str) {
    let Some(t) = parse_micro_time(s) else {
        return;
    };
    let printed = micro_time(t);
    let back = parse_micro_time(&printed).expect("a printed MicroTime parses");
    let micros = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_micros();
    assert_eq!(micros(back), micros(t), "{s:?} printed as {printed:?}");
}
