//! The catalog's records, in the reference's JSON shape (`metadata.go`), and
//! the pure operations on them: cutting buffers into shards, adding and
//! removing a holder. No I/O.
//!
//! One key per payload, `mooncake/checkpoint/<name>`, whose value is:
//!
//! ```json
//! {"name": "foo/bar", "size": 2147483648, "size_list": [2147483648],
//!  "max_shard_size": 67108864,
//!  "shards": [{"size": 67108864,
//!              "gold": [{"segment_name": "10.0.0.2:12345", "offset": 140000000000}],
//!              "replica_list": [{"segment_name": "10.0.0.3:12346", "offset": 139000000000}]},
//!             ...]}
//! ```
//!
//! `gold` holds the publisher's copy, `replica_list` the consumers' copies;
//! `offset` is the holder's virtual address, which its engine registered.

use serde::{Deserialize, Serialize};

use crate::error::{P2pError, Result};

/// Prefix of every payload key, as the reference's `METADATA_KEY_PREFIX`.
pub const KEY_PREFIX: &str = "mooncake/checkpoint/";

/// Largest shard: the reference registers memory in chunks of this size
/// and requires the shard size to divide it.
pub const MAX_CHUNK_SIZE: u64 = 4096 * 1024 * 1024;

/// The shard size the reference's example and docs recommend.
pub const DEFAULT_SHARD_SIZE: u64 = 64 * 1024 * 1024;

pub fn payload_key(name: &str) -> String {
    format!("{KEY_PREFIX}{name}")
}

/// Where one copy of a shard lives: a segment (engine) and the address in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Location {
    pub segment_name: String,
    pub offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    #[serde(rename = "size")]
    pub length: u64,
    /// Go writes an empty list as `null`.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub gold: Vec<Location>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub replica_list: Vec<Location>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    pub name: String,
    pub size: u64,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub size_list: Vec<u64>,
    pub max_shard_size: u64,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub shards: Vec<Shard>,
}

/// What `List` reports of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadInfo {
    pub name: String,
    pub max_shard_size: u64,
    pub total_size: u64,
    pub size_list: Vec<u64>,
}

fn null_as_empty<'de, D, T>(d: D) -> std::result::Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// One shard of a caller's buffers: which buffer, where in it, how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub addr: u64,
    pub length: u64,
}

/// Checks a buffer list and shard size as `Register` and `GetReplica` take
/// them. The shard size must be a power of two dividing [`MAX_CHUNK_SIZE`],
/// as the reference requires.
pub fn check_buffers(buffers: &[(u64, u64)], max_shard_size: u64) -> Result<()> {
    if buffers.is_empty() {
        return Err(P2pError::invalid("no buffers given"));
    }
    if max_shard_size == 0
        || !max_shard_size.is_power_of_two()
        || !MAX_CHUNK_SIZE.is_multiple_of(max_shard_size)
    {
        return Err(P2pError::invalid(format!(
            "max shard size {max_shard_size} is not a power of two of at most {MAX_CHUNK_SIZE}"
        )));
    }
    for &(addr, size) in buffers {
        if size == 0 {
            return Err(P2pError::invalid(format!("buffer {addr:#x} has size 0")));
        }
        if addr == 0 || addr.checked_add(size).is_none() {
            return Err(P2pError::invalid(format!(
                "buffer {addr:#x}+{size} is not a valid address range"
            )));
        }
    }
    Ok(())
}

/// The shards of `buffers` in payload order: each buffer cut into pieces of
/// `max_shard_size`, the last one shorter (the reference's layout).
pub fn shard_spans(buffers: &[(u64, u64)], max_shard_size: u64) -> Vec<Span> {
    let mut spans = Vec::new();
    for &(addr, size) in buffers {
        let mut offset = 0;
        while offset < size {
            let length = max_shard_size.min(size - offset);
            spans.push(Span {
                addr: addr + offset,
                length,
            });
            offset += length;
        }
    }
    spans
}

impl Payload {
    /// The record a publisher creates: each shard held by `segment` only.
    pub fn published(
        name: &str,
        segment: &str,
        buffers: &[(u64, u64)],
        max_shard_size: u64,
    ) -> Payload {
        let shards = shard_spans(buffers, max_shard_size)
            .into_iter()
            .map(|s| Shard {
                length: s.length,
                gold: vec![Location {
                    segment_name: segment.to_string(),
                    offset: s.addr,
                }],
                replica_list: Vec::new(),
            })
            .collect();
        Payload {
            name: name.to_string(),
            size: buffers.iter().map(|b| b.1).sum(),
            size_list: buffers.iter().map(|b| b.1).collect(),
            max_shard_size,
            shards,
        }
    }

    /// No shard has a holder left: the record is deleted rather than kept.
    pub fn is_empty(&self) -> bool {
        self.shards
            .iter()
            .all(|s| s.gold.is_empty() && s.replica_list.is_empty())
    }

    pub fn info(&self) -> PayloadInfo {
        PayloadInfo {
            name: self.name.clone(),
            max_shard_size: self.max_shard_size,
            total_size: self.size,
            size_list: self.size_list.clone(),
        }
    }

    /// Where a consumer's `buffers` put each shard; an error unless they
    /// cut into exactly this payload's shards.
    pub fn spans_for(&self, buffers: &[(u64, u64)]) -> Result<Vec<Span>> {
        check_buffers(buffers, self.max_shard_size)?;
        let spans = shard_spans(buffers, self.max_shard_size);
        let fits = spans.len() == self.shards.len()
            && spans
                .iter()
                .zip(&self.shards)
                .all(|(span, shard)| span.length == shard.length);
        if !fits {
            return Err(P2pError::invalid(format!(
                "buffers of sizes {:?} do not match payload {:?} of sizes {:?} (shard size {})",
                buffers.iter().map(|b| b.1).collect::<Vec<_>>(),
                self.name,
                self.size_list,
                self.max_shard_size
            )));
        }
        Ok(spans)
    }

