//! The `mooncake._mooncake` extension module. The public Python modules
//! (`mooncake.engine`, `mooncake.store`) re-export what is defined here.

use pyo3::prelude::*;

/// Runs the command-line program `name` (e.g. `mooncake_master`) with `argv`
/// in this process, GIL released, and returns its exit code.
#[pyfunction]
fn _run_cli(py: Python<'_>, name: String, argv: Vec<String>) -> i32 {
    py.allow_threads(|| mooncake_cli::entry::run(&name, argv))
}

#[pymodule]
fn _mooncake(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(_run_cli, m)?)?;
    Ok(())
}
