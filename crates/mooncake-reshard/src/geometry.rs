//! N-D logical boxes: containment, intersection, pairwise overlap and exact
//! cover, the checks a placement runs over every tensor's fragments.

use crate::{Block, Error, Result};

/// Pairwise comparisons allowed before a 3-D or higher overlap check gives
/// up: the sweep is exact, but its worst case is quadratic, and a manifest
/// check must not turn into unbounded work.
pub const HIGH_DIM_COMPARISON_BUDGET: u64 = 1_000_000;

fn same_rank(boxes: &[&Block]) -> Result<usize> {
    let ndim = boxes.first().map_or(0, |b| b.ndim());
    for b in boxes {
        if b.offset.len() != ndim || b.shape.len() != ndim {
            return Err(Error::Rank(format!(
                "expected {ndim} dimensions, got offset {} and shape {}",
                b.offset.len(),
                b.shape.len()
            )));
        }
    }
    Ok(ndim)
}

/// Whether `inner` lies wholly inside `outer`.
pub fn contains(outer: &Block, inner: &Block) -> Result<bool> {
    same_rank(&[outer, inner])?;
    Ok((0..outer.ndim())
        .all(|d| outer.offset[d] <= inner.offset[d] && inner.end(d) <= outer.end(d)))
}

/// The common part of two boxes, or `None` when they do not share a cell.
pub fn intersect(a: &Block, b: &Block) -> Result<Option<Block>> {
    let ndim = same_rank(&[a, b])?;
    let mut offset = Vec::with_capacity(ndim);
    let mut shape = Vec::with_capacity(ndim);
    for d in 0..ndim {
        let begin = a.offset[d].max(b.offset[d]);
        let end = a.end(d).min(b.end(d));
        if end <= begin {
            return Ok(None);
        }
        offset.push(begin);
        shape.push(end - begin);
    }
    Ok(Some(Block { offset, shape }))
}

fn cells_overlap(a: &Block, b: &Block) -> bool {
    (0..a.ndim()).all(|d| a.offset[d] < b.end(d) && b.offset[d] < a.end(d))
}

/// The dimension with the most distinct intervals: sweeping along it keeps
/// the fewest boxes active at once.
fn sweep_dimension(boxes: &[&Block], ndim: usize) -> usize {
    (0..ndim)
        .max_by_key(|&d| {
            let mut spans: Vec<(u64, u64)> =
                boxes.iter().map(|b| (b.offset[d], b.end(d))).collect();
            spans.sort_unstable();
            spans.dedup();
            // Reverse(d): on a tie the lowest dimension wins.
            (spans.len(), std::cmp::Reverse(d))
        })
        .unwrap_or(0)
}

/// Whether any two boxes share a cell, with the default budget.
pub fn any_overlap(boxes: &[&Block]) -> Result<bool> {
    any_overlap_within(boxes, HIGH_DIM_COMPARISON_BUDGET)
}

/// Whether any two boxes share a cell. Intervals are checked by a sort,
/// rectangles by a sweep with a counting segment tree (n log n), higher
/// ranks by a sweep along the most selective dimension that compares the
/// boxes active together, at most `budget` times.
pub fn any_overlap_within(boxes: &[&Block], budget: u64) -> Result<bool> {
    if boxes.len() < 2 {
        return Ok(false);
    }
    let ndim = same_rank(boxes)?;
    match ndim {
        // Two zero-dimensional boxes are the same single cell.
        0 => Ok(true),
        1 => {
            let mut spans: Vec<(u64, u64)> =
                boxes.iter().map(|b| (b.offset[0], b.end(0))).collect();
            spans.sort_unstable();
            let mut reach = spans[0].1;
            for &(begin, end) in &spans[1..] {
                if begin < reach {
                    return Ok(true);
                }
                reach = reach.max(end);
            }
            Ok(false)
        }
        2 => Ok(rectangles_overlap(boxes)),
        _ => sweep_overlap(boxes, ndim, budget),
    }
}

