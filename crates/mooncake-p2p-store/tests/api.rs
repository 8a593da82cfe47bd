//! The store's operations in one process against a real etcd: three stores
//! (a publisher, two consumers), their records, and every error the
//! reference defines.

use std::time::{SystemTime, UNIX_EPOCH};

use mooncake_p2p_store::{Catalog, EtcdCatalog, P2PStore, P2pError};
use test_support::services;

const MB: u64 = 1 << 20;

fn store(etcd: &str) -> P2PStore {
    let name = format!("127.0.0.1:{}", services::free_port());
    P2PStore::new(etcd, &name).unwrap()
}

/// A name no other run uses (the etcd may be shared).
fn unique(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test-{}-{nanos}/{what}", std::process::id())
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn bufs(v: &mut [Vec<u8>]) -> Vec<(u64, u64)> {
    v.iter_mut()
        .map(|b| (b.as_mut_ptr() as u64, b.len() as u64))
        .collect()
}

#[test]
fn publish_replicate_and_withdraw() {
    let etcd = services::etcd();
    let (a, b, c) = (store(&etcd.addr), store(&etcd.addr), store(&etcd.addr));
    let catalog = EtcdCatalog::connect(&etcd.addr).unwrap();
    let name = unique("ckpt");
    let prefix = name.rsplit_once('/').unwrap().0.to_string();

    let mut src = vec![pattern(3 * MB + 5, 1), pattern(MB, 2)];
    let src_bufs = bufs(&mut src);
    a.register(&name, &src_bufs, MB, "cpu:0", false).unwrap();

    let listed = a.list(&prefix).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, name);
    assert_eq!(listed[0].total_size, 4 * MB + 5);
    assert_eq!(listed[0].size_list, vec![3 * MB + 5, MB]);
    assert_eq!(listed[0].max_shard_size, MB);

    // The name is taken: here, and in the catalog for everyone else.
    assert_eq!(
        a.register(&name, &src_bufs, MB, "cpu:0", false)
            .unwrap_err(),
        P2pError::PayloadOpened
    );
    let mut other = vec![vec![0u8; MB as usize]];
    let e = b
        .register(&name, &bufs(&mut other), MB, "cpu:0", false)
        .unwrap_err();
    assert!(matches!(e, P2pError::AlreadyExists(_)), "{e}");

    // B reads everything from the publisher and becomes a holder of each shard.
    let mut at_b = vec![vec![0u8; (3 * MB + 5) as usize], vec![0u8; MB as usize]];
    let report = b.get_replica(&name, &bufs(&mut at_b)).unwrap();
    assert_eq!(at_b, src);
    assert_eq!(
        report.bytes_from.get(a.local_server_name()),
        Some(&(4 * MB + 5))
    );
    assert_eq!(report.bytes_from.len(), 1);
    let (record, _) = catalog.get(&name).unwrap().unwrap();
    assert_eq!(record.shards.len(), 5);
    for shard in &record.shards {
        assert_eq!(shard.gold.len(), 1);
        assert_eq!(shard.replica_list.len(), 1);
        assert_eq!(shard.replica_list[0].segment_name, b.local_server_name());
    }
    assert_eq!(
        b.get_replica(&name, &bufs(&mut at_b)).unwrap_err(),
        P2pError::PayloadOpened
    );

    // C prefers the consumer's copy: the publisher sends nothing more.
    let mut at_c = vec![vec![0u8; (3 * MB + 5) as usize], vec![0u8; MB as usize]];
    let report = c.get_replica(&name, &bufs(&mut at_c)).unwrap();
    assert_eq!(at_c, src);
    assert_eq!(
        report.bytes_from.get(b.local_server_name()),
        Some(&(4 * MB + 5))
    );
    assert_eq!(report.bytes_from.get(a.local_server_name()), None);

    // The publisher leaves; the consumers still serve it.
    a.unregister(&name).unwrap();
    assert_eq!(a.unregister(&name).unwrap_err(), P2pError::PayloadNotOpened);
    let (record, _) = catalog.get(&name).unwrap().unwrap();
    assert!(record
        .shards
        .iter()
        .all(|s| s.gold.is_empty() && s.replica_list.len() == 2));
    let d = store(&etcd.addr);
    let mut at_d = vec![vec![0u8; (3 * MB + 5) as usize], vec![0u8; MB as usize]];
    d.get_replica(&name, &bufs(&mut at_d)).unwrap();
    assert_eq!(at_d, src);

    // The last holder's withdrawal deletes the record.
    for s in [&b, &c, &d] {
        s.delete_replica(&name).unwrap();
    }
    assert!(catalog.get(&name).unwrap().is_none());
    assert!(a.list(&prefix).unwrap().is_empty());
    assert_eq!(
        b.delete_replica(&name).unwrap_err(),
        P2pError::PayloadNotOpened
    );
}

