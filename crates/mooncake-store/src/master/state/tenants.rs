//! The master's tenants: their quota policies, what each is charged (kept
//! by the object map, `objects::Charges`), and the counts metrics show.
//!
//! The policies are configuration (the policy file, rewritten by the
//! admin API in `serve/`), not replicated state: every master of a
//! cluster reads them from its file. The charges are derived from the
//! objects, so a restore, a replay or a standby rebuilds them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Mutex, RwLock};

use super::objects::Charges;
use crate::tenant::{self, Policies};

/// Why a write was refused, as the reject counter labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reject {
    NotRegistered,
    QuotaExceeded,
}

impl Reject {
    pub fn label(self) -> &'static str {
        match self {
            Reject::NotRegistered => "not_registered",
            Reject::QuotaExceeded => "quota_exceeded",
        }
    }
}

/// One tenant as the admin API and the metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantQuota {
    pub tenant_id: String,
    pub requested_quota_bytes: u64,
    pub effective_quota_bytes: u64,
    pub charged_bytes: u64,
    pub admission_closed: bool,
    pub over_quota: bool,
    pub has_explicit_policy: bool,
}

pub(crate) struct TenantTable {
    policies: RwLock<Policies>,
    pub(crate) charges: Arc<Charges>,
    /// Held from a put's admission to its placement, so that two puts of
    /// one tenant cannot both be admitted into the same room.
    pub(crate) admission: Mutex<()>,
    rejects: Mutex<BTreeMap<(String, Reject), u64>>,
    evicted_bytes: Mutex<BTreeMap<String, u64>>,
}

impl TenantTable {
    pub(crate) fn new(policies: Policies, charges: Arc<Charges>) -> Self {
        TenantTable {
            policies: RwLock::new(policies),
            charges,
            admission: Mutex::new(()),
            rejects: Mutex::default(),
            evicted_bytes: Mutex::default(),
        }
    }

    pub(crate) fn policies(&self) -> Policies {
        self.policies.read().clone()
    }

    /// `tenant`'s effective quota with `capacity` bytes mounted; `None`
    /// when it has no policy.
    pub(crate) fn effective(&self, tenant: &str, capacity: u64) -> Option<u64> {
        let p = self.policies.read();
        p.contains_key(tenant)
            .then(|| tenant::effective_quotas(&p, capacity)[tenant])
    }

    pub(crate) fn reject(&self, tenant: &str, why: Reject) {
        *self
            .rejects
            .lock()
            .entry((tenant.to_string(), why))
            .or_default() += 1;
    }

    pub(crate) fn evicted(&self, tenant: &str, bytes: u64) {
        *self
            .evicted_bytes
            .lock()
            .entry(tenant.to_string())
            .or_default() += bytes;
    }

    pub(crate) fn rejects(&self) -> BTreeMap<(String, Reject), u64> {
        self.rejects.lock().clone()
    }

    pub(crate) fn evicted_bytes(&self) -> BTreeMap<String, u64> {
        self.evicted_bytes.lock().clone()
    }

    /// Every tenant with a policy or a charge, with `capacity` mounted.
    pub(crate) fn list(&self, capacity: u64) -> Vec<TenantQuota> {
        let p = self.policies.read();
        let effective = tenant::effective_quotas(&p, capacity);
        let charged = self.charges.all();
        let mut names: Vec<&String> = p.keys().chain(charged.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|name| quota_of(name, &p, &effective, &charged))
            .collect()
    }

    /// One tenant; `OBJECT_NOT_FOUND` when it has neither policy nor charge.
    pub(crate) fn get(&self, name: &str, capacity: u64) -> Result<TenantQuota> {
        self.list(capacity)
            .into_iter()
            .find(|q| q.tenant_id == name)
            .ok_or_else(|| unknown(name))
    }

    /// Sets `name`'s requested quota; the policies to keep are returned.
    pub(crate) fn set(&self, name: &str, bytes: u64) -> Result<Policies> {
        check_name(name)?;
        if bytes == 0 || bytes > tenant::MAX_QUOTA_BYTES {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("quota {bytes} not in 1..=2^63-1 bytes"),
            ));
        }
        let mut p = self.policies.write();
        p.insert(name.to_string(), bytes);
        Ok(p.clone())
    }

    /// Drops `name`'s policy: `TENANT_NOT_EMPTY` while it is charged,
    /// `OBJECT_NOT_FOUND` when it has none.
    pub(crate) fn delete(&self, name: &str, has_objects: bool) -> Result<Policies> {
        check_name(name)?;
        let mut p = self.policies.write();
        if !p.contains_key(name) {
            return Err(unknown(name));
        }
        if has_objects || self.charges.of(name) > 0 {
            return Err(Error::new(
                ErrorCode::TENANT_NOT_EMPTY,
                format!("tenant {name:?} still has objects"),
            ));
        }
        p.remove(name);
        Ok(p.clone())
    }

    /// Puts back policies a failed file write did not keep.
    pub(crate) fn restore_policies(&self, policies: Policies) {
        *self.policies.write() = policies;
    }
}

fn quota_of(
    name: &str,
    p: &Policies,
    effective: &BTreeMap<String, u64>,
    charged: &HashMap<String, u64>,
) -> TenantQuota {
    let requested = p.get(name).copied();
    let effective = effective.get(name).copied().unwrap_or(0);
    let charged = charged.get(name).copied().unwrap_or(0);
    TenantQuota {
        tenant_id: name.to_string(),
        requested_quota_bytes: requested.unwrap_or(0),
        effective_quota_bytes: effective,
        charged_bytes: charged,
        admission_closed: requested.is_none(),
        over_quota: charged > effective,
        has_explicit_policy: requested.is_some(),
    }
}

fn check_name(name: &str) -> Result<()> {
    if tenant::is_valid(name) {
        Ok(())
    } else {
        Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("invalid tenant id {name:?}"),
        ))
    }
}

fn unknown(name: &str) -> Error {
    Error::new(
        ErrorCode::OBJECT_NOT_FOUND,
        format!("tenant {name:?} is unknown"),
    )
}