/// Counting segment tree over compressed coordinates: add to a range, ask
/// a range's maximum.
struct CoverTree {
    max: Vec<i64>,
    pending: Vec<i64>,
    len: usize,
}

impl CoverTree {
    fn new(len: usize) -> Self {
        Self {
            max: vec![0; 4 * len.max(1)],
            pending: vec![0; 4 * len.max(1)],
            len,
        }
    }

    fn add(&mut self, lo: usize, hi: usize, v: i64) {
        self.add_at(1, 0, self.len, lo, hi, v);
    }

    fn add_at(&mut self, node: usize, nlo: usize, nhi: usize, lo: usize, hi: usize, v: i64) {
        if hi <= nlo || nhi <= lo {
            return;
        }
        if lo <= nlo && nhi <= hi {
            self.max[node] += v;
            self.pending[node] += v;
            return;
        }
        let mid = (nlo + nhi) / 2;
        self.add_at(2 * node, nlo, mid, lo, hi, v);
        self.add_at(2 * node + 1, mid, nhi, lo, hi, v);
        self.max[node] = self.pending[node] + self.max[2 * node].max(self.max[2 * node + 1]);
    }

    fn peak(&self, lo: usize, hi: usize) -> i64 {
        self.peak_at(1, 0, self.len, lo, hi)
    }

    fn peak_at(&self, node: usize, nlo: usize, nhi: usize, lo: usize, hi: usize) -> i64 {
        if hi <= nlo || nhi <= lo {
            return i64::MIN;
        }
        if lo <= nlo && nhi <= hi {
            return self.max[node];
        }
        let mid = (nlo + nhi) / 2;
        let inner = self.peak_at(2 * node, nlo, mid, lo, hi).max(self.peak_at(
            2 * node + 1,
            mid,
            nhi,
            lo,
            hi,
        ));
        inner.saturating_add(self.pending[node])
    }
}

/// Sweep along dimension 0; the tree counts how many open rectangles cover
/// each cell of dimension 1. A rectangle that opens over a covered cell
/// overlaps; ends sort before starts at the same coordinate, so touching
/// rectangles do not.
fn rectangles_overlap(boxes: &[&Block]) -> bool {
    let mut ys: Vec<u64> = boxes.iter().flat_map(|b| [b.offset[1], b.end(1)]).collect();
    ys.sort_unstable();
    ys.dedup();
    let at = |y: u64| ys.partition_point(|&v| v < y);
    // (x, 0 = end / 1 = start, first cell, one past the last cell)
    let mut events: Vec<(u64, u8, usize, usize)> = Vec::with_capacity(2 * boxes.len());
    for b in boxes {
        let (lo, hi) = (at(b.offset[1]), at(b.end(1)));
        events.push((b.offset[0], 1, lo, hi));
        events.push((b.end(0), 0, lo, hi));
    }
    events.sort_unstable();
    let mut tree = CoverTree::new(ys.len().saturating_sub(1));
    for (_, start, lo, hi) in events {
        if start == 0 {
            tree.add(lo, hi, -1);
        } else {
            if tree.peak(lo, hi) > 0 {
                return true;
            }
            tree.add(lo, hi, 1);
        }
    }
    false
}

