//! The collectives' schedules as pure arithmetic: which rank reduces which
//! range, how a tensor is cut to fit the shared slots, and which schedule
//! a size gets. The Python glue asks these functions and only moves bytes.

/// Below this many bytes an all_reduce is direct: every rank reduces the
/// whole chunk from all slots (one phase fewer; the extra reads are cheap).
/// From it on, each rank reduces its own part (reduce-scatter) and then
/// copies the others' parts (all-gather), so every byte is reduced once.
pub const DIRECT_MAX_BYTES: usize = 256 << 10;

/// How an all_reduce moves its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduce {
    /// Everyone reduces everything from everyone's slot.
    Direct,
    /// Rank `r` reduces part `r` of every slot into its own slot, then every
    /// rank copies part `q` out of rank `q`'s slot.
    ReduceScatterAllGather,
}

/// The schedule for an all_reduce of `bytes` over `world` ranks.
pub fn all_reduce(bytes: usize, world: usize) -> AllReduce {
    if world <= 1 || bytes < DIRECT_MAX_BYTES {
        AllReduce::Direct
    } else {
        AllReduce::ReduceScatterAllGather
    }
}

/// `len` items cut into `parts` contiguous ranges as equal as can be (the
/// first `len % parts` get one more); empty ranges when `len < parts`.
pub fn partition(len: usize, parts: usize) -> Vec<(usize, usize)> {
    assert!(parts > 0, "partition into zero parts");
    let base = len / parts;
    let extra = len % parts;
    let mut out = Vec::with_capacity(parts);
    let mut lo = 0;
    for i in 0..parts {
        let hi = lo + base + usize::from(i < extra);
        out.push((lo, hi));
        lo = hi;
    }
    out
}

/// The part of a `len`-item chunk each of `size` ranks reduces in a
/// reduce-scatter over `members` (ranks in group order): member `i` gets
/// part `i` of `partition(len, members.len())`, every other rank nothing.
/// Over TCP a rank sends each peer only that peer's part, so a round moves
/// about twice the chunk per rank (scatter, then gather) rather than the
/// whole chunk to every peer.
pub fn owned_parts(len: usize, members: &[usize], size: usize) -> Vec<(usize, usize)> {
    let mut out = vec![(0, 0); size];
    if members.is_empty() {
        return out;
    }
    for (&r, part) in members.iter().zip(partition(len, members.len())) {
        if r < size {
            out[r] = part;
        }
    }
    out
}

/// Elements of `elem_size` bytes per block when `blocks` blocks share one
/// slot of `slot_bytes`; `None` when not even one element fits.
pub fn block_elems(slot_bytes: usize, elem_size: usize, blocks: usize) -> Option<usize> {
    if elem_size == 0 || blocks == 0 {
        return None;
    }
    let n = slot_bytes / elem_size / blocks;
    (n > 0).then_some(n)
}

/// The rounds that move `total` elements `per_round` at a time:
/// `(start, end)` of each; none for an empty tensor.
pub fn rounds(total: usize, per_round: usize) -> Vec<(usize, usize)> {
    assert!(per_round > 0, "rounds of zero elements");
    (0..total.div_ceil(per_round))
        .map(|i| (i * per_round, ((i + 1) * per_round).min(total)))
        .collect()
}

/// Start offsets of consecutive blocks of the given sizes, and the total.
pub fn offsets(sizes: &[usize]) -> (Vec<usize>, usize) {
    let mut out = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for s in sizes {
        out.push(at);
        at += s;
    }
    (out, at)
}

