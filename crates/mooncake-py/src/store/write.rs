//! Puts and upserts: the one switch between the store's twin write calls,
//! and the placement a `ReplicateConfig` asks for.

use mooncake_common::Error;
use mooncake_store::types;
use mooncake_store::Client;
use pyo3::prelude::*;

use crate::codes::INVALID;
use crate::config::ReplicateConfig;

/// Whether a write may replace an existing object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Write {
    /// First write wins: an existing key keeps its value.
    Put,
    /// The new value replaces the old.
    Upsert,
}

impl Write {
    pub(super) fn of(upsert: bool) -> Write {
        if upsert {
            Write::Upsert
        } else {
            Write::Put
        }
    }

    pub(super) fn parts(
        self,
        c: &Client,
        key: &str,
        parts: &[&[u8]],
        cfg: &types::ReplicateConfig,
    ) -> Written {
        match self {
            Write::Put => c.put_parts(key, parts, cfg),
            Write::Upsert => c.upsert_parts(key, parts, cfg),
        }
    }

    pub(super) fn values(
        self,
        c: &Client,
        keys: &[String],
        values: &[&[u8]],
        cfg: &types::ReplicateConfig,
    ) -> WrittenEach {
        match self {
            Write::Put => c.put_batch(keys, values, cfg),
            Write::Upsert => c.upsert_batch(keys, values, cfg),
        }
    }

    pub(super) fn from(
        self,
        c: &Client,
        key: &str,
        addr: usize,
        size: usize,
        cfg: &types::ReplicateConfig,
    ) -> Written {
        match self {
            Write::Put => c.put_from(key, addr, size, cfg),
            Write::Upsert => c.upsert_from(key, addr, size, cfg),
        }
    }

    pub(super) fn batch_from(
        self,
        c: &Client,
        keys: &[String],
        addrs: &[usize],
        sizes: &[usize],
        cfg: &types::ReplicateConfig,
    ) -> WrittenEach {
        match self {
            Write::Put => c.batch_put_from(keys, addrs, sizes, cfg),
            Write::Upsert => c.batch_upsert_from(keys, addrs, sizes, cfg),
        }
    }
}

/// What a write of one object answers.
type Written = Result<(), Error>;
/// What a batch write answers: per key, or a failure of the whole batch.
type WrittenEach = Result<Vec<Written>, Error>;

/// The store's placement settings for a put (`None`: one replica anywhere);
/// a config asking for no replica at all is INVALID_PARAMS.
pub(super) fn placement(
    cfg: Option<PyRef<'_, ReplicateConfig>>,
) -> Result<types::ReplicateConfig, i32> {
    let Some(c) = cfg else {
        return Ok(types::ReplicateConfig {
            replica_num: 1,
            ..Default::default()
        });
    };
    if c.replica_num == 0 {
        return Err(INVALID);
    }
    Ok(types::ReplicateConfig {
        replica_num: c.replica_num as usize,
        with_soft_pin: c.soft_pin_action == crate::enums::SoftPinAction::ENABLE,
        with_hard_pin: c.with_hard_pin,
        preferred_segment: c.preferred_segment.clone(),
        preferred_segments: c.preferred_segments.clone(),
        prefer_alloc_in_same_node: c.prefer_alloc_in_same_node,
    })
}
