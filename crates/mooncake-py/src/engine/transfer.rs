//! The `transfer_*` methods. They differ only in how many ranges they take,
//! the opcode, and whether they wait: each builds a [`Ranges`] and a
//! [`Completion`] and calls [`PyEngine::transfer`]. Those with a fixed
//! opcode are the table of `one_range!`/`many_ranges!` lines below.
//!
//! `transport_hint` is accepted for the reference's signature (whose
//! non-TENT builds ignore it too); the engine picks its transport per
//! segment, and a hint other than `""`/`"unspec"` is logged once per value
//! ([`note_hint`]) so it is never dropped silently.

use mooncake_transfer::{Notify, Opcode};
use pyo3::prelude::*;

use super::ready::Ranges;
use super::request::{PyNotify, PyOpcode};
use super::PyEngine;
use crate::args::{u64s, usizes, Unsigned};

/// How a transfer call completes, and what it answers.
enum Completion {
    /// Blocks until the bytes moved and `notify` (if any) was acknowledged:
    /// 0, or -1 on failure.
    Wait(Option<Notify>),
    /// Returns at once with a batch id to poll (never 0), or 0 on failure.
    Submit,
}

impl From<(Unsigned, Unsigned, Unsigned)> for Ranges {
    fn from((buffer, peer_buffer_address, length): (Unsigned, Unsigned, Unsigned)) -> Ranges {
        Ranges {
            locals: vec![buffer.usize()],
            remotes: vec![peer_buffer_address.0],
            lens: vec![length.usize()],
        }
    }
}

impl From<(Vec<Unsigned>, Vec<Unsigned>, Vec<Unsigned>)> for Ranges {
    fn from(
        (buffers, peer_buffer_addresses, lengths): (Vec<Unsigned>, Vec<Unsigned>, Vec<Unsigned>),
    ) -> Ranges {
        Ranges {
            locals: usizes(&buffers),
            remotes: u64s(&peer_buffer_addresses),
            lens: usizes(&lengths),
        }
    }
}

fn wait(notify: Option<PyRef<'_, PyNotify>>) -> Completion {
    Completion::Wait(notify.map(|n| Notify::from(&*n)))
}

impl PyEngine {
    /// Every transfer call: `ranges` to or from `target` by `op`, answered
    /// as `completion` says (a status or a batch id, both Python ints).
    fn transfer(
        &self,
        py: Python<'_>,
        target: &str,
        op: Opcode,
        ranges: Ranges,
        completion: Completion,
    ) -> i64 {
        let failed = match completion {
            Completion::Wait(_) => -1,
            Completion::Submit => 0,
        };
        self.ready.with(py, failed, |r| {
            let requests = r.requests(target, op, &ranges);
            let res = match completion {
                Completion::Wait(notify) => requests
                    .and_then(|q| r.transfer_sync(target, &q, notify))
                    .map(|()| 0),
                Completion::Submit => requests
                    .and_then(|q| r.submit(target, &q))
                    .map(|id| id as i64),
            };
            res.unwrap_or_else(|e| {
                tracing::warn!("transfer to {target} failed: {e}");
                failed
            })
        })
    }
}

/// Warns, once per distinct value, that a transport hint has no effect.
fn note_hint(hint: &str) {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static WARNED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    if hint.is_empty() || hint == "unspec" {
        return;
    }
    let mut warned = WARNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    // Bounded: a caller cycling through junk values cannot grow it forever.
    if warned.len() < 64 && warned.insert(hint.to_owned()) {
        tracing::warn!(
            "transport_hint={hint:?} has no effect: this engine picks the transport per \
             segment (shm on the same host, else tcp)"
        );
    }
}

