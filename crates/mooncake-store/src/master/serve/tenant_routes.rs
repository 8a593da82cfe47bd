//! The tenant quota admin routes of the master's HTTP service, with the
//! reference's path, bodies and answers: `GET`, `PUT` and `DELETE`
//! `/api/v1/tenant_quotas[?tenant_id=]`. A change is written where the
//! connector keeps the policies (the file or the etcd key of
//! `--tenant_quota_connector_uri`) before it is answered, so it survives
//! a restart. With an admin token configured, `PUT` and
//! `DELETE` need it (`Authorization: Bearer <admin token>`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use mooncake_common::{Error, ErrorCode};
use serde_json::{json, Value};

use super::access::Access;
use super::shared::Shared;
use crate::master::state::tenants::TenantQuota;

type Params = Query<HashMap<String, String>>;

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new().route(
        "/api/v1/tenant_quotas",
        get(list_or_get).put(upsert).delete(remove),
    )
}

fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::INVALID_PARAMS => StatusCode::BAD_REQUEST,
        ErrorCode::OBJECT_NOT_FOUND => StatusCode::NOT_FOUND,
        ErrorCode::TENANT_NOT_EMPTY | ErrorCode::UNAVAILABLE_IN_CURRENT_MODE => {
            StatusCode::CONFLICT
        }
        ErrorCode::ILLEGAL_CLIENT => StatusCode::UNAUTHORIZED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn failed(e: &Error) -> Response {
    let body = json!({
        "success": false,
        "error_code": e.code.code(),
        "error_message": e.context,
    });
    (status_of(e.code), Json(body)).into_response()
}

fn bad(what: &str) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, what.to_string())
}

fn quota_json(q: &TenantQuota) -> Value {
    json!({
        "tenant_id": q.tenant_id,
        "requested_quota_bytes": q.requested_quota_bytes,
        "effective_quota_bytes": q.effective_quota_bytes,
        "charged_bytes": q.charged_bytes,
        "admission_closed": q.admission_closed,
        "over_quota": q.over_quota,
        "has_explicit_policy": q.has_explicit_policy,
    })
}

fn ok(data: Value) -> Response {
    (StatusCode::OK, Json(json!({"success": true, "data": data}))).into_response()
}

/// The `tenant_id` parameter: present and a valid tenant id.
fn tenant_id(p: &Params) -> Result<&str, Error> {
    match p.get("tenant_id") {
        Some(t) if crate::tenant::is_valid(t) => Ok(t),
        _ => Err(bad("missing or invalid tenant_id")),
    }
}

/// A change needs the admin token when the master has one.
fn admin(s: &Shared, headers: &HeaderMap) -> Result<(), Error> {
    let auth = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    if s.access.has_admin_token() && s.access.http_access(auth) != Access::Admin {
        return Err(Error::new(
            ErrorCode::ILLEGAL_CLIENT,
            "tenant quotas change only with Authorization: Bearer <admin token>",
        ));
    }
    Ok(())
}

async fn list_or_get(State(s): State<Arc<Shared>>, p: Params) -> Response {
    if !p.contains_key("tenant_id") {
        return match s.service.tenant_quotas() {
            Ok(all) => ok(all.iter().map(quota_json).collect()),
            Err(e) => failed(&e),
        };
    }
    match tenant_id(&p).and_then(|t| s.service.tenant_quota(t)) {
        Ok(q) => ok(quota_json(&q)),
        Err(e) => failed(&e),
    }
}

/// Keeps `policies` where the connector keeps them; a failed write puts
/// `before` back.
fn keep(
    s: &Shared,
    before: crate::tenant::Policies,
    policies: &crate::tenant::Policies,
) -> Result<(), Error> {
    let stored = tokio::task::block_in_place(|| {
        s.config
            .tenant_policy_store()
            .and_then(|store| store.store(policies))
    });
    stored.inspect_err(|_| s.service.restore_tenant_policies(before))
}

async fn upsert(
    State(s): State<Arc<Shared>>,
    p: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = || -> Result<TenantQuota, Error> {
        admin(&s, &headers)?;
        let tenant = tenant_id(&p)?;
        let v: Value = serde_json::from_slice(&body).map_err(|_| bad("body is not JSON"))?;
        let bytes = v
            .get("requested_quota_bytes")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("requested_quota_bytes must be a non-negative integer"))?;
        let before = s.service.tenant_policies()?;
        let policies = s.service.set_tenant_quota(tenant, bytes)?;
        keep(&s, before, &policies)?;
        s.service.tenant_quota(tenant)
    };
    match run() {
        Ok(q) => ok(quota_json(&q)),
        Err(e) => failed(&e),
    }
}

async fn remove(State(s): State<Arc<Shared>>, p: Params, headers: HeaderMap) -> Response {
    let run = || -> Result<Value, Error> {
        admin(&s, &headers)?;
        let tenant = tenant_id(&p)?;
        let before = s.service.tenant_policies()?;
        let policies = s.service.delete_tenant_quota(tenant)?;
        keep(&s, before, &policies)?;
        Ok(s.service
            .tenant_quota(tenant)
            .map_or(Value::Null, |q| quota_json(&q)))
    };
    match run() {
        Ok(v) => ok(v),
        Err(e) => failed(&e),
    }
}
