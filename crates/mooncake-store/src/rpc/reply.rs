//! Answers written by another thread than the connection's.
//!
//! A call whose answer waits for another thread's work (a replicated
//! master's commit, a new log entry for a standby's pull) can be handed to
//! that thread as a [`Reply`]: the thread that makes the answer possible
//! writes it, instead of waking the connection's thread to write it (on a
//! VM a wake-up costs tens of microseconds). The connection's thread goes
//! back to reading meanwhile, but serves the connection's next call only
//! once the pending answer is written, so answers keep the calls' order.

use std::io::{self, Write};
use std::sync::Arc;

use mooncake_common::Error;
use parking_lot::{Condvar, Mutex};

use super::server::Handler;
use super::stream::Stream;
use crate::proto::frame::encode_frame;

/// The socket as a [`Reply`] writes it.
trait Wire: Write + Send {
    fn shut(&self);
}

impl<S: Stream> Wire for S {
    fn shut(&self) {
        let _ = Stream::shutdown(self);
    }
}

struct Shared {
    /// A second handle on the connection's socket.
    wire: Mutex<Box<dyn Wire>>,
    /// An answer is owed by a [`Reply`].
    pending: Mutex<bool>,
    written: Condvar,
}

/// One connection's side: hands out [`Reply`]s and waits for them.
pub(crate) struct Outbox {
    shared: Arc<Shared>,
}

impl Outbox {
    pub(crate) fn new<S: Stream>(stream: &S) -> io::Result<Outbox> {
        Ok(Outbox {
            shared: Arc::new(Shared {
                wire: Mutex::new(Box::new(stream.try_clone()?)),
                pending: Mutex::new(false),
                written: Condvar::new(),
            }),
        })
    }

    /// Waits until the answer a [`Reply`] owes is written (or given up).
    pub(crate) fn settle(&self) {
        let mut pending = self.shared.pending.lock();
        while *pending {
            self.shared.written.wait(&mut pending);
        }
    }

    /// The call being served is answered later, through the returned
    /// [`Reply`].
    pub(crate) fn later(&self) -> Later<'_> {
        Later { outbox: self }
    }
}

/// What a handler gets to answer its call later instead of now.
pub(crate) struct Later<'a> {
    outbox: &'a Outbox,
}

impl Later<'_> {
    /// Takes over the answer: the handler then returns none, and the
    /// connection's next call waits until this one is answered.
    pub(crate) fn take(self) -> Reply {
        *self.outbox.shared.pending.lock() = true;
        Reply {
            shared: Some(self.outbox.shared.clone()),
        }
    }
}

/// An answer owed to a connection's pending call. Dropped unsent, it
/// closes the connection (the caller sees it lost, as with a master gone),
/// so that no caller waits forever.
pub(crate) struct Reply {
    shared: Option<Arc<Shared>>,
}

impl Reply {
    /// Writes `resp` as the call's answer (`handler`'s failure instead
    /// when it does not encode, as the connection's thread would).
    pub(crate) fn send<H: Handler>(mut self, handler: &H, resp: &H::Response) {
        let mut out = Vec::with_capacity(256);
        let encoded = encode_frame(resp, &mut out).or_else(|e| {
            out.clear();
            let error = Error::new(H::OVERSIZED_ANSWER, e.to_string());
            encode_frame(&handler.failure(error), &mut out)
        });
        self.finish(encoded.ok().map(|()| &out[..]));
    }

    fn finish(&mut self, frame: Option<&[u8]>) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        {
            let mut wire = shared.wire.lock();
            let written = frame.is_some_and(|f| wire.write_all(f).is_ok());
            if !written {
                wire.shut();
            }
        }
        *shared.pending.lock() = false;
        shared.written.notify_one();
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.finish(None);
    }
}
