//! The write command of a Python call: the placement a `ReplicateConfig`
//! asks for and whether the call upserts, passed to the store as one
//! [`WriteOptions`].

use mooncake_store::types::{self, WriteOptions};
use pyo3::prelude::*;

use crate::codes::INVALID;
use crate::config::ReplicateConfig;

/// Whether a call takes `ReplicateConfig.prefer_alloc_in_same_node` (the
/// writer's host first), as the reference's calls do: the multi-buffer put
/// with one replica, put sessions and the tensor writes take it; the other
/// byte and zero-copy writes refuse it with INVALID_PARAMS ("not
/// supported").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SameNode {
    Refused,
    OneReplica,
    Accepted,
}

/// A put (`upsert` false) or an upsert with the placement `cfg` asks for
/// (`None`: one replica anywhere); a config asking for no replica at all,
/// a soft-pin TTL without `SoftPinAction.ENABLE`, or a same-node placement
/// the call does not take (`same_node`), is INVALID_PARAMS.
pub(super) fn write_options(
    cfg: Option<PyRef<'_, ReplicateConfig>>,
    upsert: bool,
    same_node: SameNode,
) -> Result<WriteOptions, i32> {
    let Some(c) = cfg else {
        return Ok(WriteOptions {
            config: types::ReplicaPolicy {
                replica_num: 1,
                ..Default::default()
            },
            upsert,
        });
    };
    if c.replica_num == 0 {
        return Err(INVALID);
    }
    // A soft-pin TTL without the action that pins: the reference's master
    // refuses such a put or upsert.
    if c.soft_pin_ttl_ms.is_some() && c.soft_pin_action != crate::enums::SoftPinAction::ENABLE {
        return Err(INVALID);
    }
    if c.prefer_alloc_in_same_node {
        match same_node {
            SameNode::Refused => return Err(INVALID),
            SameNode::OneReplica if c.replica_num != 1 => return Err(INVALID),
            _ => {}
        }
    }
    let config = types::ReplicaPolicy {
        replica_num: c.replica_num as usize,
        with_soft_pin: c.soft_pin_action == crate::enums::SoftPinAction::ENABLE,
        with_hard_pin: c.with_hard_pin,
        preferred_segment: c.preferred_segment.clone(),
        preferred_segments: c.preferred_segments.clone(),
        prefer_alloc_in_same_node: c.prefer_alloc_in_same_node,
        group_ids: c.group_ids.clone(),
    };
    Ok(WriteOptions { config, upsert })
}
