//! The reference implementation's error numbers. They are part of the public
//! surface: the Python API returns them as negative ints and scripts compare
//! against them, so the numbers never change.
//!
//! The reference has two numberings, one per component, and they overlap:
//! the store's codes (`mooncake-store/include/types.h`) and the Transfer
//! Engine's (`mooncake-transfer-engine/include/error.h`, the `ERR_*` codes).
//! [`ErrorCode::code`] is each code's number in its own component;
//! [`ErrorCode::wire`] tells them apart on our own protocols.

use std::borrow::Cow;
use std::fmt;

macro_rules! error_codes {
    (
        store { $($s_name:ident = $s_num:expr,)* }
        engine { $($e_name:ident = $e_num:expr,)* }
    ) => {
        /// A stable error number shared with the reference implementation.
        ///
        /// The discriminant is the code's number on our own wire protocols
        /// ([`ErrorCode::wire`]): a store code's own number, and for an
        /// engine code `ENGINE_WIRE_BASE` (-1 000 000) plus its number, because the two
        /// reference headers reuse numbers (`INTERNAL_ERROR` and
        /// `ERR_INVALID_ARGUMENT` are both -1). Users see [`ErrorCode::code`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[allow(non_camel_case_types)]
        #[repr(i32)]
        pub enum ErrorCode {
            $($s_name = $s_num,)*
            $($e_name = ENGINE_WIRE_BASE + $e_num,)*
        }

        impl ErrorCode {
            /// Every known code, in declaration order.
            pub const ALL: &'static [ErrorCode] =
                &[$(ErrorCode::$s_name,)* $(ErrorCode::$e_name,)*];

            /// The reference's name, e.g. `"OBJECT_NOT_FOUND"`.
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorCode::$s_name => stringify!($s_name),)*
                    $(ErrorCode::$e_name => stringify!($e_name),)*
                }
            }

            /// The reference's number: the store's for store codes, the
            /// engine's `error.h` for engine codes (`ERR_*`).
            pub fn code(self) -> i32 {
                match self {
                    $(ErrorCode::$s_name => $s_num,)*
                    $(ErrorCode::$e_name => $e_num,)*
                }
            }

            /// This code on our wire protocols (unique, unlike [`ErrorCode::code`]).
            pub fn wire(self) -> i32 {
                self as i32
            }

            /// The code of [`ErrorCode::wire`] number `v`, if any.
            pub fn from_wire(v: i32) -> Option<ErrorCode> {
                ErrorCode::ALL.iter().copied().find(|c| c.wire() == v)
            }
        }
    };
}

/// Where engine codes sit in the wire numbering: far below every store code.
const ENGINE_WIRE_BASE: i32 = -1_000_000;

