//! The `stoker._stoker` extension module: everything comes from `stoker-python`, plus the entry
//! point of the `stoker` command installed with the wheel.

use pyo3::prelude::*;

/// Runs the `stoker` command line with `argv` (program name first); returns the exit code.
/// Ctrl-C and a closed pipe get their default meaning (end the process), as for the native
/// binary.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> i32 {
    // SAFETY: restoring the default disposition of SIGINT is always valid; the CLI is the whole
    // remaining life of this process.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    py.detach(|| stoker_cli::run_from(argv))
}

#[pymodule]
fn _stoker(m: &Bound<'_, PyModule>) -> PyResult<()> {
    stoker_python::register(m)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    Ok(())
}
