//! The P2P Store's errors: the reference's (`error.go`, same messages), plus
//! the metadata and engine failures it reports as plain Go errors. Each has
//! the engine code a C or Python caller sees ([`P2pError::code`]).

use mooncake_common::ErrorCode;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum P2pError {
    #[error("error: invalid argument: {0}")]
    InvalidArgument(String),
    /// A buffer overlaps one registered before without being the same range.
    #[error("error: address overlapped")]
    AddressOverlapped,
    /// This store already holds the payload (registered or replicated).
    #[error("error: payload has been replicated")]
    PayloadOpened,
    /// This store does not hold the payload.
    #[error("error: payload does not replicated")]
    PayloadNotOpened,
    #[error("error: payload not found in metadata")]
    PayloadNotFound,
    /// `Register` without `force_create` of a name already in the catalog.
    #[error("error: key '{0}' already exists")]
    AlreadyExists(String),
    /// Every holder of a shard was tried and failed.
    #[error("error: too many retries: {0}")]
    TooManyRetries(String),
    /// The catalog (etcd) could not be reached or holds a record that does
    /// not parse.
    #[error("error: metadata: {0}")]
    Metadata(String),
    #[error("error: transfer engine core: {0}")]
    TransferEngine(String),
}

impl P2pError {
    /// The engine code of this error (`error.h`'s numbers).
    pub fn code(&self) -> ErrorCode {
        match self {
            P2pError::InvalidArgument(_) => ErrorCode::ERR_INVALID_ARGUMENT,
            P2pError::AddressOverlapped => ErrorCode::ERR_ADDRESS_OVERLAPPED,
            P2pError::PayloadOpened | P2pError::AlreadyExists(_) => {
                ErrorCode::OBJECT_ALREADY_EXISTS
            }
            P2pError::PayloadNotOpened | P2pError::PayloadNotFound => ErrorCode::OBJECT_NOT_FOUND,
            P2pError::TooManyRetries(_) | P2pError::TransferEngine(_) => ErrorCode::TRANSFER_FAIL,
            P2pError::Metadata(_) => ErrorCode::ERR_METADATA,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> P2pError {
        P2pError::InvalidArgument(msg.into())
    }
}

impl From<mooncake_common::Error> for P2pError {
    fn from(e: mooncake_common::Error) -> P2pError {
        match e.code {
            ErrorCode::ERR_ADDRESS_OVERLAPPED => P2pError::AddressOverlapped,
            ErrorCode::ERR_METADATA | ErrorCode::ERR_MALFORMED_JSON => {
                P2pError::Metadata(e.to_string())
            }
            _ => P2pError::TransferEngine(e.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, P2pError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages() {
        assert_eq!(P2pError::PayloadNotFound.code().code(), -704);
        assert_eq!(P2pError::invalid("x").code().code(), -1);
        assert_eq!(P2pError::AddressOverlapped.code().code(), -7);
        assert_eq!(
            P2pError::PayloadOpened.to_string(),
            "error: payload has been replicated"
        );
        let e: P2pError =
            mooncake_common::Error::new(ErrorCode::ERR_ADDRESS_OVERLAPPED, "overlap").into();
        assert_eq!(e, P2pError::AddressOverlapped);
    }
}
