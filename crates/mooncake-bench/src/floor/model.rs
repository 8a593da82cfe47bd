//! The floor of a replicated put: the sockets, threads and hand-offs of
//! one replicated commit with no state machine behind them, so that
//! `mooncake-bench ha` can say how much of a replicated put's latency is
//! the master's work and how much the machine charges for moving an entry
//! to two standbys and back.
//!
//! Three processes, as in a cluster of three masters: a leader ([`leader`],
//! process A) serving clients on the master's RPC server loop with the
//! master's socket options, and two standbys ([`standby`], B and C) that
//! pull from it as `master::follower` does (one `ReplicationPull`
//! outstanding, the same client options, the next pull sent as soon as an
//! answer is decoded). A put is what a client's put is to the master: a
//! `PutStart` call, the 4 KiB value copied, a `PutEnd` call; the log entries
//! are real `oplog` frames of a put's two mutations, so every message has
//! the size it has in a replicated master. The leader keeps no objects: a
//! call only appends entries and, for `PutEnd`, waits for the standbys its
//! [`Quorum`] names: both (a replicated master's in-sync set), the first
//! of the two to hold the entries (a majority of three), or the only one
//! (a second standby absent: the least CPU a replicated put can use).
//!
//! How the leader reaches its standbys ([`Mode`]):
//! - [`Mode::Alone`]: it does not (both calls answered at once): a plain
//!   master's round trips without its state machine;
//! - [`Mode::Pull`]: the replicated master's hand-offs: each call appends
//!   its entry and wakes the standbys' connection threads (one per
//!   standby, blocked on a condition variable), which answer the pulls; a
//!   pull's acknowledgement is read by that thread, which wakes the
//!   `PutEnd`'s thread, waiting on another condition variable;
//! - [`Mode::PullAtCommit`]: the same, but both entries are appended by the
//!   `PutEnd` (one answer per standby per put instead of two);
//! - [`Mode::Direct`]: the fewest hand-offs: the `PutEnd`'s own thread
//!   writes both entries to the standbys' sockets and reads their next
//!   pulls itself (with several client threads, one writes for all whose
//!   entries are appended by then).

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};

use mooncake_store::master::durable::oplog::{
    OwnedEntry, OwnedMutation, OwnedObjectOp, OwnedWrite, Placed,
};
use mooncake_store::proto::frame::{decode_payload, encode_frame};
use mooncake_store::proto::{Request, Response};
use mooncake_store::rpc::{connect_any, Connector, Pool};
use mooncake_store::types::{ClientId, ReplicaPolicy};

/// How the floor's leader reaches its standbys; see the module's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Alone,
    Pull,
    PullAtCommit,
    Direct,
}

impl Mode {
    /// Its name on a command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Alone => "alone",
            Mode::Pull => "pull",
            Mode::PullAtCommit => "pull-at-commit",
            Mode::Direct => "direct",
        }
    }

    pub fn parse(s: &str) -> Result<Mode> {
        [Mode::Alone, Mode::Pull, Mode::PullAtCommit, Mode::Direct]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| Error::new(ErrorCode::INVALID_PARAMS, format!("no floor mode {s:?}")))
    }

    /// Whether standbys take part.
    pub fn replicates(self) -> bool {
        self != Mode::Alone
    }
}

/// Which standbys run and which of them a `PutEnd` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quorum {
    /// Two standbys; a commit waits for both.
    BothOf2,
    /// Two standbys, both sent every entry; a commit waits for the first
    /// that holds it.
    FirstOf2,
    /// One standby, and a commit waits for it.
    OneOf1,
}

