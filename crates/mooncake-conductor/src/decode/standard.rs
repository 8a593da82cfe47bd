//! The standard's events (the reference's RFC #1527), as the Mooncake
//! master publishes them (`docs/kv-events.md`): maps keyed by
//! `event_type` (`stored`, `removed`, `cleared`), hashes in `seq_hashes`
//! (or the legacy `block_hashes`), the tier in `medium`.

use rmpv::ValueRef;

use super::*;
use crate::event::{Event, Medium, Removed, Stored};

pub(super) fn event(v: &ValueRef<'_>) -> Option<Option<Event>> {
    if !matches!(v, ValueRef::Map(_)) {
        return None;
    }
    let get = |k: &str| map_get(v, k);
    let ty = match get("event_type") {
        Some(t) => as_str(t)?,
        None => match as_str(get("type")?)? {
            "BlockStored" => "stored",
            "BlockRemoved" => "removed",
            "AllBlocksCleared" => "cleared",
            _ => return None,
        },
    };
    let hashes = || match get("seq_hashes").or_else(|| get("block_hashes")) {
        None | Some(ValueRef::Nil) => Some(Vec::new()),
        Some(h) => as_hashes(h),
    };
    let medium = || Medium::parse(as_str(get("medium")?)?);
    match ty {
        "stored" => {
            let parent = as_opt_hash(get("parent_hash").or_else(|| get("parent_block_hash")))?;
            Some(Some(Event::Stored(Stored {
                hashes: hashes()?,
                parent,
                tokens: as_tokens(get("token_ids"))?,
                block_size: as_opt_u32(get("block_size"))?,
                medium: medium()?,
                lora: as_opt_str(get("lora_name"))?.filter(|l| !l.is_empty()),
                salt: as_opt_str(get("additional_salt"))?,
                tenant: as_opt_str(get("tenant_id"))?,
            })))
        }
        "removed" => Some(Some(Event::Removed(Removed {
            hashes: hashes()?,
            medium: medium()?,
            tenant: as_opt_str(get("tenant_id"))?,
        }))),
        "cleared" => Some(Some(Event::Cleared)),
        _ => None,
    }
}