/// The part of `block` (a length) that round `(start, end)` of a
/// round-robin over blocks moves: blocks shorter than the round's start
/// move nothing in it.
pub fn clip(block: usize, round: (usize, usize)) -> (usize, usize) {
    (round.0.min(block), round.1.min(block))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cover_every_item_once_for_every_world() {
        for world in 1..=16 {
            for len in [0, 1, 2, 7, 15, 16, 17, 1000, 1 << 20, (1 << 20) + 13] {
                let parts = partition(len, world);
                assert_eq!(parts.len(), world);
                assert_eq!(parts[0].0, 0);
                assert_eq!(parts[world - 1].1, len);
                for w in parts.windows(2) {
                    assert_eq!(w[0].1, w[1].0, "world {world} len {len}");
                }
                let sizes: Vec<usize> = parts.iter().map(|(a, b)| b - a).collect();
                let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(max - min <= 1, "world {world} len {len}: {sizes:?}");
            }
        }
    }

    #[test]
    fn all_reduce_is_direct_when_small_or_alone() {
        for world in 1..=16 {
            assert_eq!(all_reduce(4096, world), AllReduce::Direct);
            assert_eq!(all_reduce(DIRECT_MAX_BYTES - 1, world), AllReduce::Direct);
            let big = all_reduce(64 << 20, world);
            if world == 1 {
                assert_eq!(big, AllReduce::Direct);
            } else {
                assert_eq!(big, AllReduce::ReduceScatterAllGather);
            }
        }
    }

    #[test]
    fn rounds_cover_a_tensor_in_slot_sized_pieces() {
        for world in 1..=16 {
            let per = block_elems(4 << 20, 4, world).unwrap();
            assert!(per * 4 * world <= 4 << 20);
            for total in [0, 1, per - 1, per, per + 1, 5 * per + 3] {
                let r = rounds(total, per);
                assert_eq!(r.len(), total.div_ceil(per));
                let mut at = 0;
                for (a, b) in &r {
                    assert_eq!(*a, at);
                    assert!(b > a && b - a <= per);
                    at = *b;
                }
                assert_eq!(at, total);
            }
        }
    }

    #[test]
    fn owned_parts_give_every_member_its_share_and_others_none() {
        for size in 1..=16usize {
            for len in [0, 1, 5, 16, 1000, (1 << 20) + 3] {
                // Every member, then one missing, then every other one.
                let all: Vec<usize> = (0..size).collect();
                let one_gone: Vec<usize> = (0..size).filter(|&r| r != size / 2).collect();
                let evens: Vec<usize> = (0..size).step_by(2).collect();
                for members in [all, one_gone, evens] {
                    let parts = owned_parts(len, &members, size);
                    assert_eq!(parts.len(), size);
                    let mut at = 0;
                    for (i, &r) in members.iter().enumerate() {
                        assert_eq!(parts[r], partition(len, members.len())[i]);
                        assert_eq!(parts[r].0, at, "size {size} len {len}");
                        at = parts[r].1;
                    }
                    assert_eq!(at, if members.is_empty() { 0 } else { len });
                    for r in (0..size).filter(|r| !members.contains(r)) {
                        assert_eq!(parts[r], (0, 0));
                    }
                }
            }
        }
        assert_eq!(owned_parts(9, &[], 3), vec![(0, 0); 3]);
        assert_eq!(owned_parts(9, &[0, 7], 3), vec![(0, 5), (0, 0), (0, 0)]);
    }

    #[test]
    fn block_elems_refuses_what_cannot_fit() {
        assert_eq!(block_elems(16, 8, 4), None);
        assert_eq!(block_elems(32, 8, 4), Some(1));
        assert_eq!(block_elems(32, 0, 4), None);
        assert_eq!(block_elems(32, 4, 0), None);
    }

    #[test]
    fn offsets_and_clip_split_variable_blocks_into_rounds() {
        assert_eq!(offsets(&[3, 0, 5]), (vec![0, 3, 3], 8));
        assert_eq!(offsets(&[]), (vec![], 0));
        // Blocks of 10 and 3 elements in rounds of 4: the short block is done
        // after its first round and moves nothing afterwards.
        let r = rounds(10, 4);
        let short: Vec<_> = r.iter().map(|&x| clip(3, x)).collect();
        assert_eq!(short, vec![(0, 3), (3, 3), (3, 3)]);
        let long: Vec<_> = r.iter().map(|&x| clip(10, x)).collect();
        assert_eq!(long, vec![(0, 4), (4, 8), (8, 10)]);
        for world in 1..=16usize {
            let sizes: Vec<usize> = (0..world).map(|i| i * 3 % 7).collect();
            let (offs, total) = offsets(&sizes);
            assert_eq!(total, sizes.iter().sum::<usize>());
            for i in 0..world {
                assert_eq!(offs[i], sizes[..i].iter().sum::<usize>());
            }
        }
    }
}
