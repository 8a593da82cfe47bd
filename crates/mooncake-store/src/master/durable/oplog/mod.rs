//! The operation log: the master's mutations as durable, replayable
//! entries.
//!
//! - [`OwnedEntry`] (`entry`): a sequence number, the leader's term and
//!   one or more [`OwnedMutation`]s, the owned form of the state
//!   machine's `Mutation` with each placement as (segment id, offset);
//! - `codec`: the versioned, checksummed frame of an entry:
//!   [`OwnedEntry::encode_into`], [`decode`] (exactly one frame) and
//!   [`decode_prefix`] (the first frame of a stream). Decoding never
//!   panics and allocates in proportion to its input, so it can be fed
//!   anything (a fuzz target calls [`decode`]);
//! - [`OwnedEntry::apply_to`] applies a decoded entry to another copy of
//!   the state machine (`MasterService::apply_logged`, which reserves each
//!   logged range at its offset);
//! - [`Recorder`]: a `MutationSink` that collects the mutations a master
//!   applies, to be cut into entries;
//! - [`wal`]: the local write-ahead log with group commit.

mod codec;
mod entry;
#[cfg(test)]
mod tests;
pub mod wal;

use parking_lot::Mutex;

/// The owned mutations an entry carries, defined by the state machine.
pub use crate::master::state::owned::{
    OwnedClientOp, OwnedDiskOp, OwnedMutation, OwnedObjectOp, OwnedSegmentOp, OwnedSegments,
    OwnedTaskOp, OwnedWrite, Placed,
};
pub use codec::{decode, decode_prefix, DecodeError, HEADER_LEN, MAGIC, MAX_ENTRY_LEN, VERSION};
pub use entry::OwnedEntry;

use crate::master::state::mutation::{Mutation, MutationSink, Release};
use crate::master::state::service::MasterService;

/// Collects every mutation it sees, in order, for a log to take
/// ([`Recorder::take`]) and cut into entries.
#[derive(Default)]
pub struct Recorder {
    pending: Mutex<Vec<OwnedMutation>>,
}

impl Recorder {
    /// The mutations seen since the last call.
    pub fn take(&self) -> Vec<OwnedMutation> {
        std::mem::take(&mut *self.pending.lock())
    }
}

impl MutationSink for Recorder {
    fn applied(&self, m: &Mutation<'_>) -> Release {
        let owned = OwnedMutation::from_mutation(m);
        self.pending.lock().push(owned);
        Release::Now
    }
}

impl MutationSink for std::sync::Arc<Recorder> {
    fn applied(&self, m: &Mutation<'_>) -> Release {
        (**self).applied(m)
    }
}

/// `service` with every mutation it applies appended to `wal`: a logged
/// state machine without a server, as the snapshot benchmark drives one
/// (a master adds the put fence; `snapshot::open`).
pub fn logged(service: MasterService, wal: &std::sync::Arc<wal::Wal>) -> MasterService {
    service.with_sink(Box::new(wal::WalSink(wal.clone())))
}
