//! Decodes KV-event batch payloads as the Conductor reads them from each
//! kind of publisher (vLLM, SGLang, the Mooncake master), and applies what
//! decodes to an index, which must stay consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_conductor::decode::decode_batch;
use mooncake_conductor::index::{Index, Kind, Namespace, SubInfo};
use mooncake_fuzz::{within_budget, BINARY_PER_BYTE};

fuzz_target!(|data: &[u8]| {
    within_budget(data.len(), BINARY_PER_BYTE, || {
        for kind in [Kind::Vllm, Kind::Sglang, Kind::Mooncake] {
            let Ok(batch) = decode_batch(kind, data) else { continue };
            let mut index = Index::new(1337);
            let sub = index.register(SubInfo {
                instance_id: "i".into(),
                kind,
                dp_rank: 0,
                namespace: Namespace {
                    tenant: "default".into(),
                    model: "m".into(),
                    lora: String::new(),
                    salt: String::new(),
                    block_size: 2,
                },
            });
            index.apply(sub, &batch).expect("registered");
            index.mark_stale(sub);
            assert!(index.unregister(sub));
            assert!(index.is_empty(), "unregister left blocks behind");
        }
    });
});
