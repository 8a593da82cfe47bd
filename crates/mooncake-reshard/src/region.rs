//! One overlap box as a strided byte copy between two row-major fragments.
//!
//! The copy is `inner_bytes` contiguous bytes, repeated over nested outer
//! loops: the trailing dimensions whose extent equals both fragments' full
//! extent fold into the contiguous run, the rest become loops with each
//! side's byte stride. A TP split on dimension 0 is one run; a split on the
//! last dimension is one run per row.

use crate::geometry::{contains, volume};
use crate::{Block, Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub source_base: u64,
    pub target_base: u64,
    pub inner_bytes: u64,
    /// Outer loop extents, outermost first.
    pub counts: Vec<u64>,
    pub source_strides: Vec<u64>,
    pub target_strides: Vec<u64>,
}

/// Row-major byte strides of a box of `shape` with `itemsize`-byte cells.
pub fn row_major_strides(shape: &[u64], itemsize: u64) -> Result<Vec<u64>> {
    let mut strides = vec![0u64; shape.len()];
    let mut running = itemsize;
    for d in (0..shape.len()).rev() {
        strides[d] = running;
        running = running
            .checked_mul(shape[d])
            .ok_or(Error::Overflow("stride"))?;
    }
    Ok(strides)
}

fn base_offset(fragment: &Block, overlap: &Block, strides: &[u64]) -> Result<u64> {
    let mut at = 0u64;
    for (d, stride) in strides.iter().enumerate() {
        // Callers check containment first, so the difference is not negative.
        let step = (overlap.offset[d] - fragment.offset[d])
            .checked_mul(*stride)
            .ok_or(Error::Overflow("base offset"))?;
        at = at.checked_add(step).ok_or(Error::Overflow("base offset"))?;
    }
    Ok(at)
}

impl Region {
    /// The copy that moves `overlap` from `source` to `target`, both laid
    /// out row-major with `itemsize`-byte cells.
    pub fn derive(source: &Block, target: &Block, overlap: &Block, itemsize: u64) -> Result<Self> {
        let ndim = overlap.ndim();
        if ndim == 0 || source.ndim() != ndim || target.ndim() != ndim {
            return Err(Error::Rank("transfer region logical rank mismatch".into()));
        }
        if itemsize == 0 || overlap.shape.contains(&0) {
            return Err(Error::Geometry(
                "transfer region logical box is invalid".into(),
            ));
        }
        if !contains(source, overlap)? {
            return Err(Error::Geometry(
                "transfer region exceeds source logical fragment".into(),
            ));
        }
        if !contains(target, overlap)? {
            return Err(Error::Geometry(
                "transfer region exceeds target logical fragment".into(),
            ));
        }
        let src = row_major_strides(&source.shape, itemsize)?;
        let dst = row_major_strides(&target.shape, itemsize)?;
        let source_base = base_offset(source, overlap, &src)?;
        let target_base = base_offset(target, overlap, &dst)?;
        let mut inner = overlap.shape[ndim - 1]
            .checked_mul(itemsize)
            .ok_or(Error::Overflow("inner bytes"))?;
        let mut first_inner = ndim - 1;
        // Fold a dimension in while both sides' rows are exactly the run so far.
        while first_inner > 0 && src[first_inner - 1] == inner && dst[first_inner - 1] == inner {
            first_inner -= 1;
            inner = inner
                .checked_mul(overlap.shape[first_inner])
                .ok_or(Error::Overflow("inner bytes"))?;
        }
        Ok(Region {
            source_base,
            target_base,
            inner_bytes: inner,
            counts: overlap.shape[..first_inner].to_vec(),
            source_strides: src[..first_inner].to_vec(),
            target_strides: dst[..first_inner].to_vec(),
        })
    }

    /// How many contiguous runs the copy is.
    pub fn segment_count(&self) -> Result<u64> {
        volume(&self.counts).ok_or(Error::Overflow("segment count"))
    }

    pub fn total_bytes(&self) -> Result<u64> {
        self.segment_count()?
            .checked_mul(self.inner_bytes)
            .ok_or(Error::Overflow("total bytes"))
    }

    /// One past the last byte touched on each side: (source, target).
    pub fn extents(&self) -> Result<(u64, u64)> {
        let end = |base: u64, strides: &[u64]| -> Result<u64> {
            let mut end = base
                .checked_add(self.inner_bytes)
                .ok_or(Error::Overflow("extent"))?;
            for (c, s) in self.counts.iter().zip(strides) {
                let reach = (c.saturating_sub(1))
                    .checked_mul(*s)
                    .ok_or(Error::Overflow("extent"))?;
                end = end.checked_add(reach).ok_or(Error::Overflow("extent"))?;
            }
            Ok(end)
        };
        Ok((
            end(self.source_base, &self.source_strides)?,
            end(self.target_base, &self.target_strides)?,
        ))
    }

