//! What bytes a put or a get moves, and how: a memcpy for a replica in this
//! process's own segment, a copy into a peer's shared memory when the peer is
//! on this host, an engine transfer otherwise. Pure: nothing here touches
//! memory, the engine or the master. `write.rs` and `read.rs` carry the
//! plans out.

use mooncake_common::{Error, ErrorCode, Result};

use super::super::replica::Site;
use crate::types::{MemoryDescriptor, ReplicaDesc};

/// `len` bytes from `src` to `dst`, both addresses in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Memcpy {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

/// `len` bytes between `local` in this process and `remote` in a peer's
/// segment (the direction is the plan's: a write sends, a read fetches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub local: usize,
    pub remote: u64,
    pub len: usize,
}

// ---- writes -------------------------------------------------------------

/// How one value reaches its replicas.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WritePlan<'r> {
    /// Copies into the replicas in this process's own segments.
    pub memcpy: Vec<Memcpy>,
    /// Every other replica, in the master's order.
    pub peers: Vec<PeerWrite<'r>>,
}

/// One replica outside this process.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PeerWrite<'r> {
    /// The engine endpoint serving the replica's segment.
    pub endpoint: &'r str,
    /// Caller bytes only: copies into the segment's shared memory, tried
    /// first. They succeed when the peer is on this host and its mapping
    /// serves the range; when one is refused, `engine` writes the whole
    /// value instead. Registered memory (`None`) goes to the engine, whose
    /// own shared-memory transport takes the same-host case.
    pub shared: Option<Vec<Piece>>,
    pub engine: EngineWrite,
}

/// What the engine sends to a peer's replica.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum EngineWrite {
    /// The value's registered parts, each to its place in the replica.
    Parts(Vec<Piece>),
    /// The whole value, `len` bytes to `remote`, from a copy staged in
    /// registered memory (the engine cannot read caller bytes).
    Staged { remote: u64, len: usize },
}

impl EngineWrite {
    /// How many engine requests this is.
    pub(super) fn requests(&self) -> usize {
        match self {
            EngineWrite::Parts(pieces) => pieces.len(),
            EngineWrite::Staged { len, .. } => usize::from(*len > 0),
        }
    }
}

impl WritePlan<'_> {
    /// The most engine requests the plan can make (every shared copy refused).
    pub(super) fn max_requests(&self) -> usize {
        self.peers.iter().map(|p| p.engine.requests()).sum()
    }
}

/// Plans writing a value, given as `(address, length)` parts in order, into
/// the replicas the master allocated for it. `caller_bytes`: the parts are
/// caller memory the engine does not know (plain bytes), so a peer is first
/// tried through shared memory and otherwise sent a staged copy.
pub(crate) fn plan_write<'r>(
    parts: &[(usize, usize)],
    caller_bytes: bool,
    replicas: &'r [ReplicaDesc],
    site: &Site,
) -> Result<WritePlan<'r>> {
    let len: u64 = parts.iter().map(|p| p.1 as u64).sum();
    let targets: Vec<&MemoryDescriptor> = replicas.iter().filter_map(ReplicaDesc::memory).collect();
    if targets.is_empty() {
        return Err(Error::new(
            ErrorCode::INVALID_REPLICA,
            "master gave no memory replica",
        ));
    }
    if let Some(t) = targets.iter().find(|t| t.size < len) {
        return Err(Error::new(
            ErrorCode::INVALID_REPLICA,
            format!("replica of {} bytes for a {len} byte value", t.size),
        ));
    }
    let mut plan = WritePlan {
        memcpy: Vec::new(),
        peers: Vec::new(),
    };
    for t in targets {
        let pieces = lay_out(parts, t.buffer_address);
        if site.is_own(t) {
            plan.memcpy.extend(pieces.iter().map(|p| Memcpy {
                src: p.local,
                dst: p.remote as usize,
                len: p.len,
            }));
        } else if caller_bytes {
            plan.peers.push(PeerWrite {
                endpoint: &t.transport_endpoint,
                shared: Some(pieces),
                engine: EngineWrite::Staged {
                    remote: t.buffer_address,
                    len: len as usize,
                },
            });
        } else {
            plan.peers.push(PeerWrite {
                endpoint: &t.transport_endpoint,
                shared: None,
                engine: EngineWrite::Parts(pieces),
            });
        }
    }
    Ok(plan)
}

