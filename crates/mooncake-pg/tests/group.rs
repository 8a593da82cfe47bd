//! Two or more ranks in one process (threads), each through its own
//! mapping, as separate processes would see them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_pg::{Flag, GroupError, Layout, ShmGroup};

fn group(dir: &tempfile::TempDir, world: usize, ring: usize) -> Vec<Arc<ShmGroup>> {
    let layout = Layout::new(world, 1 << 16, ring).unwrap();
    let paths: Vec<PathBuf> = (0..world)
        .map(|r| dir.path().join(format!("r{r}")))
        .collect();
    let gs: Vec<ShmGroup> = (0..world)
        .map(|r| ShmGroup::create(&paths[r], r, layout).unwrap())
        .collect();
    let pid = std::process::id() as i32;
    for (r, g) in gs.iter().enumerate() {
        for (p, path) in paths.iter().enumerate() {
            if p != r {
                g.connect(p, path, pid).unwrap();
            }
        }
    }
    for g in &gs {
        g.unlink();
    }
    gs.into_iter().map(Arc::new).collect()
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

#[test]
fn flags_posted_by_one_rank_release_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let gs = group(&dir, 4, 1 << 12);
    let all: Vec<usize> = (0..4).collect();
    let handles: Vec<_> = gs
        .iter()
        .cloned()
        .map(|g| {
            let all = all.clone();
            std::thread::spawn(move || {
                for k in 1..=200u32 {
                    g.post(Flag::Arrive, k);
                    assert_eq!(g.wait(&all, Flag::Arrive, k, far()), Ok(vec![]));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for r in 0..4 {
        assert_eq!(gs[0].flag(r, Flag::Arrive), 200);
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "files left"
    );
}

#[test]
fn messages_cross_a_small_ring_intact_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let gs = group(&dir, 2, 1 << 12);
    let sizes = [0usize, 1, 15, 4096, 4097, 100_000, 3];
    let sender = gs[0].clone();
    let t = std::thread::spawn(move || {
        let mut end = 0;
        for (i, &n) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..n).map(|b| (b * 7 + i) as u8).collect();
            end = sender.send(1, i as i64 - 2, &data, far()).unwrap();
        }
        // Returns once the receiver has read the last message.
        sender.wait_read(1, end, far()).unwrap();
    });
    for (i, &n) in sizes.iter().enumerate() {
        let (tag, len) = gs[1].recv_header(0, far()).unwrap();
        assert_eq!((tag, len), (i as i64 - 2, n));
        let mut out = vec![0u8; len];
        gs[1].recv_body(0, &mut out, far()).unwrap();
        let want: Vec<u8> = (0..n).map(|b| (b * 7 + i) as u8).collect();
        assert_eq!(out, want, "message {i}");
    }
    t.join().unwrap();
    assert!(!gs[1].pending(0));
}

#[test]
fn a_wait_on_a_silent_peer_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let gs = group(&dir, 2, 1 << 12);
    let soon = Instant::now() + Duration::from_millis(100);
    assert_eq!(
        gs[0].wait(&[0, 1], Flag::Done, 1, soon),
        Err(GroupError::Timeout)
    );
    let soon = Instant::now() + Duration::from_millis(100);
    assert_eq!(gs[0].recv_header(1, soon), Err(GroupError::Timeout));
}

#[test]
fn a_dead_peer_ends_the_wait_instead_of_hanging_it() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(2, 1 << 16, 1 << 12).unwrap();
    let (p0, p1) = (dir.path().join("r0"), dir.path().join("r1"));
    let g0 = ShmGroup::create(&p0, 0, layout).unwrap();
    let g1 = ShmGroup::create(&p1, 1, layout).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    g0.connect(1, &p1, child.id() as i32).unwrap();
    // Rank 1 (the child, as far as g0 knows) posts round 1 and dies.
    g1.post(Flag::Arrive, 1);
    child.kill().unwrap();
    let started = Instant::now();
    // What it posted before dying still counts; what it never posted is
    // reported missing, on every later wait too.
    assert_eq!(g0.wait(&[0, 1], Flag::Arrive, 1, far()), Ok(vec![]));
    assert_eq!(g0.wait(&[0, 1], Flag::Arrive, 2, far()), Ok(vec![1]));
    assert_eq!(g0.wait(&[1, 0], Flag::Done, 1, far()), Ok(vec![1]));
    // A message it will never read: the send lands in the mailbox, the
    // wait for its reading ends on the death.
    let end = g0.send(1, 5, &[1, 2, 3], far()).unwrap();
    assert_eq!(g0.wait_read(1, end, far()), Err(GroupError::Dead(vec![1])));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(g0.recv_header(1, far()), Err(GroupError::Dead(vec![1])));
    child.wait().unwrap();
}

