//! The ints the Python API returns for failures, in the reference's terms.
//!
//! Store calls (see docs/reference-behaviour.md) return 0 or a negative store
//! error code; byte counts and object counts are non-negative. Engine calls
//! return 0 or -1, except memory registration, which returns the reference
//! engine's own numbers ([`engine_code`]).

use mooncake_common::{Error, ErrorCode};
use mooncake_transfer::TransferState;

/// What calls return on a store that is not set up (the reference crashes).
pub(crate) const NOT_READY: i32 = ErrorCode::INTERNAL_ERROR as i32;
pub(crate) const INVALID: i32 = ErrorCode::INVALID_PARAMS as i32;
pub(crate) const NOT_FOUND: i32 = ErrorCode::OBJECT_NOT_FOUND as i32;

/// The number a failed store call returns, as the reference's store does
/// (see [`mooncake_store::client::store_code`]: engine failures are
/// TRANSFER_FAIL, bad destinations INVALID_PARAMS, ...).
pub(crate) fn code(e: &Error) -> i32 {
    mooncake_store::client::store_code(e)
}

/// 0 or the code; a put of an existing key is a success that keeps the
/// stored value (see [`mooncake_store::client::store_status`]).
pub(crate) fn status(r: Result<(), Error>) -> i32 {
    mooncake_store::client::store_status(r)
}

/// A byte or object count, or the code of the failure.
pub(crate) fn count<N: TryInto<i64>>(r: Result<N, Error>) -> i64 {
    mooncake_store::client::store_count(r)
}

/// One [`status`] per key; a failure of the whole batch is every key's code.
pub(crate) fn per_key(n: usize, r: Result<Vec<Result<(), Error>>, Error>) -> Vec<i32> {
    match r {
        Ok(v) => v.into_iter().map(status).collect(),
        Err(e) => vec![code(&e); n],
    }
}

/// One int for a batch: 0, or the first failing key's code.
pub(crate) fn first_error(r: Result<Vec<Result<(), Error>>, Error>) -> i32 {
    match r {
        Ok(v) => v.into_iter().map(status).find(|&c| c != 0).unwrap_or(0),
        Err(e) => code(&e),
    }
}

/// `is_exist`: 1 exists, 0 missing (also for a key that cannot exist), -1
/// when the cluster could not answer.
pub(crate) fn exist(r: Result<bool, Error>) -> i32 {
    mooncake_store::client::store_exist(r)
}

/// A failed `setup`: -600 for bad arguments; any other failure to join
/// (master or metadata server unreachable, a name already taken, RDMA
/// devices not found) is -600 when `local_hostname` names a port and -1
/// when it does not, as in the reference (whose setup reports a failed
/// client creation as INVALID_PARAMS, and a failed search for a free port
/// as INTERNAL_ERROR).
pub(crate) fn setup(e: &Error, named_port: bool) -> i32 {
    if e.code == ErrorCode::INVALID_PARAMS || named_port {
        INVALID
    } else {
        NOT_READY
    }
}

/// `health_check` of a set-up store: 0 healthy, 2 master unreachable (1,
/// not set up, is answered before asking the cluster).
pub(crate) fn health(r: Result<(), Error>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(_) => 2,
    }
}

/// A 128-bit id as the reference's Python shows a UUID: `(high, low)`.
pub(crate) fn split_uuid(id: u128) -> (u64, u64) {
    ((id >> 64) as u64, id as u64)
}

pub(crate) fn join_uuid((hi, lo): (u64, u64)) -> u128 {
    (u128::from(hi) << 64) | u128::from(lo)
}

/// `create_*_task`: `((hi, lo), 0)`, or `((0, 0), code)`.
pub(crate) fn task(r: Result<u128, Error>) -> ((u64, u64), i32) {
    match r {
        Ok(id) => (split_uuid(id), 0),
        Err(e) => ((0, 0), code(&e)),
    }
}

/// The reference engine's numbers for failures its Python methods return
/// as-is (memory registration); everything else is -1 there too.
pub(crate) fn engine_code(e: &Error) -> i32 {
    match e.code {
        ErrorCode::ERR_TOO_MANY_REQUESTS => -2,
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED => -3,
        ErrorCode::ERR_BATCH_BUSY => -4,
        ErrorCode::ERR_DEVICE_NOT_FOUND => -6,
        ErrorCode::ERR_ADDRESS_OVERLAPPED => -7,
        _ => -1,
    }
}