/// Checks a session call's ranges, `(addr, len, offset)`, against an
/// object of `size` bytes: the bytes they move.
pub(crate) fn check_ranges(ranges: &[(usize, usize, u64)], size: u64) -> Result<u64> {
    let mut total = 0u64;
    for &(_, len, off) in ranges {
        match off.checked_add(len as u64) {
            Some(end) if end <= size => total += len as u64,
            _ => {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("range {off}+{len} runs past the {size} byte object"),
                ))
            }
        }
    }
    Ok(total)
}

/// Plans writing ranges of registered memory, `(addr, len, offset)`, to
/// their offsets in every memory replica. Each replica's own size bounds
/// the ranges again here: an own-segment replica is written by memcpy.
pub(crate) fn plan_range_write<'r>(
    ranges: &[(usize, usize, u64)],
    replicas: &'r [ReplicaDesc],
    site: &Site,
) -> Result<WritePlan<'r>> {
    let targets: Vec<&MemoryDescriptor> = replicas.iter().filter_map(ReplicaDesc::memory).collect();
    if targets.is_empty() {
        return Err(Error::new(
            ErrorCode::INVALID_REPLICA,
            "master gave no memory replica",
        ));
    }
    let mut plan = WritePlan {
        memcpy: Vec::new(),
        peers: Vec::new(),
    };
    for t in targets {
        check_ranges(ranges, t.size)?;
        let pieces: Vec<Piece> = ranges
            .iter()
            .filter(|r| r.1 > 0)
            .map(|&(local, len, off)| Piece {
                local,
                remote: t.buffer_address + off,
                len,
            })
            .collect();
        if site.is_own(t) {
            plan.memcpy.extend(pieces.iter().map(|p| Memcpy {
                src: p.local,
                dst: p.remote as usize,
                len: p.len,
            }));
        } else {
            plan.peers.push(PeerWrite {
                endpoint: &t.transport_endpoint,
                shared: None,
                engine: EngineWrite::Parts(pieces),
            });
        }
    }
    Ok(plan)
}

/// The parts laid out back to back from `remote`; empty parts move nothing.
fn lay_out(parts: &[(usize, usize)], remote: u64) -> Vec<Piece> {
    let mut off = 0u64;
    let mut pieces = Vec::with_capacity(parts.len());
    for &(local, len) in parts {
        if len > 0 {
            pieces.push(Piece {
                local,
                remote: remote + off,
                len,
            });
        }
        off += len as u64;
    }
    pieces
}

// ---- reads --------------------------------------------------------------

/// One piece of a read: `len` bytes at `src_off` in the object land at `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frag {
    pub src_off: u64,
    pub dst: usize,
    pub len: usize,
}

/// Splits an object of `size` bytes over destination parts in order.
pub(crate) fn scatter(size: u64, dests: &[(usize, usize)]) -> Result<Vec<Frag>> {
    let capacity: u64 = dests.iter().map(|d| d.1 as u64).sum();
    if capacity < size {
        return Err(Error::new(
            ErrorCode::BUFFER_OVERFLOW,
            format!("object of {size} bytes does not fit a {capacity} byte buffer"),
        ));
    }
    let mut frags = Vec::new();
    let mut off = 0u64;
    for &(addr, len) in dests {
        if off == size {
            break;
        }
        let n = (len as u64).min(size - off) as usize;
        if n > 0 {
            frags.push(Frag {
                src_off: off,
                dst: addr,
                len: n,
            });
        }
        off += n as u64;
    }
    Ok(frags)
}

