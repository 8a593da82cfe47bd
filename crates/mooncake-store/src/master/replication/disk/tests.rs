//! The replicated log on disk: what comes back, torn tails, sync rules.

use super::*;
use crate::master::durable::oplog::{OwnedEntry, OwnedMutation, OwnedObjectOp};

fn frame(seq: u64, term: u64) -> Vec<u8> {
    OwnedEntry {
        seq,
        term,
        mutations: vec![OwnedMutation::Object {
            key: format!("k{seq}"),
            op: OwnedObjectOp::Remove { now: seq },
        }],
    }
    .to_frame()
}

fn seqs(r: &Recovered) -> Vec<(u64, u64)> {
    r.entries.iter().map(|e| (e.0, e.1)).collect()
}

fn write(log: &DiskLog, range: std::ops::RangeInclusive<u64>, term: u64) {
    for s in range.clone() {
        log.append(s, &frame(s, term));
    }
    log.write_through(*range.end()).unwrap();
}

#[test]
fn written_entries_come_back_with_their_terms() {
    let dir = tempfile::tempdir().unwrap();
    let log = DiskLog::start(dir.path(), 0, false).unwrap();
    write(&log, 1..=3, 1);
    write(&log, 4..=5, 2);
    log.note_committed(4);
    log.stop();
    keep_member(dir.path(), "m#1").unwrap();
    let r = recover(dir.path()).unwrap();
    assert_eq!(seqs(&r), [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]);
    assert_eq!(r.base, 0);
    assert_eq!(r.member.as_deref(), Some("m#1"));
    assert!(r.committed <= 4, "never past what was noted");
    assert_eq!(r.entries[2].2, frame(3, 1));
    // Reopened after its last entry, it goes on where it stopped.
    let log = DiskLog::start(dir.path(), 5, false).unwrap();
    write(&log, 6..=6, 3);
    log.stop();
    let r = recover(dir.path()).unwrap();
    assert_eq!(r.entries.last().map(|e| (e.0, e.1)), Some((6, 3)));
    assert_eq!(r.entries.len(), 6);
}

#[test]
fn a_cut_tail_stays_cut_and_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let log = DiskLog::start(dir.path(), 0, false).unwrap();
    write(&log, 1..=5, 1);
    log.truncate_after(2).unwrap();
    assert_eq!(seqs(&recover(dir.path()).unwrap()), [(1, 1), (2, 1)]);
    write(&log, 3..=4, 2);
    log.stop();
    let r = recover(dir.path()).unwrap();
    assert_eq!(seqs(&r), [(1, 1), (2, 1), (3, 2), (4, 2)]);
}

#[test]
fn a_torn_last_write_is_cut_off_and_damage_elsewhere_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = DiskLog::start(dir.path(), 0, false).unwrap();
    write(&log, 1..=3, 1);
    log.stop();
    let (_, path) = list_files(dir.path()).unwrap().pop().unwrap();
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(&frame(4, 1)[..10]).unwrap();
    drop(f);
    assert_eq!(recover(dir.path()).unwrap().entries.len(), 3);
    // Cut off for good: a later file after it reads back.
    let log = DiskLog::start(dir.path(), 3, false).unwrap();
    write(&log, 4..=4, 1);
    log.stop();
    assert_eq!(recover(dir.path()).unwrap().entries.len(), 4);
    // A damaged byte inside the first file is an error.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[HEADER_AT] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert!(recover(dir.path()).is_err());
}

const HEADER_AT: usize = 20;

/// Three frames written, then one byte of frame `which`'s payload
/// flipped, the frame keeping its full length.
fn damaged(which: usize) -> (tempfile::TempDir, PathBuf, usize) {
    let dir = tempfile::tempdir().unwrap();
    let log = DiskLog::start(dir.path(), 0, false).unwrap();
    write(&log, 1..=3, 1);
    log.stop();
    let (_, path) = list_files(dir.path()).unwrap().pop().unwrap();
    let len = frame(1, 1).len();
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 3 * len);
    bytes[which * len - 1] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    (dir, path, len)
}

