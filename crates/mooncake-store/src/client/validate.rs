//! Checks a client makes before bothering the master, with the same codes
//! the master would answer.

use mooncake_common::{Error, ErrorCode, Result};

use crate::types::{MAX_KEY_LEN, MAX_VALUE_LEN};

/// A key to write: empty is `INVALID_PARAMS` (as the reference answers),
/// too long is `INVALID_KEY` (as the master answers).
pub(crate) fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::new(ErrorCode::INVALID_PARAMS, "empty key"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::new(
            ErrorCode::INVALID_KEY,
            format!("key of {} bytes (max {MAX_KEY_LEN})", key.len()),
        ));
    }
    Ok(())
}

/// A key to read or remove: the reference answers "not found" for an empty key.
pub(crate) fn validate_read_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "empty key"));
    }
    validate_key(key)
}

pub(crate) fn validate_value_len(len: u64) -> Result<()> {
    if len == 0 {
        return Err(Error::new(ErrorCode::INVALID_PARAMS, "empty value"));
    }
    if len > MAX_VALUE_LEN {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("value of {len} bytes (max {MAX_VALUE_LEN})"),
        ));
    }
    Ok(())
}

/// Batch arguments must line up one-to-one.
pub(crate) fn same_len(what: &str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("{what}: {a} keys but {b} entries"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert_eq!(
            validate_key("").unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(
            validate_read_key("").unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
        assert_eq!(
            validate_read_key(&"k".repeat(MAX_KEY_LEN + 1))
                .unwrap_err()
                .code,
            ErrorCode::INVALID_KEY
        );
        assert_eq!(
            validate_key(&"k".repeat(MAX_KEY_LEN + 1)).unwrap_err().code,
            ErrorCode::INVALID_KEY
        );
        validate_key(&"k".repeat(MAX_KEY_LEN)).unwrap();
        assert_eq!(
            validate_value_len(0).unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(
            validate_value_len(MAX_VALUE_LEN + 1).unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        validate_value_len(1).unwrap();
        assert_eq!(
            same_len("x", 1, 2).unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
    }
}