/// How a read gets its fragments from one replica.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadPlan<'r> {
    /// The replica is in this process's own segment.
    Memcpy(Vec<Memcpy>),
    /// The replica is a peer's: each piece through shared memory when the
    /// peer's mapping serves it (the peer is on this host), else by an
    /// engine read.
    Peer {
        endpoint: &'r str,
        pieces: Vec<Piece>,
    },
}

/// Plans reading `frags` of the object from `replica` (one of those
/// [`Site::rank`] ordered; a caller falls back to the next on failure).
/// A fragment past the object's end is `INVALID_PARAMS`.
pub(crate) fn plan_read<'r>(
    replica: &'r MemoryDescriptor,
    frags: &[Frag],
    site: &Site,
) -> Result<ReadPlan<'r>> {
    let past_end = |f: &&Frag| {
        f.src_off
            .checked_add(f.len as u64)
            .is_none_or(|end| end > replica.size)
    };
    if let Some(f) = frags.iter().find(past_end) {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "read of {}+{} past the {} byte object",
                f.src_off, f.len, replica.size
            ),
        ));
    }
    let base = replica.buffer_address;
    if site.is_own(replica) {
        return Ok(ReadPlan::Memcpy(
            frags
                .iter()
                .map(|f| Memcpy {
                    src: (base + f.src_off) as usize,
                    dst: f.dst,
                    len: f.len,
                })
                .collect(),
        ));
    }
    Ok(ReadPlan::Peer {
        endpoint: &replica.transport_endpoint,
        pieces: frags
            .iter()
            .map(|f| Piece {
                local: f.dst,
                remote: base + f.src_off,
                len: f.len,
            })
            .collect(),
    })
}