fn sweep_overlap(boxes: &[&Block], ndim: usize, budget: u64) -> Result<bool> {
    let dim = sweep_dimension(boxes, ndim);
    let mut order: Vec<usize> = (0..boxes.len()).collect();
    order.sort_unstable_by_key(|&i| (boxes[i].offset[dim], boxes[i].end(dim)));
    let mut comparisons = 0u64;
    // Active boxes, and a min-heap of when each stops being active.
    let mut active: std::collections::BTreeSet<usize> = std::collections::BTreeSet::new();
    let mut expiry = std::collections::BinaryHeap::new();
    for &i in &order {
        let begin = boxes[i].offset[dim];
        while let Some(&std::cmp::Reverse((end, j))) = expiry.peek() {
            if end > begin {
                break;
            }
            expiry.pop();
            active.remove(&j);
        }
        for &j in &active {
            if comparisons >= budget {
                return Err(Error::OverlapBudget);
            }
            comparisons += 1;
            if cells_overlap(boxes[i], boxes[j]) {
                return Ok(true);
            }
        }
        active.insert(i);
        expiry.push(std::cmp::Reverse((boxes[i].end(dim), i)));
    }
    Ok(false)
}

/// The number of cells in a box, or `None` past 64 bits.
pub fn volume(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &e| acc.checked_mul(e))
}

/// Whether `boxes` tile `container` exactly, with the default budget.
pub fn exactly_cover(container: &Block, boxes: &[&Block]) -> Result<bool> {
    exactly_cover_within(container, boxes, HIGH_DIM_COMPARISON_BUDGET)
}

