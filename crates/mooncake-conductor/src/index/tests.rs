use super::*;
use crate::event::{Batch, Event, Medium, Removed, Stored};
use crate::hash::DEFAULT_SEED;

fn ns(block_size: u32) -> Namespace {
    Namespace {
        tenant: "default".into(),
        model: "deepseek".into(),
        lora: String::new(),
        salt: String::new(),
        block_size,
    }
}

fn info(instance: &str, kind: Kind, dp: u32, namespace: Namespace) -> SubInfo {
    SubInfo {
        instance_id: instance.into(),
        kind,
        dp_rank: dp,
        namespace,
    }
}

fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>, medium: Medium) -> Event {
    Event::Stored(Stored {
        hashes,
        parent,
        tokens,
        block_size: None,
        medium,
        lora: None,
        salt: None,
        tenant: None,
    })
}

fn batch(events: Vec<Event>) -> Batch {
    Batch {
        events,
        ..Batch::default()
    }
}

const PROMPT: [u32; 6] = [101, 15, 100, 55, 89, 63];

/// The design document's example: block size 2, two DP ranks; H1 on GPU
/// (dp0, dp1), CPU and DISK; H2 on GPU (dp0) and CPU; H3 on DISK.
#[test]
fn worked_example() {
    let mut ix = Index::new(DEFAULT_SEED);
    let dp0 = ix.register(info("vllm-1", Kind::Vllm, 0, ns(2)));
    let dp1 = ix.register(info("vllm-1", Kind::Vllm, 1, ns(2)));
    let pool = ix.register(info("vllm-1", Kind::Mooncake, 0, ns(2)));
    let h = ix.prompt_hashes(&PROMPT, 2);
    assert_eq!(h.len(), 3);
    // vLLM hashes its own way (here 1001..); it sends the tokens.
    ix.apply(
        dp0,
        &batch(vec![stored(
            vec![1001, 1002],
            None,
            PROMPT[..4].to_vec(),
            Medium::Gpu,
        )]),
    )
    .unwrap();
    ix.apply(
        dp1,
        &batch(vec![stored(
            vec![2001],
            None,
            PROMPT[..2].to_vec(),
            Medium::Gpu,
        )]),
    )
    .unwrap();
    // The master publishes standard hashes, no tokens.
    let a = ix
        .apply(
            pool,
            &batch(vec![
                stored(vec![h[0], h[1]], None, vec![], Medium::Cpu),
                stored(vec![h[0]], None, vec![], Medium::Disk),
                stored(vec![h[2]], None, vec![], Medium::Disk),
            ]),
        )
        .unwrap();
    assert_eq!(a.stored_blocks, 4);
    let ans = ix.query(&ns(2), None, &h);
    let hit = &ans["vllm-1"];
    assert_eq!(hit.longest_matched, 3);
    assert_eq!((hit.gpu, hit.cpu, hit.disk), (2, 2, 2));
    assert_eq!(hit.dp, BTreeMap::from([(0, 2), (1, 1)]));
    assert_eq!(ix.len(), 3);
}

#[test]
fn walk_stops_at_first_block_no_tier_holds_and_per_instance() {
    let mut ix = Index::new(DEFAULT_SEED);
    let a = ix.register(info("a", Kind::Mooncake, 0, ns(2)));
    let b = ix.register(info("b", Kind::Mooncake, 0, ns(2)));
    let h = ix.prompt_hashes(&PROMPT, 2);
    ix.apply(
        a,
        &batch(vec![stored(vec![h[0], h[2]], None, vec![], Medium::Cpu)]),
    )
    .unwrap();
    ix.apply(
        b,
        &batch(vec![stored(
            vec![h[0], h[1], h[2]],
            None,
            vec![],
            Medium::Disk,
        )]),
    )
    .unwrap();
    let ans = ix.query(&ns(2), None, &h);
    // `a` misses h1: its walk stops there, h2 is not counted.
    assert_eq!(
        ans["a"],
        InstanceHit {
            longest_matched: 1,
            cpu: 1,
            ..Default::default()
        }
    );
    assert_eq!(
        ans["b"],
        InstanceHit {
            longest_matched: 3,
            disk: 3,
            ..Default::default()
        }
    );
    // One instance only.
    let only = ix.query(&ns(2), Some("b"), &h);
    assert_eq!(only.len(), 1);
    assert!(ix.query(&ns(2), Some("nobody"), &h).is_empty());
    // An instance registered with nothing matched answers zeros.
    ix.register(info("c", Kind::Vllm, 3, ns(2)));
    let c = &ix.query(&ns(2), None, &h)["c"];
    assert_eq!(c.longest_matched, 0);
    assert_eq!(c.dp, BTreeMap::from([(3, 0)]));
}

