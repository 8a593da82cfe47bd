//! Multi-tenant mode: each object call scoped to its caller's tenant,
//! writes admitted against the tenant's quota, the quota table's admin
//! calls.

use std::collections::{BTreeMap, HashMap};

use mooncake_common::{Error, ErrorCode, Result};

use super::apply::Fate;
use super::MasterService;
use crate::master::config::MasterConfig;
use crate::master::events::{Kind, Medium};
use crate::master::state::eviction::{eligible, Rank};
use crate::master::state::mutation::{Call, ObjectOp};
use crate::master::state::objects::{charge_of, ObjectMeta};
use crate::master::state::tenants::{Reject, TenantQuota, TenantTable};
use crate::proto::{Request, Response};
use crate::tenant::{self, Policies};
use crate::types::ReplicaPolicy;

/// Refused writes by tenant and reason.
pub(crate) type Rejects = BTreeMap<(String, Reject), u64>;

impl MasterService {
    /// Multi-tenant mode when `config` asks for it, with the policy
    /// file's quotas (`MasterConfig::validate` refuses a bad file before
    /// a master serves; one that went bad since grants no quota).
    pub(super) fn with_tenants_of(self, config: &MasterConfig) -> Self {
        if !config.enable_multi_tenants {
            return self;
        }
        let policies = config.tenant_policies().map_or_else(
            |e| {
                tracing::error!(error = %e, "tenant quota policy: none loaded");
                Policies::new()
            },
            |(_, p)| p,
        );
        self.with_tenants(policies)
    }

    /// Multi-tenant mode with `policies` (requested quota by tenant).
    pub fn with_tenants(mut self, policies: Policies) -> Self {
        let charges = self.objects.count_charges();
        self.tenants = Some(TenantTable::new(policies, charges));
        self
    }

    pub fn multi_tenant(&self) -> bool {
        self.tenants.is_some()
    }

