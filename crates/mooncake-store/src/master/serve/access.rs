//! Who may call what on the master: the optional cluster and admin tokens.
//!
//! With a cluster token (`--cluster_token_file`, else
//! `$MOONCAKE_CLUSTER_TOKEN`), a connection must present it (`Authenticate`)
//! before any other call, and the HTTP calls that change state (POST and
//! the like) need `Authorization: Bearer <token>`. Without one, every
//! connection is a member, as in the reference.
//!
//! `RemoveAll` with `force` also drops objects being read (their leases
//! are ignored). A master without tokens takes it from anyone, as the
//! reference does (vLLM's store connector resets with it); with a token
//! configured it is an admin call: it needs the admin token
//! (`--admin_token_file`, else `$MOONCAKE_ADMIN_TOKEN`) on the connection,
//! or `--allow_force_remove_all`.

use mooncake_common::auth::ClusterToken;
use mooncake_common::auth::ADMIN_TOKEN_ENV;
use mooncake_common::{Error, ErrorCode, Result};

use crate::master::config::MasterConfig;
use crate::proto::Request;

/// What a connection has proven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Access {
    /// Nothing yet, and a cluster token is required.
    Anonymous,
    Member,
    /// Presented the admin token.
    Admin,
}

/// The master's tokens and the rules that use them.
#[derive(Debug, Default)]
pub(crate) struct AccessPolicy {
    cluster: Option<ClusterToken>,
    admin: Option<ClusterToken>,
    allow_force_remove_all: bool,
}

impl AccessPolicy {
    /// The tokens `config` names (files read now; `FILE_OPEN_FAIL` when one
    /// cannot be read, so a master never runs open by mistake).
    pub(crate) fn from_config(config: &MasterConfig) -> Result<AccessPolicy> {
        let admin = match config.admin_token_file.trim() {
            "" => match std::env::var(ADMIN_TOKEN_ENV) {
                Ok(v) if !v.trim().is_empty() => Some(ClusterToken::new(&v)?),
                _ => None,
            },
            path => Some(ClusterToken::from_file(std::path::Path::new(path))?),
        };
        Ok(AccessPolicy {
            cluster: ClusterToken::resolve(&config.cluster_token_file)?,
            admin,
            allow_force_remove_all: config.allow_force_remove_all,
        })
    }

    #[cfg(test)]
    pub(crate) fn new(
        cluster: Option<ClusterToken>,
        admin: Option<ClusterToken>,
        allow_force_remove_all: bool,
    ) -> AccessPolicy {
        AccessPolicy {
            cluster,
            admin,
            allow_force_remove_all,
        }
    }

    /// Whether an admin token is configured.
    pub(crate) fn has_admin_token(&self) -> bool {
        self.admin.is_some()
    }

    /// What this master presents when it calls another (a standby
    /// pulling from its leader).
    pub(crate) fn credential(&self) -> Option<&ClusterToken> {
        self.cluster.as_ref()
    }

    /// A new connection's access, before it presents anything.
    pub(crate) fn initial(&self) -> Access {
        if self.cluster.is_some() {
            Access::Anonymous
        } else {
            Access::Member
        }
    }

    /// The access `presented` gives, on top of `current`; `ILLEGAL_CLIENT`
    /// when it is neither token (and a token is configured).
    pub(crate) fn authenticate(&self, current: Access, presented: &str) -> Result<Access> {
        let p = presented.as_bytes();
        if self.admin.as_ref().is_some_and(|t| t.matches(p)) {
            return Ok(Access::Admin);
        }
        if self.cluster.as_ref().is_some_and(|t| t.matches(p)) {
            return Ok(current.max(Access::Member));
        }
        if self.cluster.is_none() && self.admin.is_none() {
            return Ok(current); // nothing to check, as a master without tokens
        }
        Err(Error::new(ErrorCode::ILLEGAL_CLIENT, "wrong cluster token"))
    }