#[test]
fn isolation_dimensions() {
    let base = ns(2);
    let h = Index::new(DEFAULT_SEED).prompt_hashes(&PROMPT, 2);
    let variants: Vec<Namespace> = vec![
        Namespace {
            model: "other".into(),
            ..base.clone()
        },
        Namespace {
            lora: "sql-adapter".into(),
            ..base.clone()
        },
        Namespace {
            tenant: "acme".into(),
            ..base.clone()
        },
        Namespace {
            salt: "w8a8".into(),
            ..base.clone()
        },
    ];
    for v in &variants {
        let mut ix = Index::new(DEFAULT_SEED);
        let s = ix.register(info("i", Kind::Mooncake, 0, v.clone()));
        ix.apply(
            s,
            &batch(vec![stored(h.clone(), None, vec![], Medium::Cpu)]),
        )
        .unwrap();
        assert_eq!(ix.query(v, None, &h)["i"].longest_matched, 3, "{v:?}");
        let other = ix.query(&base, None, &h);
        assert!(
            other.get("i").is_none_or(|x| x.longest_matched == 0),
            "{v:?} leaked into the base namespace"
        );
    }
    // Block size: the same tokens in blocks of 3 are other blocks.
    let mut ix = Index::new(DEFAULT_SEED);
    let s = ix.register(info("i", Kind::Vllm, 0, ns(3)));
    ix.apply(
        s,
        &batch(vec![stored(vec![7, 8], None, PROMPT.to_vec(), Medium::Gpu)]),
    )
    .unwrap();
    let h3 = ix.prompt_hashes(&PROMPT, 3);
    assert_eq!(ix.query(&ns(3), None, &h3)["i"].longest_matched, 2);
    assert!(ix.query(&ns(2), None, &h).is_empty());
}

#[test]
fn event_lora_salt_and_tenant_pick_the_namespace() {
    let mut ix = Index::new(DEFAULT_SEED);
    let s = ix.register(info("i", Kind::Vllm, 0, ns(2)));
    let mk = |lora: Option<&str>, salt: Option<&str>, tenant: Option<&str>, hashes: Vec<u64>| {
        Event::Stored(Stored {
            hashes,
            parent: None,
            tokens: PROMPT[..2].to_vec(),
            block_size: Some(2),
            medium: Medium::Gpu,
            lora: lora.map(String::from),
            salt: salt.map(String::from),
            tenant: tenant.map(String::from),
        })
    };
    ix.apply(
        s,
        &batch(vec![
            mk(Some("sql"), None, None, vec![1]),
            mk(None, Some("s1"), None, vec![2]),
            mk(
                crate::event::lora_from_id(4).as_deref(),
                None,
                None,
                vec![3],
            ),
            mk(None, None, Some("acme"), vec![4]),
        ]),
    )
    .unwrap();
    let h = ix.prompt_hashes(&PROMPT, 2);
    let hit = |ix: &Index, n: Namespace| {
        ix.query(&n, None, &h)
            .get("i")
            .map_or(0, |x| x.longest_matched)
    };
    assert_eq!(
        hit(
            &ix,
            Namespace {
                lora: "sql".into(),
                ..ns(2)
            }
        ),
        1
    );
    assert_eq!(
        hit(
            &ix,
            Namespace {
                salt: "s1".into(),
                ..ns(2)
            }
        ),
        1
    );
    assert_eq!(
        hit(
            &ix,
            Namespace {
                lora: "lora_id:4".into(),
                ..ns(2)
            }
        ),
        1
    );
    assert_eq!(
        hit(
            &ix,
            Namespace {
                tenant: "acme".into(),
                ..ns(2)
            }
        ),
        1
    );
    assert_eq!(hit(&ix, ns(2)), 0);
    // Removal by the engine's hash finds the block in its namespace.
    let a = ix
        .apply(
            s,
            &batch(vec![Event::Removed(Removed {
                hashes: vec![1],
                medium: Medium::Gpu,
                tenant: None,
            })]),
        )
        .unwrap();
    assert_eq!(a.removed_blocks, 1);
    assert_eq!(
        hit(
            &ix,
            Namespace {
                lora: "sql".into(),
                ..ns(2)
            }
        ),
        0
    );
}

