//! The numbers the C functions return, in the reference's two conventions:
//! - engine calls returning `int` answer 0 or a negative `ERR_*` of its
//!   `error.h` (`-1` invalid argument, `-3` address not registered, ...);
//! - the calls that wrap its `Status` (`submitTransfer`,
//!   `submitTransferWithNotify`, `getTransferStatus`, `freeBatchID`) answer
//!   the positive `Status::Code` (`1` invalid argument, `3` address not
//!   registered, `4` batch busy, ...);
//! - store calls answer 0 (or a count) or a negative store error code
//!   (`-600` invalid params, `-704` object not found, ...).

use std::ffi::c_int;

use mooncake_common::Error;
use mooncake_transfer::TransferState;

/// `ERR_INVALID_ARGUMENT`: also what a bad handle or argument returns.
pub(crate) const ERR_INVALID_ARGUMENT: c_int = -1;
/// `Status::Code::kInvalidArgument`.
pub(crate) const STATUS_INVALID_ARGUMENT: c_int = 1;

/// The `int` an engine call returns for `e`: its `ERR_*` number; a failure
/// the engine's `error.h` has no number for (the engine shut down, a
/// transfer that failed) is -1, as the reference's calls answer then.
pub(crate) fn engine_code(e: &Error) -> c_int {
    if e.code.name().starts_with("ERR_") {
        e.code.code()
    } else {
        ERR_INVALID_ARGUMENT
    }
}

/// 0 or [`engine_code`], with the failure logged (the reference logs it).
pub(crate) fn engine_status(r: Result<(), Error>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::warn!("{e}");
            engine_code(&e)
        }
    }
}

/// The `Status::Code` for `e`: an `ERR_*` number negated (the reference
/// numbers both the same); 1 (invalid argument) for a failure without one.
pub(crate) fn status_code(e: &Error) -> c_int {
    let c = engine_code(e);
    if c < 0 {
        -c
    } else {
        STATUS_INVALID_ARGUMENT
    }
}

/// 0 or [`status_code`], with the failure logged.
pub(crate) fn status_result(r: Result<(), Error>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::warn!("{e}");
            status_code(&e)
        }
    }
}

/// `STATUS_*` of the header for a request's state.
pub(crate) fn transfer_state(s: TransferState) -> c_int {
    match s {
        TransferState::Waiting => 0,
        TransferState::Pending => 1,
        TransferState::Invalid => 2,
        TransferState::Canceled => 3,
        TransferState::Completed => 4,
        TransferState::Timeout => 5,
        TransferState::Failed => 6,
    }
}

/// The store code of `e` (see [`mooncake_store::client::store_code`]).
pub(crate) fn store_code(e: &Error) -> c_int {
    mooncake_store::client::store_code(e)
}

/// A store call's 0 or code (see [`mooncake_store::client::store_status`]).
pub(crate) fn store_status(r: Result<(), Error>) -> c_int {
    mooncake_store::client::store_status(r)
}

/// A byte or object count, or the store code of the failure.
pub(crate) fn store_count(r: Result<u64, Error>) -> i64 {
    mooncake_store::client::store_count(r)
}

/// `is_exist`: 1 exists, 0 missing (also a key that cannot exist), -1 when
/// the cluster could not answer.
pub(crate) fn exist(r: Result<bool, Error>) -> c_int {
    mooncake_store::client::store_exist(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_common::ErrorCode;

    fn err(c: ErrorCode) -> Error {
        Error::from(c)
    }

    #[test]
    fn engine_ints_are_error_h() {
        assert_eq!(engine_code(&err(ErrorCode::ERR_INVALID_ARGUMENT)), -1);
        assert_eq!(engine_code(&err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED)), -3);
        assert_eq!(engine_code(&err(ErrorCode::ERR_ADDRESS_OVERLAPPED)), -7);
        assert_eq!(engine_code(&err(ErrorCode::ERR_METADATA)), -200);
        assert_eq!(engine_code(&err(ErrorCode::TRANSFER_FAIL)), -1);
        assert_eq!(engine_status(Ok(())), 0);
    }

    #[test]
    fn status_codes_are_positive() {
        assert_eq!(status_code(&err(ErrorCode::ERR_INVALID_ARGUMENT)), 1);
        assert_eq!(status_code(&err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED)), 3);
        assert_eq!(status_code(&err(ErrorCode::ERR_BATCH_BUSY)), 4);
        assert_eq!(status_code(&err(ErrorCode::ERR_SOCKET)), 102);
        assert_eq!(status_code(&err(ErrorCode::INTERNAL_ERROR)), 1);
        assert_eq!(status_result(Ok(())), 0);
    }

    #[test]
    fn states_are_the_headers() {
        assert_eq!(transfer_state(TransferState::Waiting), 0);
        assert_eq!(transfer_state(TransferState::Completed), 4);
        assert_eq!(transfer_state(TransferState::Timeout), 5);
        assert_eq!(transfer_state(TransferState::Failed), 6);
    }

    #[test]
    fn store_numbers() {
        assert_eq!(store_status(Err(err(ErrorCode::OBJECT_ALREADY_EXISTS))), 0);
        assert_eq!(store_status(Err(err(ErrorCode::OBJECT_NOT_FOUND))), -704);
        assert_eq!(
            store_status(Err(err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED))),
            -600
        );
        assert_eq!(store_count(Ok(5)), 5);
        assert_eq!(store_count(Err(err(ErrorCode::OBJECT_NOT_FOUND))), -704);
        assert_eq!(exist(Ok(true)), 1);
        assert_eq!(exist(Err(err(ErrorCode::OBJECT_NOT_FOUND))), 0);
        assert_eq!(exist(Err(err(ErrorCode::RPC_FAIL))), -1);
    }
}
