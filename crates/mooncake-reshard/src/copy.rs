//! Running regions: the bytes of each overlap box move from a source
//! fragment's buffer to a target fragment's buffer.
//!
//! Work is split by target buffer, so each thread owns the buffers it
//! writes and the split needs no unsafe code; a reshard writes many target
//! fragments (one per rank and tensor), which keeps the threads busy.

use crate::region::Region;
use crate::{Error, Result};

/// One region to run: from `sources[source]` into `targets[target]`.
#[derive(Clone, Debug)]
pub struct Job {
    pub source: usize,
    pub target: usize,
    pub region: Region,
}

/// Copies one region; checks both sides' bounds before touching a byte.
pub fn copy_region(source: &[u8], target: &mut [u8], region: &Region) -> Result<u64> {
    let (source_end, target_end) = region.extents()?;
    if source_end > source.len() as u64 {
        return Err(Error::Bounds(format!(
            "region reads to byte {source_end} of a {}-byte source",
            source.len()
        )));
    }
    if target_end > target.len() as u64 {
        return Err(Error::Bounds(format!(
            "region writes to byte {target_end} of a {}-byte target",
            target.len()
        )));
    }
    let mut moved = 0u64;
    for (s, t, n) in region.segments(u64::MAX)? {
        // In bounds: every run ends at or before the extents checked above.
        let (s, t, n) = (s as usize, t as usize, n as usize);
        target[t..t + n].copy_from_slice(&source[s..s + n]);
        moved += n as u64;
    }
    Ok(moved)
}

/// Runs `jobs` on up to `threads` threads and returns the bytes moved.
/// Every job's bounds are checked before any copy starts, so a bad job
/// leaves every target untouched.
pub fn run(
    jobs: &[Job],
    sources: &[&[u8]],
    targets: &mut [&mut [u8]],
    threads: usize,
) -> Result<u64> {
    for job in jobs {
        let source = sources
            .get(job.source)
            .ok_or_else(|| Error::Bounds(format!("no source buffer {}", job.source)))?;
        let target = targets
            .get(job.target)
            .ok_or_else(|| Error::Bounds(format!("no target buffer {}", job.target)))?;
        let (source_end, target_end) = job.region.extents()?;
        if source_end > source.len() as u64 || target_end > target.len() as u64 {
            return Err(Error::Bounds(format!(
                "region from buffer {} to buffer {} exceeds a buffer",
                job.source, job.target
            )));
        }
    }
    let mut by_target: Vec<Vec<&Job>> = vec![Vec::new(); targets.len()];
    for job in jobs {
        by_target[job.target].push(job);
    }
    let threads = threads.clamp(1, targets.len().max(1));
    // Deal targets out round-robin by bytes so each thread gets a fair share.
    let mut loads = vec![0u64; threads];
    let mut shares: Vec<Vec<(usize, &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
    let mut order: Vec<(usize, &mut &mut [u8])> = targets.iter_mut().enumerate().collect();
    order.sort_by_key(|(i, t)| std::cmp::Reverse((t.len(), *i)));
    for (i, t) in order {
        let lightest = (0..threads).min_by_key(|&k| loads[k]).unwrap_or(0);
        loads[lightest] += by_target[i]
            .iter()
            .map(|j| j.region.total_bytes().unwrap_or(0))
            .sum::<u64>();
        shares[lightest].push((i, &mut **t));
    }
    let by_target = &by_target;
    let results: Vec<Result<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = shares
            .into_iter()
            .map(|share| {
                scope.spawn(move || {
                    let mut moved = 0u64;
                    for (i, target) in share {
                        for job in &by_target[i] {
                            moved += copy_region(sources[job.source], target, &job.region)?;
                        }
                    }
                    Ok(moved)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Bounds("copy thread panicked".into())))
            })
            .collect()
    });
    results.into_iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::match_boxes;
    use crate::Block;

    fn b(offset: &[u64], shape: &[u64]) -> Block {
        Block::new(offset.to_vec(), shape.to_vec())
    }

    /// Reshards a rows x cols u16 tensor from `from` to `to` column shards
    /// and checks every cell lands where the global layout says.
    fn reshard_columns(rows: u64, cols: u64, from: u64, to: u64, threads: usize) {
        let global: Vec<u16> = (0..rows * cols).map(|v| v as u16).collect();
        let shard = |n: u64, k: u64| b(&[0, k * cols / n], &[rows, cols / n]);
        let sources: Vec<Block> = (0..from).map(|k| shard(from, k)).collect();
        let targets: Vec<Block> = (0..to).map(|k| shard(to, k)).collect();
        let source_bytes: Vec<Vec<u8>> = sources
            .iter()
            .map(|s| {
                let mut out = Vec::new();
                for r in 0..rows {
                    for c in s.offset[1]..s.end(1) {
                        out.extend_from_slice(&global[(r * cols + c) as usize].to_le_bytes());
                    }
                }
                out
            })
            .collect();
        let mut target_bytes: Vec<Vec<u8>> = targets
            .iter()
            .map(|t| vec![0u8; (rows * t.shape[1] * 2) as usize])
            .collect();
        let mut jobs = Vec::new();
        for (ti, found) in match_boxes(&sources, &targets)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            for (si, overlap) in found {
                let region = Region::derive(&sources[si], &targets[ti], &overlap, 2).unwrap();
                jobs.push(Job {
                    source: si,
                    target: ti,
                    region,
                });
            }
        }
        let srcs: Vec<&[u8]> = source_bytes.iter().map(|v| v.as_slice()).collect();
        let mut dsts: Vec<&mut [u8]> = target_bytes.iter_mut().map(|v| v.as_mut_slice()).collect();
        assert_eq!(
            run(&jobs, &srcs, &mut dsts, threads).unwrap(),
            rows * cols * 2
        );
        for (t, bytes) in targets.iter().zip(&target_bytes) {
            let mut at = 0;
            for r in 0..rows {
                for c in t.offset[1]..t.end(1) {
                    let v = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
                    assert_eq!(v, global[(r * cols + c) as usize]);
                    at += 2;
                }
            }
        }
    }

    #[test]
    fn column_reshards_land_every_cell() {
        reshard_columns(6, 16, 2, 4, 1);
        reshard_columns(6, 16, 4, 2, 3);
        reshard_columns(5, 24, 3, 8, 8);
    }

    #[test]
    fn bad_bounds_touch_nothing() {
        let region = Region::derive(&b(&[0], &[8]), &b(&[0], &[8]), &b(&[0], &[8]), 1).unwrap();
        let source = [7u8; 4];
        let mut target = [0u8; 8];
        assert!(matches!(
            copy_region(&source, &mut target, &region),
            Err(Error::Bounds(_))
        ));
        let jobs = [
            Job {
                source: 0,
                target: 0,
                region,
            },
            Job {
                source: 1,
                target: 0,
                region: Region::derive(&b(&[0], &[1]), &b(&[0], &[1]), &b(&[0], &[1]), 1).unwrap(),
            },
        ];
        let big = [1u8; 8];
        let mut t = [0u8; 8];
        let mut dsts: Vec<&mut [u8]> = vec![&mut t];
        assert!(run(&jobs, &[&big], &mut dsts, 2).is_err());
        assert_eq!(t, [0u8; 8]);
    }
}
