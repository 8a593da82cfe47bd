//! Cuts through the object map for snapshots (`ObjectMap::cut`).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

use super::table::{Frozen, Table};

/// Cuts through the object map: consistent views of every shard at one
/// moment of the log, without a copy of the tables (`ObjectMap::cut`).
///
/// Every write to a table holds `gate` (read) from before it touches the
/// table until the change, and the mutation it logs, are done; a cut holds
/// it (write) for an instant and opens a new `epoch`. The first write to a
/// shard after a cut freezes that shard's table first, so the view holds
/// exactly what was applied before the cut; shards no one writes are
/// frozen when the view is collected. The chunks written meanwhile are
/// the only ones copied.
#[derive(Default)]
pub(super) struct Cuts {
    pub(super) gate: RwLock<()>,
    pub(super) epoch: AtomicU64,
}

/// Opens a write to `map`: freezes it first when a cut since its last
/// freeze wants its view. The guard keeps the next cut out until the
/// write is over.
pub(super) fn open_write<'a>(
    map: &Table,
    cuts: &'a Cuts,
    frozen: &mut Option<Frozen>,
    frozen_at: &mut u64,
) -> RwLockReadGuard<'a, ()> {
    // Recursive: a call writing under one guard (an update logging its
    // mutation) never waits for a cut that waits for that guard.
    let gate = cuts.gate.read_recursive();
    let epoch = cuts.epoch.load(Ordering::Acquire);
    if *frozen_at < epoch {
        *frozen = Some(map.freeze());
        *frozen_at = epoch;
    }
    gate
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::super::{ObjectMap, SHARDS};

    /// A log of (seq, key, size or none for a removal), seq assigned in
    /// order under its lock, as the write-ahead log does.
    #[derive(Default)]
    struct Log(Mutex<Vec<(u64, String, Option<u64>)>>);

    impl Log {
        fn append(&self, key: &str, size: Option<u64>) -> u64 {
            let mut l = self.0.lock();
            let seq = l.len() as u64 + 1;
            l.push((seq, key.to_string(), size));
            seq
        }

        fn position(&self) -> u64 {
            self.0.lock().len() as u64
        }
    }

    #[test]
    fn a_cut_sees_exactly_the_writes_logged_before_it() {
        let map = Arc::new(ObjectMap::default());
        let log = Arc::new(Log::default());
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let (map, log, stop) = (map.clone(), log.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        i = i
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let key = format!("k/{}", (i >> 33) % 20_000);
                        let mut shard = map.lock(&key);
                        // Logged and applied under the shard lock, as a
                        // mutation is; some removals, some reads in place.
                        let remove = (i >> 20) % 7 == 0 && shard.contains_key(&key);
                        if (i >> 24) % 5 == 0 {
                            if let Some(mut o) = shard.get_mut(&key) {
                                log.append(&key, Some(i >> 40));
                                o.size = i >> 40;
                            }
                            continue;
                        }
                        map.update(&mut shard, &key, true, |o| {
                            let seq = log.append(&key, (!remove).then_some(i >> 40));
                            o.size = i >> 40;
                            o.lease_until = seq;
                            !remove
                        });
                    }
                })
            })
            .collect();
        let mut views = Vec::new();
        for _ in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(60));
            let at = map.cut(|| Some(log.position())).unwrap();
            views.push((at, map.frozen()));
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        let log = log.0.lock();
        for (at, frozen) in views {
            assert!(
                at > 0 && at < log.len() as u64,
                "writes on both sides of the cut"
            );
            assert_eq!(frozen.len(), SHARDS);
            let mut want: HashMap<&str, u64> = HashMap::new();
            for (_, key, size) in &log[..at as usize] {
                match size {
                    Some(s) => want.insert(key, *s),
                    None => want.remove(key.as_str()),
                };
            }
            let got: HashMap<&str, u64> = frozen
                .iter()
                .flat_map(|f| f.iter())
                .map(|(k, o)| (k, o.size))
                .collect();
            assert_eq!(got.len(), want.len(), "cut at {at}");
            assert!(
                got == want,
                "cut at {at}: the view differs from the log up to it"
            );
        }
    }
}
