//! Restores masters from snapshot files: the header, the checksum, and
//! the state the payload holds (segments, clients, tasks, retired space,
//! SSD tiers, objects), checked for consistency as it is rebuilt.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::within_budget;
use mooncake_store::master::durable::snapshot::format::{decode_into, encode, read_meta};
use mooncake_store::master::durable::snapshot::RestoreProgress;
use mooncake_store::master::{MasterConfig, MasterService};

fuzz_target!(|data: &[u8]| {
    let meta = read_meta(data);
    // Every object, segment and task costs the master a few hundred
    // bytes of tables for tens of bytes of snapshot.
    let restored = within_budget(data.len(), 4096, || {
        let s = MasterService::new(&MasterConfig::default());
        decode_into(data, &s, &RestoreProgress::default()).map(|m| (s, m))
    });
    let Ok((first, decoded)) = restored else {
        return;
    };
    assert_eq!(meta.ok(), Some(decoded));
    // What was restored is a state the master can snapshot and restore
    // again, to the same totals.
    let again = encode(&first, decoded);
    let second = MasterService::new(&MasterConfig::default());
    let meta = decode_into(&again, &second, &RestoreProgress::default())
        .expect("a re-encoded snapshot restores");
    assert_eq!(meta, decoded);
    assert_eq!(second.stats(meta.now), first.stats(meta.now));
});
