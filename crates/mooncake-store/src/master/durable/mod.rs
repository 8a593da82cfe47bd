//! What makes the state machine outlive its process: [`oplog`] turns its
//! mutations into log entries (and the WAL that writes them), [`snapshot`]
//! encodes, stores and restores whole images of it.

pub mod oplog;
pub mod snapshot;
