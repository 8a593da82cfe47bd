//! The reference implementation's error numbers. They are part of the public
//! surface: the Python API returns them as negative ints and scripts compare
//! against them, so the numbers never change.

use std::fmt;

macro_rules! error_codes {
    ($($name:ident = $num:expr),* $(,)?) => {
        /// A stable error number shared with the reference implementation.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[allow(non_camel_case_types)]
        #[repr(i32)]
        pub enum ErrorCode {
            $($name = $num,)*
        }

        impl ErrorCode {
            /// Every known code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name,)*];

            /// The reference's name, e.g. `"OBJECT_NOT_FOUND"`.
            pub fn name(self) -> &'static str {
                match self { $(ErrorCode::$name => stringify!($name),)* }
            }

            /// Maps a number back to its code; unknown numbers become `INTERNAL_ERROR`.
            pub fn from_i32(v: i32) -> ErrorCode {
                match v { $($num => ErrorCode::$name,)* _ => ErrorCode::INTERNAL_ERROR }
            }
        }
    };
}

error_codes! {
    OK = 0,
    INTERNAL_ERROR = -1,
    BUFFER_OVERFLOW = -10,
    // Transfer-engine codes. -12/-14/-16/-19/-20 are the reference's; the
    // others fill the same -11..-22 range for engine failures it leaves unnamed.
    ERR_INVALID_ARGUMENT = -11,
    ERR_TOO_MANY_REQUESTS = -22,
    ERR_ADDRESS_NOT_REGISTERED = -12,
    ERR_BATCH_BUSY = -13,
    ERR_DEVICE_NOT_FOUND = -14,
    ERR_ADDRESS_OVERLAPPED = -15,
    ERR_DNS = -16,
    ERR_SOCKET = -17,
    ERR_MALFORMED_JSON = -18,
    ERR_REJECT_HANDSHAKE = -19,
    ERR_METADATA = -20,
    ERR_ENDPOINT = -21,
    // Store codes.
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
}

impl ErrorCode {
    /// The number as the Python API returns it (negative, or 0 for OK).
    pub fn code(self) -> i32 {
        self as i32
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// The public-edge error: a stable code plus human context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {context}")]
pub struct Error {
    pub code: ErrorCode,
    pub context: String,
}

impl Error {
    pub fn new(code: ErrorCode, context: impl Into<String>) -> Self {
        Error {
            code,
            context: context.into(),
        }
    }

    /// Prepends more context, keeping the code.
    pub fn with_context(mut self, ctx: impl fmt::Display) -> Self {
        self.context = format!("{ctx}: {}", self.context);
        self
    }
}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Self {
        Error {
            code,
            context: String::new(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_the_reference() {
        assert_eq!(ErrorCode::OBJECT_NOT_FOUND.code(), -704);
        assert_eq!(ErrorCode::NO_AVAILABLE_HANDLE.code(), -200);
        assert_eq!(ErrorCode::ERR_ADDRESS_NOT_REGISTERED.code(), -12);
        assert_eq!(ErrorCode::ERR_METADATA.code(), -20);
        assert_eq!(ErrorCode::PERSISTENT_FAIL.code(), -1503);
    }

    #[test]
    fn round_trips_through_i32() {
        for &c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_i32(c.code()), c);
        }
        assert_eq!(ErrorCode::from_i32(-123456), ErrorCode::INTERNAL_ERROR);
    }

    #[test]
    fn codes_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &c in ErrorCode::ALL {
            assert!(seen.insert(c.code()), "duplicate number {}", c.code());
        }
    }

    #[test]
    fn display_names_code() {
        let e = Error::new(ErrorCode::INVALID_KEY, "empty key").with_context("put");
        assert_eq!(e.to_string(), "INVALID_KEY (-400): put: empty key");
    }
}
