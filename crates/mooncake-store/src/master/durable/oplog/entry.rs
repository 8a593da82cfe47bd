//! A log entry: a sequence number, the leader's term and the state
//! machine's mutations in owned form (`state::owned`), with their wire
//! form (the payload of a frame, `codec`).

use mooncake_common::Result;

use crate::master::state::owned::OwnedMutation;
use crate::master::state::service::MasterService;
use crate::proto::wire::{wire_struct, Decode, DecodeError, Reader};

/// One log entry: a sequence number, the term of the leader that wrote
/// it, and the mutations it carries, in the order they were applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedEntry {
    pub seq: u64,
    pub term: u64,
    pub mutations: Vec<OwnedMutation>,
}

impl OwnedEntry {
    /// Applies every mutation of this entry to `s` in order. An error
    /// means the entry does not belong to that state (a log of another
    /// master, or a gap): the mutation that failed changed nothing, those
    /// before it in the entry stay applied, and the caller must stop
    /// following.
    pub fn apply_to(&self, s: &MasterService) -> Result<()> {
        for m in &self.mutations {
            s.apply_logged(m)
                .map_err(|e| e.with_context(format!("log entry {}", self.seq)))?;
        }
        Ok(())
    }
}

wire_struct!(OwnedEntry {
    seq,
    term,
    mutations = decode_mutations,
});

/// An entry's mutations. The count is checked against the input left,
/// and the vector grows as mutations actually decode, so what a hostile
/// count reserves stays small next to the input.
fn decode_mutations(r: &mut Reader<'_>) -> Result<Vec<OwnedMutation>, DecodeError> {
    // Every mutation takes at least two bytes (a tag and a field).
    let n = r.len(2)?;
    let mut v = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        v.push(OwnedMutation::decode(r)?);
    }
    Ok(v)
}