    /// Adds `at` to shard `index`'s replicas. False when it is already there
    /// or the shard does not exist.
    pub fn add_replica(&mut self, index: usize, at: Location) -> bool {
        match self.shards.get_mut(index) {
            Some(shard) if !shard.replica_list.contains(&at) => {
                shard.replica_list.push(at);
                true
            }
            _ => false,
        }
    }

    /// Whether `at` still holds shard `index` (as gold or replica).
    pub fn holds(&self, index: usize, at: &Location) -> bool {
        self.shards
            .get(index)
            .is_some_and(|s| s.gold.contains(at) || s.replica_list.contains(at))
    }

    /// Drops every gold location (`Unregister`).
    pub fn remove_gold(&mut self) {
        for shard in &mut self.shards {
            shard.gold.clear();
        }
    }

    /// Drops every replica held by `segment` (`DeleteReplica`).
    pub fn remove_replicas_of(&mut self, segment: &str) {
        for shard in &mut self.shards {
            shard.replica_list.retain(|l| l.segment_name != segment);
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings, integers and lists always serializes.
        serde_json::to_vec(self).expect("payload serializes")
    }

    pub fn from_json(key: &str, bytes: &[u8]) -> Result<Payload> {
        serde_json::from_slice(bytes)
            .map_err(|e| P2pError::Metadata(format!("record {key:?} does not parse: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn buffers_are_cut_into_shards_in_order() {
        let spans = shard_spans(&[(0x1000, 10 * MB), (0x100_0000_0000, 4 * MB)], 4 * MB);
        let got: Vec<(u64, u64)> = spans.iter().map(|s| (s.addr, s.length)).collect();
        assert_eq!(
            got,
            [
                (0x1000, 4 * MB),
                (0x1000 + 4 * MB, 4 * MB),
                (0x1000 + 8 * MB, 2 * MB),
                (0x100_0000_0000, 4 * MB),
            ]
        );
    }

    #[test]
    fn bad_buffers_and_shard_sizes_are_refused() {
        for (buffers, shard) in [
            (vec![], MB),
            (vec![(0x1000, 0)], MB),
            (vec![(0, MB)], MB),
            (vec![(u64::MAX - 5, MB)], MB),
            (vec![(0x1000, MB)], 0),
            (vec![(0x1000, MB)], 3 * MB),
            (vec![(0x1000, MB)], 2 * MAX_CHUNK_SIZE),
        ] {
            let e = check_buffers(&buffers, shard).unwrap_err();
            assert!(
                matches!(e, P2pError::InvalidArgument(_)),
                "{buffers:?} {shard}"
            );
        }
        check_buffers(&[(0x1000, 1)], MAX_CHUNK_SIZE).unwrap();
    }

    #[test]
    fn json_has_the_reference_field_names() {
        let p = Payload::published("foo/bar", "10.0.0.2:12345", &[(4096, 3 * MB)], 2 * MB);
        let v: serde_json::Value = serde_json::from_slice(&p.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "name": "foo/bar", "size": 3 * MB, "size_list": [3 * MB],
                "max_shard_size": 2 * MB,
                "shards": [
                    {"size": 2 * MB, "gold": [{"segment_name": "10.0.0.2:12345", "offset": 4096}],
                     "replica_list": []},
                    {"size": MB, "gold": [{"segment_name": "10.0.0.2:12345", "offset": 4096 + 2 * MB}],
                     "replica_list": []},
                ]
            })
        );
        assert_eq!(Payload::from_json("k", &p.to_json()).unwrap(), p);
    }

    #[test]
    fn go_nulls_parse_as_empty_lists() {
        // What the reference writes after Unregister cleared the gold.
        let go = br#"{"name":"a","size":5,"size_list":[5],"max_shard_size":8,
            "shards":[{"size":5,"gold":null,"replica_list":[{"segment_name":"h:1","offset":64}]}]}"#;
        let p = Payload::from_json("k", go).unwrap();
        assert!(p.shards[0].gold.is_empty());
        assert_eq!(p.shards[0].replica_list.len(), 1);
        assert!(matches!(
            Payload::from_json("k", b"{"),
            Err(P2pError::Metadata(_))
        ));
    }

    #[test]
    fn holders_come_and_go() {
        let mut p = Payload::published("a", "pub", &[(4096, 2 * MB)], MB);
        let me = Location {
            segment_name: "me".into(),
            offset: 8192,
        };
        assert!(p.add_replica(1, me.clone()));
        assert!(!p.add_replica(1, me.clone()), "added twice");
        assert!(!p.add_replica(7, me.clone()), "no such shard");
        assert!(p.holds(1, &me));
        assert!(!p.holds(0, &me));
        p.remove_gold();
        assert!(!p.is_empty());
        p.remove_replicas_of("other");
        assert!(p.holds(1, &me));
        p.remove_replicas_of("me");
        assert!(p.is_empty());
    }

    #[test]
    fn consumer_buffers_must_cut_into_the_same_shards() {
        let p = Payload::published("a", "pub", &[(4096, 3 * MB), (1 << 40, MB)], 2 * MB);
        let spans = p.spans_for(&[(1 << 30, 3 * MB), (1 << 31, MB)]).unwrap();
        assert_eq!(spans.len(), 3);
        assert_eq!(spans[2].addr, 1 << 31);
        // Same total, different cut: the shards would not line up.
        assert!(p.spans_for(&[(1 << 30, 4 * MB)]).is_err());
        assert!(p.spans_for(&[(1 << 30, 3 * MB)]).is_err());
    }
}
