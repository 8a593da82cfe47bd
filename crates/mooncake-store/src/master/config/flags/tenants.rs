//! Multi-tenancy's flags (`crate::tenant`, the master's quota table).

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! tenants_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    enable_multi_tenants: Bool = "false", Full, "Enable strict multi-tenant namespace and quota admission"
        => enable_multi_tenants: bool = boolean;
    tenant_quota_connector_type: Str = "file", Full, "Tenant quota policy connector type"
        => tenant_quota_connector_type: String = text;
    tenant_quota_connector_uri: Str = "", Full, "Tenant quota policy connector URI"
        => tenant_quota_connector_uri: String = text;
    } };
}