/// A ranged-read fragment of `len` bytes at `src_off` of an object of
/// `size` bytes: empty or past the end is `INVALID_PARAMS`.
pub(crate) fn check_source_range(key: &str, size: u64, src_off: u64, len: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::new(ErrorCode::INVALID_PARAMS, "fragment of 0 bytes"));
    }
    match src_off.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("source range {src_off}+{len} past the {size} byte object {key}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DiskDescriptor, ReplicaKind, ReplicaStatus};

    const OWN: u64 = 0x10_0000; // base of our one segment
    const PEER: u64 = 0x90_0000;

    fn site(memcpy: bool) -> Site {
        Site {
            endpoint: "me:1".into(),
            host: "me".into(),
            segments: vec![(OWN, 0x1000)],
            memcpy,
        }
    }

    fn mem(endpoint: &str, addr: u64, size: u64) -> MemoryDescriptor {
        MemoryDescriptor {
            segment_name: endpoint.into(),
            transport_endpoint: endpoint.into(),
            buffer_address: addr,
            size,
            suspected: false,
        }
    }

    fn replica(endpoint: &str, addr: u64, size: u64) -> ReplicaDesc {
        ReplicaDesc {
            kind: ReplicaKind::Memory(mem(endpoint, addr, size)),
            status: ReplicaStatus::Complete,
        }
    }

    fn disk(size: u64) -> ReplicaDesc {
        ReplicaDesc {
            kind: ReplicaKind::Disk(DiskDescriptor {
                file_path: "/ssd/x".into(),
                object_size: size,
            }),
            status: ReplicaStatus::Complete,
        }
    }

    fn piece(local: usize, remote: u64, len: usize) -> Piece {
        Piece { local, remote, len }
    }

    #[test]
    fn own_replica_is_a_memcpy_per_part() {
        let reps = [replica("me:1", OWN + 0x40, 10)];
        let plan = plan_write(&[(0x5000, 4), (0x7000, 6)], true, &reps, &site(true)).unwrap();
        assert_eq!(
            plan.memcpy,
            [
                Memcpy {
                    src: 0x5000,
                    dst: (OWN + 0x40) as usize,
                    len: 4
                },
                Memcpy {
                    src: 0x7000,
                    dst: (OWN + 0x44) as usize,
                    len: 6
                },
            ]
        );
        assert!(plan.peers.is_empty());
        assert_eq!(plan.max_requests(), 0, "no engine batch needed");
    }

    #[test]
    fn caller_bytes_try_shared_memory_then_a_staged_copy() {
        let reps = [replica("me:2", PEER, 16)];
        let plan = plan_write(&[(0x5000, 3), (0x6000, 5)], true, &reps, &site(true)).unwrap();
        assert!(plan.memcpy.is_empty());
        assert_eq!(
            plan.peers,
            [PeerWrite {
                endpoint: "me:2",
                shared: Some(vec![piece(0x5000, PEER, 3), piece(0x6000, PEER + 3, 5)]),
                engine: EngineWrite::Staged {
                    remote: PEER,
                    len: 8
                },
            }]
        );
        assert_eq!(
            plan.max_requests(),
            1,
            "the staged copy goes in one request"
        );
    }

    #[test]
    fn registered_memory_goes_to_the_engine_part_by_part() {
        let reps = [replica("far:1", PEER, 8)];
        let plan = plan_write(&[(0x5000, 3), (0x6000, 5)], false, &reps, &site(true)).unwrap();
        assert_eq!(
            plan.peers,
            [PeerWrite {
                endpoint: "far:1",
                shared: None,
                engine: EngineWrite::Parts(vec![
                    piece(0x5000, PEER, 3),
                    piece(0x6000, PEER + 3, 5)
                ]),
            }]
        );
        assert_eq!(plan.max_requests(), 2);
    }

    #[test]
    fn every_replica_in_the_masters_order() {
        // Own, same host, remote, and a disk replica the client does not write.
        let reps = [
            replica("far:1", PEER, 4),
            disk(4),
            replica("me:1", OWN, 4),
            replica("me:2", PEER + 0x100, 4),
        ];
        let plan = plan_write(&[(0x5000, 4)], false, &reps, &site(true)).unwrap();
        assert_eq!(
            plan.memcpy,
            [Memcpy {
                src: 0x5000,
                dst: OWN as usize,
                len: 4
            }]
        );
        let peers: Vec<(&str, &EngineWrite)> =
            plan.peers.iter().map(|p| (p.endpoint, &p.engine)).collect();
        assert_eq!(
            peers,
            [
                ("far:1", &EngineWrite::Parts(vec![piece(0x5000, PEER, 4)])),
                (
                    "me:2",
                    &EngineWrite::Parts(vec![piece(0x5000, PEER + 0x100, 4)])
                ),
            ]
        );
        assert_eq!(plan.max_requests(), 2);
    }

    #[test]
    fn with_memcpy_off_our_own_segment_is_a_peer() {
        let reps = [replica("me:1", OWN, 4)];
        let plan = plan_write(&[(0x5000, 4)], true, &reps, &site(false)).unwrap();
        assert!(plan.memcpy.is_empty());
        assert_eq!(plan.peers.len(), 1);
        assert_eq!(plan.peers[0].endpoint, "me:1");
        assert_eq!(plan.peers[0].shared, Some(vec![piece(0x5000, OWN, 4)]));
    }

    #[test]
    fn a_replica_outside_our_segments_is_a_peer_even_at_our_endpoint() {
        // The master says "ours", but the address lies past our segment.
        let reps = [replica("me:1", OWN + 0xffe, 4)];
        let plan = plan_write(&[(0x5000, 4)], false, &reps, &site(true)).unwrap();
        assert!(plan.memcpy.is_empty());
        assert_eq!(plan.max_requests(), 1);
    }

    #[test]
    fn empty_parts_move_nothing_but_keep_offsets() {
        let reps = [replica("me:1", OWN, 6), replica("far:1", PEER, 6)];
        let parts = [(0x5000, 0), (0x6000, 2), (0x7000, 0), (0x8000, 4)];
        let plan = plan_write(&parts, false, &reps, &site(true)).unwrap();
        let own: Vec<(usize, usize, usize)> =
            plan.memcpy.iter().map(|c| (c.src, c.dst, c.len)).collect();
        assert_eq!(
            own,
            [(0x6000, OWN as usize, 2), (0x8000, OWN as usize + 2, 4)]
        );
        assert_eq!(
            plan.peers[0].engine,
            EngineWrite::Parts(vec![piece(0x6000, PEER, 2), piece(0x8000, PEER + 2, 4)])
        );
    }

    #[test]
    fn edge_sizes() {
        // One byte; a value exactly the replica's size; a larger replica.
        for (len, size) in [(1usize, 1u64), (4096, 4096), (3, 64)] {
            let reps = [replica("me:1", OWN, size), replica("me:2", PEER, size)];
            let plan = plan_write(&[(0x5000, len)], true, &reps, &site(true)).unwrap();
            assert_eq!(plan.memcpy.len(), 1);
            assert_eq!(plan.memcpy[0].len, len);
            assert_eq!(
                plan.peers[0].engine,
                EngineWrite::Staged { remote: PEER, len }
            );
        }
        // Nothing to move for a value of no bytes (the client refuses those
        // before planning; the planner still answers sanely).
        let reps = [replica("me:1", OWN, 0), replica("me:2", PEER, 0)];
        let plan = plan_write(&[], true, &reps, &site(true)).unwrap();
        assert!(plan.memcpy.is_empty());
        assert_eq!(plan.peers[0].shared, Some(vec![]));
        assert_eq!(plan.max_requests(), 0);
    }

    #[test]
    fn replicas_that_cannot_hold_the_value_are_refused() {
        let too_small = [replica("me:1", OWN, 8), replica("me:2", PEER, 7)];
        let e = plan_write(&[(0x5000, 8)], true, &too_small, &site(true)).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_REPLICA);
        let disk_only = [disk(8)];
        let e = plan_write(&[(0x5000, 8)], true, &disk_only, &site(true)).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_REPLICA);
        let e = plan_write(&[(0x5000, 8)], true, &[], &site(true)).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_REPLICA);
    }

    #[test]
    fn scatter_splits_in_order() {
        let f = scatter(10, &[(100, 4), (200, 4), (300, 8)]).unwrap();
        let got: Vec<(u64, usize, usize)> = f.iter().map(|f| (f.src_off, f.dst, f.len)).collect();
        assert_eq!(got, [(0, 100, 4), (4, 200, 4), (8, 300, 2)]);
        assert_eq!(
            scatter(10, &[(100, 9)]).unwrap_err().code,
            ErrorCode::BUFFER_OVERFLOW
        );
        assert!(scatter(0, &[(100, 9)]).unwrap().is_empty());
        // Empty destination parts are skipped; parts past the object unused.
        let f = scatter(4, &[(100, 0), (200, 4), (300, 4)]).unwrap();
        assert_eq!(
            f,
            [Frag {
                src_off: 0,
                dst: 200,
                len: 4
            }]
        );
    }

    fn frag(src_off: u64, dst: usize, len: usize) -> Frag {
        Frag { src_off, dst, len }
    }

    #[test]
    fn reads_the_best_replica_own_then_same_host_then_remote() {
        let reps = [
            replica("far:1", PEER, 16),
            replica("me:2", PEER + 0x100, 16),
            replica("me:1", OWN + 0x10, 16),
        ];
        let s = site(true);
        let ranked = s.rank(&reps);
        let order: Vec<&str> = ranked
            .iter()
            .map(|d| d.transport_endpoint.as_str())
            .collect();
        assert_eq!(order, ["me:1", "me:2", "far:1"]);
        let frags = [frag(0, 0x5000, 10), frag(10, 0x6000, 6)];
        assert_eq!(
            plan_read(&ranked[0], &frags, &s).unwrap(),
            ReadPlan::Memcpy(vec![
                Memcpy {
                    src: (OWN + 0x10) as usize,
                    dst: 0x5000,
                    len: 10
                },
                Memcpy {
                    src: (OWN + 0x1a) as usize,
                    dst: 0x6000,
                    len: 6
                },
            ])
        );
        // The fallbacks, in order: the same-host peer, then the remote one.
        for (rep, endpoint) in [(&ranked[1], "me:2"), (&ranked[2], "far:1")] {
            let base = rep.buffer_address;
            assert_eq!(
                plan_read(rep, &frags, &s).unwrap(),
                ReadPlan::Peer {
                    endpoint,
                    pieces: vec![piece(0x5000, base, 10), piece(0x6000, base + 10, 6)],
                }
            );
        }
        // Memcpy off: our own replica is read like a peer's.
        assert!(matches!(
            plan_read(&ranked[0], &frags, &site(false)).unwrap(),
            ReadPlan::Peer {
                endpoint: "me:1",
                ..
            }
        ));
    }

    #[test]
    fn reads_past_the_object_are_refused() {
        let rep = mem("me:2", PEER, 16);
        let s = site(true);
        plan_read(&rep, &[frag(0, 0x5000, 16)], &s).unwrap();
        plan_read(&rep, &[frag(15, 0x5000, 1)], &s).unwrap();
        for bad in [
            frag(0, 0x5000, 17),
            frag(16, 0x5000, 1),
            frag(u64::MAX, 0, 2),
        ] {
            let e = plan_read(&rep, &[frag(0, 0x4000, 1), bad], &s).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{bad:?}");
        }
        assert_eq!(
            plan_read(&rep, &[], &s).unwrap(),
            ReadPlan::Peer {
                endpoint: "me:2",
                pieces: vec![]
            }
        );
    }

    #[test]
    fn ranged_fragments_lie_inside_the_object() {
        check_source_range("k", 10, 0, 10).unwrap();
        check_source_range("k", 10, 9, 1).unwrap();
        for (off, len) in [(0, 0), (0, 11), (10, 1), (u64::MAX, 1)] {
            assert_eq!(
                check_source_range("k", 10, off, len).unwrap_err().code,
                ErrorCode::INVALID_PARAMS,
                "{off}+{len}"
            );
        }
    }

    #[test]
    fn session_ranges_stay_inside_the_object() {
        assert_eq!(check_ranges(&[], 10), Ok(0));
        assert_eq!(
            check_ranges(&[(1, 4, 0), (2, 6, 4), (3, 0, 10)], 10),
            Ok(10)
        );
        for bad in [(1, 1, 10), (1, 11, 0), (1, 2, u64::MAX)] {
            let e = check_ranges(&[(0, 1, 0), bad], 10).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{bad:?}");
        }
    }

    #[test]
    fn session_ranges_land_at_their_offsets_in_every_replica() {
        let reps = [
            replica("me:1", OWN + 0x100, 16),
            disk(16),
            replica("me:2", PEER, 16),
        ];
        let ranges = [(0x5000, 4, 12), (0x6000, 0, 3), (0x7000, 8, 0)];
        let plan = plan_range_write(&ranges, &reps, &site(true)).unwrap();
        assert_eq!(
            plan.memcpy,
            [
                Memcpy {
                    src: 0x5000,
                    dst: (OWN + 0x10c) as usize,
                    len: 4
                },
                Memcpy {
                    src: 0x7000,
                    dst: (OWN + 0x100) as usize,
                    len: 8
                },
            ],
            "empty ranges move nothing"
        );
        assert_eq!(
            plan.peers,
            [PeerWrite {
                endpoint: "me:2",
                shared: None,
                engine: EngineWrite::Parts(vec![
                    piece(0x5000, PEER + 12, 4),
                    piece(0x7000, PEER, 8)
                ]),
            }]
        );
    }

    #[test]
    fn session_ranges_past_a_replica_or_without_one_are_refused() {
        let short = [replica("me:1", OWN, 16), replica("me:2", PEER, 8)];
        let e = plan_range_write(&[(0x5000, 4, 8)], &short, &site(true)).unwrap_err();
        assert_eq!(
            e.code,
            ErrorCode::INVALID_PARAMS,
            "a replica smaller than the range"
        );
        let e = plan_range_write(&[(0x5000, 4, 0)], &[disk(16)], &site(true)).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_REPLICA);
    }
}
