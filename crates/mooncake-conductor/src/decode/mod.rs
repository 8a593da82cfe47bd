//! Decoders of the publishers' batches: pure functions from bytes to
//! `event::Batch` that never panic (fuzzed: `fuzz/fuzz_targets/kv_event_batch.rs`).
//!
//! Every publisher sends ZMQ messages `[topic, seq (8 bytes, big-endian),
//! payload]` whose payload is one msgpack batch; the batches differ:
//! - vLLM and SGLang (`engine.rs`): msgspec structs, the batch an array
//!   `[ts, events, dp_rank]` (or a map with `ts`, `events`,
//!   `data_parallel_rank`), each event a tagged array `[tag, fields...]` or a
//!   map tagged by its `type` key;
//! - the Mooncake master and other publishers of the standard's events
//!   (`standard.rs`): `[ts, [event maps], dp_rank]`, each map keyed by
//!   `event_type`.
//!
//! A payload that is not a batch is an error; an event inside that does not
//! decode is counted in `Batch::malformed` and skipped.

mod engine;
mod standard;
#[cfg(test)]
mod tests;

use rmpv::ValueRef;

use crate::event::Batch;
use crate::index::Kind;

/// Nesting deeper than any publisher's batch (batch → events → event →
/// field → metadata) is refused rather than recursed into.
const MAX_DEPTH: usize = 16;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("payload is not msgpack: {0}")]
    NotMsgpack(String),
    #[error("payload has {0} trailing bytes after the batch")]
    Trailing(usize),
    #[error("not an event batch: {0}")]
    NotABatch(&'static str),
}

/// Decodes one payload of a publisher of `kind`.
pub fn decode_batch(kind: Kind, payload: &[u8]) -> Result<Batch, DecodeError> {
    let mut rd = payload;
    let v = rmpv::decode::read_value_ref_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| DecodeError::NotMsgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(DecodeError::Trailing(rd.len()));
    }
    let (events, dp_rank) = envelope(&v)?;
    let mut batch = Batch {
        dp_rank,
        ..Batch::default()
    };
    for ev in events {
        let decoded = match kind {
            Kind::Vllm | Kind::Sglang => engine::event(kind, ev),
            Kind::Mooncake => standard::event(ev),
        };
        match decoded {
            Some(Some(e)) => batch.events.push(e),
            // An event the index has no use for (another KV-cache group).
            Some(None) => {}
            None => batch.malformed += 1,
        }
    }
    Ok(batch)
}

/// The batch's events and data-parallel rank.
fn envelope<'a>(v: &'a ValueRef<'a>) -> Result<(&'a [ValueRef<'a>], Option<i64>), DecodeError> {
    let (events, dp) = match v {
        ValueRef::Array(items) => {
            if items.len() < 2 || items.len() > 4 {
                return Err(DecodeError::NotABatch("an array batch has 2 or 3 items"));
            }
            (&items[1], items.get(2))
        }
        ValueRef::Map(_) => (
            map_get(v, "events").ok_or(DecodeError::NotABatch("a map batch needs `events`"))?,
            map_get(v, "data_parallel_rank").or_else(|| map_get(v, "attn_dp_rank")),
        ),
        _ => return Err(DecodeError::NotABatch("neither an array nor a map")),
    };
    let ValueRef::Array(events) = events else {
        return Err(DecodeError::NotABatch("`events` is not an array"));
    };
    let dp = match dp {
        None | Some(ValueRef::Nil) => None,
        Some(v) => Some(as_i64(v).ok_or(DecodeError::NotABatch("the dp rank is not an integer"))?),
    };
    Ok((events, dp))
}

/// The value of string key `key` in a map.
pub(crate) fn map_get<'a>(v: &'a ValueRef<'a>, key: &str) -> Option<&'a ValueRef<'a>> {
    let ValueRef::Map(entries) = v else {
        return None;
    };
    entries
        .iter()
        .find(|(k, _)| as_str(k) == Some(key))
        .map(|(_, v)| v)
}

pub(crate) fn as_str<'a>(v: &'a ValueRef<'a>) -> Option<&'a str> {
    match v {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}

pub(crate) fn as_i64(v: &ValueRef<'_>) -> Option<i64> {
    match v {
        ValueRef::Integer(i) => i.as_i64(),
        _ => None,
    }
}

pub(crate) fn as_u32(v: &ValueRef<'_>) -> Option<u32> {
    match v {
        ValueRef::Integer(i) => i.as_u64().and_then(|n| u32::try_from(n).ok()),
        _ => None,
    }
}

/// A block hash: an unsigned or signed 64-bit integer (SGLang's are signed;
/// their bits are the hash), or bytes (vLLM's SHA-256 hashes), of which the
/// last 8 big-endian, as vLLM itself turns them into integers.
pub(crate) fn as_hash(v: &ValueRef<'_>) -> Option<u64> {
    match v {
        ValueRef::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|n| n as u64)),
        ValueRef::Binary(b) if !b.is_empty() => {
            let tail = &b[b.len().saturating_sub(8)..];
            Some(tail.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
        }
        _ => None,
    }
}

pub(crate) fn as_hashes(v: &ValueRef<'_>) -> Option<Vec<u64>> {
    let ValueRef::Array(items) = v else {
        return None;
    };
    items.iter().map(as_hash).collect()
}

/// `nil` → `Some(None)`; a hash → `Some(Some(h))`; anything else → `None`.
pub(crate) fn as_opt_hash(v: Option<&ValueRef<'_>>) -> Option<Option<u64>> {
    match v {
        None | Some(ValueRef::Nil) => Some(None),
        Some(v) => as_hash(v).map(Some),
    }
}

pub(crate) fn as_tokens(v: Option<&ValueRef<'_>>) -> Option<Vec<u32>> {
    match v {
        None | Some(ValueRef::Nil) => Some(Vec::new()),
        Some(ValueRef::Array(items)) => items.iter().map(as_u32).collect(),
        Some(_) => None,
    }
}

/// `nil` or absent → `Some(None)`; a string → `Some(Some(s))`.
pub(crate) fn as_opt_str(v: Option<&ValueRef<'_>>) -> Option<Option<String>> {
    match v {
        None | Some(ValueRef::Nil) => Some(None),
        Some(v) => as_str(v).map(|s| Some(s.to_string())),
    }
}

pub(crate) fn as_opt_u32(v: Option<&ValueRef<'_>>) -> Option<Option<u32>> {
    match v {
        None | Some(ValueRef::Nil) => Some(None),
        Some(v) => as_u32(v).map(Some),
    }
}

pub(crate) fn as_opt_i64(v: Option<&ValueRef<'_>>) -> Option<Option<i64>> {
    match v {
        None | Some(ValueRef::Nil) => Some(None),
        Some(v) => as_i64(v).map(Some),
    }
}
