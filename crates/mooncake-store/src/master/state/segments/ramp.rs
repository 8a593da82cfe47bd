//! A newly mounted segment takes new replicas gradually: its weight in
//! placement ramps from a small share to all of it over `--segment_ramp_ms`,
//! so an empty segment (which a ranked strategy puts first) is not handed
//! every put at once, and a random pick does not pile onto it either.

/// `mounted_at` of a segment that does not ramp (restored, replayed, or
/// mounted while the ramp is off).
pub(crate) const NOT_RAMPING: u64 = u64::MAX;

/// The least weight a fresh segment gets: it still takes some puts, and
/// all of them when no other segment has room.
const MIN_WEIGHT: f64 = 0.05;

/// A segment's placement weight at `now` (master clock, ms): from
/// [`MIN_WEIGHT`] at its mount up to 1 after `ramp_ms` (0: always 1).
pub(crate) fn weight(mounted_at: u64, now: u64, ramp_ms: u64) -> f64 {
    if ramp_ms == 0 || mounted_at == NOT_RAMPING {
        return 1.0;
    }
    let elapsed = now.saturating_sub(mounted_at);
    if elapsed >= ramp_ms {
        return 1.0;
    }
    (elapsed as f64 / ramp_ms as f64).max(MIN_WEIGHT)
}

/// `items` (each with its weight) in the order to try them: those whose
/// draw of `coin` (uniform in [0, 1)) falls under their weight first, the
/// others after, each group in the given order. Nothing is dropped.
pub(crate) fn weighted_order<T>(items: Vec<(T, f64)>, mut coin: impl FnMut() -> f64) -> Vec<T> {
    let (mut first, mut later) = (Vec::with_capacity(items.len()), Vec::new());
    for (item, w) in items {
        if w >= 1.0 || coin() < w {
            first.push(item);
        } else {
            later.push(item);
        }
    }
    first.append(&mut later);
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weight_ramps_from_a_floor_to_one() {
        let mount = 10_000;
        assert_eq!(weight(mount, mount, 0), 1.0, "off");
        assert_eq!(weight(NOT_RAMPING, mount, 4_000), 1.0, "not new");
        assert_eq!(weight(mount, mount, 4_000), MIN_WEIGHT);
        assert_eq!(weight(mount, mount - 5, 4_000), MIN_WEIGHT, "clock behind");
        assert_eq!(weight(mount, mount + 1_000, 4_000), 0.25);
        assert_eq!(weight(mount, mount + 3_000, 4_000), 0.75);
        assert_eq!(weight(mount, mount + 4_000, 4_000), 1.0);
        assert_eq!(weight(mount, u64::MAX - 1, 4_000), 1.0);
    }

    #[test]
    fn light_items_are_tried_after_the_others_and_never_dropped() {
        let coins = [0.5, 0.5, 0.01];
        let mut next = coins.iter().copied();
        let order = weighted_order(
            vec![("fresh", 0.25), ("old", 1.0), ("half", 0.5), ("new", 0.05)],
            || next.next().unwrap(),
        );
        // "old" needs no draw; "fresh" draws 0.5 (>= 0.25: later), "half"
        // 0.5 (>= 0.5: later), "new" 0.01 (< 0.05: first).
        assert_eq!(order, ["old", "new", "fresh", "half"]);
    }

    #[test]
    fn a_fresh_segment_gets_about_its_weight_of_first_places() {
        // A fake, evenly spread coin: 1000 draws, 0.000 .. 0.999.
        let mut i = 0u32;
        let mut coin = || {
            i += 1;
            f64::from((i * 389) % 1000) / 1000.0
        };
        let first = (0..1000)
            .filter(|_| weighted_order(vec![("new", 0.25), ("old", 1.0)], &mut coin)[0] == "new")
            .count();
        assert_eq!(first, 250);
    }
}