impl Quorum {
    /// Its name on a command line.
    pub fn name(self) -> &'static str {
        match self {
            Quorum::BothOf2 => "both-of-2",
            Quorum::FirstOf2 => "first-of-2",
            Quorum::OneOf1 => "1-of-1",
        }
    }

    pub fn parse(s: &str) -> Result<Quorum> {
        [Quorum::BothOf2, Quorum::FirstOf2, Quorum::OneOf1]
            .into_iter()
            .find(|q| q.name() == s)
            .ok_or_else(|| Error::new(ErrorCode::INVALID_PARAMS, format!("no floor quorum {s:?}")))
    }

    /// The standby processes.
    pub fn standbys(self) -> usize {
        match self {
            Quorum::BothOf2 | Quorum::FirstOf2 => 2,
            Quorum::OneOf1 => 1,
        }
    }

    /// How many standbys hold an entry when it is committed.
    pub fn acks(self) -> usize {
        match self {
            Quorum::BothOf2 => 2,
            Quorum::FirstOf2 | Quorum::OneOf1 => 1,
        }
    }
}

/// The client's id in the calls (any: the leader keeps no clients).
const CLIENT: ClientId = 0x0066_6c6f_6f72;

/// The frame of a put's first entry: its PutStart, one replica placed.
pub(super) fn put_start_entry(seq: u64, key: &str, size: u64) -> Vec<u8> {
    let op = OwnedObjectOp::PutStart {
        client: CLIENT,
        size,
        pins: 0,
        now: seq,
        write: OwnedWrite::Fresh(vec![Placed {
            segment: 1,
            offset: seq * size,
        }]),
    };
    entry(seq, key, op)
}

/// The frame of a put's second entry: its PutEnd.
pub(super) fn put_end_entry(seq: u64, key: &str) -> Vec<u8> {
    let op = OwnedObjectOp::PutEnd {
        now: seq,
        readers_until: 0,
    };
    entry(seq, key, op)
}

fn entry(seq: u64, key: &str, op: OwnedObjectOp) -> Vec<u8> {
    OwnedEntry {
        seq,
        term: TERM,
        mutations: vec![OwnedMutation::Object {
            key: key.to_string(),
            op,
        }],
    }
    .to_frame()
}

/// The term every floor entry carries.
pub(super) const TERM: u64 = 1;

struct Target(Vec<SocketAddr>);

impl Connector for Target {
    fn peer(&self) -> String {
        format!("floor leader {:?}", self.0)
    }

    fn connect(&self, timeout: Duration) -> Result<TcpStream> {
        connect_any(&self.0, timeout).map_err(|e| Error::new(ErrorCode::RPC_FAIL, e.to_string()))
    }
}

/// A client of the floor's leader, with a master client's connection pool
/// and socket options; usable from any thread.
pub struct FloorClient {
    pool: Pool<Target>,
}

impl FloorClient {
    pub fn connect(addr: &str) -> Result<FloorClient> {
        let addrs = mooncake_store::rpc::resolve(addr, "floor leader")?;
        let opts = mooncake_store::master_client::client_options(
            Duration::from_secs(5),
            Duration::from_secs(30),
        );
        Ok(FloorClient {
            pool: Pool::new(Target(addrs), opts),
        })
    }

    /// One put of `value` under `key`: PutStart, the value copied into
    /// `segment` (as a client holding its segment writes it), PutEnd.
    pub fn put(&self, key: &str, value: &[u8], segment: &mut [u8]) -> Result<()> {
        let mut frame = Vec::with_capacity(128);
        let start = Request::PutStart {
            client_id: CLIENT,
            key,
            value_len: value.len() as u64,
            config: ReplicaPolicy::default(),
            upsert: false,
        };
        self.call(&start, &mut frame)?;
        let n = value.len().min(segment.len());
        segment[..n].copy_from_slice(&value[..n]);
        std::hint::black_box(&segment[..n]);
        self.call(
            &Request::PutEnd {
                client_id: CLIENT,
                key,
            },
            &mut frame,
        )
    }

