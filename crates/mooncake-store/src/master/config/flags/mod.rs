//! The flag table: every `mooncake_master` flag, declared once.
//!
//! Each group module (one per concern) holds its rows; [`master_flags!`]
//! receives them all and generates [`FLAGS`] (the `--help` list, in group
//! order), the [`MasterConfig`] struct, its `Default` and the setter of
//! implemented flags. A new flag is one row in the module of its concern.

use std::time::Duration;

use mooncake_common::Result;

use super::parse;
use crate::master::config::policy::{AllocationStrategy, EvictionPolicy, HotKeyMode};

/// Kind of value a flag takes (for `--help` and boolean spellings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    Bool,
    Int,
    Float,
    Str,
    /// A duration: bare number in the flag's unit, or `5s`, `30m`, `1h`.
    Duration,
    /// A byte size: `1073741824`, `1GB`, `16 MB`.
    Size,
}

/// What a flag does in this implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Implemented.
    Full,
    /// Accepted for compatibility, feature not implemented: the value's form
    /// is checked and a non-default value is reported in the log.
    NotImplemented,
    /// A glog logging flag: accepted, no effect (logging is `--log_level`/`RUST_LOG`).
    Ignored,
}

/// One `mooncake_master` flag.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    pub name: &'static str,
    pub kind: FlagKind,
    pub default: &'static str,
    pub help: &'static str,
    pub support: Support,
}

/// Generates the table from the rows of every group. A row is
/// `name: Kind = "default", Support, "help"`, followed for an implemented
/// flag by `=> field: Type = parser`, where `parser` is a function of
/// [`parse`] turning the value into the field's type. `extra` declares the
/// fields no flag sets.
macro_rules! master_flags {
    (
        []
        extra {
            $( $(#[$xdoc:meta])* $xfield:ident : $xty:ty = $xdefault:expr; )*
        }
        $(
            $name:ident : $kind:ident = $default:literal, $support:ident, $help:literal
            $( => $field:ident : $ty:ty = $parse:ident )?;
        )*
    ) => {
        /// Every flag the master accepts (the reference's, same names and
        /// defaults), in `--help` order.
        pub const FLAGS: &[Flag] = &[
            $(
                Flag {
                    name: stringify!($name),
                    kind: FlagKind::$kind,
                    default: $default,
                    help: $help,
                    support: Support::$support,
                },
            )*
        ];

        /// Master settings. `Default` gives the reference's defaults.
        #[derive(Debug, Clone, PartialEq)]
        pub struct MasterConfig {
            $( $( #[doc = $help] pub $field: $ty, )? )*
            $( $(#[$xdoc])* pub $xfield: $xty, )*
        }

        impl Default for MasterConfig {
            fn default() -> Self {
                MasterConfig {
                    $( $(
                        $field: parse::$parse(stringify!($name), $default, $default)
                            .expect("flag defaults parse"),
                    )? )*
                    $( $xfield: $xdefault, )*
                }
            }
        }

        impl MasterConfig {
            /// Sets the field of an implemented flag; `None` for the others.
            pub(super) fn set_field(&mut self, name: &str, value: &str, v: &str) -> Option<Result<()>> {
                match name {
                    $( $(
                        stringify!($name) => {
                            Some(parse::$parse(name, value, v).map(|x| self.$field = x))
                        }
                    )? )*
                    _ => None,
                }
            }
        }
    };
}

#[macro_use]
mod core;
#[macro_use]
mod eviction;
#[macro_use]
mod events;
#[macro_use]
mod glog;
#[macro_use]
mod ha;
#[macro_use]
mod offload;
#[macro_use]
mod snapshot;
#[macro_use]
mod tasks;
#[macro_use]
mod tenants;
#[macro_use]
mod unsupported;

// Each group appends its rows and calls the next; the last is the generator.
core_flags! {
    [eviction_flags, tasks_flags, ha_flags, snapshot_flags, offload_flags, events_flags, tenants_flags, unsupported_flags, glog_flags, master_flags]
    extra {
        /// How often the metrics summary is logged.
        metric_report_interval: Duration = Duration::from_secs(10);
        /// Flags accepted for compatibility whose feature is not implemented,
        /// set to a non-default value: `(name, value)`; the server logs them.
        unsupported: Vec<(String, String)> = Vec::new();
    }
}

/// Names of the boolean flags, for `gflags::normalize`.
pub fn bool_flag_names() -> Vec<&'static str> {
    FLAGS
        .iter()
        .filter(|f| f.kind == FlagKind::Bool)
        .map(|f| f.name)
        .collect()
}
