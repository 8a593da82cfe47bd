//! The hashing standard routers and publishers share (the reference's, and
//! NVIDIA Dynamo's, so the two interoperate): XXH3-64 over a block's tokens
//! as little-endian `u32`, rolled with the parent's hash.
//!
//! `seq[0] = xxh3(tokens[0..bs])`,
//! `seq[i] = xxh3(seq[i-1] as u64 LE || local[i] as u64 LE)`, all with one seed.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Dynamo's default seed.
pub const DEFAULT_SEED: u64 = 1337;

/// The hash of one block's tokens alone.
pub fn local_block_hash(tokens: &[u32], seed: u64) -> u64 {
    // Tokens are hashed as their little-endian bytes; a stack buffer keeps
    // the common block sizes (up to 256 tokens) free of allocation.
    let mut stack = [0u8; 1024];
    let n = tokens.len() * 4;
    if n <= stack.len() {
        for (chunk, t) in stack.chunks_exact_mut(4).zip(tokens) {
            chunk.copy_from_slice(&t.to_le_bytes());
        }
        xxh3_64_with_seed(&stack[..n], seed)
    } else {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&bytes, seed)
    }
}

/// The rolling hash of a block whose parent prefix hashed to `parent`.
pub fn roll(parent: Option<u64>, local: u64, seed: u64) -> u64 {
    match parent {
        None => local,
        Some(p) => {
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&p.to_le_bytes());
            buf[8..].copy_from_slice(&local.to_le_bytes());
            xxh3_64_with_seed(&buf, seed)
        }
    }
}

/// The rolling hashes of every complete block of `tokens` (a trailing
/// partial block is not hashed), starting below `parent`.
pub fn seq_hashes_from(
    parent: Option<u64>,
    tokens: &[u32],
    block_size: usize,
    seed: u64,
) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut prev = parent;
    for block in tokens.chunks_exact(block_size) {
        let h = roll(prev, local_block_hash(block, seed), seed);
        out.push(h);
        prev = Some(h);
    }
    out
}

/// The rolling hashes of a prompt's complete blocks.
pub fn seq_hashes(tokens: &[u32], block_size: usize, seed: u64) -> Vec<u64> {
    seq_hashes_from(None, tokens, block_size, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamo_vector() {
        // Dynamo's published test vector for its block hash.
        assert_eq!(
            local_block_hash(&[1, 2, 3, 4], DEFAULT_SEED),
            14643705804678351452
        );
        assert_eq!(
            seq_hashes(&[1, 2, 3, 4], 4, DEFAULT_SEED),
            vec![14643705804678351452]
        );
    }

    #[test]
    fn rolling_prefix_property() {
        let a = seq_hashes(&[1, 2, 3, 4, 5, 6], 2, DEFAULT_SEED);
        let b = seq_hashes(&[1, 2, 3, 4, 9, 9, 7], 2, DEFAULT_SEED);
        assert_eq!(a.len(), 3);
        assert_eq!(b.len(), 3, "the trailing partial block is not hashed");
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // Same tokens at another depth hash differently.
        assert_ne!(
            a[0],
            seq_hashes_from(Some(a[0]), &[1, 2], 2, DEFAULT_SEED)[0]
        );
        // Continuing from a parent equals hashing the whole prompt.
        assert_eq!(
            seq_hashes_from(Some(a[1]), &[5, 6], 2, DEFAULT_SEED),
            vec![a[2]]
        );
        // The seed matters.
        assert_ne!(
            seq_hashes(&[1, 2], 2, 0),
            seq_hashes(&[1, 2], 2, DEFAULT_SEED)
        );
        // Large blocks take the heap path and agree with the definition.
        let big: Vec<u32> = (0..600).collect();
        let bytes: Vec<u8> = big.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(local_block_hash(&big, 7), xxh3_64_with_seed(&bytes, 7));
        assert!(seq_hashes(&[1, 2], 0, DEFAULT_SEED).is_empty());
    }
}
