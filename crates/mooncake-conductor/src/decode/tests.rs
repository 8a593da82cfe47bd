use super::*;
use crate::encode::{batch, Style};
use crate::event::{Batch, Event, Medium, Removed, Stored};

fn st(
    hashes: Vec<u64>,
    parent: Option<u64>,
    tokens: Vec<u32>,
    medium: Medium,
    lora: Option<&str>,
    salt: Option<&str>,
) -> Event {
    Event::Stored(Stored {
        hashes,
        parent,
        tokens,
        block_size: Some(2),
        medium,
        lora: lora.map(String::from),
        salt: salt.map(String::from),
        tenant: None,
    })
}

fn rm(hashes: Vec<u64>, medium: Medium) -> Event {
    Event::Removed(Removed {
        hashes,
        medium,
        tenant: None,
    })
}

#[test]
fn engine_styles_round_trip() {
    let events = vec![
        st(
            vec![1, u64::MAX - 5],
            None,
            vec![1, 2, 3, 4],
            Medium::Gpu,
            Some("sql"),
            None,
        ),
        st(
            vec![3],
            Some(u64::MAX - 5),
            vec![5, 6],
            Medium::Gpu,
            Some("lora_id:7"),
            None,
        ),
        st(vec![1], None, vec![], Medium::Cpu, None, None),
        rm(vec![1], Medium::Gpu),
        Event::Cleared,
    ];
    for style in [Style::VllmArray, Style::VllmMap] {
        let b = decode_batch(Kind::Vllm, &batch(style, 1.5, &events, Some(1))).unwrap();
        assert_eq!(
            b,
            Batch {
                events: events.clone(),
                dp_rank: Some(1),
                malformed: 0
            },
            "{style:?}"
        );
    }
    // SGLang has no lora_name; its salt rides in `metadata`.
    let sg = vec![
        st(
            vec![1, u64::MAX - 5],
            None,
            vec![1, 2, 3, 4],
            Medium::Gpu,
            None,
            Some("salt"),
        ),
        st(vec![9], None, vec![], Medium::Cpu, Some("lora_id:3"), None),
        st(vec![8], None, vec![], Medium::Disk, None, None),
        rm(vec![u64::MAX - 5], Medium::Cpu),
        Event::Cleared,
    ];
    let b = decode_batch(Kind::Sglang, &batch(Style::Sglang, 2.0, &sg, Some(3))).unwrap();
    assert_eq!(
        b,
        Batch {
            events: sg,
            dp_rank: Some(3),
            malformed: 0
        }
    );
}

