//! Property test: random batches of reads and writes between two engines,
//! checked byte for byte against a mirror of both buffers, over TCP (with
//! tiny slices, so requests span many frames and connections) and over the
//! same-host shared-memory path.

use std::sync::OnceLock;
use std::time::Duration;

use mooncake_transfer::{EngineConfig, Opcode, TransferEngine, TransferRequest, TransferState};
use proptest::prelude::*;

const LEN: usize = 64 * 1024;

struct Pair {
    a: TransferEngine,
    _b: TransferEngine,
    seg: u64,
    local: usize,
    remote: usize,
}

fn pair(force_tcp: bool) -> Pair {
    let make = || {
        let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
        c.rpc_bind_address = Some("127.0.0.1".into());
        c.force_tcp = force_tcp;
        c.slice_size = 1000;
        c.tcp_connections = 3;
        c.transfer_timeout = Duration::from_secs(30);
        TransferEngine::new(c).unwrap()
    };
    let (a, b) = (make(), make());
    let local = a.allocate_managed_buffer(LEN).unwrap();
    let remote = b.allocate_managed_buffer(LEN).unwrap();
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    Pair {
        a,
        _b: b,
        seg,
        local,
        remote,
    }
}

fn view(addr: usize) -> &'static mut [u8] {
    // SAFETY: `addr` is a managed buffer of LEN bytes that lives as long as
    // the engines in the process-wide `Pair`s below.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, LEN) }
}

#[derive(Clone, Debug)]
struct Op {
    write: bool,
    local: usize,
    remote: usize,
    len: usize,
}

fn op() -> impl Strategy<Value = Op> {
    (any::<bool>(), 0..LEN, 0..LEN, 0usize..6000).prop_map(|(write, local, remote, len)| Op {
        write,
        local: local.min(LEN - len.min(LEN)),
        remote: remote.min(LEN - len.min(LEN)),
        len,
    })
}

fn overlaps(a: usize, al: usize, b: usize, bl: usize) -> bool {
    a < b + bl && b < a + al
}

/// Keeps only requests whose effect does not depend on execution order: no
/// request writes bytes another one reads or writes.
fn independent(ops: Vec<Op>) -> Vec<Op> {
    let mut kept: Vec<Op> = Vec::new();
    for o in ops {
        let clash = kept.iter().any(|k| {
            let remote = overlaps(o.remote, o.len, k.remote, k.len) && (o.write || k.write);
            let local = overlaps(o.local, o.len, k.local, k.len) && (!o.write || !k.write);
            remote || local
        });
        if !clash {
            kept.push(o);
        }
    }
    kept
}

fn check(p: &Pair, ops: Vec<Op>, seed: u8) -> Result<(), TestCaseError> {
    let (local, remote) = (view(p.local), view(p.remote));
    for (i, b) in local.iter_mut().enumerate() {
        *b = (i as u8).wrapping_add(seed);
    }
    for (i, b) in remote.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7) ^ seed;
    }
    let (mut want_local, mut want_remote) = (local.to_vec(), remote.to_vec());
    let ops = independent(ops);
    let reqs: Vec<TransferRequest> = ops
        .iter()
        .map(|o| TransferRequest {
            opcode: if o.write { Opcode::Write } else { Opcode::Read },
            source: p.local + o.local,
            target_id: p.seg,
            target_offset: (p.remote + o.remote) as u64,
            length: o.len,
        })
        .collect();
    for o in &ops {
        if o.write {
            want_remote[o.remote..o.remote + o.len]
                .copy_from_slice(&local[o.local..o.local + o.len]);
        } else {
            want_local[o.local..o.local + o.len]
                .copy_from_slice(&remote[o.remote..o.remote + o.len]);
        }
    }
    let batch = p.a.allocate_batch(reqs.len().max(1)).unwrap();
    p.a.submit(batch, &reqs).unwrap();
    let s = p.a.wait_batch(batch).unwrap();
    prop_assert_eq!(s.state, TransferState::Completed);
    prop_assert_eq!(
        s.transferred_bytes,
        ops.iter().map(|o| o.len as u64).sum::<u64>()
    );
    p.a.free_batch(batch).unwrap();
    prop_assert!(
        local[..] == want_local[..],
        "local buffer differs from the mirror"
    );
    prop_assert!(
        remote[..] == want_remote[..],
        "remote buffer differs from the mirror"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn tcp_batches_match_the_mirror(ops in proptest::collection::vec(op(), 1..40), seed in any::<u8>()) {
        static PAIR: OnceLock<Pair> = OnceLock::new();
        let p = PAIR.get_or_init(|| pair(true));
        check(p, ops, seed)?;
        let s = p.a.transport_stats();
        prop_assert_eq!(s.shm, 0);
    }

    #[test]
    fn shm_batches_match_the_mirror(ops in proptest::collection::vec(op(), 1..40), seed in any::<u8>()) {
        static PAIR: OnceLock<Pair> = OnceLock::new();
        let p = PAIR.get_or_init(|| pair(false));
        check(p, ops, seed)?;
        let s = p.a.transport_stats();
        prop_assert_eq!(s.tcp, 0);
    }
}
