//! Command-line front ends. Each binary only parses flags and calls a library
//! `run` function; the Python package calls the same functions so that
//! `pip install` puts identical binaries on PATH.
