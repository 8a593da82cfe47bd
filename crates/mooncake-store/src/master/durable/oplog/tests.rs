//! The codec against the state machine: what a leader's sink records,
//! framed, decoded and applied to a fresh master, gives the leader's
//! replicated state; damaged frames are refused with the right error.

use std::sync::Arc;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::master::config::policy::AllocationStrategy;
use crate::master::state::service::tests::{
    assert_same, segment, service, step, History, SEGMENTS,
};
use crate::proto::wire::{put_varint, Encode};
use crate::types::SegmentInfo;

/// Cuts `mutations` into entries of 1..=8 mutations.
fn cut(mutations: Vec<OwnedMutation>, seq: &mut u64, rng: &mut StdRng) -> Vec<OwnedEntry> {
    let mut entries = Vec::new();
    let mut it = mutations.into_iter().peekable();
    while it.peek().is_some() {
        let n = rng.gen_range(1..=8);
        *seq += 1;
        entries.push(OwnedEntry {
            seq: *seq,
            term: 3,
            mutations: it.by_ref().take(n).collect(),
        });
    }
    entries
}

#[test]
fn recorded_encoded_decoded_replayed_gives_the_same_state() {
    for seed in 0..12u64 {
        let strategy = if seed % 2 == 0 {
            AllocationStrategy::Random
        } else {
            AllocationStrategy::FreeRatioFirst
        };
        let recorder = Arc::new(Recorder::default());
        let leader = service(strategy).with_sink(Box::new(recorder.clone()));
        // Half of them place puts in reserved space, as a replicated leader.
        let leader = if seed % 4 < 2 {
            leader.with_put_fence()
        } else {
            leader
        };
        let follower = service(strategy);
        for (name, owner) in SEGMENTS {
            leader.mount_segment(owner, &segment(name), 0).unwrap();
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut history = History::default();
        let mut seq = 0;
        for round in 0..30 {
            for _ in 0..rng.gen_range(1..80) {
                step(&leader, &mut rng, &mut history);
            }
            let entries = cut(recorder.take(), &mut seq, &mut rng);
            let mut stream = Vec::new();
            for e in &entries {
                e.encode_into(&mut stream);
            }
            let mut at = 0;
            for e in &entries {
                let (decoded, used) = decode_prefix(&stream[at..]).unwrap();
                assert_eq!(&decoded, e);
                assert_eq!(decoded.to_frame(), stream[at..at + used], "canonical");
                at += used;
                decoded.apply_to(&follower).unwrap();
            }
            assert_eq!(at, stream.len());
            let ctx = format!("seed {seed} round {round}");
            assert_same(&leader, &follower, &history.tasks, &ctx);
        }
    }
}

fn sample_entry() -> OwnedEntry {
    let info = SegmentInfo {
        name: "seg".into(),
        base: 1 << 40,
        size: 1 << 20,
        transport_endpoint: "h:1".into(),
    };
    OwnedEntry {
        seq: 42,
        term: 7,
        mutations: vec![
            OwnedMutation::Segment(OwnedSegmentOp::Mount {
                id: 0,
                owner: 5,
                info,
            }),
            OwnedMutation::Client(OwnedClientOp::Register { client: 9, now: 1 }),
            OwnedMutation::Object {
                key: "key".into(),
                op: OwnedObjectOp::PutStart {
                    client: 9,
                    size: 4096,
                    pins: 0,
                    now: 2,
                    write: OwnedWrite::Fresh(vec![Placed {
                        segment: 0,
                        offset: 0,
                    }]),
                },
            },
            OwnedMutation::Object {
                key: "key".into(),
                op: OwnedObjectOp::PutEnd {
                    now: 3,
                    readers_until: 3,
                },
            },
        ],
    }
}

#[test]
fn every_truncation_is_reported_as_such() {
    let frame = sample_entry().to_frame();
    for cut in 0..frame.len() {
        assert_eq!(
            decode(&frame[..cut]).unwrap_err(),
            DecodeError::Truncated,
            "cut at {cut}"
        );
    }
    assert_eq!(decode(&frame).unwrap(), sample_entry());
    let mut two = frame.clone();
    two.push(0);
    assert_eq!(decode(&two).unwrap_err(), DecodeError::TrailingBytes(1));
}

#[test]
fn every_damaged_byte_is_caught() {
    let frame = sample_entry().to_frame();
    for at in 0..frame.len() {
        for bit in 0..8 {
            let mut bad = frame.clone();
            bad[at] ^= 1 << bit;
            let err = decode(&bad).unwrap_err();
            match at {
                0..=3 => assert_eq!(err, DecodeError::BadMagic),
                4 => assert!(matches!(err, DecodeError::UnknownVersion(_))),
                8..=11 => assert!(
                    matches!(
                        err,
                        DecodeError::Truncated
                            | DecodeError::TooLarge(_)
                            | DecodeError::Checksum { .. }
                    ),
                    "{at}: {err:?}"
                ),
                _ => assert!(matches!(err, DecodeError::Checksum { .. }), "{at}: {err:?}"),
            }
        }
    }
}

#[test]
fn unknown_versions_are_refused() {
    let mut frame = sample_entry().to_frame();
    frame[4] = VERSION + 1;
    assert_eq!(
        decode(&frame).unwrap_err(),
        DecodeError::UnknownVersion(VERSION + 1)
    );
    let e: mooncake_common::Error = DecodeError::UnknownVersion(2).into();
    assert_eq!(e.code, mooncake_common::ErrorCode::INVALID_VERSION);
}

/// A frame with a correct checksum around any payload: reaches the parser.
fn sealed(payload: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[VERSION, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(payload);
    codec::seal(&mut out, 0);
    out
}

#[test]
fn hostile_counts_are_refused_before_allocating() {
    let mut payload = Vec::new();
    42u64.encode(&mut payload);
    7u64.encode(&mut payload);
    put_varint(&mut payload, u64::MAX >> 1);
    payload.push(9);
    let err = decode(&sealed(&payload)).unwrap_err();
    assert!(matches!(err, DecodeError::Malformed(_)), "{err:?}");
    // A huge length in the header is refused without reading on.
    let mut frame = sample_entry().to_frame();
    frame[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        decode(&frame).unwrap_err(),
        DecodeError::TooLarge(u64::from(u32::MAX))
    );
}

#[test]
fn an_entry_that_does_not_fit_changes_nothing() {
    let s = service(AllocationStrategy::Random);
    let entry = sample_entry();
    entry.apply_to(&s).unwrap();
    let used = s.segments_table().by_id(0).unwrap().used();
    // The same put again: the key exists, and the range is taken.
    let again = OwnedEntry {
        seq: 43,
        mutations: entry.mutations[2..3].to_vec(),
        ..entry.clone()
    };
    assert!(again.apply_to(&s).is_err());
    let other_key = match &again.mutations[0] {
        OwnedMutation::Object { op, .. } => OwnedMutation::Object {
            key: "other".into(),
            op: op.clone(),
        },
        _ => unreachable!(),
    };
    assert!(s.apply_logged(&other_key).is_err(), "range is taken");
    assert_eq!(s.segments_table().by_id(0).unwrap().used(), used);
    // A placement on a segment that was never mounted.
    let nowhere = OwnedMutation::Object {
        key: "x".into(),
        op: OwnedObjectOp::PutStart {
            client: 9,
            size: 8,
            pins: 0,
            now: 4,
            write: OwnedWrite::Fresh(vec![
                Placed {
                    segment: 0,
                    offset: 1 << 16,
                },
                Placed {
                    segment: 77,
                    offset: 0,
                },
            ]),
        },
    };
    assert!(s.apply_logged(&nowhere).is_err());
    assert_eq!(
        s.segments_table().by_id(0).unwrap().used(),
        used,
        "given back"
    );
}

proptest! {
    #[test]
    fn decode_never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode(&bytes);
        let _ = decode(&sealed(&bytes));
    }

    #[test]
    fn decode_never_panics_on_mutated_frames(
        at in 0usize..200, byte in any::<u8>(), cut in 0usize..200,
    ) {
        let frame = sample_entry().to_frame();
        let mut payload = frame[HEADER_LEN..].to_vec();
        if !payload.is_empty() {
            let i = at % payload.len();
            payload[i] = byte;
            payload.truncate(cut.max(i + 1));
        }
        let _ = decode(&sealed(&payload));
    }
}

fn disk_entries() -> [OwnedEntry; 2] {
    let disk = |op| OwnedMutation::Disk(op);
    [
        OwnedEntry {
            seq: 1,
            term: 2,
            mutations: vec![
                disk(OwnedDiskOp::MountTier {
                    client: 9,
                    tier_id: "t1".into(),
                    endpoint: "svc:1".into(),
                    capacity: 1 << 20,
                }),
                disk(OwnedDiskOp::AddCopy {
                    client: 9,
                    key: "a".into(),
                    size: 4096,
                }),
                disk(OwnedDiskOp::AddCopy {
                    client: 9,
                    key: "b".into(),
                    size: 100,
                }),
                disk(OwnedDiskOp::DropCopy { key: "b".into() }),
            ],
        },
        OwnedEntry {
            seq: 2,
            term: 2,
            mutations: vec![
                disk(OwnedDiskOp::DropCopy { key: "a".into() }),
                disk(OwnedDiskOp::UnmountTier { client: 9 }),
            ],
        },
    ]
}

#[test]
fn disk_mutations_round_trip_and_replay() {
    let s = service(AllocationStrategy::Random);
    let [first, second] = disk_entries();
    for e in [&first, &second] {
        let frame = e.to_frame();
        assert_eq!(&decode(&frame).unwrap(), e);
        for cut in 0..frame.len() {
            assert_eq!(decode(&frame[..cut]).unwrap_err(), DecodeError::Truncated);
        }
    }
    first.apply_to(&s).unwrap();
    assert_eq!(s.disk_usage(), (4096, 1 << 20, 1));
    second.apply_to(&s).unwrap();
    assert_eq!(s.disk_usage(), (0, 0, 0));
}

#[test]
fn unknown_disk_op_tags_are_refused() {
    let mut payload = Vec::new();
    1u64.encode(&mut payload);
    2u64.encode(&mut payload);
    put_varint(&mut payload, 1);
    payload.extend_from_slice(&[10, 5, 0]);
    let err = decode(&sealed(&payload)).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Malformed(crate::proto::wire::DecodeError::BadTag {
                what: "disk op",
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn recovery_makes_every_file_it_read_durable_first() {
    use super::wal::{file_name, recover, SYNCED};
    let dir = tempfile::tempdir().unwrap();
    let entry = |seq| OwnedEntry {
        seq,
        term: 0,
        mutations: sample_entry().mutations,
    };
    let first = file_name(dir.path(), 1);
    let second = file_name(dir.path(), 3);
    std::fs::write(&first, [entry(1).to_frame(), entry(2).to_frame()].concat()).unwrap();
    std::fs::write(&second, entry(3).to_frame()).unwrap();
    SYNCED.with(|s| s.borrow_mut().clear());
    let r = recover(dir.path(), 0, None).unwrap();
    assert_eq!(r.last_seq, 3);
    let synced = SYNCED.with(|s| s.borrow().clone());
    for f in [&first, &second] {
        assert!(synced.contains(f), "{} read but not synced", f.display());
    }
    assert!(synced.contains(&dir.path().to_path_buf()), "{synced:?}");
    // A snapshot's view of closed files repairs and syncs nothing.
    SYNCED.with(|s| s.borrow_mut().clear());
    recover(dir.path(), 0, Some(2)).unwrap();
    assert!(SYNCED.with(|s| s.borrow().is_empty()));
}

#[test]
fn recover_each_hands_entries_on_in_order_and_stops_at_an_error() {
    use super::wal::{file_name, recover_each, Tail};
    let dir = tempfile::tempdir().unwrap();
    let entry = |seq| OwnedEntry {
        seq,
        term: 0,
        mutations: sample_entry().mutations,
    };
    std::fs::write(
        file_name(dir.path(), 1),
        [entry(1).to_frame(), entry(2).to_frame()].concat(),
    )
    .unwrap();
    std::fs::write(file_name(dir.path(), 3), entry(3).to_frame()).unwrap();
    let mut seen = Vec::new();
    let tail = recover_each(dir.path(), 1, None, &mut |e| {
        seen.push(e.seq);
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, [2, 3]);
    assert_eq!(
        tail,
        Tail {
            entries: 2,
            last_seq: 3,
            torn_bytes: 0
        }
    );
    // The caller's error ends the read at that entry.
    let mut seen = Vec::new();
    let err = recover_each(dir.path(), 0, None, &mut |e| {
        seen.push(e.seq);
        match e.seq {
            2 => Err(mooncake_common::Error::new(
                mooncake_common::ErrorCode::INTERNAL_ERROR,
                "does not fit",
            )),
            _ => Ok(()),
        }
    })
    .unwrap_err();
    assert_eq!(seen, [1, 2]);
    assert!(err.to_string().contains("does not fit"), "{err}");
}

#[test]
fn a_mark_ends_an_entry_after_the_mutations_queued_before_it() {
    use super::wal::{recover_each, Wal, WalSink};
    use crate::master::state::mutation::{ClientOp, Mutation, MutationSink};
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::start(dir.path(), 1, false).unwrap();
    let sink = WalSink(wal.clone());
    let log = |n: usize| {
        for _ in 0..n {
            let _ = sink.applied(&Mutation::Client(ClientOp::Register { client: 9, now: 1 }));
        }
    };
    let seq =
        |rx: std::sync::mpsc::Receiver<mooncake_common::Result<u64>>| rx.recv().unwrap().unwrap();
    let before_any = wal.mark();
    log(3);
    let after_3 = wal.mark();
    log(2);
    let after_5 = wal.mark();
    let again = wal.mark();
    log(4);
    wal.flush().unwrap();
    let (m0, m3, m5, m5b) = (seq(before_any), seq(after_3), seq(after_5), seq(again));
    let mut ends = Vec::new();
    let mut total = 0;
    recover_each(dir.path(), 0, None, &mut |e| {
        total += e.mutations.len();
        ends.push((e.seq, total));
        Ok(())
    })
    .unwrap();
    wal.stop();
    assert_eq!(total, 9);
    assert_eq!(m0, 0, "no entry before it");
    assert!(ends.contains(&(m3, 3)), "{m3} in {ends:?}");
    assert!(ends.contains(&(m5, 5)), "{m5} in {ends:?}");
    assert_eq!(m5, m5b);
}
