//! Per-tenant families of multi-tenant mode, with the reference's names:
//! `mooncake_tenant_quota_*` gauges by `tenant_id`, and the counters of
//! refused writes (`_reject_total{tenant_id,reason}`) and of bytes evicted
//! to make a tenant room (`_evict_bytes_total{tenant_id}`).

use std::fmt::Write;

use crate::master::state::service::MasterService;
use crate::master::state::tenants::TenantQuota;

/// A gauge's value for one tenant.
type Gauge = fn(&TenantQuota) -> u64;

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The families as Prometheus text; empty outside multi-tenant mode.
pub fn render(svc: &MasterService) -> String {
    let (Ok(quotas), Some((rejects, evicted))) = (svc.tenant_quotas(), svc.tenant_counters())
    else {
        return String::new();
    };
    let mut out = String::new();
    let gauges: [(&str, &str, Gauge); 6] = [
        ("requested_bytes", "Requested tenant quota in bytes", |q| {
            q.requested_quota_bytes
        }),
        ("effective_bytes", "Effective tenant quota in bytes", |q| {
            q.effective_quota_bytes
        }),
        ("charged_bytes", "Tenant quota charge in bytes", |q| {
            q.charged_bytes
        }),
        (
            "admission_closed",
            "Tenant quota admission closed flag",
            |q| u64::from(q.admission_closed),
        ),
        ("over_quota", "Tenant over-quota flag", |q| {
            u64::from(q.over_quota)
        }),
        ("explicit_policy", "Tenant explicit policy flag", |q| {
            u64::from(q.has_explicit_policy)
        }),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP mooncake_tenant_quota_{name} {help}");
        let _ = writeln!(out, "# TYPE mooncake_tenant_quota_{name} gauge");
        for q in &quotas {
            let _ = writeln!(
                out,
                "mooncake_tenant_quota_{name}{{tenant_id=\"{}\"}} {}",
                label(&q.tenant_id),
                value(q)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP mooncake_tenant_quota_reject_total Writes refused by tenant admission"
    );
    let _ = writeln!(out, "# TYPE mooncake_tenant_quota_reject_total counter");
    for ((tenant, why), n) in &rejects {
        let _ = writeln!(
            out,
            "mooncake_tenant_quota_reject_total{{tenant_id=\"{}\",reason=\"{}\"}} {n}",
            label(tenant),
            why.label()
        );
    }
    let _ = writeln!(out, "# HELP mooncake_tenant_quota_evict_bytes_total Bytes evicted to make room within a tenant's quota");
    let _ = writeln!(
        out,
        "# TYPE mooncake_tenant_quota_evict_bytes_total counter"
    );
    for (tenant, n) in &evicted {
        let _ = writeln!(
            out,
            "mooncake_tenant_quota_evict_bytes_total{{tenant_id=\"{}\"}} {n}",
            label(tenant)
        );
    }
    out
}