/// A power cut can leave the last frame at its full length with pages
/// that never reached the disk: cut off like a short one.
#[test]
fn a_full_length_last_frame_failing_its_checksum_is_cut_off() {
    let (dir, path, len) = damaged(3);
    let r = recover(dir.path()).unwrap();
    assert_eq!(seqs(&r), [(1, 1), (2, 1)]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * len as u64);
    let log = DiskLog::start(dir.path(), 2, false).unwrap();
    write(&log, 3..=3, 2);
    log.stop();
    assert_eq!(
        seqs(&recover(dir.path()).unwrap()),
        [(1, 1), (2, 1), (3, 2)]
    );
}

/// A file that grew before its data reached the disk ends in zeros.
#[test]
fn a_tail_of_zeros_is_cut_off_but_not_zeros_before_a_frame() {
    let dir = tempfile::tempdir().unwrap();
    let log = DiskLog::start(dir.path(), 0, false).unwrap();
    write(&log, 1..=2, 1);
    log.stop();
    let (_, path) = list_files(dir.path()).unwrap().pop().unwrap();
    let good = std::fs::read(&path).unwrap();
    let mut bytes = good.clone();
    bytes.resize(good.len() + 3 * frame(3, 1).len(), 0);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(seqs(&recover(dir.path()).unwrap()), [(1, 1), (2, 1)]);
    assert_eq!(std::fs::read(&path).unwrap(), good);
    // Zeros followed by a frame are damage.
    let mut bytes = good.clone();
    bytes.resize(good.len() + 32, 0);
    bytes.extend_from_slice(&frame(3, 1));
    std::fs::write(&path, &bytes).unwrap();
    assert!(recover(dir.path()).is_err());
}

#[test]
fn a_frame_failing_its_checksum_before_the_last_is_an_error() {
    let (dir, path, len) = damaged(2);
    assert!(recover(dir.path()).is_err());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * len as u64);
}

/// A sync that finishes after a cut counts for nothing written after
/// the cut, whatever it covered before.
#[test]
fn a_sync_counts_only_within_its_generation() {
    let mut s = Synced { gen: 0, seq: 0 };
    let began = s.gen;
    s.cut(1);
    s.raise(began, 3);
    assert_eq!(s, Synced { gen: 1, seq: 1 });
    s.raise(s.gen, 3);
    assert_eq!(s.seq, 3);
    s.raise(s.gen, 2);
    assert_eq!(s.seq, 3, "never backwards within a generation");
}

/// The syncer begins a sync of entries 1..=3, the log is cut after 1
/// and entries 2 and 3 of a new leader are written; the old sync
/// finishing must not acknowledge them.
#[test]
fn a_sync_begun_before_a_cut_acknowledges_nothing_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = DiskLog::start(dir.path(), 0, true).unwrap();
    let (tx, rx) = std::sync::mpsc::sync_channel(0);
    *log.steps.lock() = Some(tx);
    let gate = log.sync_gate.lock();
    for s in 1..=3 {
        log.append(s, &frame(s, 1));
    }
    log.write_pending().unwrap();
    assert_eq!(rx.recv().unwrap(), "syncs");
    log.truncate_after(1).unwrap();
    for s in 2..=3 {
        log.append(s, &frame(s, 2));
    }
    log.write_pending().unwrap();
    drop(gate);
    assert_eq!(rx.recv().unwrap(), "synced");
    assert_eq!(log.synced.lock().seq, 1, "2 and 3 of term 2 not synced yet");
    assert_eq!(rx.recv().unwrap(), "syncs");
    assert_eq!(rx.recv().unwrap(), "synced");
    assert_eq!(log.synced.lock().seq, 3);
    log.write_through(3).unwrap();
    *log.steps.lock() = None;
    log.stop();
    assert_eq!(
        seqs(&recover(dir.path()).unwrap()),
        [(1, 1), (2, 2), (3, 2)]
    );
}