/// Whether `boxes` lie inside `container`, do not overlap, and together
/// have its volume: then they tile it exactly. `budget` bounds the overlap
/// check from three dimensions up, as in [`any_overlap_within`].
pub fn exactly_cover_within(container: &Block, boxes: &[&Block], budget: u64) -> Result<bool> {
    if boxes.is_empty() {
        return Ok(false);
    }
    for b in boxes {
        if !contains(container, b)? {
            return Ok(false);
        }
    }
    let want = volume(&container.shape).ok_or(Error::Overflow("container volume"))?;
    let mut have = 0u64;
    for b in boxes {
        let v = volume(&b.shape).ok_or(Error::Overflow("box volume"))?;
        have = match have.checked_add(v) {
            Some(h) => h,
            // More cells than a 64-bit container can hold: not a tiling.
            None => return Ok(false),
        };
    }
    if have != want {
        return Ok(false);
    }
    Ok(!any_overlap_within(boxes, budget)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn b(offset: &[u64], shape: &[u64]) -> Block {
        Block::new(offset.to_vec(), shape.to_vec())
    }

    #[test]
    fn contains_and_intersect() {
        let outer = b(&[0, 0], &[4, 8]);
        assert!(contains(&outer, &b(&[1, 2], &[3, 6])).unwrap());
        assert!(!contains(&outer, &b(&[1, 2], &[4, 6])).unwrap());
        assert_eq!(
            intersect(&outer, &b(&[2, 6], &[4, 4])).unwrap(),
            Some(b(&[2, 6], &[2, 2]))
        );
        assert_eq!(intersect(&outer, &b(&[4, 0], &[1, 1])).unwrap(), None);
        assert!(matches!(
            intersect(&outer, &b(&[0], &[1])),
            Err(Error::Rank(_))
        ));
    }

    #[test]
    fn overlap_by_rank() {
        let row = [b(&[0], &[4]), b(&[4], &[4])];
        assert!(!any_overlap(&row.iter().collect::<Vec<_>>()).unwrap());
        let row = [b(&[0], &[5]), b(&[4], &[4])];
        assert!(any_overlap(&row.iter().collect::<Vec<_>>()).unwrap());
        // Touching rectangles share an edge but no cell.
        let grid = [
            b(&[0, 0], &[2, 2]),
            b(&[0, 2], &[2, 2]),
            b(&[2, 0], &[2, 4]),
        ];
        assert!(!any_overlap(&grid.iter().collect::<Vec<_>>()).unwrap());
        let grid = [b(&[0, 0], &[2, 3]), b(&[1, 2], &[2, 2])];
        assert!(any_overlap(&grid.iter().collect::<Vec<_>>()).unwrap());
        let cube = [b(&[0, 0, 0], &[2, 2, 2]), b(&[1, 1, 1], &[2, 2, 2])];
        assert!(any_overlap(&cube.iter().collect::<Vec<_>>()).unwrap());
    }

    #[test]
    fn high_dimensional_budget_fails_closed() {
        // Staircase: distinct, mutually overlapping spans on dimension 0
        // (the sweep's choice on a tie), disjoint on dimension 1, so every
        // box stays active and each is compared with all before it.
        let stairs = |n: u64| -> Vec<Block> { (0..n).map(|i| b(&[i, i, 0], &[n, 1, 1])).collect() };
        let small = stairs(100);
        assert_eq!(any_overlap(&small.iter().collect::<Vec<_>>()), Ok(false));
        let large = stairs(1500);
        assert_eq!(
            any_overlap(&large.iter().collect::<Vec<_>>()),
            Err(Error::OverlapBudget)
        );
        assert_eq!(
            any_overlap_within(&small.iter().collect::<Vec<_>>(), 0),
            Err(Error::OverlapBudget)
        );
        // The same shape in 2-D has no budget.
        let flat: Vec<Block> = (0..1500).map(|i| b(&[i, i], &[1500, 1])).collect();
        assert_eq!(any_overlap(&flat.iter().collect::<Vec<_>>()), Ok(false));
    }

    #[test]
    fn rectangle_sweep_handles_many_nested_spans() {
        // Each row split in two at a different column: every left part
        // starts at column 0, the worst case for a pairwise sweep.
        let n = 4096u64;
        let mut boxes = Vec::new();
        for row in 0..n {
            boxes.push(b(&[0, row], &[row + 1, 1]));
            boxes.push(b(&[row + 1, row], &[n - row, 1]));
        }
        let container = b(&[0, 0], &[n + 1, n]);
        assert!(exactly_cover(&container, &boxes.iter().collect::<Vec<_>>()).unwrap());
        boxes.push(b(&[3, 7], &[1, 1]));
        assert!(any_overlap(&boxes.iter().collect::<Vec<_>>()).unwrap());
    }

    #[test]
    fn cover_needs_volume_bounds_and_no_overlap() {
        let c = b(&[0, 0], &[4, 4]);
        let halves = [b(&[0, 0], &[2, 4]), b(&[2, 0], &[2, 4])];
        assert!(exactly_cover(&c, &halves.iter().collect::<Vec<_>>()).unwrap());
        let gap = [b(&[0, 0], &[2, 4])];
        assert!(!exactly_cover(&c, &gap.iter().collect::<Vec<_>>()).unwrap());
        let twice = [b(&[0, 0], &[2, 4]), b(&[0, 0], &[2, 4])];
        assert!(!exactly_cover(&c, &twice.iter().collect::<Vec<_>>()).unwrap());
        let outside = [b(&[0, 0], &[2, 4]), b(&[2, 0], &[3, 4])];
        assert!(!exactly_cover(&c, &outside.iter().collect::<Vec<_>>()).unwrap());
        assert!(!exactly_cover(&c, &[]).unwrap());
    }

    fn brute_overlap(boxes: &[Block]) -> bool {
        for i in 0..boxes.len() {
            for j in i + 1..boxes.len() {
                if cells_overlap(&boxes[i], &boxes[j]) {
                    return true;
                }
            }
        }
        false
    }

    proptest! {
        #[test]
        fn sweep_matches_brute_force(
            ndim in 1usize..4,
            raw in prop::collection::vec((0u64..6, 1u64..4, 0u64..6, 1u64..4, 0u64..6, 1u64..4), 0..12),
        ) {
            let boxes: Vec<Block> = raw
                .iter()
                .map(|&(o0, s0, o1, s1, o2, s2)| {
                    b(&[o0, o1, o2][..ndim], &[s0, s1, s2][..ndim])
                })
                .collect();
            let refs: Vec<&Block> = boxes.iter().collect();
            prop_assert_eq!(any_overlap(&refs).unwrap(), brute_overlap(&boxes));
        }
    }
}