/// 0 or the [`engine_code`] of the failure (logged: the reference prints it).
pub(crate) fn engine_status(r: Result<(), Error>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::warn!("{e}");
            engine_code(&e)
        }
    }
}

/// `transfer_check_status` of a batch: 1 done, 0 running, -1 failed, -2
/// timed out; `None` while it runs (the batch is kept).
pub(crate) fn batch_state(state: TransferState) -> Option<i32> {
    match state {
        TransferState::Waiting | TransferState::Pending => None,
        TransferState::Completed => Some(1),
        TransferState::Timeout => Some(-2),
        TransferState::Failed | TransferState::Invalid | TransferState::Canceled => Some(-1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(c: ErrorCode) -> Error {
        Error::from(c)
    }

    #[test]
    fn store_codes_are_the_reference_python_numbers() {
        assert_eq!(NOT_READY, -1);
        assert_eq!(INVALID, -600);
        assert_eq!(NOT_FOUND, -704);
        for c in [
            ErrorCode::BUFFER_OVERFLOW,
            ErrorCode::INVALID_KEY,
            ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
            ErrorCode::ERR_INVALID_ARGUMENT,
            ErrorCode::INVALID_PARAMS,
        ] {
            assert_eq!(code(&err(c)), -600, "{c}");
        }
        assert_eq!(code(&err(ErrorCode::SEGMENT_NOT_FOUND)), -200);
        for c in [
            ErrorCode::ERR_METADATA,
            ErrorCode::ERR_ENDPOINT,
            ErrorCode::ERR_SOCKET,
            ErrorCode::ERR_DNS,
            ErrorCode::ERR_MALFORMED_JSON,
            ErrorCode::ERR_REJECT_HANDSHAKE,
            ErrorCode::ERR_TOO_MANY_REQUESTS,
            ErrorCode::ERR_BATCH_BUSY,
            ErrorCode::ERR_DEVICE_NOT_FOUND,
            ErrorCode::ERR_ADDRESS_OVERLAPPED,
        ] {
            assert_eq!(code(&err(c)), -800, "{c}");
            assert_eq!(status(Err(err(c))), -800, "{c}");
        }
        assert_eq!(per_key(1, Err(err(ErrorCode::ERR_METADATA))), vec![-800]);
        assert_eq!(count::<u64>(Err(err(ErrorCode::ERR_SOCKET))), -800);
        assert_eq!(code(&err(ErrorCode::NO_AVAILABLE_HANDLE)), -200);
        assert_eq!(code(&err(ErrorCode::OBJECT_NOT_FOUND)), -704);
        assert_eq!(
            code(&err(ErrorCode::OBJECT_HAS_LEASE)),
            ErrorCode::OBJECT_HAS_LEASE.code()
        );
    }

    #[test]
    fn an_existing_key_is_a_successful_put() {
        assert_eq!(status(Ok(())), 0);
        assert_eq!(status(Err(err(ErrorCode::OBJECT_ALREADY_EXISTS))), 0);
        assert_eq!(status(Err(err(ErrorCode::INVALID_KEY))), -600);
        assert_eq!(status(Err(err(ErrorCode::OBJECT_NOT_FOUND))), -704);
    }

    #[test]
    fn a_put_in_flight_is_no_success() {
        let busy = ErrorCode::OBJECT_REPLICA_BUSY.code();
        assert_eq!(status(Err(err(ErrorCode::OBJECT_REPLICA_BUSY))), busy);
        let batch = || {
            Ok(vec![
                Err(err(ErrorCode::OBJECT_ALREADY_EXISTS)),
                Err(err(ErrorCode::OBJECT_REPLICA_BUSY)),
            ])
        };
        assert_eq!(per_key(2, batch()), vec![0, busy]);
        assert_eq!(first_error(batch()), busy);
    }

    #[test]
    fn counts_or_codes() {
        assert_eq!(count(Ok(4096usize)), 4096);
        assert_eq!(count(Ok(7u64)), 7);
        assert_eq!(count(Ok(u64::MAX)), i64::MAX);
        assert_eq!(count::<usize>(Err(err(ErrorCode::BUFFER_OVERFLOW))), -600);
    }

    #[test]
    fn batches_per_key_and_first_error() {
        let mixed = || {
            Ok(vec![
                Ok(()),
                Err(err(ErrorCode::OBJECT_ALREADY_EXISTS)),
                Err(err(ErrorCode::NO_AVAILABLE_HANDLE)),
                Err(err(ErrorCode::INVALID_KEY)),
            ])
        };
        assert_eq!(per_key(4, mixed()), vec![0, 0, -200, -600]);
        assert_eq!(first_error(mixed()), -200);
        assert_eq!(first_error(Ok(vec![Ok(()), Ok(())])), 0);
        let whole = || Err(err(ErrorCode::RPC_FAIL));
        let rpc = ErrorCode::RPC_FAIL.code();
        assert_eq!(per_key(3, whole()), vec![rpc; 3]);
        assert_eq!(first_error(whole()), rpc);
    }

    #[test]
    fn existence() {
        assert_eq!(exist(Ok(true)), 1);
        assert_eq!(exist(Ok(false)), 0);
        assert_eq!(exist(Err(err(ErrorCode::OBJECT_NOT_FOUND))), 0);
        assert_eq!(exist(Err(err(ErrorCode::INVALID_KEY))), 0);
        assert_eq!(exist(Err(err(ErrorCode::INVALID_PARAMS))), 0);
        assert_eq!(exist(Err(err(ErrorCode::RPC_FAIL))), -1);
    }

    #[test]
    fn setup_and_health() {
        assert_eq!(setup(&err(ErrorCode::INVALID_PARAMS), false), -600);
        assert_eq!(setup(&err(ErrorCode::RPC_FAIL), false), -1);
        assert_eq!(setup(&err(ErrorCode::ERR_METADATA), false), -1);
        assert_eq!(setup(&err(ErrorCode::RPC_FAIL), true), -600);
        assert_eq!(setup(&err(ErrorCode::ERR_METADATA), true), -600);
        assert_eq!(health(Ok(())), 0);
        assert_eq!(health(Err(err(ErrorCode::RPC_FAIL))), 2);
    }

    #[test]
    fn task_ids_round_trip_as_high_low() {
        let id = (7u128 << 64) | 9;
        assert_eq!(split_uuid(id), (7, 9));
        assert_eq!(join_uuid((7, 9)), id);
        assert_eq!(join_uuid(split_uuid(u128::MAX)), u128::MAX);
        assert_eq!(task(Ok(id)), ((7, 9), 0));
        assert_eq!(task(Err(err(ErrorCode::OBJECT_NOT_FOUND))), ((0, 0), -704));
    }

    #[test]
    fn reference_codes_for_engine_errors() {
        assert_eq!(engine_code(&err(ErrorCode::ERR_TOO_MANY_REQUESTS)), -2);
        assert_eq!(engine_code(&err(ErrorCode::ERR_ADDRESS_NOT_REGISTERED)), -3);
        assert_eq!(engine_code(&err(ErrorCode::ERR_BATCH_BUSY)), -4);
        assert_eq!(engine_code(&err(ErrorCode::ERR_DEVICE_NOT_FOUND)), -6);
        assert_eq!(engine_code(&err(ErrorCode::ERR_ADDRESS_OVERLAPPED)), -7);
        assert_eq!(engine_code(&err(ErrorCode::ERR_INVALID_ARGUMENT)), -1);
        assert_eq!(engine_code(&err(ErrorCode::ERR_METADATA)), -1);
        assert_eq!(engine_status(Ok(())), 0);
        assert_eq!(
            engine_status(Err(err(ErrorCode::ERR_ADDRESS_OVERLAPPED))),
            -7
        );
    }

    #[test]
    fn batch_states() {
        assert_eq!(batch_state(TransferState::Waiting), None);
        assert_eq!(batch_state(TransferState::Pending), None);
        assert_eq!(batch_state(TransferState::Completed), Some(1));
        assert_eq!(batch_state(TransferState::Timeout), Some(-2));
        for s in [
            TransferState::Failed,
            TransferState::Invalid,
            TransferState::Canceled,
        ] {
            assert_eq!(batch_state(s), Some(-1));
        }
    }
}
