//! What a replicated master (`--enable_ha --enable_oplog`) does on taking
//! over, with real processes: a retry of a put that the failover left in
//! flight is not told the put exists (which clients report as success),
//! and a coordination service that lost the replication record (a redis
//! `FLUSHALL`) gets no takeover by a master that followed a leader.
//!
//! Waits are bounded hang guards, never speed checks.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::ha::{
    cluster, in_sync, mounted_client, put_keys, replication_field, role, start_master,
};
use common::{code, eventually, free_port, WAIT};
use mooncake_common::ErrorCode;
use mooncake_store::types::{SegmentInfo, WriteOptions};
use mooncake_store::MasterClient;
use test_support::services;

/// The standby holds the leader's whole log, applied.
fn caught_up(leader: &common::ha::Master, standby: &common::ha::Master) -> bool {
    let last = replication_field(leader, "last_seq");
    last > 0 && replication_field(standby, "applied_seq") >= last
}

#[test]
fn a_retry_over_a_put_left_in_flight_by_a_failover_is_not_told_it_exists() {
    let etcd = services::etcd();
    let cluster = cluster("in-flight-retry");
    let mut masters = vec![start_master(&etcd.addr, &cluster, free_port(), free_port())];
    masters[0].up.recv_timeout(WAIT).expect("A leads");
    masters.push(start_master(&etcd.addr, &cluster, free_port(), free_port()));
    eventually("the standby in sync", || in_sync(&masters[0]) == 1);

    let client_id = 7u128;
    let m = mounted_client(&etcd.addr, &cluster, client_id);
    let opts = WriteOptions::default();
    m.put_start(client_id, "stalled", 64, &opts).unwrap();
    // The standby holds the PutStart, and the PutEnd never comes.
    eventually("the standby holds the PutStart", || {
        caught_up(&masters[0], &masters[1])
    });
    masters[0].proc.kill9();

    let deadline = Instant::now() + WAIT;
    let retry = loop {
        match m.put_start(client_id, "stalled", 64, &opts) {
            // No leader yet, or the old one's connection: ask again.
            Err(e)
                if Instant::now() < deadline
                    && !matches!(
                        e.code,
                        ErrorCode::OBJECT_ALREADY_EXISTS | ErrorCode::OBJECT_REPLICA_BUSY
                    ) =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            r => break r,
        }
    };
    assert_eq!(code(retry), ErrorCode::OBJECT_REPLICA_BUSY);
    assert_eq!(role(&masters[1]).as_deref(), Some("leader"));
    // Nothing readable was stored: "exists" would have been a lie.
    assert_eq!(
        code(m.get_replica_list("stalled")),
        ErrorCode::REPLICA_IS_NOT_READY
    );
}

/// `FLUSHALL` on the redis of this test's own: the leader key, the term
/// counter and the replication record are gone.
fn flushall(addr: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"*1\r\n$8\r\nFLUSHALL\r\n").unwrap();
    let mut reply = [0u8; 5];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
}

#[test]
fn a_standby_does_not_take_over_when_redis_lost_the_record() {
    let redis = services::start_redis(&[]);
    let coordination = format!("redis://{}", redis.addr);
    let cluster = cluster("flushed");
    let mut masters = vec![start_master(
        &coordination,
        &cluster,
        free_port(),
        free_port(),
    )];
    masters[0].up.recv_timeout(WAIT).expect("A leads");
    masters.push(start_master(
        &coordination,
        &cluster,
        free_port(),
        free_port(),
    ));
    eventually("the standby in sync", || in_sync(&masters[0]) == 1);

    let client_id = 7u128;
    let m = MasterClient::connect_in_cluster(&coordination, &cluster).unwrap();
    let _ = m.ping(client_id);
    let segment = SegmentInfo {
        name: "seg".into(),
        base: 1 << 30,
        size: 64 << 20,
        transport_endpoint: "127.0.0.1:1".into(),
    };
    m.mount_segment(client_id, &segment).unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    put_keys(&m, client_id, &keys);
    eventually("the standby holds every entry", || {
        caught_up(&masters[0], &masters[1])
    });

    flushall(&redis.addr);
    masters[0].proc.kill9();
    // B wins at once (nothing holds the leader key) but finds no record,
    // with a term counted again from 0: it must step aside, every time.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        assert_ne!(role(&masters[1]).as_deref(), Some("leader"));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        role(&masters[1]).is_some(),
        "the standby is still up, stepping aside"
    );
}