error_codes! {
    // mooncake-store's error codes (the Python store API returns these).
    store {
        OK = 0,
        INTERNAL_ERROR = -1,
        BUFFER_OVERFLOW = -10,
        SHARD_INDEX_OUT_OF_RANGE = -100,
        SEGMENT_NOT_FOUND = -101,
        SEGMENT_ALREADY_EXISTS = -102,
        CLIENT_NOT_FOUND = -103,
        NO_AVAILABLE_HANDLE = -200,
        INVALID_VERSION = -300,
        INVALID_KEY = -400,
        WRITE_FAIL = -500,
        INVALID_PARAMS = -600,
        ILLEGAL_CLIENT = -601,
        INVALID_WRITE = -700,
        INVALID_READ = -701,
        INVALID_REPLICA = -702,
        REPLICA_IS_NOT_READY = -703,
        OBJECT_NOT_FOUND = -704,
        OBJECT_ALREADY_EXISTS = -705,
        OBJECT_HAS_LEASE = -706,
        LEASE_EXPIRED = -707,
        OBJECT_HAS_REPLICATION_TASK = -708,
        OBJECT_NO_REPLICATION_TASK = -709,
        REPLICA_NOT_FOUND = -710,
        REPLICA_ALREADY_EXISTS = -711,
        REPLICA_IS_GONE = -712,
        REPLICA_NOT_IN_LOCAL_MEMORY = -713,
        OBJECT_REPLICA_BUSY = -714,
        TRANSFER_FAIL = -800,
        RPC_FAIL = -900,
        ETCD_OPERATION_ERROR = -1000,
        ETCD_KEY_NOT_EXIST = -1001,
        ETCD_TRANSACTION_FAIL = -1002,
        ETCD_CTX_CANCELLED = -1003,
        OPLOG_ENTRY_NOT_FOUND = -1004,
        // The reference's Kubernetes Lease backend (newer than 0.3.13).
        K8S_LEASE_OPERATION_ERROR = -1005,
        UNAVAILABLE_IN_CURRENT_STATUS = -1010,
        UNAVAILABLE_IN_CURRENT_MODE = -1011,
        FILE_NOT_FOUND = -1100,
        FILE_OPEN_FAIL = -1101,
        FILE_READ_FAIL = -1102,
        FILE_WRITE_FAIL = -1103,
        FILE_INVALID_BUFFER = -1104,
        FILE_LOCK_FAIL = -1105,
        FILE_INVALID_HANDLE = -1106,
        BUCKET_NOT_FOUND = -1200,
        BUCKET_ALREADY_EXISTS = -1201,
        KEYS_EXCEED_BUCKET_LIMIT = -1202,
        KEYS_ULTRA_LIMIT = -1203,
        UNABLE_OFFLOAD = -1300,
        UNABLE_OFFLOADING = -1301,
        TASK_NOT_FOUND = -1400,
        JOB_NOT_FOUND = -1402,
        SERIALIZE_UNSUPPORTED = -1500,
        SERIALIZE_FAIL = -1501,
        DESERIALIZE_FAIL = -1502,
        PERSISTENT_FAIL = -1503,
        // Multi-tenant admission (the reference's, newer than 0.3.13).
        TENANT_QUOTA_EXCEEDED = -1700,
        TENANT_NOT_REGISTERED = -1701,
        TENANT_NOT_EMPTY = -1702,
    }
    // The Transfer Engine's, as its include/error.h numbers them.
    engine {
        ERR_INVALID_ARGUMENT = -1,
        ERR_TOO_MANY_REQUESTS = -2,
        ERR_ADDRESS_NOT_REGISTERED = -3,
        ERR_BATCH_BUSY = -4,
        ERR_DEVICE_NOT_FOUND = -6,
        ERR_ADDRESS_OVERLAPPED = -7,
        ERR_DNS = -101,
        ERR_SOCKET = -102,
        ERR_MALFORMED_JSON = -103,
        ERR_REJECT_HANDSHAKE = -104,
        ERR_METADATA = -200,
        ERR_ENDPOINT = -201,
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// The public-edge error: a stable code plus human context. A fixed
/// context (`&'static str`) costs no allocation, which matters for the
/// per-key errors of large batch answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {context}")]
pub struct Error {
    pub code: ErrorCode,
    pub context: Cow<'static, str>,
}

impl Error {
    pub fn new(code: ErrorCode, context: impl Into<Cow<'static, str>>) -> Self {
        Error {
            code,
            context: context.into(),
        }
    }

    /// Prepends more context, keeping the code.
    pub fn with_context(mut self, ctx: impl fmt::Display) -> Self {
        self.context = format!("{ctx}: {}", self.context).into();
        self
    }
}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Self {
        Error {
            code,
            context: Cow::Borrowed(""),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn is_engine(c: ErrorCode) -> bool {
        c.name().starts_with("ERR_")
    }

    #[test]
    fn numbers_match_the_reference() {
        assert_eq!(ErrorCode::OBJECT_NOT_FOUND.code(), -704);
        assert_eq!(ErrorCode::NO_AVAILABLE_HANDLE.code(), -200);
        assert_eq!(ErrorCode::PERSISTENT_FAIL.code(), -1503);
        // error.h
        assert_eq!(ErrorCode::ERR_INVALID_ARGUMENT.code(), -1);
        assert_eq!(ErrorCode::ERR_ADDRESS_NOT_REGISTERED.code(), -3);
        assert_eq!(ErrorCode::ERR_ADDRESS_OVERLAPPED.code(), -7);
        assert_eq!(ErrorCode::ERR_REJECT_HANDSHAKE.code(), -104);
        assert_eq!(ErrorCode::ERR_METADATA.code(), -200);
    }

    #[test]
    fn store_codes_are_their_own_wire_number() {
        for &c in ErrorCode::ALL.iter().filter(|&&c| !is_engine(c)) {
            assert_eq!(c.wire(), c.code());
            assert_eq!(c as i32, c.code());
        }
    }

    #[test]
    fn round_trips_through_the_wire() {
        for &c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_wire(c.wire()), Some(c));
        }
        assert_eq!(ErrorCode::from_wire(-123456), None);
        assert_eq!(ErrorCode::from_wire(-5), None);
    }

    #[test]
    fn wire_numbers_are_unique_and_numbers_unique_per_component() {
        let mut wire = std::collections::HashSet::new();
        let mut num = std::collections::HashSet::new();
        for &c in ErrorCode::ALL {
            assert!(wire.insert(c.wire()), "duplicate wire number {}", c.wire());
            assert!(num.insert((is_engine(c), c.code())), "duplicate {c}");
        }
    }

    #[test]
    fn display_names_code() {
        let e = Error::new(ErrorCode::INVALID_KEY, "empty key").with_context("put");
        assert_eq!(e.to_string(), "INVALID_KEY (-400): put: empty key");
    }
}
