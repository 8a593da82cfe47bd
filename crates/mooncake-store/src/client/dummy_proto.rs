//! Messages between a dummy client and the real client (`mooncake_client`)
//! on the same host, in the master protocol's encoding and framing.
//!
//! Memory is named by [`Span`]s: offsets into the region the dummy shared
//! at [`DummyRequest::Hello`]. Only metadata crosses the socket; object
//! bytes are read and written in that region by the real client.
//!
//! The service listens on TCP (`--host`, `--port`) and on the Unix socket
//! [`local_socket_name`] in the abstract namespace; both speak this protocol.

use mooncake_common::{Error, ErrorCode, Result};

use crate::proto::messages::wire_enum;
use crate::proto::wire::{wire_struct, Decode, DecodeError, Encode, Reader};
use crate::types::{ClientId, ReplicaDesc, ReplicaPolicy, TaskId, TaskInfo};

/// The abstract Unix socket (shown as `@mooncake_client_<port>.sock`, the
/// reference's name for it) of the service whose TCP port is `port`.
/// Abstract: it lives in the network namespace like the TCP port, and leaves
/// no file behind a crashed service.
pub fn local_socket_name(port: u16) -> String {
    format!("mooncake_client_{port}.sock")
}

/// `len` bytes at `off` in the shared region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub off: u64,
    pub len: u64,
}
wire_struct!(Span { off, len });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteItem {
    pub key: String,
    pub parts: Vec<Span>,
}
wire_struct!(WriteItem { key, parts });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadItem {
    pub key: String,
    pub dests: Vec<Span>,
}
wire_struct!(ReadItem { key, dests });

/// One fragment of a ranged read into the buffer `buffer`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeItem {
    pub buffer: Span,
    pub key: String,
    pub dst_off: u64,
    pub src_off: u64,
    pub len: u64,
}
wire_struct!(RangeItem {
    buffer,
    key,
    dst_off,
    src_off,
    len
});

wire_enum! {
    /// A dummy client's call.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum DummyRequest {
        /// First call of a dummy: map the sealed memfd `shm_name` that
        /// process `pid` holds as `fd`.
        1 => Hello { shm_name: String, region_len: u64, pid: u32, fd: i32 },
        /// Further connections of the same dummy join its session.
        2 => Attach { session: u64 },
        3 => Write { upsert: bool, config: ReplicaPolicy, items: Vec<WriteItem> },
        4 => ReadInto { items: Vec<ReadItem> },
        5 => ReadRanges { items: Vec<RangeItem> },
        6 => GetSize { keys: Vec<String> },
        7 => IsExist { keys: Vec<String> },
        8 => Remove { keys: Vec<String>, force: bool },
        9 => RemoveByRegex { pattern: String, force: bool },
        10 => RemoveAll { force: bool },
        11 => ReplicaDesc { keys: Vec<String> },
        12 => Health {},
        13 => CreateCopyTask { key: String, targets: Vec<String> },
        14 => CreateMoveTask { key: String, source: String, target: String },
        15 => QueryTask { id: TaskId },
        16 => BatchReplicaClear { keys: Vec<String>, segment_name: String },
        /// Presents the cluster token: with one configured, the first call
        /// of every connection. Answered `Unit`.
        17 => Authenticate { token: String },
    }
}

wire_enum! {
    /// The real client's answer.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum DummyResponse {
        1 => Session { session: u64, client_id: ClientId, hostname: String },
        2 => Unit { result: Result<()> },
        3 => Units { result: Result<Vec<Result<()>>> },
        4 => Counts { result: Result<Vec<Result<u64>>> },
        5 => Bools { result: Result<Vec<Result<bool>>> },
        6 => Count { result: Result<u64> },
        7 => Replicas { result: Result<Vec<Result<Vec<ReplicaDesc>>>> },
        8 => Task { result: Result<TaskId> },
        9 => TaskState { result: Result<TaskInfo> },
        10 => Keys { result: Result<Vec<String>> },
    }
}

