//! The data plane of the `mooncake-cpu` torch.distributed backend.
//!
//! Ranks on one host share memory: every rank owns one segment (a file
//! under `/dev/shm`, mapped by all its peers) holding its control words,
//! two collective slots and one outgoing mailbox ring per peer. A
//! collective is a sequence of phases; a rank announces a phase by bumping
//! one of its control words and waits for its peers' words with a short
//! spin and then futex sleeps, so an idle rank burns no CPU. While it
//! sleeps it checks that its peers' processes are alive (pidfds), so a
//! dead rank fails the operation within [`wait::LIVENESS_PERIOD`] instead
//! of hanging it.
//!
//! [`schedule`] holds the pure arithmetic (partitions, chunking, the
//! choice between the direct and the reduce-scatter + all-gather schedule)
//! that the Python glue in `mooncake.pg` follows; [`membership`] the
//! arithmetic of growing a group (which ranks join, the size reported).
//!
//! Ranks on different hosts use [`tcp`]: the same interface over a TCP
//! mesh, each peer's slots copied in by a reader thread. Both implement
//! [`Transport`], the calls the Python glue makes.

pub mod group;
pub mod layout;
pub mod membership;
pub mod schedule;
pub mod tcp;
pub mod transport;
pub mod wait;

pub use group::{Flag, GroupError, ShmGroup};
pub use layout::Layout;
pub use tcp::TcpGroup;
pub use transport::Transport;
