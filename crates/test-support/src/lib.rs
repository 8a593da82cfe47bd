//! Helpers the integration tests of several crates share (a dev-dependency
//! only; never part of a product):
//! - [`corpus`]: fuzz seed corpora checked against what the encoders make;
//! - [`services`]: real etcd and redis servers, from the environment or
//!   started here;
//! - [`freeze_proxy`]: a TCP relay that can stop carrying bytes, as behind a
//!   network partition;
//! - [`ports`]: free ports, and the settings that give a master only free
//!   ones;
//! - [`process`]: child processes killed on drop, ready lines, bounded waits.

pub mod corpus;
pub mod freeze_proxy;
pub mod ports;
pub mod process;
pub mod services;

pub use freeze_proxy::FreezeProxy;
pub use ports::free_port;
pub use process::{eventually, Proc, WAIT};