    fn tenant_table(&self) -> Result<&TenantTable> {
        self.tenants.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                "multi-tenant mode is off (--enable_multi_tenants)",
            )
        })
    }

    /// Bytes the mounted segments hold, which effective quotas share.
    fn mounted_capacity(&self) -> u64 {
        self.segments.usage().1
    }

    /// Every tenant with a policy or objects.
    pub fn tenant_quotas(&self) -> Result<Vec<TenantQuota>> {
        Ok(self.tenant_table()?.list(self.mounted_capacity()))
    }

    pub fn tenant_quota(&self, name: &str) -> Result<TenantQuota> {
        self.tenant_table()?.get(name, self.mounted_capacity())
    }

    /// The requested quotas by tenant.
    pub fn tenant_policies(&self) -> Result<Policies> {
        Ok(self.tenant_table()?.policies())
    }

    /// Sets a requested quota; returns the policies to keep in the file.
    pub fn set_tenant_quota(&self, name: &str, bytes: u64) -> Result<Policies> {
        self.tenant_table()?.set(name, bytes)
    }

    /// Drops a tenant's policy (`TENANT_NOT_EMPTY` while it has objects);
    /// returns the policies to keep in the file.
    pub fn delete_tenant_quota(&self, name: &str) -> Result<Policies> {
        let t = self.tenant_table()?;
        let owns = self.disk.keys_where(|k| tenant::tenant_of(k) == name);
        t.delete(name, !owns.is_empty())
    }

    /// Rereads the policy file: a master taking over leads with the quotas
    /// an admin last set through the leader before it, when the masters
    /// share the file (`docs/tenants.md`). A file it cannot read leaves
    /// the quotas it holds.
    pub fn reload_tenant_policies(&self, config: &MasterConfig) {
        let Some(t) = &self.tenants else {
            return;
        };
        match config.tenant_policies() {
            Ok((_, policies)) => t.restore_policies(policies),
            Err(e) => tracing::warn!(error = %e, "tenant quota policy: kept the quotas held"),
        }
    }

    /// Puts back the policies a failed file write did not keep.
    pub fn restore_tenant_policies(&self, policies: Policies) {
        if let Some(t) = &self.tenants {
            t.restore_policies(policies);
        }
    }

    /// Refused writes by tenant and reason, and bytes evicted to make a
    /// tenant room, for metrics.
    pub fn tenant_counters(&self) -> Option<(Rejects, BTreeMap<String, u64>)> {
        let t = self.tenants.as_ref()?;
        Some((t.rejects(), t.evicted_bytes()))
    }

    /// Admits a put of `len` bytes per replica under master key `key`:
    /// `TENANT_NOT_REGISTERED` for a tenant without policy; over its
    /// effective quota the tenant's own evictable objects go first, then
    /// `TENANT_QUOTA_EXCEEDED`. The caller holds the admission lock
    /// until the put is placed.
    pub(super) fn admit(
        &self,
        t: &TenantTable,
        call: &mut Call,
        key: &str,
        len: u64,
        cfg: &ReplicaPolicy,
        now: u64,
    ) -> Result<()> {
        let name = tenant::tenant_of(key);
        let Some(quota) = t.effective(name, self.mounted_capacity()) else {
            t.reject(name, Reject::NotRegistered);
            return Err(Error::new(
                ErrorCode::TENANT_NOT_REGISTERED,
                format!("tenant {name:?} has no quota policy"),
            ));
        };
        let need = len.saturating_mul(cfg.replica_num as u64);
        // An upsert's new version replaces what the old one is charged.
        let replaced = {
            let shard = self.objects.lock(key);
            shard.get(key).map_or(0, charge_of)
        };
        let room = |charged: u64| charged.saturating_sub(replaced).saturating_add(need) <= quota;
        if room(t.charges.of(name)) {
            return Ok(());
        }
        if need <= quota {
            let over = (t.charges.of(name) - replaced).saturating_add(need) - quota;
            let freed = self.evict_tenant(call, name, over, now);
            if freed > 0 {
                t.evicted(name, freed);
            }
            if room(t.charges.of(name)) {
                return Ok(());
            }
        }
        t.reject(name, Reject::QuotaExceeded);
        Err(Error::new(
            ErrorCode::TENANT_QUOTA_EXCEEDED,
            format!(
                "tenant {name:?}: {need} more bytes exceed its quota of {quota} ({} charged)",
                t.charges.of(name)
            ),
        ))
    }

    /// Evicts `tenant`'s oldest evictable objects until `target` charged
    /// bytes are gone; returns the bytes freed. A group goes whole, ranked
    /// by its newest member, and only when no member is leased, as in
    /// every eviction round (`tick`).
    fn evict_tenant(&self, call: &mut Call, name: &str, target: u64, now: u64) -> u64 {
        let soft = self.policy.evict_soft_pinned;
        let may_go = |key: &str, o: &ObjectMeta| {
            tenant::tenant_of(key) == name
                && eligible(o, now, soft)
                && self.may_leave_memory(o, true)
        };
        let epoch = crate::master::state::leases::uses_now();
        let order = self
            .eviction
            .weight
            .order(self.policy.eviction_policy, epoch);
        let rank = |o: &ObjectMeta| order.rank(o);
        let grouping = self.objects.groups.grouping();
        let mut candidates = Vec::new();
        // Per group: members seen, one leased, newest eligible rank, bytes.
        let mut groups: HashMap<u32, (usize, bool, Rank, u64)> = HashMap::new();
        for shard in self.objects.shards() {
            for (key, o) in shard.iter() {
                if let Some(g) = grouping.group_of(key) {
                    let st = groups.entry(g).or_default();
                    st.0 += 1;
                    st.1 |= o.is_leased(now);
                    if may_go(key, o) {
                        st.2 = st.2.max(rank(o));
                        st.3 += charge_of(o);
                    }
                } else if may_go(key, o) {
                    candidates.push((rank(o), charge_of(o)));
                }
            }
        }
        let groups: HashMap<u32, Rank> = groups
            .into_iter()
            .filter(|&(g, (seen, leased, _, bytes))| {
                !leased && bytes > 0 && seen == grouping.size(g)
            })
            .map(|(g, (_, _, r, bytes))| {
                candidates.push((r, bytes));
                (g, r)
            })
            .collect();
        let Some((threshold, _)) = crate::master::state::eviction::cover(&mut candidates, target)
        else {
            return 0;
        };
        let whole_groups = groups.values().any(|&r| r <= threshold);
        let mut freed = 0;
        for mut shard in self.objects.shards() {
            if freed >= target && !whole_groups {
                break;
            }
            self.objects.retain(&mut shard, |key, obj| {
                let chosen = match grouping.group_of(key) {
                    Some(g) => groups.get(&g).is_some_and(|&r| r <= threshold),
                    None => freed < target && rank(obj) <= threshold,
                };
                if !chosen || !may_go(key, obj) {
                    return true;
                }
                freed += charge_of(obj);
                if obj.is_on_disk() {
                    self.forget_copy(call, key, Some(&mut *obj));
                }
                let fate = self.apply_object(call, key, obj, ObjectOp::Remove { now });
                self.kv_event(Kind::Removed, key, Medium::Cpu);
                fate == Fate::Keep
            });
        }
        freed
    }

    /// Serves `req` for `tenant` in multi-tenant mode: its keys are the
    /// tenant's, its removals of everything or by pattern reach only them.
    pub(super) fn respond_as(
        &self,
        call: &mut Call,
        req: Request<'_>,
        tenant: &str,
        now: u64,
    ) -> Response {
        let tenant = tenant::normalize(tenant);
        let keys = object_keys(&req);
        if keys.is_none() {
            // Not an object call: no tenant to scope.
            return self.respond(call, req, None, now);
        }
        let keys = keys.unwrap_or_default();
        if !tenant::is_valid(tenant) {
            // As the reference: removing everything of no valid tenant
            // removes nothing.
            if matches!(req, Request::RemoveAll { .. }) {
                return Response::Count { result: Ok(0) };
            }
            let code = if writes(&req) {
                if let Some(t) = &self.tenants {
                    t.reject(tenant, Reject::NotRegistered);
                }
                ErrorCode::TENANT_NOT_REGISTERED
            } else {
                ErrorCode::INVALID_PARAMS
            };
            let error = Error::new(code, format!("invalid tenant id {tenant:?}"));
            return Response::Failed { error };
        }
        if tenant == tenant::DEFAULT_TENANT {
            if keys.iter().any(|k| tenant::is_ambiguous(k)) {
                let error = Error::new(
                    ErrorCode::INVALID_PARAMS,
                    "a key of multi-tenant mode holds no NUL character",
                );
                return Response::Failed { error };
            }
            return self.respond(call, req, Some(tenant), now);
        }
        let scoped: Vec<String> = keys
            .iter()
            .map(|k| tenant::scoped(tenant, k).into_owned())
            .collect();
        let req = with_keys(req, &scoped);
        match self.respond(call, req, Some(tenant), now) {
            // Cleared keys go back as the caller named them.
            Response::Keys { result: Ok(keys) } => Response::Keys {
                result: Ok(keys
                    .iter()
                    .map(|k| tenant::split(k).1.to_string())
                    .collect()),
            },
            other => other,
        }
    }
}

