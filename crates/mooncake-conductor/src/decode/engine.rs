//! vLLM's and SGLang's events (`vllm/distributed/kv_events.py`,
//! SGLang's `disaggregation/kv_events.py`): msgspec structs tagged with
//! their class name, encoded as arrays `[tag, field, ...]` (trailing
//! defaults omitted) or, in newer vLLM, as maps with a `type` key.

use rmpv::ValueRef;

use super::*;
use crate::event::{lora_from_id, Event, Medium, Removed, Stored};

/// vLLM's `BlockStored` fields in declaration order (11, 12 with the tag).
const VLLM_STORED: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];
const VLLM_REMOVED: &[&str] = &[
    "block_hashes",
    "medium",
    "group_idx",
    "remaining_copy_counts",
];
/// SGLang's `BlockStored` (and `BlockStoredWithMetadata`, whose `metadata`
/// carries the request's `cache_salt`).
const SGLANG_STORED: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "metadata",
];
const SGLANG_REMOVED: &[&str] = &["block_hashes", "medium"];

/// One event's fields, positional or by name.
struct Fields<'a> {
    v: &'a ValueRef<'a>,
    names: &'static [&'static str],
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a ValueRef<'a>> {
        match self.v {
            ValueRef::Array(items) => {
                let pos = self.names.iter().position(|n| *n == name)?;
                items.get(pos + 1)
            }
            _ => map_get(self.v, name),
        }
    }
}

/// `None`: malformed; `Some(None)`: well-formed but not for the index.
pub(super) fn event(kind: Kind, v: &ValueRef<'_>) -> Option<Option<Event>> {
    let tag = match v {
        ValueRef::Array(items) => as_str(items.first()?)?,
        ValueRef::Map(_) => as_str(map_get(v, "type")?)?,
        _ => return None,
    };
    let sglang = kind == Kind::Sglang;
    let (stored, removed) = if sglang {
        (SGLANG_STORED, SGLANG_REMOVED)
    } else {
        (VLLM_STORED, VLLM_REMOVED)
    };
    match tag {
        "BlockStored" => stored_event(&Fields { v, names: stored }),
        "BlockRemoved" => removed_event(&Fields { v, names: removed }),
        "AllBlocksCleared" => Some(Some(Event::Cleared)),
        _ => None,
    }
}

/// Only the first KV-cache group is indexed: a hybrid model's other
/// groups (sliding windows) hold the same hashes for shorter spans, and
/// their evictions would otherwise erase blocks the full-attention group
/// still holds.
fn other_group(f: &Fields<'_>) -> Option<bool> {
    Some(as_opt_i64(f.get("group_idx"))?.is_some_and(|g| g != 0))
}

fn medium(f: &Fields<'_>) -> Option<Medium> {
    match as_opt_str(f.get("medium"))? {
        None => Some(Medium::Gpu),
        Some(m) => Medium::parse(&m),
    }
}

fn stored_event(f: &Fields<'_>) -> Option<Option<Event>> {
    let hashes = as_hashes(f.get("block_hashes")?)?;
    let parent = as_opt_hash(f.get("parent_block_hash"))?;
    let tokens = as_tokens(f.get("token_ids"))?;
    let block_size = as_opt_u32(f.get("block_size"))?;
    let lora_id = as_opt_i64(f.get("lora_id"))?;
    let lora_name = as_opt_str(f.get("lora_name"))?;
    let medium = medium(f)?;
    let salt = match f.get("metadata") {
        None | Some(ValueRef::Nil) => None,
        Some(m @ ValueRef::Map(_)) => as_opt_str(map_get(m, "cache_salt"))?,
        Some(_) => return None,
    };
    if other_group(f)? {
        return Some(None);
    }
    let lora = lora_name
        .filter(|n| !n.is_empty())
        .or_else(|| lora_id.and_then(lora_from_id));
    Some(Some(Event::Stored(Stored {
        hashes,
        parent,
        tokens,
        block_size,
        medium,
        lora,
        salt,
        tenant: None,
    })))
}

fn removed_event(f: &Fields<'_>) -> Option<Option<Event>> {
    let hashes = as_hashes(f.get("block_hashes")?)?;
    let medium = medium(f)?;
    if other_group(f)? {
        return Some(None);
    }
    Some(Some(Event::Removed(Removed {
        hashes,
        medium,
        tenant: None,
    })))
}