#[test]
fn bad_calls_get_the_reference_errors() {
    let etcd = services::etcd();
    let (a, b) = (store(&etcd.addr), store(&etcd.addr));
    let name = unique("errors");
    let mut src = vec![pattern(4 * MB, 3)];
    let src_bufs = bufs(&mut src);

    let invalid = |r: Result<(), P2pError>| {
        let e = r.unwrap_err();
        assert!(matches!(e, P2pError::InvalidArgument(_)), "{e}");
        assert_eq!(e.code().code(), -1);
    };
    invalid(a.register(&name, &[], MB, "cpu:0", false));
    invalid(a.register(&name, &src_bufs, 3 * MB, "cpu:0", false));
    invalid(a.register(&name, &src_bufs, 0, "cpu:0", false));
    invalid(a.register("", &src_bufs, MB, "cpu:0", false));
    invalid(b.get_replica(&name, &[]).map(|_| ()));

    let missing = b
        .get_replica(&unique("missing"), &[(0x1000, MB)])
        .unwrap_err();
    assert_eq!(missing, P2pError::PayloadNotFound);
    assert_eq!(missing.code().code(), -704);

    a.register(&name, &src_bufs, MB, "cpu:0", false).unwrap();
    // A range overlapping a registered one, not the same range.
    let (addr, _) = src_bufs[0];
    let e = a
        .register(&unique("overlap"), &[(addr + MB, MB)], MB, "cpu:0", false)
        .unwrap_err();
    assert_eq!(e, P2pError::AddressOverlapped);

    // Consumer buffers that do not cut into the same shards.
    let mut wrong = vec![vec![0u8; 2 * MB as usize], vec![0u8; MB as usize]];
    invalid(b.get_replica(&name, &bufs(&mut wrong)).map(|_| ()));
    // The failed call left nothing behind: the right buffers work.
    let mut right = vec![vec![0u8; 4 * MB as usize]];
    b.get_replica(&name, &bufs(&mut right)).unwrap();
    assert_eq!(right, src);

    assert_eq!(b.unregister(&name).unwrap_err(), P2pError::PayloadNotOpened);
    a.unregister(&name).unwrap();
    b.delete_replica(&name).unwrap();

    let e = P2PStore::new("P2PHANDSHAKE", "127.0.0.1:1").err().unwrap();
    assert!(matches!(e, P2pError::Metadata(_)), "{e}");
}

#[test]
fn a_holder_that_left_is_skipped() {
    let etcd = services::etcd();
    let (a, b) = (store(&etcd.addr), store(&etcd.addr));
    let name = unique("gone");
    let mut src = vec![pattern(8 * MB, 4)];
    a.register(&name, &bufs(&mut src), MB, "cpu:0", false)
        .unwrap();
    let mut at_b = vec![vec![0u8; 8 * MB as usize]];
    b.get_replica(&name, &bufs(&mut at_b)).unwrap();
    // B's process ends without withdrawing: its entries stay in the record.
    b.close();
    drop(b);

    let c = store(&etcd.addr);
    let mut at_c = vec![vec![0u8; 8 * MB as usize]];
    let report = c.get_replica(&name, &bufs(&mut at_c)).unwrap();
    assert_eq!(at_c, src);
    assert_eq!(
        report.bytes_from.get(a.local_server_name()),
        Some(&(8 * MB))
    );
    assert!(!report.failed_holders.is_empty(), "{report:?}");
    a.unregister(&name).unwrap();
    c.delete_replica(&name).unwrap();
}

#[test]
fn claims_are_exclusive_until_released() {
    let etcd = services::etcd();
    let catalog = EtcdCatalog::connect(&etcd.addr).unwrap();
    let name = unique("claims");
    assert!(catalog.claimed(&name).unwrap().is_empty());
    assert!(catalog.claim(&name, 3, "a").unwrap());
    assert!(!catalog.claim(&name, 3, "b").unwrap(), "claimed twice");
    assert!(catalog.claim(&name, 10, "b").unwrap());
    assert_eq!(
        catalog.claimed(&name).unwrap(),
        [3, 10].into_iter().collect()
    );
    // Claims are not records: list does not see them.
    assert!(catalog.list(&name).unwrap().is_empty());
    catalog.unclaim(&name, 3).unwrap();
    assert!(catalog.claim(&name, 3, "b").unwrap());
    catalog.unclaim(&name, 3).unwrap();
    catalog.unclaim(&name, 10).unwrap();
    assert!(catalog.claimed(&name).unwrap().is_empty());
}