    /// The runs as (source offset, target offset, bytes), outer loops in
    /// row-major order; refuses more than `max_segments` runs.
    pub fn segments(&self, max_segments: u64) -> Result<Segments<'_>> {
        let count = self.segment_count()?;
        if count > max_segments {
            return Err(Error::TooManySegments {
                count,
                max: max_segments,
            });
        }
        self.extents()?;
        Ok(Segments {
            region: self,
            index: vec![0; self.counts.len()],
            left: count,
        })
    }
}

/// Iterator over a region's contiguous runs.
pub struct Segments<'a> {
    region: &'a Region,
    index: Vec<u64>,
    left: u64,
}

impl Iterator for Segments<'_> {
    type Item = (u64, u64, u64);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let r = self.region;
        // extents() checked that the furthest run fits in 64 bits.
        let (mut s, mut t) = (r.source_base, r.target_base);
        for (d, &i) in self.index.iter().enumerate() {
            s += i * r.source_strides[d];
            t += i * r.target_strides[d];
        }
        for d in (0..self.index.len()).rev() {
            self.index[d] += 1;
            if self.index[d] < r.counts[d] {
                break;
            }
            self.index[d] = 0;
        }
        Some((s, t, r.inner_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(offset: &[u64], shape: &[u64]) -> Block {
        Block::new(offset.to_vec(), shape.to_vec())
    }

    #[test]
    fn split_on_rows_is_one_run() {
        // TP2 -> TP4 on dim 0 of a 16x4 fp16 tensor: target 1 is rows 4..8,
        // inside source 0 (rows 0..8) at byte 4*4*2.
        let r = Region::derive(
            &b(&[0, 0], &[8, 4]),
            &b(&[4, 0], &[4, 4]),
            &b(&[4, 0], &[4, 4]),
            2,
        )
        .unwrap();
        assert_eq!((r.source_base, r.target_base, r.inner_bytes), (32, 0, 32));
        assert!(r.counts.is_empty());
        assert_eq!(
            r.segments(1).unwrap().collect::<Vec<_>>(),
            vec![(32, 0, 32)]
        );
    }

    #[test]
    fn split_on_columns_is_a_run_per_row() {
        // A 2x8 tensor split on dim 1: source cols 0..4 of TP2, target cols 0..2 of TP4.
        let r = Region::derive(
            &b(&[0, 0], &[2, 4]),
            &b(&[0, 0], &[2, 2]),
            &b(&[0, 0], &[2, 2]),
            2,
        )
        .unwrap();
        assert_eq!(r.counts, vec![2]);
        assert_eq!((r.source_strides[0], r.target_strides[0]), (8, 4));
        assert_eq!(
            r.segments(2).unwrap().collect::<Vec<_>>(),
            vec![(0, 0, 4), (8, 4, 4)]
        );
        assert_eq!(
            r.segments(1).err(),
            Some(Error::TooManySegments { count: 2, max: 1 })
        );
        assert_eq!(r.extents().unwrap(), (12, 8));
    }

    #[test]
    fn three_dimensional_box_folds_only_full_trailing_dims() {
        let src = b(&[0, 0, 0], &[4, 6, 8]);
        let dst = b(&[2, 0, 0], &[2, 6, 8]);
        let r = Region::derive(&src, &dst, &dst, 1).unwrap();
        assert_eq!((r.source_base, r.inner_bytes, r.counts.len()), (96, 96, 0));
        let part = b(&[1, 2, 0], &[2, 3, 8]);
        let r = Region::derive(&src, &b(&[0, 0, 0], &[4, 6, 8]), &part, 1).unwrap();
        assert_eq!(r.inner_bytes, 24);
        assert_eq!(r.counts, vec![2]);
        assert_eq!(r.total_bytes().unwrap(), 48);
    }

    #[test]
    fn rejects_boxes_outside_either_fragment() {
        let e = Region::derive(&b(&[0], &[4]), &b(&[0], &[8]), &b(&[2], &[4]), 2);
        assert!(matches!(e, Err(Error::Geometry(m)) if m.contains("source")));
        let e = Region::derive(&b(&[0], &[8]), &b(&[0], &[4]), &b(&[2], &[4]), 2);
        assert!(matches!(e, Err(Error::Geometry(m)) if m.contains("target")));
        assert!(Region::derive(&b(&[], &[]), &b(&[], &[]), &b(&[], &[]), 2).is_err());
    }
}
