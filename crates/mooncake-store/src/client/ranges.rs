//! Ranged reads (`get_into_ranges`): the caller's buffer-major arguments
//! flattened into one list of fragment reads, and the answers put back in
//! the caller's shape. Pure logic.

use mooncake_common::{Error, ErrorCode, Result};

/// One fragment of a ranged read, flattened from the buffer-major shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RangeRead {
    pub buffer: usize,
    /// The caller's stated buffer size, when known (the dummy client knows it).
    pub buffer_len: Option<usize>,
    pub key: String,
    pub dst_off: u64,
    pub src_off: u64,
    pub len: usize,
}

/// Per buffer, per key, per fragment: an outcome.
pub(crate) type RangeAnswers = Vec<Vec<Vec<Result<u64>>>>;

/// The reads to make, and the answers so far: `INVALID_PARAMS` where the
/// argument shapes do not line up (only the entries they touch), a
/// placeholder elsewhere. [`Self::answer`] fills the placeholders in.
pub(crate) struct RangeBatch {
    pub reads: Vec<RangeRead>,
    /// Where each read's answer goes: `(buffer, key, fragment)`.
    slots: Vec<(usize, usize, usize)>,
    answers: RangeAnswers,
}

fn shape_err<T>() -> Result<T> {
    Err(Error::new(
        ErrorCode::INVALID_PARAMS,
        "get_into_ranges: argument shapes differ",
    ))
}

impl RangeBatch {
    /// `all_keys[i][j]`'s fragment `k` is `all_sizes[i][j][k]` bytes at
    /// `all_src_offsets[i][j][k]` in the object, into
    /// `buffer_ptrs[i] + all_dst_offsets[i][j][k]`.
    pub(super) fn flatten(
        buffer_ptrs: &[usize],
        all_keys: &[Vec<String>],
        all_dst_offsets: &[Vec<Vec<u64>>],
        all_src_offsets: &[Vec<Vec<u64>>],
        all_sizes: &[Vec<Vec<u64>>],
    ) -> RangeBatch {
        let n = buffer_ptrs.len();
        let top_ok = all_keys.len() == n
            && all_dst_offsets.len() == n
            && all_src_offsets.len() == n
            && all_sizes.len() == n;
        let mut batch = RangeBatch {
            reads: Vec::new(),
            slots: Vec::new(),
            answers: Vec::with_capacity(n),
        };
        for (i, &buffer) in buffer_ptrs.iter().enumerate() {
            let keys = all_keys.get(i).map(Vec::as_slice).unwrap_or(&[]);
            let (dsts, srcs, sizes) = (
                all_dst_offsets.get(i),
                all_src_offsets.get(i),
                all_sizes.get(i),
            );
            let buf_ok = top_ok
                && dsts.map(Vec::len) == Some(keys.len())
                && srcs.map(Vec::len) == Some(keys.len())
                && sizes.map(Vec::len) == Some(keys.len());
            let mut per_key = Vec::with_capacity(keys.len());
            for (j, key) in keys.iter().enumerate() {
                let d = dsts.and_then(|v| v.get(j));
                let s = srcs.and_then(|v| v.get(j));
                let z = sizes.and_then(|v| v.get(j));
                let nfrag = [d, s, z]
                    .iter()
                    .map(|v| v.map_or(0, Vec::len))
                    .max()
                    .unwrap_or(0);
                let frag_ok = buf_ok && [d, s, z].iter().all(|v| v.map(Vec::len) == Some(nfrag));
                let mut per_frag = Vec::with_capacity(nfrag);
                for k in 0..nfrag {
                    if !frag_ok {
                        per_frag.push(shape_err());
                        continue;
                    }
                    let (d, s, z) = (d.unwrap()[k], s.unwrap()[k], z.unwrap()[k]);
                    match (usize::try_from(z), usize::try_from(d)) {
                        (Ok(len), Ok(_)) => {
                            per_frag.push(Ok(0));
                            batch.slots.push((i, j, k));
                            batch.reads.push(RangeRead {
                                buffer,
                                buffer_len: None,
                                key: key.clone(),
                                dst_off: d,
                                src_off: s,
                                len,
                            });
                        }
                        _ => per_frag.push(shape_err()),
                    }
                }
                per_key.push(per_frag);
            }
            batch.answers.push(per_key);
        }
        batch
    }

    /// The answers in the caller's shape, given one outcome per read.
    pub(super) fn answer(self, outcomes: Vec<Result<u64>>) -> RangeAnswers {
        let mut answers = self.answers;
        for (r, (i, j, k)) in outcomes.into_iter().zip(self.slots) {
            answers[i][j][k] = r;
        }
        answers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(a: &RangeAnswers) -> Vec<Vec<Vec<std::result::Result<u64, ErrorCode>>>> {
        a.iter()
            .map(|b| {
                b.iter()
                    .map(|k| k.iter().map(|r| r.clone().map_err(|e| e.code)).collect())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn flattens_buffer_major_and_answers_in_shape() {
        let keys = vec![
            vec!["a".to_string(), "b".to_string()],
            vec!["c".to_string()],
        ];
        let batch = RangeBatch::flatten(
            &[0x1000, 0x2000],
            &keys,
            &[vec![vec![0, 8], vec![16]], vec![vec![0]]],
            &[vec![vec![100, 200], vec![0]], vec![vec![5]]],
            &[vec![vec![8, 8], vec![4]], vec![vec![3]]],
        );
        let got: Vec<(usize, &str, u64, u64, usize)> = batch
            .reads
            .iter()
            .map(|r| (r.buffer, r.key.as_str(), r.dst_off, r.src_off, r.len))
            .collect();
        assert_eq!(
            got,
            [
                (0x1000, "a", 0, 100, 8),
                (0x1000, "a", 8, 200, 8),
                (0x1000, "b", 16, 0, 4),
                (0x2000, "c", 0, 5, 3),
            ]
        );
        assert!(batch.reads.iter().all(|r| r.buffer_len.is_none()));
        let answers = batch.answer(vec![
            Ok(8),
            Err(Error::new(ErrorCode::BUFFER_OVERFLOW, "x")),
            Ok(4),
            Ok(3),
        ]);
        assert_eq!(
            codes(&answers),
            [
                vec![vec![Ok(8), Err(ErrorCode::BUFFER_OVERFLOW)], vec![Ok(4)]],
                vec![vec![Ok(3)]],
            ]
        );
    }

    #[test]
    fn a_shape_mismatch_fails_only_what_it_touches() {
        let bad = Err(ErrorCode::INVALID_PARAMS);
        // Key "b" has two destination offsets but one size: its fragments fail.
        let keys = vec![vec!["a".to_string(), "b".to_string()]];
        let batch = RangeBatch::flatten(
            &[0x1000],
            &keys,
            &[vec![vec![0], vec![8, 16]]],
            &[vec![vec![0], vec![0, 4]]],
            &[vec![vec![4], vec![4]]],
        );
        assert_eq!(batch.reads.len(), 1);
        let answers = batch.answer(vec![Ok(4)]);
        assert_eq!(codes(&answers), [vec![vec![Ok(4)], vec![bad, bad]]]);

        // A missing top-level list fails every fragment of that buffer.
        let batch = RangeBatch::flatten(&[0x1000], &keys, &[], &[], &[]);
        assert!(batch.reads.is_empty());
        assert_eq!(codes(&batch.answer(vec![])), [vec![vec![], vec![]]]);

        // No buffers, nothing to read.
        let batch = RangeBatch::flatten(&[], &[], &[], &[], &[]);
        assert!(batch.reads.is_empty());
        assert!(batch.answer(vec![]).is_empty());
    }
}
