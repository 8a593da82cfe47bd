//! The target is this engine's own segment: a plain memcpy.

use crate::transport::{OpenSegment, Route, Transport, Work};
use crate::Opcode;
use crate::{memcopy, rawmem};

pub(crate) struct LocalTransport;

impl Transport for LocalTransport {
    fn name(&self) -> &'static str {
        "local"
    }

    fn route(&self, segment: &OpenSegment) -> Option<Box<dyn Route>> {
        segment
            .is_local
            .then(|| Box::new(LocalRoute) as Box<dyn Route>)
    }
}

struct LocalRoute;

impl Route for LocalRoute {
    fn serves(&self, _remote: u64, _len: usize) -> bool {
        true
    }

    fn submit(&self, work: Vec<Work>) {
        for w in work {
            w.task.expect_slices(1);
            let remote = w.remote as usize;
            // SAFETY: the engine checked both ranges against this engine's
            // registry before submitting (`remote` is our own address).
            unsafe {
                match w.opcode {
                    Opcode::Read => rawmem::copy(w.local, remote, w.len),
                    Opcode::Write => {
                        memcopy::copy_to_segment(remote as *mut u8, w.local as *const u8, w.len)
                    }
                }
            };
            w.task.slice_done(Ok(w.len));
        }
    }
}
