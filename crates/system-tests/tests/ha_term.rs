//! The term fence of client calls in replicated HA (`--enable_ha
//! --enable_oplog`), with real processes on a real etcd
//! (`MOONCAKE_TEST_ETCD`, or started here): a connection states the
//! election term its client found the leader under, and a master leading
//! another term answers none of its calls.

mod common;

use std::net::TcpStream;
use std::time::Instant;

use common::ha::{cluster, in_sync, mounted_client, put_keys, role, start_master, Master};
use common::{eventually, free_port, raw, WAIT};
use mooncake_common::ErrorCode;
use mooncake_store::ha::{self, ElectionBackend};
use mooncake_store::proto::{Request, Response};
use test_support::freeze_proxy::FreezeProxy;
use test_support::services;

/// A connection of the test's own to a master: requests sent one frame at
/// a time, answers read back.
struct Raw(TcpStream);

impl Raw {
    fn connect(port: u16) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        Raw(stream)
    }

    fn call(&mut self, req: &Request<'_>) -> Response {
        raw::call(&mut self.0, req)
    }
}

/// A refusal of the term fence: `UNAVAILABLE_IN_CURRENT_STATUS`, naming
/// the master's term and the connection's.
fn assert_term_refusal(answer: &Response, leading: u64, stated: u64) {
    let Response::Failed { error } = answer else {
        panic!("a master leading term {leading} answered a call of term {stated}: {answer:?}");
    };
    assert_eq!(
        error.code,
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        "{error:?}"
    );
    assert!(
        error.context.contains(&format!("leads term {leading}"))
            && error.context.contains(&format!("term {stated}")),
        "not the term fence's refusal: {error:?}"
    );
}

/// The leader A is deposed in etcd by someone else (what a standby does
/// when it finds A's port closed, or an operator) while its own etcd
/// connection hangs (a frozen relay), so A does not learn of it before
/// its next renewal fails; its lease, proven at its last renewal, still
/// holds on its clock. B takes over and a client finds B's term. A
/// connection stating B's term then reaches A: A refuses the statement
/// and every call after it, naming both terms, although its lease check
/// passes. Without the term check A answered both (the lease fence
/// covers a leader frozen past its lease, not one deposed within it).
#[test]
fn a_deposed_leader_within_its_lease_refuses_calls_of_the_newer_term() {
    let etcd = services::etcd();
    let cluster = cluster("term");
    let relay = FreezeProxy::start(&etcd.addr);
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let a = start_master(&relay.addr, &cluster, ports[0].0, ports[0].1);
    a.up.recv_timeout(WAIT).expect("A leads");
    let b = start_master(&etcd.addr, &cluster, ports[1].0, ports[1].1);
    let c = start_master(&etcd.addr, &cluster, ports[2].0, ports[2].1);
    eventually("both standbys in sync", || in_sync(&a) == 2);

    let client_id = 7u128;
    let m = mounted_client(&etcd.addr, &cluster, client_id);
    put_keys(&m, client_id, &["k".to_string()]);
    let term_a = m.term().expect("an HA client knows its leader's term");
    let backend = ElectionBackend::parse(&format!("etcd://{}", etcd.addr), false).unwrap();
    let found = ha::find_leader(&backend, &cluster)
        .unwrap()
        .expect("A leads");
    assert_eq!(found.term, term_a);
    assert_eq!(found.address, format!("127.0.0.1:{}", a.rpc));

    // A connection of its own to A, under A's term: answered.
    let mut raw = Raw::connect(a.rpc);
    let stated = raw.call(&Request::LeaderTerm { term: term_a });
    assert_eq!(stated, Response::Unit { result: Ok(()) });
    let read = raw.call(&Request::ExistKey { key: "k" });
    assert_eq!(read, Response::Bool { result: Ok(true) });

    // A can no longer reach etcd; someone else deposes it there.
    relay.freeze();
    let cut = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let deposed = rt.block_on(async {
        let election = backend.connect(&cluster, ha::LEASE_TTL).await?;
        election.depose(&found.address).await
    });
    assert_eq!(deposed, Ok(true));
    let next = new_leader(&[&b, &c]);
    let fresh = mooncake_store::MasterClient::connect_in_cluster(
        &format!("etcd://{}", etcd.addr),
        &cluster,
    )
    .unwrap();
    let term_b = fresh.term().unwrap();
    assert!(term_b > term_a, "B's term {term_b} after A's {term_a}");
    assert!(fresh.exist_key("k").unwrap(), "B serves A's objects");

    // A still believes it leads, and its lease still holds on its clock:
    // only the term tells it apart from B.
    let stated = raw.call(&Request::LeaderTerm { term: term_b });
    let read = raw.call(&Request::ExistKey { key: "k" });
    let took = cut.elapsed();
    println!("A deposed; {next} took over; A asked under term {term_b} {took:?} after the cut");
    assert_term_refusal(&read, term_a, term_b);
    assert_term_refusal(&stated, term_a, term_b);
    // A connection stating an older term is refused by B too.
    let mut old = Raw::connect(if next == "B" { b.rpc } else { c.rpc });
    assert_term_refusal(
        &old.call(&Request::LeaderTerm { term: term_a }),
        term_b,
        term_a,
    );
    relay.thaw();
}

/// Which of `standbys` (B, C) leads, once one does.
fn new_leader(standbys: &[&Master; 2]) -> &'static str {
    let mut found = "";
    eventually("a standby takes over", || {
        if let Some(i) = standbys
            .iter()
            .position(|m| role(m).as_deref() == Some("leader"))
        {
            found = ["B", "C"][i];
        }
        !found.is_empty()
    });
    found
}
