//! Transfer Engine: moves bytes between registered memory in different
//! processes and hosts.

pub mod metadata;
