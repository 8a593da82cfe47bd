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
    pub fn requests(&self) -> usize {
        match self {
            EngineWrite::Parts(pieces) => pieces.len(),
            EngineWrite::Staged { len, .. } => usize::from(*len > 0),
        }
    }
}

impl WritePlan<'_> {
    /// The most engine requests the plan can make (every shared copy refused).
    pub fn max_requests(&self) -> usize {
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