#[test]
fn a_segment_of_another_group_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = Layout::new(2, 1 << 16, 1 << 12).unwrap();
    let b = Layout::new(3, 1 << 16, 1 << 12).unwrap();
    let g0 = ShmGroup::create(&dir.path().join("a0"), 0, a).unwrap();
    let _other = ShmGroup::create(&dir.path().join("b1"), 1, b).unwrap();
    let pid = std::process::id() as i32;
    assert!(matches!(
        g0.connect(1, &dir.path().join("b1"), pid),
        Err(GroupError::Setup(_))
    ));
    assert!(g0.connect(1, &dir.path().join("missing"), pid).is_err());
    assert!(
        ShmGroup::create(&dir.path().join("a0"), 0, a).is_err(),
        "existing file reused"
    );
}

#[test]
fn a_replacement_process_takes_over_a_dead_ranks_mailboxes() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(2, 1 << 16, 1 << 12).unwrap();
    let (p0, p1, p1b) = (
        dir.path().join("r0"),
        dir.path().join("r1"),
        dir.path().join("r1b"),
    );
    let g0 = ShmGroup::create(&p0, 0, layout).unwrap();
    let g1 = ShmGroup::create(&p1, 1, layout).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    g0.connect(1, &p1, child.id() as i32).unwrap();
    g1.connect(0, &p0, std::process::id() as i32).unwrap();
    // The old rank 1 leaves a message unread behind it and dies.
    g0.send(1, 7, &[9; 100], far()).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(g0.dead(&[1]), vec![1]);
    // Its replacement: a new segment, a live process.
    let g1b = ShmGroup::create(&p1b, 1, layout).unwrap();
    g0.connect(1, &p1b, std::process::id() as i32).unwrap();
    g1b.connect(0, &p0, std::process::id() as i32).unwrap();
    assert_eq!(g0.dead(&[1]), Vec::<usize>::new());
    assert!(!g1b.pending(0), "the dead rank's unread message leaked");
    let end = g0.send(1, 3, &[1, 2, 3], far()).unwrap();
    assert_eq!(g1b.recv_header(0, far()), Ok((3, 3)));
    let mut out = [0u8; 3];
    g1b.recv_body(0, &mut out, far()).unwrap();
    assert_eq!(out, [1, 2, 3]);
    g0.wait_read(1, end, far()).unwrap();
    g1b.send(0, 4, &[5], far()).unwrap();
    assert_eq!(g0.recv_header(1, far()), Ok((4, 1)));
}

#[test]
fn a_rank_that_left_counts_as_dead_though_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let gs = group(&dir, 2, 1 << 12);
    assert!(gs[0].dead(&[1]).is_empty());
    gs[1].post(Flag::Left, 1);
    assert_eq!(gs[0].dead(&[0, 1]), vec![1]);
    assert_eq!(gs[0].wait(&[0, 1], Flag::Arrive, 1, far()), Ok(vec![1]));
}

#[test]
fn a_rank_that_left_stops_waiting_on_its_peers() {
    let dir = tempfile::tempdir().unwrap();
    let gs = group(&dir, 2, 1 << 12);
    let g1 = gs[1].clone();
    let recv = std::thread::spawn(move || g1.recv_header(0, far()));
    std::thread::sleep(Duration::from_millis(50));
    gs[1].post(Flag::Left, 1);
    assert_eq!(recv.join().unwrap(), Err(GroupError::Dead(vec![0])));
    assert_eq!(gs[1].dead(&[0, 1]), vec![0]);
}

#[test]
fn a_send_that_fits_goes_at_once_and_one_that_does_not_waits() {
    let dir = tempfile::tempdir().unwrap();
    let gs = group(&dir, 2, 1 << 12);
    let end = gs[0].try_send(1, 7, &[1, 2, 3]).unwrap();
    assert_eq!(end, 16 + 3);
    // No room for another 4 KiB message until rank 1 reads the first.
    assert_eq!(gs[0].try_send(1, 8, &[0; 4096]), None);
    assert_eq!(gs[1].recv_header(0, far()), Ok((7, 3)));
    let mut out = [0u8; 3];
    gs[1].recv_body(0, &mut out, far()).unwrap();
    assert_eq!(out, [1, 2, 3]);
    gs[0].wait_read(1, end, far()).unwrap();
    // Messages sent either way share one stream, in order.
    let e2 = gs[0].try_send(1, 9, &[4; 100]).unwrap();
    let e3 = gs[0].send(1, 10, &[5; 10], far()).unwrap();
    assert_eq!((e2, e3), (end + 116, end + 116 + 26));
    assert_eq!(gs[1].recv_header(0, far()), Ok((9, 100)));
    gs[1].recv_body(0, &mut [0; 100], far()).unwrap();
    assert_eq!(gs[1].recv_header(0, far()), Ok((10, 10)));
}
