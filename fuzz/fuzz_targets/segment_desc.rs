//! Segment descriptors (`mooncake/ram/<name>`, and a P2P handshake's
//! answer) and `mooncake/rpc_meta/<name>` records, as read from a metadata
//! store or a peer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::within_budget;
use mooncake_transfer::fuzzing::{RpcMeta, SegmentDesc};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // serde_json's values (the `devices` list) take up to ~100 bytes of
    // heap per byte of JSON: a one-entry object is a B-tree node.
    let (desc, meta) = within_budget(data.len(), 256, || {
        (SegmentDesc::from_json(data), RpcMeta::from_json(data))
    });
    if let Ok(d) = desc {
        let back = SegmentDesc::from_json(&d.to_json()).expect("our JSON reads back");
        // `devices` is carried, not read; serde_json may read a float in it
        // one unit in the last place off (its parsing is not correctly
        // rounded), so those compare with that tolerance.
        assert!(same_json(&back.devices, &d.devices), "{back:?} != {d:?}");
        assert_eq!(
            SegmentDesc {
                devices: vec![],
                ..back
            },
            SegmentDesc {
                devices: vec![],
                ..d.clone()
            }
        );
        // Lookups with the descriptor's own numbers, which a peer chooses.
        for b in &d.buffers {
            for (addr, len) in [
                (b.addr, b.length),
                (b.addr, b.length.wrapping_add(1)),
                (b.addr.wrapping_add(b.length), 1),
                (b.addr.wrapping_sub(1), 2),
                (u64::MAX, 1),
            ] {
                if let Some(found) = d.find_buffer(addr, len) {
                    assert!(found.contains(addr, len));
                    assert!(addr >= found.addr && addr - found.addr + len <= found.length);
                }
            }
        }
        let _ = d.first_buffer_address();
    }
    if let Ok(m) = meta {
        assert_eq!(RpcMeta::from_json(&m.to_json()).expect("reads back"), m);
    }
});

fn same_json(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_value(a, b))
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() && y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x.to_bits() as i64 - y.to_bits() as i64).abs() <= 1
        }
        (Value::Array(x), Value::Array(y)) => same_json(x, y),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, vx), (ky, vy))| kx == ky && same_value(vx, vy))
        }
        _ => a == b,
    }
}