/// The caller's keys of an object call, in order; `None` for the other
/// calls (heartbeats, mounts, tasks, tiers: their keys, if any, are the
/// master's own, handed out earlier).
fn object_keys<'a>(req: &Request<'a>) -> Option<Vec<&'a str>> {
    use Request as Q;
    Some(match req {
        Q::PutStart { key, .. }
        | Q::PutEnd { key, .. }
        | Q::PutRevoke { key, .. }
        | Q::GetReplicaList { key }
        | Q::ExistKey { key }
        | Q::GetSize { key }
        | Q::Remove { key, .. }
        | Q::CreateCopyTask { key, .. }
        | Q::CreateMoveTask { key, .. } => vec![*key],
        Q::BatchPutStart { keys, .. }
        | Q::BatchPutEnd { keys, .. }
        | Q::BatchPutRevoke { keys, .. }
        | Q::BatchGetReplicaList { keys }
        | Q::BatchExistKey { keys }
        | Q::BatchRemove { keys, .. }
        | Q::BatchReplicaClear { keys, .. } => keys.clone(),
        Q::RemoveByRegex { .. } | Q::RemoveAll { .. } => Vec::new(),
        _ => return None,
    })
}

/// Whether an object call puts (a bad tenant is then not registered;
/// for the other calls its id is a bad parameter).
fn writes(req: &Request<'_>) -> bool {
    use Request as Q;
    matches!(
        req,
        Q::PutStart { .. }
            | Q::BatchPutStart { .. }
            | Q::PutEnd { .. }
            | Q::BatchPutEnd { .. }
            | Q::PutRevoke { .. }
            | Q::BatchPutRevoke { .. }
    )
}

/// `req` with its keys (`object_keys`) replaced by `keys`, in order.
fn with_keys<'a>(req: Request<'a>, keys: &'a [String]) -> Request<'a> {
    use Request as Q;
    let one = || keys[0].as_str();
    let all = || keys.iter().map(String::as_str).collect();
    match req {
        Q::PutStart {
            client_id,
            value_len,
            config,
            upsert,
            ..
        } => Q::PutStart {
            client_id,
            key: one(),
            value_len,
            config,
            upsert,
        },
        Q::PutEnd { client_id, .. } => Q::PutEnd {
            client_id,
            key: one(),
        },
        Q::PutRevoke { client_id, .. } => Q::PutRevoke {
            client_id,
            key: one(),
        },
        Q::GetReplicaList { .. } => Q::GetReplicaList { key: one() },
        Q::ExistKey { .. } => Q::ExistKey { key: one() },
        Q::GetSize { .. } => Q::GetSize { key: one() },
        Q::Remove { force, .. } => Q::Remove { key: one(), force },
        Q::CreateCopyTask { targets, .. } => Q::CreateCopyTask {
            key: one(),
            targets,
        },
        Q::CreateMoveTask { source, target, .. } => Q::CreateMoveTask {
            key: one(),
            source,
            target,
        },
        Q::BatchPutStart {
            client_id,
            value_lens,
            config,
            upsert,
            ..
        } => Q::BatchPutStart {
            client_id,
            keys: all(),
            value_lens,
            config,
            upsert,
        },
        Q::BatchPutEnd { client_id, .. } => Q::BatchPutEnd {
            client_id,
            keys: all(),
        },
        Q::BatchPutRevoke { client_id, .. } => Q::BatchPutRevoke {
            client_id,
            keys: all(),
        },
        Q::BatchGetReplicaList { .. } => Q::BatchGetReplicaList { keys: all() },
        Q::BatchExistKey { .. } => Q::BatchExistKey { keys: all() },
        Q::BatchRemove { force, .. } => Q::BatchRemove { keys: all(), force },
        Q::BatchReplicaClear {
            client_id,
            segment_name,
            ..
        } => Q::BatchReplicaClear {
            client_id,
            keys: all(),
            segment_name,
        },
        other => other,
    }
}
