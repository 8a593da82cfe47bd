//! The `kv_event_batch` fuzz target's seed corpus (`fuzz/corpus/kv_event_batch/`),
//! made by the encoders of each publisher's format: this test fails when the
//! checked-in files differ from what they produce now.
//! `MOONCAKE_FUZZ_CORPUS=write cargo test -p mooncake-conductor --test fuzz_corpus`
//! rewrites them.

use mooncake_conductor::encode::{batch, Style};
use mooncake_conductor::event::{Event, Medium, Removed, Stored};
use test_support::corpus::{check_or_write, Seeds};

#[test]
fn kv_event_batch_corpus() {
    let events = vec![
        Event::Stored(Stored {
            hashes: vec![1, u64::MAX - 5],
            parent: None,
            tokens: vec![1, 2, 3, 4],
            block_size: Some(2),
            medium: Medium::Gpu,
            lora: Some("sql".into()),
            salt: Some("s".into()),
            tenant: None,
        }),
        Event::Stored(Stored {
            hashes: vec![3],
            parent: Some(u64::MAX - 5),
            tokens: vec![5, 6],
            block_size: Some(2),
            medium: Medium::Cpu,
            lora: Some("lora_id:4".into()),
            salt: None,
            tenant: Some("default".into()),
        }),
        Event::Removed(Removed {
            hashes: vec![1],
            medium: Medium::Disk,
            tenant: None,
        }),
        Event::Cleared,
    ];
    let mut seeds = Seeds::new();
    for (name, style) in [
        ("vllm_array", Style::VllmArray),
        ("vllm_map", Style::VllmMap),
        ("sglang", Style::Sglang),
        ("mooncake", Style::Mooncake),
    ] {
        seeds.insert(name.into(), batch(style, 1.5, &events, Some(1)));
        seeds.insert(format!("{name}_empty"), batch(style, 0.0, &[], None));
    }
    check_or_write("mooncake-conductor", "kv_event_batch", &seeds);
}