    fn call(&self, req: &Request<'_>, frame: &mut Vec<u8>) -> Result<()> {
        frame.clear();
        encode_frame(req, frame)
            .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?;
        self.pool.call(frame, |payload| {
            match decode_payload::<Response>(payload)? {
                Response::Unit { result } => result,
                Response::Failed { error } => Err(error),
                other => Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("unexpected answer {}", other.name()),
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::floor::leader::serve_leader;
    use crate::floor::standby::run_standby;
    use std::sync::mpsc;

    /// Puts 50 keys on a thread of `s`; each index sent once answered.
    fn putting<'s>(
        s: &'s std::thread::Scope<'s, '_>,
        client: &'s FloorClient,
    ) -> mpsc::Receiver<i32> {
        let (tx, rx) = mpsc::channel();
        s.spawn(move || {
            let value = vec![7u8; 4096];
            let mut segment = vec![0u8; 4096];
            for i in 0..50 {
                client.put(&format!("k{i}"), &value, &mut segment).unwrap();
                tx.send(i).unwrap();
            }
        });
        rx
    }

    /// A put is answered only once both standbys hold its entries, in
    /// every mode that replicates; and every entry reaches them in order
    /// (a standby fails on a gap).
    #[test]
    fn a_put_waits_for_both_standbys() {
        for mode in [Mode::Pull, Mode::PullAtCommit, Mode::Direct] {
            let leader = serve_leader(mode, Quorum::BothOf2).unwrap();
            let (rpc, standbys) = leader.addresses();
            let client = FloorClient::connect(&rpc.to_string()).unwrap();
            std::thread::scope(|s| {
                let rx = putting(s, &client);
                std::thread::spawn(move || run_standby(standbys, "b"));
                let early = rx.recv_timeout(Duration::from_millis(300));
                assert!(early.is_err(), "{mode:?}: answered with one standby");
                std::thread::spawn(move || run_standby(standbys, "c"));
                for i in 0..50 {
                    assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(i), "{mode:?}");
                }
            });
        }
    }

    /// A standby that pulls once and then stops: connected, never
    /// acknowledging anything.
    fn stalled_standby(leader: SocketAddr, id: &str) -> TcpStream {
        let mut stream = TcpStream::connect(leader).unwrap();
        let pull = Request::ReplicationPull {
            standby: id,
            after: 0,
            after_term: TERM,
            applied: 0,
            max: 1024,
            wait_ms: 1000,
        };
        let mut frame = Vec::new();
        encode_frame(&pull, &mut frame).unwrap();
        std::io::Write::write_all(&mut stream, &frame).unwrap();
        stream
    }

    /// With one standby to wait for, a put waits for one, and is answered
    /// while the other standby is stopped ([`Quorum::FirstOf2`]) or absent
    /// ([`Quorum::OneOf1`]).
    #[test]
    fn a_put_waits_for_one_standby_in_a_one_standby_quorum() {
        for mode in [Mode::Pull, Mode::PullAtCommit, Mode::Direct] {
            for quorum in [Quorum::FirstOf2, Quorum::OneOf1] {
                let leader = serve_leader(mode, quorum).unwrap();
                let (rpc, standbys) = leader.addresses();
                let client = FloorClient::connect(&rpc.to_string()).unwrap();
                let _stalled = (quorum == Quorum::FirstOf2).then(|| stalled_standby(standbys, "c"));
                std::thread::scope(|s| {
                    let rx = putting(s, &client);
                    let early = rx.recv_timeout(Duration::from_millis(300));
                    assert!(early.is_err(), "{mode:?} {quorum:?}: answered unheld");
                    std::thread::spawn(move || run_standby(standbys, "b"));
                    for i in 0..50 {
                        let got = rx.recv_timeout(Duration::from_secs(10));
                        assert_eq!(got, Ok(i), "{mode:?} {quorum:?}");
                    }
                });
            }
        }
    }

    #[test]
    fn alone_answers_at_once() {
        let leader = serve_leader(Mode::Alone, Quorum::BothOf2).unwrap();
        let client = FloorClient::connect(&leader.addresses().0.to_string()).unwrap();
        let mut segment = vec![0u8; 16];
        client.put("k", &[1; 16], &mut segment).unwrap();
        assert_eq!(segment, [1; 16]);
        assert_eq!(Mode::parse("direct").unwrap(), Mode::Direct);
        assert!(Mode::parse("nope").is_err());
        assert!(!Mode::Alone.replicates() && Mode::Pull.replicates());
        for q in [Quorum::BothOf2, Quorum::FirstOf2, Quorum::OneOf1] {
            assert_eq!(Quorum::parse(q.name()).unwrap(), q);
        }
        assert!(Quorum::parse("all").is_err());
    }
}
