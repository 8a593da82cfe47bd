//! `--allocation_strategy=local_first`, as the reference orders it: a
//! single-replica put tries the segments of the writer's host first, then
//! the other hosts in name order (wrapping round), each host's segments in
//! name order rotated by the key's hash, so one host's writes spread over
//! its segments. Pure: the segments and hosts are passed in.
//!
//! A host is the host part of a segment's name (its owner's
//! `local_hostname`), as the reference's host id is; loopback and
//! wildcard names have none (the reference's rule), so a single-host test
//! cluster on `127.0.0.1` falls back to the strategy's random placement.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// The host of `name` (`host:port`, `[v6]:port`, or a bare host), or
/// `None` for loopback and wildcard addresses.
pub(crate) fn host_id(name: &str) -> Option<&str> {
    let name = name.trim();
    let host = if name == "::1" || name == "::" {
        name
    } else if let Some(rest) = name.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else if name.matches(':').count() == 1 {
        name.split(':').next().unwrap_or("")
    } else {
        name
    };
    let host = host.trim();
    let loopback = host.eq_ignore_ascii_case("localhost")
        || matches!(host, "" | "127.0.0.1" | "0.0.0.0" | "::1" | "::");
    (!loopback).then_some(host)
}

/// Segment names in the order a single-replica put of `key` by a writer on
/// `writer_host` tries them: the writer's host (or the next one in name
/// order when it holds none) first, then the others in order.
pub(crate) fn host_ordered(segments: &[&str], writer_host: &str, key: &str) -> Vec<String> {
    let mut by_host: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for &name in segments {
        if let Some(host) = host_id(name) {
            by_host.entry(host).or_default().push(name);
        }
    }
    if writer_host.is_empty() || by_host.is_empty() {
        return Vec::new();
    }
    let hosts: Vec<&str> = by_host.keys().copied().collect();
    let start = hosts.partition_point(|h| *h < writer_host) % hosts.len();
    let rotation = {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        h.finish()
    };
    let mut ordered = Vec::with_capacity(segments.len());
    for i in 0..hosts.len() {
        let names = by_host
            .get_mut(hosts[(start + i) % hosts.len()])
            .expect("a host listed");
        names.sort_unstable();
        names.dedup();
        let first = (rotation % names.len() as u64) as usize;
        for j in 0..names.len() {
            ordered.push(names[(first + j) % names.len()].to_owned());
        }
    }
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_the_names_host_part_without_loopback() {
        assert_eq!(host_id("10.0.0.7:12345"), Some("10.0.0.7"));
        assert_eq!(host_id("node-a"), Some("node-a"));
        assert_eq!(host_id("[fe80::1]:80"), Some("fe80::1"));
        assert_eq!(host_id("fe80::1"), Some("fe80::1"));
        for none in [
            "127.0.0.1:1",
            "localhost:9",
            "LOCALHOST",
            "0.0.0.0:1",
            "::1",
            "[::1]:5",
            "::",
            "",
        ] {
            assert_eq!(host_id(none), None, "{none}");
        }
    }

    #[test]
    fn the_writers_host_comes_first_then_the_others_in_order() {
        let segs = ["c:1", "a:1", "b:2", "b:1", "127.0.0.1:3"];
        for key in ["k1", "k2", "k3"] {
            let got = host_ordered(&segs, "b", key);
            assert_eq!(got.len(), 4, "loopback has no host");
            let mut own = got[..2].to_vec();
            own.sort();
            assert_eq!(own, ["b:1", "b:2"]);
            assert_eq!(&got[2..], ["c:1", "a:1"], "wrapping round");
        }
    }

    #[test]
    fn an_unknown_writer_starts_at_the_next_host_in_order() {
        let segs = ["a:1", "c:1", "e:1"];
        assert_eq!(host_ordered(&segs, "b", "k"), ["c:1", "e:1", "a:1"]);
        assert_eq!(host_ordered(&segs, "z", "k"), ["a:1", "c:1", "e:1"]);
        assert!(
            host_ordered(&segs, "", "k").is_empty(),
            "a writer without a host"
        );
    }

    #[test]
    fn keys_spread_over_the_writers_segments() {
        let segs = ["h:1", "h:2", "h:3", "h:4"];
        let firsts: std::collections::HashSet<String> = (0..64)
            .map(|i| host_ordered(&segs, "h", &format!("key-{i}"))[0].clone())
            .collect();
        assert!(firsts.len() > 1);
        // One key always starts at the same segment.
        assert_eq!(host_ordered(&segs, "h", "x"), host_ordered(&segs, "h", "x"));
    }
}