#[test]
fn engine_hashes_chain_and_offload_by_hash() {
    let mut ix = Index::new(DEFAULT_SEED);
    let s = ix.register(info("v", Kind::Vllm, 0, ns(2)));
    // Block 1 stored, then blocks 2 and 3 below it in a later event.
    ix.apply(
        s,
        &batch(vec![stored(
            vec![11],
            None,
            PROMPT[..2].to_vec(),
            Medium::Gpu,
        )]),
    )
    .unwrap();
    ix.apply(
        s,
        &batch(vec![stored(
            vec![12, 13],
            Some(11),
            PROMPT[2..].to_vec(),
            Medium::Gpu,
        )]),
    )
    .unwrap();
    let h = ix.prompt_hashes(&PROMPT, 2);
    assert_eq!(ix.query(&ns(2), None, &h)["v"].longest_matched, 3);
    // vLLM's CPU offload: hashes only, blocks known by their engine hash.
    ix.apply(
        s,
        &batch(vec![stored(vec![11, 12], None, vec![], Medium::Cpu)]),
    )
    .unwrap();
    // GPU evicts block 1: the CPU copy keeps the prefix whole.
    ix.apply(
        s,
        &batch(vec![Event::Removed(Removed {
            hashes: vec![11],
            medium: Medium::Gpu,
            tenant: None,
        })]),
    )
    .unwrap();
    let hit = &ix.query(&ns(2), None, &h)["v"];
    assert_eq!((hit.longest_matched, hit.gpu, hit.cpu), (3, 2, 2));
    assert_eq!(hit.dp[&0], 2);
    // Then the CPU copy goes too: nothing matches from the root.
    ix.apply(
        s,
        &batch(vec![Event::Removed(Removed {
            hashes: vec![11],
            medium: Medium::Cpu,
            tenant: None,
        })]),
    )
    .unwrap();
    assert_eq!(ix.query(&ns(2), None, &h)["v"].longest_matched, 0);
    // A removal for a medium it is not on, or an unknown hash, is a no-op.
    let a = ix
        .apply(
            s,
            &batch(vec![Event::Removed(Removed {
                hashes: vec![13, 999],
                medium: Medium::Disk,
                tenant: None,
            })]),
        )
        .unwrap();
    assert_eq!(a.removed_blocks, 0);
}

#[test]
fn unplaceable_events_are_rejected() {
    let mut ix = Index::new(DEFAULT_SEED);
    let s = ix.register(info("v", Kind::Vllm, 0, ns(2)));
    let bad = vec![
        // A parent never seen.
        stored(vec![12], Some(11), PROMPT[2..4].to_vec(), Medium::Gpu),
        // Tokens that do not fill the blocks.
        stored(vec![1, 2], None, PROMPT[..3].to_vec(), Medium::Gpu),
        Event::Stored(Stored {
            hashes: vec![1],
            parent: None,
            tokens: PROMPT[..4].to_vec(),
            block_size: Some(4),
            medium: Medium::Gpu,
            lora: None,
            salt: None,
            tenant: None,
        }),
    ];
    let a = ix.apply(s, &batch(bad)).unwrap();
    assert_eq!(a.rejected, 3);
    assert!(ix.is_empty());
}

