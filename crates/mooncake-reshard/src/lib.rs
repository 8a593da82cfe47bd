//! The hot parts of `mooncake.reshard`, the weight-resharding planner: the
//! Python layer (`python/mooncake/reshard/`) owns the manifests, identities
//! and validation messages, and calls in here for the work that grows with
//! the number of fragments or bytes.
//!
//! - [`geometry`]: N-D logical boxes ([`Block`]: a global offset and a shape per
//!   fragment): containment, pairwise overlap, exact cover of a container.
//! - [`plan`]: which source boxes overlap each target box, through an
//!   interval index on the most selective dimension.
//! - [`region`]: the strided byte copy that moves one overlap box between
//!   two row-major fragments, and its flattened segments.
//! - [`copy`]: runs regions between byte buffers.
//!
//! Everything is pure and allocation-bounded by its inputs; nothing here
//! knows tensor names, ranks or transports.

pub mod copy;
pub mod geometry;
pub mod plan;
pub mod region;

/// A logical box of a tensor: where it starts in the global tensor, and
/// its extent per dimension.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    pub offset: Vec<u64>,
    pub shape: Vec<u64>,
}

impl Block {
    pub fn new(offset: Vec<u64>, shape: Vec<u64>) -> Self {
        Self { offset, shape }
    }

    pub fn ndim(&self) -> usize {
        self.offset.len()
    }

    /// One past the last index on `dim`.
    pub fn end(&self, dim: usize) -> u64 {
        self.offset[dim].saturating_add(self.shape[dim])
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("box rank mismatch: {0}")]
    Rank(String),
    #[error("high-dimensional overlap budget exceeded before validation")]
    OverlapBudget,
    #[error("{0}")]
    Geometry(String),
    #[error("transfer region exceeds max_segments: {count} > {max}")]
    TooManySegments { count: u64, max: u64 },
    #[error("size overflows 64 bits: {0}")]
    Overflow(&'static str),
    #[error("copy out of bounds: {0}")]
    Bounds(String),
}

pub type Result<T> = std::result::Result<T, Error>;
