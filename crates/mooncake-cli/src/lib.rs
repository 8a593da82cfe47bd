//! Command-line front ends. Each binary only parses flags and calls a library
//! `run` function; the Python package calls the same functions so that
//! `pip install` puts identical binaries on PATH.
//!
//! Convention for every binary `NAME` (see [`entry`]): the library exposes
//! `pub fn main(argv: Vec<String>) -> i32` (argv[0] is the program name, as
//! `std::env::args`), and `src/bin/NAME.rs` is only
//! `fn main() { std::process::exit(mooncake_cli::entry::run("NAME", std::env::args().collect())) }`.
//! Such a `main` must stop cleanly on SIGINT/SIGTERM by itself (use
//! [`signals::shutdown_signal`]): inside the Python console scripts the same
//! function runs in the interpreter's process with default signal dispositions.
//! Set up logs with [`logging::init`] (never `tracing_subscriber`'s `init()`,
//! which panics inside Python, where a subscriber is already installed).

pub mod client;
pub mod entry;
pub mod http_metadata_server;
pub mod logging;
pub mod master;
pub mod signals;
pub mod te_bench;
pub mod umbrella;