/// Turns an unexpected answer into an error.
pub(crate) fn unexpected(resp: &DummyResponse) -> Error {
    Error::new(
        ErrorCode::RPC_FAIL,
        format!("unexpected answer {}", resp.name()),
    )
}

/// A batch call's inputs, as either end of the protocol splits them: the
/// items that could be prepared (each with what it keeps until the answer)
/// and every input's result slot (an error for those that could not).
pub(crate) struct Batch<I, K, T> {
    items: Vec<I>,
    /// The input of each item.
    owners: Vec<usize>,
    kept: Vec<K>,
    results: Vec<Result<T>>,
}

impl<I, K, T: Default> Batch<I, K, T> {
    pub(crate) fn prepare(inputs: impl IntoIterator<Item = Result<(I, K)>>) -> Self {
        let mut b = Batch {
            items: Vec::new(),
            owners: Vec::new(),
            kept: Vec::new(),
            results: Vec::new(),
        };
        for (i, input) in inputs.into_iter().enumerate() {
            match input {
                Ok((item, keep)) => {
                    b.items.push(item);
                    b.owners.push(i);
                    b.kept.push(keep);
                    b.results.push(Ok(T::default()));
                }
                Err(e) => b.results.push(Err(e)),
            }
        }
        b
    }

    /// Runs `call` on the prepared items (not at all when there are none)
    /// and spreads its answers over their inputs' results; a failed call or
    /// an answer of the wrong length fails every item. Returns every
    /// input's result and, per item, its input's index and what it kept.
    pub(crate) fn finish(
        self,
        call: impl FnOnce(Vec<I>) -> Result<Vec<Result<T>>>,
    ) -> (Vec<Result<T>>, Vec<(usize, K)>) {
        let Batch {
            items,
            owners,
            kept,
            mut results,
        } = self;
        if !items.is_empty() {
            let n = items.len();
            let answer = call(items).and_then(|v| {
                if v.len() == n {
                    return Ok(v);
                }
                Err(Error::new(
                    ErrorCode::RPC_FAIL,
                    format!("answer for {} of {n} items", v.len()),
                ))
            });
            match answer {
                Ok(v) => {
                    for (r, &i) in v.into_iter().zip(&owners) {
                        results[i] = r;
                    }
                }
                Err(e) => {
                    for &i in &owners {
                        results[i] = Err(e.clone());
                    }
                }
            }
        }
        (results, owners.into_iter().zip(kept).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::frame::{decode_payload, encode_frame, LEN_PREFIX};

    #[test]
    fn round_trips() {
        let req = DummyRequest::Write {
            upsert: true,
            config: ReplicaPolicy {
                replica_num: 2,
                ..Default::default()
            },
            items: vec![WriteItem {
                key: "k".into(),
                parts: vec![Span { off: 4096, len: 10 }],
            }],
        };
        let mut frame = Vec::new();
        encode_frame(&req, &mut frame).unwrap();
        assert_eq!(
            decode_payload::<DummyRequest>(&frame[LEN_PREFIX..]).unwrap(),
            req
        );
        let hello = DummyRequest::Hello {
            shm_name: "mooncake-dummy-1-2".into(),
            region_len: 1 << 20,
            pid: 4242,
            fd: 17,
        };
        assert_eq!(DummyRequest::from_bytes(&hello.to_bytes()).unwrap(), hello);
        let resp = DummyResponse::Counts {
            result: Ok(vec![
                Ok(5),
                Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "k")),
            ]),
        };
        let bytes = resp.to_bytes();
        assert_eq!(DummyResponse::from_bytes(&bytes).unwrap(), resp);
    }

    #[test]
    fn rejects_garbage() {
        assert!(DummyRequest::from_bytes(&[99]).is_err());
        assert!(DummyRequest::from_bytes(&[1, 200]).is_err());
        assert!(DummyRequest::from_bytes(&[]).is_err());
        let mut ok = DummyRequest::Health {}.to_bytes();
        ok.push(0);
        assert!(DummyRequest::from_bytes(&ok).is_err(), "trailing byte");
    }
}
