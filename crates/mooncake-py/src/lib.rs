//! The `mooncake._mooncake` extension module. The public Python modules
//! (`mooncake.engine`, `mooncake.store`) re-export what is defined here.
//!
//! - `engine`: `TransferEngine`, `TransferOpcode`, `TransferNotify`;
//! - `store`: `MooncakeDistributedStore` and the classes its calls return;
//! - `config`, `enums`: `ReplicateConfig` and the store's int enums;
//! - `hostmem`: `MooncakeHostMemAllocator`, `bind_to_numa_node`;
//! - `p2p_store`: `P2PStore` and `P2PStoreError` (`mooncake.p2p_store`);
//! - `fast_copy`: `concat_arrays_into`, which `mooncake._fast_copy` exports;
//! - `reshard`: the `reshard_*` geometry and copy calls behind `mooncake.reshard`;
//! - `codes`: the ints both APIs return for failures;
//! - `args`, `buffer`, `handle`, `mem`: argument conversions, borrowed and
//!   lent Python buffers, and the checks that keep raw addresses from
//!   crashing the process.

use pyo3::prelude::*;

mod args;
mod buffer;
mod codes;
mod config;
mod engine;
mod enums;
mod fast_copy;
mod handle;
mod hostmem;
mod mem;
mod p2p_store;
mod pg;
mod pg_args;
mod pg_group;
mod reshard;
mod running;
mod store;

/// Runs the command-line program `name` (e.g. `mooncake_master`) with `argv`
/// in this process, GIL released, and returns its exit code.
#[pyfunction]
fn _run_cli(py: Python<'_>, name: String, argv: Vec<String>) -> i32 {
    py.allow_threads(|| mooncake_cli::entry::run(&name, argv))
}

/// Logs to stderr like the reference: level from `MC_LOG_LEVEL` (`TRACE`,
/// `DEBUG`, `INFO`, `WARNING`, `ERROR`; default warnings and errors), or a
/// full `RUST_LOG` filter. Called when the first engine or store is made (not
/// at import, so a program run through `_run_cli` sets up its own logs).
pub(crate) fn init_logging() {
    mooncake_common::logging::init_once("warn");
}

/// The programs built into this package (those `_run_cli` can run).
#[pyfunction]
fn _programs() -> Vec<&'static str> {
    mooncake_cli::entry::PROGRAMS
        .iter()
        .copied()
        .filter(|p| mooncake_cli::entry::lookup(p).is_some())
        .collect()
}

/// Keeps freed heap memory for reuse instead of handing it back at once.
///
/// `get`/`get_batch` return fresh `bytes` objects, which CPython mallocs.
/// glibc returns a freed heap top above a small, dynamic threshold to the
/// kernel, so the next call's results fault every page in again (zeroed by
/// the kernel): on the test VM that made `get_batch` of 16 x 1 MiB 2-3x
/// slower than the copies themselves. Up to 32 MiB per allocation now comes
/// from the heap, and up to 256 MiB of free heap is kept. Opt out with
/// `MC_MALLOC_TUNING=0`, or by setting glibc's own `MALLOC_TRIM_THRESHOLD_` /
/// `MALLOC_MMAP_THRESHOLD_`, which then win.
fn tune_malloc() {
    mooncake_common::malloc::tune(mooncake_common::malloc::Thresholds {
        mmap: Some(32 << 20),
        trim: Some(256 << 20),
    });
}

#[pymodule]
fn _mooncake(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tune_malloc();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(_run_cli, m)?)?;
    m.add_function(wrap_pyfunction!(_programs, m)?)?;
    m.add_function(wrap_pyfunction!(fast_copy::concat_arrays_into, m)?)?;
    m.add_class::<config::ReplicateConfig>()?;
    enums::register(m)?;
    engine::register(m)?;
    store::register(m)?;
    pg::register(m)?;
    p2p_store::register(m)?;
    reshard::register(m)?;
    m.add_class::<hostmem::HostMemAllocator>()?;
    m.add_function(wrap_pyfunction!(hostmem::bind_to_numa_node, m)?)?;
    m.add_function(wrap_pyfunction!(hostmem::_readable, m)?)?;
    m.add_function(wrap_pyfunction!(hostmem::_writable, m)?)?;
    Ok(())
}