#[test]
fn clear_and_unregister_drop_a_subscriptions_blocks_only() {
    let mut ix = Index::new(DEFAULT_SEED);
    let a = ix.register(info("a", Kind::Sglang, 0, ns(2)));
    let b = ix.register(info("b", Kind::Sglang, 0, ns(2)));
    let h = ix.prompt_hashes(&PROMPT, 2);
    for s in [a, b] {
        ix.apply(
            s,
            &batch(vec![stored(
                vec![5, 6, 7],
                None,
                PROMPT.to_vec(),
                Medium::Gpu,
            )]),
        )
        .unwrap();
    }
    assert_eq!(ix.len(), 3);
    let r = ix.apply(a, &batch(vec![Event::Cleared])).unwrap();
    assert_eq!(r.cleared, 1);
    let ans = ix.query(&ns(2), None, &h);
    assert_eq!((ans["a"].longest_matched, ans["b"].longest_matched), (0, 3));
    assert_eq!(ix.len(), 3);
    assert!(ix.unregister(b));
    assert!(!ix.unregister(b));
    assert!(ix.is_empty());
    // A late batch of an unregistered publisher is ignored.
    assert!(ix
        .apply(
            b,
            &batch(vec![stored(
                vec![5],
                None,
                PROMPT[..2].to_vec(),
                Medium::Gpu
            )])
        )
        .is_none());
    assert!(ix.is_empty());
    assert!(!ix.query(&ns(2), None, &h).contains_key("b"));
}

#[test]
fn stale_entries_are_not_trusted_until_stored_again() {
    let mut ix = Index::new(DEFAULT_SEED);
    let s = ix.register(info("v", Kind::Vllm, 0, ns(2)));
    let h = ix.prompt_hashes(&PROMPT, 2);
    ix.apply(
        s,
        &batch(vec![stored(
            vec![5, 6, 7],
            None,
            PROMPT.to_vec(),
            Medium::Gpu,
        )]),
    )
    .unwrap();
    ix.apply(s, &batch(vec![stored(vec![5], None, vec![], Medium::Cpu)]))
        .unwrap();
    assert_eq!(ix.mark_stale(s), 4);
    assert_eq!(ix.mark_stale(s), 0, "already stale");
    let hit = &ix.query(&ns(2), None, &h)["v"];
    assert_eq!(hit.longest_matched, 0);
    // Stored again after the gap: trusted again, medium by medium.
    ix.apply(
        s,
        &batch(vec![stored(
            vec![5, 6],
            None,
            PROMPT[..4].to_vec(),
            Medium::Gpu,
        )]),
    )
    .unwrap();
    let hit = &ix.query(&ns(2), None, &h)["v"];
    assert_eq!((hit.longest_matched, hit.gpu, hit.cpu), (2, 2, 0));
    // A clear resets everything, stale or not.
    ix.apply(s, &batch(vec![Event::Cleared])).unwrap();
    assert!(ix.is_empty());
}

#[test]
fn memory_per_block_is_compact() {
    let mut ix = Index::new(DEFAULT_SEED);
    let s = ix.register(info("v", Kind::Mooncake, 0, ns(16)));
    let hashes: Vec<u64> = (0..100_000u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    ix.apply(s, &batch(vec![stored(hashes, None, vec![], Medium::Cpu)]))
        .unwrap();
    assert_eq!(ix.len(), 100_000);
    let per_block = ix.approx_bytes() / ix.len();
    assert!(per_block <= 80, "{per_block} bytes per block");
}