    /// The access an HTTP request's `Authorization` header gives.
    pub(crate) fn http_access(&self, authorization: Option<&[u8]>) -> Access {
        if self
            .admin
            .as_ref()
            .is_some_and(|t| t.matches_bearer(authorization))
        {
            return Access::Admin;
        }
        if self
            .cluster
            .as_ref()
            .is_none_or(|t| t.matches_bearer(authorization))
        {
            return Access::Member;
        }
        Access::Anonymous
    }

    /// Whether a connection with `access` may make this call.
    pub(crate) fn check(&self, access: Access, req: &Request<'_>) -> Result<()> {
        if access == Access::Anonymous {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                "this master requires the cluster token: authenticate first",
            ));
        }
        let open = self.cluster.is_none() && self.admin.is_none();
        if matches!(req, Request::RemoveAll { force: true })
            && access < Access::Admin
            && !self.allow_force_remove_all
            && !open
        {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                "RemoveAll with force is an admin call: present the admin token, \
                 or start the master with --allow_force_remove_all",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> Option<ClusterToken> {
        Some(ClusterToken::new(s).unwrap())
    }

    const FORCE: Request<'static> = Request::RemoveAll { force: true };
    const GET: Request<'static> = Request::GetSize { key: "k" };

    #[test]
    fn without_tokens_everyone_is_a_member() {
        let p = AccessPolicy::new(None, None, false);
        let a = p.initial();
        assert_eq!(a, Access::Member);
        assert!(p.check(a, &GET).is_ok());
        assert!(p.check(a, &Request::RemoveAll { force: false }).is_ok());
        // As the reference: no token, no admin call.
        assert!(p.check(a, &FORCE).is_ok());
        assert_eq!(p.authenticate(a, "anything").unwrap(), Access::Member);
        assert_eq!(p.http_access(None), Access::Member);
        let open = AccessPolicy::new(None, None, true);
        assert!(open.check(Access::Member, &FORCE).is_ok());
    }

    #[test]
    fn any_token_makes_force_remove_all_an_admin_call() {
        for p in [
            AccessPolicy::new(token("c"), None, false),
            AccessPolicy::new(None, token("a"), false),
        ] {
            let m = p.authenticate(p.initial(), "c").unwrap_or(Access::Member);
            let e = p.check(m, &FORCE).unwrap_err();
            assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT);
        }
        let admin_only = AccessPolicy::new(None, token("a"), false);
        let admin = admin_only.authenticate(Access::Member, "a").unwrap();
        assert!(admin_only.check(admin, &FORCE).is_ok());
        let allowed = AccessPolicy::new(token("c"), None, true);
        assert!(allowed.check(Access::Member, &FORCE).is_ok());
    }

    #[test]
    fn the_cluster_token_gates_every_call() {
        let p = AccessPolicy::new(token("c"), token("a"), false);
        let a = p.initial();
        assert_eq!(a, Access::Anonymous);
        assert_eq!(
            p.check(a, &GET).unwrap_err().code,
            ErrorCode::ILLEGAL_CLIENT
        );
        assert_eq!(
            p.authenticate(a, "wrong").unwrap_err().code,
            ErrorCode::ILLEGAL_CLIENT
        );
        let m = p.authenticate(a, "c").unwrap();
        assert_eq!(m, Access::Member);
        assert!(p.check(m, &GET).is_ok());
        assert!(p.check(m, &FORCE).is_err());
        let admin = p.authenticate(m, "a").unwrap();
        assert_eq!(admin, Access::Admin);
        assert!(p.check(admin, &FORCE).is_ok());
        // Presenting the member token again does not lower it.
        assert_eq!(p.authenticate(admin, "c").unwrap(), Access::Admin);
        assert_eq!(p.http_access(None), Access::Anonymous);
        assert_eq!(p.http_access(Some(b"Bearer c")), Access::Member);
        assert_eq!(p.http_access(Some(b"Bearer a")), Access::Admin);
        assert_eq!(p.http_access(Some(b"Bearer x")), Access::Anonymous);
    }
}