fn encode(v: &rmpv::Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

#[test]
fn vllm_twelve_field_stored_and_bytes_hashes() {
    use rmpv::Value as V;
    // All 11 fields after the tag, hashes as vLLM's 32-byte SHA-256 digests.
    let digest = |last: u8| {
        let mut d = vec![0xAAu8; 32];
        d[31] = last;
        V::Binary(d)
    };
    let ev = V::Array(vec![
        V::from("BlockStored"),
        V::Array(vec![digest(1)]),
        digest(9),
        V::Array(vec![V::from(5), V::from(6)]),
        V::from(2),
        V::Nil,
        V::from("GPU"),
        V::Nil,
        V::Array(vec![V::Nil]),
        V::from(0),
        V::from("full_attention"),
        V::Nil,
    ]);
    let other_group = {
        let V::Array(mut a) = ev.clone() else {
            unreachable!()
        };
        a[9] = V::from(1);
        V::Array(a)
    };
    let payload = encode(&V::Array(vec![
        V::F64(1.0),
        V::Array(vec![ev, other_group]),
    ]));
    let b = decode_batch(Kind::Vllm, &payload).unwrap();
    let tail = u64::from_be_bytes([0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 1]);
    let parent = u64::from_be_bytes([0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 9]);
    assert_eq!(
        b.events,
        vec![st(
            vec![tail],
            Some(parent),
            vec![5, 6],
            Medium::Gpu,
            None,
            None
        )]
    );
    assert_eq!(
        b.malformed, 0,
        "another group's event is skipped, not malformed"
    );
    assert_eq!(b.dp_rank, None);
}

#[test]
fn master_events_decode() {
    let events = vec![
        Event::Stored(Stored {
            hashes: vec![42],
            parent: None,
            tokens: vec![],
            block_size: None,
            medium: Medium::Cpu,
            lora: None,
            salt: None,
            tenant: Some("default".into()),
        }),
        Event::Removed(Removed {
            hashes: vec![42],
            medium: Medium::Disk,
            tenant: Some("t2".into()),
        }),
    ];
    let b = decode_batch(Kind::Mooncake, &batch(Style::Mooncake, 1.0, &events, None)).unwrap();
    assert_eq!(b.events, events);
    assert_eq!(b.dp_rank, Some(0));
}

#[test]
fn malformed_events_are_counted_and_skipped() {
    use rmpv::Value as V;
    let good = V::Array(vec![V::from("AllBlocksCleared")]);
    let bad = vec![
        V::from(3),
        V::Array(vec![]),
        V::Array(vec![V::from("NoSuchEvent")]),
        V::Array(vec![V::from("BlockStored")]),
        V::Array(vec![V::from("BlockStored"), V::from("not a list")]),
        V::Array(vec![
            V::from("BlockRemoved"),
            V::Array(vec![V::from(1)]),
            V::from("TAPE"),
        ]),
        V::Array(vec![
            V::from("BlockStored"),
            V::Array(vec![V::from(1)]),
            V::Nil,
            V::Array(vec![V::from(-1)]),
        ]),
        V::Map(vec![(V::from("type"), V::from(5))]),
    ];
    let n = bad.len() as u32;
    let mut evs = bad;
    evs.push(good);
    let b = decode_batch(
        Kind::Vllm,
        &encode(&V::Array(vec![V::F64(0.0), V::Array(evs)])),
    )
    .unwrap();
    assert_eq!(b.malformed, n);
    assert_eq!(b.events, vec![Event::Cleared]);
    // Master events without a medium or with unknown types.
    let m = V::Array(vec![
        V::from(1),
        V::Array(vec![
            V::Map(vec![
                (V::from("event_type"), V::from("stored")),
                (V::from("seq_hashes"), V::Array(vec![V::from(1)])),
            ]),
            V::Map(vec![(V::from("event_type"), V::from("moved"))]),
            V::Array(vec![]),
        ]),
        V::from(0),
    ]);
    assert_eq!(
        decode_batch(Kind::Mooncake, &encode(&m)).unwrap().malformed,
        3
    );
}

#[test]
fn bad_payloads_are_errors() {
    use rmpv::Value as V;
    assert!(matches!(
        decode_batch(Kind::Vllm, &[]),
        Err(DecodeError::NotMsgpack(_))
    ));
    assert!(decode_batch(Kind::Vllm, &[0xc1]).is_err());
    assert!(
        matches!(
            decode_batch(Kind::Vllm, &[0x92, 0x01]),
            Err(DecodeError::NotMsgpack(_))
        ),
        "truncated"
    );
    let mut p = encode(&V::Array(vec![V::F64(0.0), V::Array(vec![])]));
    p.push(0);
    assert_eq!(decode_batch(Kind::Vllm, &p), Err(DecodeError::Trailing(1)));
    for v in [
        V::from(1),
        V::Array(vec![V::F64(0.0)]),
        V::Array(vec![V::F64(0.0), V::from(1)]),
        V::Map(vec![]),
    ] {
        assert!(
            matches!(
                decode_batch(Kind::Sglang, &encode(&v)),
                Err(DecodeError::NotABatch(_))
            ),
            "{v:?}"
        );
    }
    // An array header claiming 4 billion items.
    assert!(decode_batch(Kind::Vllm, &[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
    // Deep nesting is refused, not recursed into.
    let mut deep = vec![0x91u8; 100_000];
    deep.push(0xc0);
    assert!(decode_batch(Kind::Mooncake, &deep).is_err());
}
