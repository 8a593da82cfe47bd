//! Pieces every mooncake-rs layer shares: the reference's numeric error codes
//! ([`ErrorCode`], [`Error`]), human-readable size and duration parsing
//! ([`size`], [`duration`]), gflags-style argument handling ([`gflags`])
//! the optional cluster token ([`auth`]), checks of raw addresses
//! against this process's mappings ([`maps`]) and log setup ([`logging`]).

#![warn(unreachable_pub)]

pub mod auth;
pub mod duration;
pub mod error;
pub mod fd_limit;
pub mod gflags;
pub mod log_limit;
pub mod logging;
pub mod malloc;
pub mod maps;
pub mod size;

pub use error::{Error, ErrorCode, Result};
pub use log_limit::LogLimit;