/// With `--ha_wal_sync_ack` an answer waits for the fdatasync of its
/// entry; without, it goes once the entry is written. The syncer is
/// held back, so an answer that did not wait comes while nothing is
/// synced.
#[test]
fn with_sync_ack_an_answer_waits_for_its_sync() {
    for sync_ack in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let log = DiskLog::start(dir.path(), 0, sync_ack).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        *log.probe.lock() = Some(tx.clone());
        let gate = log.sync_gate.lock();
        log.append(1, &frame(1, 1));
        let l = log.clone();
        let caller = std::thread::spawn(move || {
            l.write_through(1).unwrap();
            let synced = l.synced.lock().seq;
            tx.send(if synced >= 1 {
                "answered, synced"
            } else {
                "answered unsynced"
            })
            .unwrap();
        });
        let first = rx.recv().unwrap();
        if sync_ack {
            assert_eq!(first, "waits for its sync");
            drop(gate);
            let answer = rx.iter().find(|e| e.starts_with("answered")).unwrap();
            assert_eq!(answer, "answered, synced");
        } else {
            assert_eq!(first, "answered unsynced");
            drop(gate);
        }
        caller.join().unwrap();
        log.stop();
    }
}

#[test]
fn compaction_removes_only_files_a_snapshot_holds() {
    let dir = tempfile::tempdir().unwrap();
    let log = DiskLog::start(dir.path(), 0, false).unwrap();
    write(&log, 1..=4, 1);
    assert_eq!(log.remove_through(4).unwrap(), 1);
    write(&log, 5..=6, 1);
    assert_eq!(log.remove_through(2).unwrap(), 0, "nothing wholly held");
    log.stop();
    let r = recover(dir.path()).unwrap();
    assert_eq!((r.base, seqs(&r)), (4, vec![(5, 1), (6, 1)]));
    clear(dir.path()).unwrap();
    assert!(recover(dir.path()).unwrap().entries.is_empty());
}

/// A write that failed (a full disk) can leave a torn frame at the end of
/// the current file; the snapshot taken as the master gives up must not
/// start a new file behind it, or no restart reads the log again.
#[test]
fn a_failed_log_is_not_compacted_or_cut_behind_its_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let log = DiskLog::start(dir.path(), 0, false).unwrap();
    write(&log, 1..=3, 1);
    let (_, path) = list_files(dir.path()).unwrap().pop().unwrap();
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(&frame(4, 1)[..10]).unwrap();
    drop(f);
    log.fail(&Error::new(ErrorCode::FILE_WRITE_FAIL, "no space left"));
    assert!(log.remove_through(3).is_err());
    assert!(log.truncate_after(2).is_err());
    log.stop();
    assert_eq!(list_files(dir.path()).unwrap().len(), 1);
    let r = recover(dir.path()).unwrap();
    assert_eq!(seqs(&r), [(1, 1), (2, 1), (3, 1)]);
}

#[test]
fn recovery_makes_every_file_it_read_durable_first() {
    use crate::master::durable::oplog::wal::SYNCED;
    let dir = tempfile::tempdir().unwrap();
    let log = DiskLog::start(dir.path(), 0, false).unwrap();
    write(&log, 1..=3, 1);
    // A second file: the cut tail's replacement.
    log.truncate_after(2).unwrap();
    write(&log, 3..=4, 2);
    log.stop();
    SYNCED.with(|s| s.borrow_mut().clear());
    let r = recover(dir.path()).unwrap();
    assert_eq!(seqs(&r), [(1, 1), (2, 1), (3, 2), (4, 2)]);
    let synced = SYNCED.with(|s| s.borrow().clone());
    let files = list_files(dir.path()).unwrap();
    assert!(files.len() >= 2, "{files:?}");
    for (_, f) in &files {
        assert!(synced.contains(f), "{} read but not synced", f.display());
    }
    assert!(
        synced.contains(&dir.path().to_path_buf()),
        "the directory was not synced: {synced:?}"
    );
}
