//! Matching target boxes to the source boxes they overlap: the planner's
//! inner loop, which runs once per target fragment of every tensor.

use crate::geometry::intersect;
use crate::{Block, Error, Result};

/// Source boxes indexed by their interval on one dimension, the one with
/// the most distinct intervals (the lowest such on a tie), so a query scans
/// few candidates that cannot overlap.
pub struct SourceIndex<'a> {
    sources: &'a [Block],
    dim: usize,
    /// Source indices sorted by (begin, end) on `dim`.
    order: Vec<usize>,
    longest: u64,
}

impl<'a> SourceIndex<'a> {
    pub fn new(sources: &'a [Block]) -> Result<Self> {
        let ndim = sources.first().map_or(0, |b| b.ndim());
        if sources
            .iter()
            .any(|b| b.offset.len() != ndim || b.shape.len() != ndim)
        {
            return Err(Error::Rank("source fragments differ in rank".into()));
        }
        let dim = (0..ndim)
            .max_by_key(|&d| {
                let mut spans: Vec<(u64, u64)> =
                    sources.iter().map(|b| (b.offset[d], b.end(d))).collect();
                spans.sort_unstable();
                spans.dedup();
                (spans.len(), std::cmp::Reverse(d))
            })
            .unwrap_or(0);
        let mut order: Vec<usize> = (0..sources.len()).collect();
        let key = |i: usize| {
            if ndim == 0 {
                (0, 0)
            } else {
                (sources[i].offset[dim], sources[i].end(dim))
            }
        };
        order.sort_unstable_by_key(|&i| key(i));
        let longest = if ndim == 0 {
            0
        } else {
            sources.iter().map(|b| b.shape[dim]).max().unwrap_or(0)
        };
        Ok(Self {
            sources,
            dim,
            order,
            longest,
        })
    }

    /// The dimension the index sorts on.
    pub fn dimension(&self) -> usize {
        self.dim
    }

    /// Every source that shares a cell with `target`, in increasing source
    /// index, with the shared box.
    pub fn overlapping(&self, target: &Block) -> Result<Vec<(usize, Block)>> {
        if self.sources.is_empty() {
            return Ok(Vec::new());
        }
        if target.ndim() != self.sources[0].ndim() || target.shape.len() != target.ndim() {
            return Err(Error::Rank(
                "target fragment differs in rank from sources".into(),
            ));
        }
        let candidates: &[usize] = if target.ndim() == 0 {
            &self.order
        } else {
            let (begin, end) = (target.offset[self.dim], target.end(self.dim));
            // A source starting at or before begin - longest ends by begin.
            let from = match begin.checked_sub(self.longest) {
                Some(floor) => self
                    .order
                    .partition_point(|&i| self.sources[i].offset[self.dim] <= floor),
                None => 0,
            };
            let to = self
                .order
                .partition_point(|&i| self.sources[i].offset[self.dim] < end);
            &self.order[from..to.max(from)]
        };
        let mut out = Vec::new();
        for &i in candidates {
            if let Some(overlap) = intersect(&self.sources[i], target)? {
                out.push((i, overlap));
            }
        }
        out.sort_unstable_by_key(|(i, _)| *i);
        Ok(out)
    }
}

/// For each target, the sources it overlaps and the shared boxes.
pub fn match_boxes(sources: &[Block], targets: &[Block]) -> Result<Vec<Vec<(usize, Block)>>> {
    let index = SourceIndex::new(sources)?;
    targets.iter().map(|t| index.overlapping(t)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn b(offset: &[u64], shape: &[u64]) -> Block {
        Block::new(offset.to_vec(), shape.to_vec())
    }

    #[test]
    fn tp2_to_tp4_on_rows() {
        let sources = [b(&[0, 0], &[8, 4]), b(&[8, 0], &[8, 4])];
        let targets: Vec<Block> = (0..4).map(|i| b(&[i * 4, 0], &[4, 4])).collect();
        let m = match_boxes(&sources, &targets).unwrap();
        assert_eq!(m[0], vec![(0, b(&[0, 0], &[4, 4]))]);
        assert_eq!(m[3], vec![(1, b(&[12, 0], &[4, 4]))]);
    }

    #[test]
    fn replicas_all_match_and_ranks_must_agree() {
        let sources = [b(&[0], &[8]), b(&[0], &[8]), b(&[4], &[4])];
        let m = match_boxes(&sources, &[b(&[2], &[4])]).unwrap();
        assert_eq!(
            m[0].iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert!(match_boxes(&sources, &[b(&[0, 0], &[1, 1])]).is_err());
        assert!(match_boxes(&[], &[b(&[0], &[1])]).unwrap()[0].is_empty());
    }

    proptest! {
        #[test]
        fn index_matches_brute_force(
            raw_sources in prop::collection::vec((0u64..20, 1u64..8, 0u64..20, 1u64..8), 1..16),
            raw_targets in prop::collection::vec((0u64..20, 1u64..8, 0u64..20, 1u64..8), 1..8),
        ) {
            let mk = |v: &Vec<(u64, u64, u64, u64)>| -> Vec<Block> {
                v.iter().map(|&(o0, s0, o1, s1)| b(&[o0, o1], &[s0, s1])).collect()
            };
            let (sources, targets) = (mk(&raw_sources), mk(&raw_targets));
            let got = match_boxes(&sources, &targets).unwrap();
            for (t, found) in targets.iter().zip(got) {
                let want: Vec<(usize, Block)> = sources
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| intersect(s, t).unwrap().map(|o| (i, o)))
                    .collect();
                prop_assert_eq!(found, want);
            }
        }
    }
}
