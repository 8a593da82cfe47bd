//! The optional cluster token: one shared secret that every listener of a
//! cluster (master RPC, engine RPC, dummy service, metadata server writes,
//! admin HTTP) can require of its peers.
//!
//! Off unless configured, for compatibility with the reference. It proves
//! that a peer knows the secret; it does not encrypt anything, and a peer
//! that can watch the network sees it travel (use TLS or a private network
//! for that). Tokens are compared in constant time.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use subtle::ConstantTimeEq;

use crate::{Error, ErrorCode, Result};

/// Environment variable holding the token itself (every process reads it
/// when no `--cluster_token_file` flag is given).
pub const TOKEN_ENV: &str = "MOONCAKE_CLUSTER_TOKEN";
/// Environment variable holding the admin token (force `RemoveAll`).
pub const ADMIN_TOKEN_ENV: &str = "MOONCAKE_ADMIN_TOKEN";

/// Longest token accepted: a token must fit one control frame everywhere.
pub const MAX_TOKEN_LEN: usize = 4096;

/// The shared secret. Cheap to clone; `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterToken(Arc<str>);

impl ClusterToken {
    /// A token from its text (surrounding whitespace, such as a file's
    /// final newline, is not part of it); `INVALID_PARAMS` when empty or
    /// longer than [`MAX_TOKEN_LEN`].
    pub fn new(text: &str) -> Result<ClusterToken> {
        let t = text.trim();
        if t.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "cluster token is empty",
            ));
        }
        if t.len() > MAX_TOKEN_LEN {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("cluster token is longer than {MAX_TOKEN_LEN} bytes"),
            ));
        }
        Ok(ClusterToken(t.into()))
    }

    /// The token stored in `path` (`FILE_OPEN_FAIL` when unreadable).
    pub fn from_file(path: &Path) -> Result<ClusterToken> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                ErrorCode::FILE_OPEN_FAIL,
                format!("cluster token file {}: {e}", path.display()),
            )
        })?;
        ClusterToken::new(&text)
            .map_err(|e| e.with_context(format!("cluster token file {}", path.display())))
    }

    /// The token of [`TOKEN_ENV`] read through `var` (`None`: unset or
    /// blank).
    pub fn from_env_with(var: impl Fn(&str) -> Option<String>) -> Result<Option<ClusterToken>> {
        match var(TOKEN_ENV) {
            Some(v) if !v.trim().is_empty() => ClusterToken::new(&v)
                .map(Some)
                .map_err(|e| e.with_context(TOKEN_ENV)),
            _ => Ok(None),
        }
    }

    /// The token of [`TOKEN_ENV`] in this process's environment.
    pub fn from_env() -> Result<Option<ClusterToken>> {
        ClusterToken::from_env_with(|k| std::env::var(k).ok())
    }

    /// What a process runs with: the file a `--cluster_token_file` flag
    /// names (when not empty), else [`TOKEN_ENV`], else no token.
    pub fn resolve(file_flag: &str) -> Result<Option<ClusterToken>> {
        match file_flag.trim() {
            "" => ClusterToken::from_env(),
            path => ClusterToken::from_file(Path::new(path)).map(Some),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, in time independent of where
    /// they differ (a different length is told apart at once; the length
    /// is not the secret).
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(presented).into()
    }

    /// Whether an HTTP `Authorization` header value is `Bearer <token>`.
    pub fn matches_bearer(&self, header: Option<&[u8]>) -> bool {
        header
            .and_then(|h| h.strip_prefix(b"Bearer "))
            .is_some_and(|t| self.matches(t.trim_ascii()))
    }

    /// The `Authorization` header value that carries this token.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

/// Whether a peer presenting `presented` may go on: always when no token
/// is configured.
pub fn admits(expected: Option<&ClusterToken>, presented: &[u8]) -> bool {
    expected.is_none_or(|t| t.matches(presented))
}

impl PartialEq for ClusterToken {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl Eq for ClusterToken {}

impl fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterToken(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_compared_whole() {
        let t = ClusterToken::new(" s3cret\n").unwrap();
        assert_eq!(t.as_str(), "s3cret");
        assert!(t.matches(b"s3cret"));
        assert!(!t.matches(b"s3cre"));
        assert!(!t.matches(b"s3cret!"));
        assert!(!t.matches(b""));
        assert!(t.matches_bearer(Some(b"Bearer s3cret")));
        assert!(!t.matches_bearer(Some(b"Basic s3cret")));
        assert!(!t.matches_bearer(Some(b"Bearer other")));
        assert!(!t.matches_bearer(None));
        assert!(admits(None, b"anything"));
        assert!(!admits(Some(&t), b"anything"));
        assert_eq!(format!("{t:?}"), "ClusterToken(<redacted>)");
    }

    #[test]
    fn bad_tokens_are_refused() {
        assert_eq!(
            ClusterToken::new("  \n").unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        let long = "x".repeat(MAX_TOKEN_LEN + 1);
        assert!(ClusterToken::new(&long).is_err());
        assert!(ClusterToken::new(&long[1..]).is_ok());
    }

    #[test]
    fn resolution_prefers_the_file() {
        let env = |k: &str| (k == TOKEN_ENV).then(|| "from-env".to_string());
        assert_eq!(
            ClusterToken::from_env_with(env).unwrap().unwrap().as_str(),
            "from-env"
        );
        assert_eq!(ClusterToken::from_env_with(|_| None).unwrap(), None);
        assert_eq!(
            ClusterToken::from_env_with(|_| Some(" ".into())).unwrap(),
            None
        );
        let dir = std::env::temp_dir().join(format!("mc-token-{}", std::process::id()));
        std::fs::write(&dir, "from-file\n").unwrap();
        let t = ClusterToken::resolve(dir.to_str().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(t.as_str(), "from-file");
        std::fs::remove_file(&dir).unwrap();
        let e = ClusterToken::resolve(dir.to_str().unwrap()).unwrap_err();
        assert_eq!(e.code, ErrorCode::FILE_OPEN_FAIL);
    }
}
