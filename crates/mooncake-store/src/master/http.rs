//! The master's HTTP service on `metrics_port`: Prometheus metrics, health
//! and admin queries, with the reference's paths and body formats.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use mooncake_common::Error;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use super::shared::Shared;
use crate::types::{ReplicaDesc, ReplicaKind};

type Params = Query<HashMap<String, String>>;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics))
        .route("/metrics/summary", get(summary))
        .route("/health", get(health))
        .route("/query_key", get(query_key))
        .route("/batch_query_keys", get(batch_query_keys))
        .route("/get_all_keys", get(all_keys))
        .route("/get_all_segments", get(all_segments))
        .route("/query_segment", get(query_segment))
        .merge(super::drain_http::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .with_state(shared)
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "404 Not Found").into_response()
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let body = tokio::task::block_in_place(|| {
        let stats = s.service.stats(s.clock.now_ms());
        s.metrics.render(&s.service, &stats)
    });
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// One line describing the master, for `/metrics/summary` and the periodic log.
pub(crate) fn summary_line(s: &Shared) -> String {
    let st = s.service.stats(s.clock.now_ms());
    let body = s.metrics.summary(&s.service, &st);
    format!("role=leader, state=serving, service_ready=true, {body}")
}

/// The status page (see `status`).
async fn status_page(State(s): State<Arc<Shared>>) -> Response {
    let body = tokio::task::block_in_place(|| {
        let stats = s.service.stats(s.clock.now_ms());
        let segments = s.service.segment_summaries();
        let view = s.metrics.status_numbers();
        let page = super::status::StatusView {
            role: "leader",
            stats: &stats,
            segments: &segments,
            totals: view.totals,
            file_used: view.file_used,
            file_capacity: view.file_capacity,
            ha_lag: view.ha_lag,
            ha_state: view.ha_state,
            gets: view.gets,
        };
        super::status::render(&page)
    });
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

async fn summary(State(s): State<Arc<Shared>>) -> Response {
    tokio::task::block_in_place(|| summary_line(&s)).into_response()
}

async fn health() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"ok","role":"leader","ha_state":"serving","service_ready":true,"leader_address":null,"view_version":null}"#,
    )
        .into_response()
}

/// A memory replica as the reference's admin API prints it.
#[derive(Serialize)]
struct ReplicaJson<'a> {
    size_: u64,
    buffer_address_: u64,
    protocol_: &'static str,
    transport_endpoint_: &'a str,
}

fn replica_json(replicas: &[ReplicaDesc]) -> Vec<ReplicaJson<'_>> {
    replicas
        .iter()
        .filter_map(|r| match &r.kind {
            ReplicaKind::Memory(m) => Some(ReplicaJson {
                size_: m.size,
                buffer_address_: m.buffer_address,
                protocol_: "tcp",
                transport_endpoint_: &m.transport_endpoint,
            }),
            ReplicaKind::Disk(_) | ReplicaKind::LocalDisk(_) => None,
        })
        .collect()
}

fn json(status: StatusCode, v: &impl Serialize) -> Response {
    match serde_json::to_string(v) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn error_json(status: StatusCode, e: &Error) -> Response {
    #[derive(Serialize)]
    struct ErrorBody<'a> {
        success: bool,
        error_code: i32,
        error_message: &'a str,
    }
    json(
        status,
        &ErrorBody {
            success: false,
            error_code: e.code.code(),
            error_message: e.code.name(),
        },
    )
}

async fn query_key(State(s): State<Arc<Shared>>, Query(p): Params) -> Response {
    let key = p.get("key").map_or("", String::as_str);
    match s.service.query_key(key) {
        Ok(replicas) => {
            #[derive(Serialize)]
            struct Body<'a> {
                success: bool,
                data: Vec<ReplicaJson<'a>>,
            }
            json(
                StatusCode::OK,
                &Body {
                    success: true,
                    data: replica_json(&replicas),
                },
            )
        }
        Err(e) => error_json(StatusCode::NOT_FOUND, &e),
    }
}

#[derive(Serialize)]
struct KeyEntry<'a> {
    ok: bool,
    error: Option<&'static str>,
    values: Option<Vec<ReplicaJson<'a>>>,
    disk_values: Option<()>,
    local_disk_values: Option<()>,
    nof_values: Option<()>,
}

/// A JSON object whose members keep the order given.
struct Ordered<'a, T>(&'a [(String, T)]);

impl<T: Serialize> Serialize for Ordered<'_, T> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut m = ser.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

async fn batch_query_keys(State(s): State<Arc<Shared>>, Query(p): Params) -> Response {
    let keys: Vec<&str> = p
        .get("keys")
        .map(|k| k.split(',').filter(|k| !k.is_empty()).collect())
        .unwrap_or_default();
    if keys.is_empty() {
        #[derive(Serialize)]
        struct Bad {
            success: bool,
            error: &'static str,
        }
        return json(
            StatusCode::BAD_REQUEST,
            &Bad {
                success: false,
                error: "No keys provided. Use ?keys=key1,key2,...",
            },
        );
    }
    let found: Vec<(String, Result<Vec<ReplicaDesc>, Error>)> = keys
        .iter()
        .map(|k| (k.to_string(), s.service.query_key(k)))
        .collect();
    let entries: Vec<(String, KeyEntry<'_>)> = found
        .iter()
        .map(|(k, r)| {
            let entry = match r {
                Ok(replicas) => KeyEntry {
                    ok: true,
                    error: None,
                    values: Some(replica_json(replicas)),
                    disk_values: None,
                    local_disk_values: None,
                    nof_values: None,
                },
                Err(e) => KeyEntry {
                    ok: false,
                    error: Some(e.code.name()),
                    values: None,
                    disk_values: None,
                    local_disk_values: None,
                    nof_values: None,
                },
            };
            (k.clone(), entry)
        })
        .collect();
    #[derive(Serialize)]
    struct Body<'a, 'b> {
        success: bool,
        data: Ordered<'a, KeyEntry<'b>>,
    }
    json(
        StatusCode::OK,
        &Body {
            success: true,
            data: Ordered(&entries),
        },
    )
}

async fn all_keys(State(s): State<Arc<Shared>>) -> Response {
    let body = tokio::task::block_in_place(|| {
        let mut out = String::new();
        for k in s.service.all_keys() {
            out.push_str(&k);
            out.push('\n');
        }
        out
    });
    body.into_response()
}

async fn all_segments(State(s): State<Arc<Shared>>) -> Response {
    let mut out = String::new();
    for seg in s.service.segment_summaries() {
        out.push_str(&seg.name);
        out.push('\n');
    }
    out.into_response()
}

async fn query_segment(State(s): State<Arc<Shared>>, Query(p): Params) -> Response {
    let name = p.get("segment").map_or("", String::as_str);
    match s
        .service
        .segment_summaries()
        .into_iter()
        .find(|seg| seg.name == name)
    {
        Some(seg) => format!(
            "{}\nUsed(bytes): {}\nCapacity(bytes) : {}\n",
            seg.name, seg.used, seg.capacity
        )
        .into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, "Failed to query segment").into_response(),
    }
}
