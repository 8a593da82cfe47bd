//! The HTTP API (the reference's `conductor-indexer.md`): `POST /register`,
//! `/unregister`, `/query`, `/query_by_hash`; `GET /metrics` and
//! `GET /instances` (each subscription's stream state).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::config::Registration;
use crate::event::{lora_from_id, Medium};
use crate::index::{Kind, Namespace};
use crate::metrics::QueryLabels;
use crate::service::{Conductor, RegisterError};

/// A request the API refuses, and why.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad(format!("bad request body: {e}")))
}

pub fn router(c: Arc<Conductor>) -> Router {
    Router::new()
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/metrics", get(metrics))
        .route("/instances", get(instances))
        .route("/health", get(|| async { "ok" }))
        .with_state(c)
}

async fn register(State(c): State<Arc<Conductor>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let reg: Registration = parse(&body)?;
    let instance = reg.instance_id.clone();
    // Connecting a socket and starting a thread: off the async workers.
    let res = tokio::task::spawn_blocking(move || c.register(reg))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match res {
        Ok(_) => Ok(Json(
            json!({ "status": "registered successfully", "instance_id": instance }),
        )),
        Err(e @ RegisterError::Duplicate(_)) => Err(ApiError(StatusCode::CONFLICT, e.to_string())),
        Err(e) => Err(bad(e.to_string())),
    }
}

#[derive(Deserialize)]
struct UnregisterReq {
    instance_id: String,
    #[serde(default)]
    tenant_id: Option<String>,
    #[serde(default)]
    dp_rank: Option<u32>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

async fn unregister(State(c): State<Arc<Conductor>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: UnregisterReq = parse(&body)?;
    let kind = match req.kind.as_deref() {
        None => None,
        Some(k) => Some(
            Kind::parse(k)
                .ok_or_else(|| bad(format!("type {k:?} is not one of vLLM, SGLang, Mooncake")))?,
        ),
    };
    let tenant = req
        .tenant_id
        .as_deref()
        .filter(|t| !t.is_empty())
        .unwrap_or("default");
    let removed = c.unregister(&req.instance_id, tenant, req.dp_rank, kind);
    if removed.is_empty() {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "no registration of instance {:?} under tenant {tenant:?}",
                req.instance_id
            ),
        ));
    }
    Ok(Json(
        json!({ "status": "unregistered successfully", "removed_instances": removed }),
    ))
}

#[derive(Deserialize)]
struct QueryReq {
    model: String,
    #[serde(default)]
    lora_name: Option<String>,
    #[serde(default)]
    lora_id: Option<i64>,
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    seq_hashes: Option<Vec<Value>>,
    #[serde(default)]
    block_hash: Option<Vec<Value>>,
    #[serde(default)]
    tenant_id: Option<String>,
    #[serde(default)]
    instance_id: Option<String>,
    block_size: u32,
    #[serde(default)]
    cache_salt: Option<String>,
}

impl QueryReq {
    fn namespace(&self) -> Result<Namespace, ApiError> {
        if self.model.is_empty() {
            return Err(bad("model is empty"));
        }
        if self.block_size == 0 {
            return Err(bad("block_size must be positive"));
        }
        let named = self.lora_name.clone().filter(|n| !n.is_empty());
        let by_id = self.lora_id.and_then(lora_from_id);
        if named.is_some() && by_id.is_some() {
            return Err(bad("give lora_name or lora_id, not both"));
        }
        Ok(Namespace {
            tenant: self
                .tenant_id
                .clone()
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| "default".into()),
            model: self.model.clone(),
            lora: named.or(by_id).unwrap_or_default(),
            salt: self.cache_salt.clone().unwrap_or_default(),
            block_size: self.block_size,
        })
    }
}

/// A hash as a router may send it: an integer (negative ones as their
/// 64-bit two's complement), or a decimal or `0x` hex string.
fn hash_of(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| n.as_i64().map(|i| i as u64)),
        Value::String(s) => match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s
                .parse::<u64>()
                .ok()
                .or_else(|| s.parse::<i64>().ok().map(|i| i as u64)),
        },
        _ => None,
    }
}

