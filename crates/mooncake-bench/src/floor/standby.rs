//! A floor standby (process B or C): the follower's pull loop without a
//! state machine. One pull outstanding on the leader, with a standby's
//! client options; an answer's entries are decoded and counted, and the
//! next pull (their acknowledgement) goes out at once.

use std::net::SocketAddr;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};

use super::model::TERM;
use mooncake_store::master::durable::oplog::decode_prefix;
use mooncake_store::master::ha::follower::{pull_options, spin_window};
use mooncake_store::proto::frame::{decode_payload, encode_frame};
use mooncake_store::proto::{Request, Response};
use mooncake_store::rpc::{connect_any, Connection};

/// How long a pull may be held when the leader has nothing new (the
/// master's default poll interval).
const POLL: Duration = Duration::from_secs(1);
/// Longest a pull may wait for its answer.
const IDLE_LIMIT: Duration = Duration::from_secs(3600);

/// Follows the floor leader at `leader` as standby `id` until the
/// connection fails (the leader stopped).
pub fn run_standby(leader: SocketAddr, id: &str) -> Result<()> {
    let rpc = |e: std::io::Error| Error::new(ErrorCode::RPC_FAIL, format!("floor standby: {e}"));
    let mut opts = pull_options(POLL);
    // A direct leader answers only when it has entries, however long
    // that takes; the timeout is never on the measured path.
    opts.call_timeout = IDLE_LIMIT;
    let stream = connect_any(&[leader], opts.connect_timeout).map_err(rpc)?;
    let mut conn = Connection::new(stream, &opts).map_err(rpc)?;
    let mut frame = Vec::new();
    let mut after = 0u64;
    let spin = spin_window();
    loop {
        frame.clear();
        let pull = Request::ReplicationPull {
            standby: id,
            after,
            after_term: TERM,
            applied: after,
            max: 1024,
            wait_ms: POLL.as_millis() as u32,
        };
        encode_frame(&pull, &mut frame).map_err(rpc)?;
        conn.send(&frame).map_err(rpc)?;
        let payload = conn.receive(spin).map_err(rpc)?;
        let frames = match decode_payload::<Response>(payload)? {
            Response::Entries { frames, .. } => frames,
            Response::Failed { error } => return Err(error),
            other => {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("unexpected answer {} to a pull", other.name()),
                ))
            }
        };
        let mut rest = &frames.0[..];
        while !rest.is_empty() {
            let (entry, used) = decode_prefix(rest).map_err(|e| {
                Error::new(
                    ErrorCode::DESERIALIZE_FAIL,
                    format!("entry from leader: {e}"),
                )
            })?;
            if entry.seq != after + 1 {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("entry {} after {after}", entry.seq),
                ));
            }
            after = entry.seq;
            rest = &rest[used..];
        }
    }
}
