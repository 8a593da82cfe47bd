//! The C ABI of the transfer engine and the store, as the reference ships
//! it: every function of its `transfer_engine_c.h` and `store_c.h`, with
//! the same types, constants and return codes, over
//! [`mooncake_transfer::TransferEngine`] and the store
//! [`Client`](mooncake_store::Client). Built as `libmooncake_capi.so`; the
//! headers are `include/`, the pkg-config file `mooncake.pc` (docs/c-abi.md).
//!
//! - `engine`, `store`: the exported functions (safe code);
//! - `ffi`: the only module with `unsafe`: reading and writing through the
//!   caller's pointers, the `malloc`ed notify arrays;
//! - `handles`: opaque handles looked up, never dereferenced;
//! - (`mooncake_common::maps` says whether memory is mapped);
//! - `codes`: the reference's numbers; `types`: the headers' structs.

mod codes;
pub mod engine;
mod ffi;
mod handles;
pub mod store;
pub mod types;

/// Runs `f`, turning a panic into `fallback`: a panic must not unwind into
/// C (it would abort the caller's process).
fn guard<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            tracing::error!("internal error (panic) in a mooncake C call");
            fallback
        }
    }
}

/// Logs to stderr at `MC_LOG_LEVEL` (`warn` by default), or as `RUST_LOG`
/// says; once per process, and not over a subscriber the host installed.
fn init_logging() {
    mooncake_common::logging::init_once("warn");
}
