//! The nemesis: three replicated masters (`--enable_ha --enable_oplog`)
//! on etcd, redis or the Kubernetes Lease stand-in, two load tasks with a
//! store client each, and random faults drawn from a printed seed, one at
//! a time, the cluster made whole again between them. The checker
//! ([`checker`]) then asserts what the cluster promised.
//!
//! - [`plan`]: the faults drawn from the seed (pure);
//! - [`checker`]: what a read must return, what the end must hold (pure);
//! - [`coordination`], [`masters`], [`load`]: the processes and the load;
//! - [`run()`]: a run, and its [`Summary`].

pub mod checker;
pub mod coordination;
pub mod load;
pub mod masters;
pub mod plan;
mod run;

pub use coordination::Backend;
pub use plan::{Fault, Kind, Target};
pub use run::{run, Config, Summary};