/// A transfer method with a fixed opcode and completion, `(target_hostname,
/// <local>, <remote>, <length>, transport_hint="")`: one range, or lists of
/// ranges.
macro_rules! fixed_opcode {
    (
        $(#[$doc:meta])*
        $name:ident($local:ident, $remote:ident, $len:ident: $ty:ty), $op:expr, $completion:expr
    ) => {
        #[pymethods]
        impl PyEngine {
            $(#[$doc])*
            #[pyo3(signature = (target_hostname, $local, $remote, $len, transport_hint = ""))]
            fn $name(
                &self,
                py: Python<'_>,
                target_hostname: &str,
                $local: $ty,
                $remote: $ty,
                $len: $ty,
                transport_hint: &str,
            ) -> i64 {
                note_hint(transport_hint);
                let ranges = Ranges::from(($local, $remote, $len));
                self.transfer(py, target_hostname, $op, ranges, $completion)
            }
        }
    };
}

fixed_opcode!(
    transfer_sync_write(buffer, peer_buffer_address, length: Unsigned),
    Opcode::Write,
    Completion::Wait(None)
);
fixed_opcode!(
    transfer_sync_read(buffer, peer_buffer_address, length: Unsigned),
    Opcode::Read,
    Completion::Wait(None)
);
fixed_opcode!(
    /// Starts one write and returns its batch id (0 on failure); poll it
    /// with `transfer_check_status`.
    transfer_submit_write(buffer, peer_buffer_address, length: Unsigned),
    Opcode::Write,
    Completion::Submit
);
fixed_opcode!(
    batch_transfer_sync_write(buffers, peer_buffer_addresses, lengths: Vec<Unsigned>),
    Opcode::Write,
    Completion::Wait(None)
);
fixed_opcode!(
    batch_transfer_sync_read(buffers, peer_buffer_addresses, lengths: Vec<Unsigned>),
    Opcode::Read,
    Completion::Wait(None)
);
fixed_opcode!(
    batch_transfer_async_write(buffers, peer_buffer_addresses, lengths: Vec<Unsigned>),
    Opcode::Write,
    Completion::Submit
);
fixed_opcode!(
    batch_transfer_async_read(buffers, peer_buffer_addresses, lengths: Vec<Unsigned>),
    Opcode::Read,
    Completion::Submit
);

/// The methods that take the opcode (and a notification) from Python.
#[pymethods]
impl PyEngine {
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: Unsigned,
        peer_buffer_address: Unsigned,
        length: Unsigned,
        opcode: PyOpcode,
        notify: Option<PyRef<'_, PyNotify>>,
        transport_hint: &str,
    ) -> i64 {
        note_hint(transport_hint);
        let ranges = Ranges::from((buffer, peer_buffer_address, length));
        self.transfer(py, target_hostname, opcode.into(), ranges, wait(notify))
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Unsigned>,
        peer_buffer_addresses: Vec<Unsigned>,
        lengths: Vec<Unsigned>,
        opcode: PyOpcode,
        notify: Option<PyRef<'_, PyNotify>>,
        transport_hint: &str,
    ) -> i64 {
        note_hint(transport_hint);
        let ranges = Ranges::from((buffers, peer_buffer_addresses, lengths));
        self.transfer(py, target_hostname, opcode.into(), ranges, wait(notify))
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Unsigned>,
        peer_buffer_addresses: Vec<Unsigned>,
        lengths: Vec<Unsigned>,
        opcode: PyOpcode,
        transport_hint: &str,
    ) -> i64 {
        note_hint(transport_hint);
        let ranges = Ranges::from((buffers, peer_buffer_addresses, lengths));
        self.transfer(
            py,
            target_hostname,
            opcode.into(),
            ranges,
            Completion::Submit,
        )
    }

    /// 1 completed, 0 still running, -1 failed, -2 timed out.
    fn transfer_check_status(&self, py: Python<'_>, batch_id: Unsigned) -> i32 {
        self.ready.with(py, -1, |r| r.check(batch_id.0))
    }

    /// Waits for every batch in `batch_ids`; 0 when all completed, -1 when any
    /// failed, timed out or is unknown. Each batch is freed.
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<Unsigned>) -> i32 {
        self.ready.with(py, -1, |r| {
            // Wait for all of them even after a failure, so none is left behind.
            let mut ok = true;
            for id in &batch_ids {
                ok &= r.wait(id.0);
            }
            if ok {
                0
            } else {
                -1
            }
        })
    }
}