async fn query(State(c): State<Arc<Conductor>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: QueryReq = parse(&body)?;
    let ns = req.namespace()?;
    let tokens = req
        .token_ids
        .as_deref()
        .ok_or_else(|| bad("token_ids is required"))?;
    let start = Instant::now();
    let hashes =
        crate::hash::seq_hashes(tokens, ns.block_size as usize, c.shared.index.read().seed());
    answer(&c, &ns, req.instance_id.as_deref(), &hashes, start, "query")
}

async fn query_by_hash(
    State(c): State<Arc<Conductor>>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: QueryReq = parse(&body)?;
    let ns = req.namespace()?;
    let raw = req
        .seq_hashes
        .as_deref()
        .or(req.block_hash.as_deref())
        .ok_or_else(|| bad("seq_hashes is required"))?;
    let hashes = raw
        .iter()
        .enumerate()
        .map(|(i, v)| {
            hash_of(v).ok_or_else(|| bad(format!("seq_hashes[{i}] is not a 64-bit hash: {v}")))
        })
        .collect::<Result<Vec<u64>, ApiError>>()?;
    answer(
        &c,
        &ns,
        req.instance_id.as_deref(),
        &hashes,
        Instant::now(),
        "query_by_hash",
    )
}

/// `{tenant: {instance: {longest_matched, GPU, CPU, DISK, DP}}}`, in tokens.
fn answer(
    c: &Conductor,
    ns: &Namespace,
    instance: Option<&str>,
    hashes: &[u64],
    start: Instant,
    endpoint: &str,
) -> Result<Json<Value>, ApiError> {
    let hits = c.shared.index.read().query(ns, instance, hashes);
    c.shared
        .metrics
        .query_latency
        .get_or_create(&QueryLabels {
            endpoint: endpoint.into(),
        })
        .observe(start.elapsed().as_secs_f64());
    if let Some(want) = instance.filter(|_| hits.is_empty()) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "instance {want:?} is not registered for tenant {:?} and model {:?}",
                ns.tenant, ns.model
            ),
        ));
    }
    let bs = u64::from(ns.block_size);
    let mut per_instance = Map::new();
    for (name, h) in hits {
        let mut o = Map::new();
        o.insert("longest_matched".into(), json!(h.longest_matched * bs));
        for m in Medium::ALL {
            o.insert(m.label().into(), json!(h.medium(m) * bs));
        }
        let dp: BTreeMap<String, u64> = h.dp.iter().map(|(r, n)| (r.to_string(), n * bs)).collect();
        o.insert("DP".into(), json!(dp));
        per_instance.insert(name, Value::Object(o));
    }
    Ok(Json(json!({ ns.tenant.clone(): per_instance })))
}

async fn metrics(State(c): State<Arc<Conductor>>) -> Response {
    {
        let index = c.shared.index.read();
        c.shared.metrics.index_blocks.set(index.len() as i64);
        c.shared
            .metrics
            .index_bytes
            .set(index.approx_bytes() as i64);
    }
    let body = c.shared.metrics.render();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn instances(State(c): State<Arc<Conductor>>) -> Json<Value> {
    Json(c.instances())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_as_routers_send_them() {
        assert_eq!(hash_of(&json!(5)), Some(5));
        assert_eq!(hash_of(&json!(-1)), Some(u64::MAX));
        assert_eq!(hash_of(&json!(u64::MAX)), Some(u64::MAX));
        assert_eq!(hash_of(&json!("0x10")), Some(16));
        assert_eq!(hash_of(&json!("18446744073709551615")), Some(u64::MAX));
        assert_eq!(hash_of(&json!("-2")), Some(u64::MAX - 1));
        assert_eq!(hash_of(&json!(1.5)), None);
        assert_eq!(hash_of(&json!("abc")), None);
        assert_eq!(hash_of(&json!(null)), None);
    }
}
