//! The master's HTTP service on `metrics_port`: Prometheus metrics, health
//! and admin queries, with the reference's paths and body formats.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use mooncake_common::{Error, ErrorCode};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use super::shared::Shared;
use crate::master::replication::Role;
use crate::types::{ReplicaDesc, ReplicaKind};

type Params = Query<HashMap<String, String>>;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    // Data endpoints answer only on a leader (a standby's state lags).
    let data = Router::new()
        .route("/query_key", get(query_key))
        .route("/batch_query_keys", get(batch_query_keys))
        .route("/get_all_keys", get(all_keys))
        .route("/get_all_segments", get(all_segments))
        .route("/query_segment", get(query_segment))
        .route("/get_segments_detail", get(segments_detail))
        .merge(super::drain_routes::routes())
        .merge(super::tenant_routes::routes())
        .route_layer(middleware::from_fn_with_state(shared.clone(), leader_only));
    Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics))
        .route("/metrics/summary", get(summary))
        .route("/health", get(health))
        .route("/role", get(role))
        .route("/ha_status", get(ha_status))
        .route("/leader", get(leader))
        .route("/replication", get(replication))
        .route("/kv_events/status", get(kv_events_status))
        .merge(data)
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .layer(middleware::from_fn_with_state(
            shared.clone(),
            changes_need_token,
        ))
        .with_state(shared)
}

/// With a cluster token, a request that may change state (anything but
/// GET and HEAD: drain jobs and the like) needs
/// `Authorization: Bearer <cluster or admin token>`.
async fn changes_need_token(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    use super::access::Access;
    use axum::http::Method;
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        let auth = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if s.access.http_access(auth) == Access::Anonymous {
            return (
                StatusCode::UNAUTHORIZED,
                "this master requires Authorization: Bearer <cluster token>",
            )
                .into_response();
        }
    }
    next.run(req).await
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "404 Not Found").into_response()
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let body = tokio::task::block_in_place(|| {
        publish_ha(&s);
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
    publish_ha(s);
    let st = s.service.stats(s.clock.now_ms());
    let body = s.metrics.summary(&s.service, &st);
    let v = view(s);
    format!(
        "role={}, state={}, service_ready={}, {body}",
        v.role, v.ha_state, v.service_ready
    )
}

/// The status page (see `status`).
async fn status_page(State(s): State<Arc<Shared>>) -> Response {
    let body = tokio::task::block_in_place(|| {
        publish_ha(&s);
        let stats = s.service.stats(s.clock.now_ms());
        let segments = s.service.segment_summaries();
        let numbers = s.metrics.status_numbers();
        let page = super::status::StatusView {
            role: view(&s).role,
            stats: &stats,
            segments: &segments,
            totals: numbers.totals,
            file_used: numbers.file_used,
            file_capacity: numbers.file_capacity,
            ha_lag: numbers.ha_lag,
            ha_state: numbers.ha_state,
            gets: numbers.gets,
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

/// Brings the `ha_*` families and `master_is_leader` up to date with the
/// replication status before they are read.
fn publish_ha(s: &Shared) {
    if let Some(r) = &s.replication {
        r.publish_metrics(&s.metrics);
    }
}

async fn summary(State(s): State<Arc<Shared>>) -> Response {
    tokio::task::block_in_place(|| summary_line(&s)).into_response()
}

/// Where this master stands, as `/health` and its siblings report it.
#[derive(Serialize)]
struct View {
    status: &'static str,
    role: &'static str,
    ha_state: &'static str,
    service_ready: bool,
    leader_address: Option<String>,
    /// The election's term of the leader known.
    view_version: Option<u64>,
}

fn view(s: &Shared) -> View {
    let Some(r) = &s.replication else {
        return View {
            status: "ok",
            role: "leader",
            ha_state: "serving",
            service_ready: true,
            leader_address: None,
            view_version: None,
        };
    };
    let st = r.status();
    let (role, ha_state, ready) = match st.role {
        Role::Leader => ("leader", "serving", true),
        Role::Standby => ("standby", "standby", false),
        Role::Deposed => ("standby", "deposed", false),
    };
    View {
        status: "ok",
        role,
        ha_state,
        service_ready: ready,
        view_version: st.leader.is_some().then_some(st.term),
        leader_address: st.leader,
    }
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    json(StatusCode::OK, &view(&s))
}

/// The KV-event publisher's counters, as the reference's admin service
/// reports them (all zero when disabled).
async fn kv_events_status(State(s): State<Arc<Shared>>) -> Response {
    #[derive(Serialize)]
    struct Status {
        enabled: bool,
        #[serde(flatten)]
        stats: crate::master::events::Stats,
    }
    let stats = s.service.kv_event_stats();
    let status = Status {
        enabled: stats.is_some(),
        stats: stats.unwrap_or_default(),
    };
    json(StatusCode::OK, &status)
}

async fn role(State(s): State<Arc<Shared>>) -> Response {
    view(&s).role.into_response()
}

async fn ha_status(State(s): State<Arc<Shared>>) -> Response {
    view(&s).ha_state.into_response()
}

async fn leader(State(s): State<Arc<Shared>>) -> Response {
    #[derive(Serialize)]
    struct Body {
        present: bool,
        leader_address: Option<String>,
        view_version: Option<u64>,
    }
    let v = view(&s);
    json(
        StatusCode::OK,
        &Body {
            present: v.leader_address.is_some() || s.replication.is_none(),
            leader_address: v.leader_address,
            view_version: v.view_version,
        },
    )
}

/// The replicated log's state on this master (ours; the reference has none).
async fn replication(State(s): State<Arc<Shared>>) -> Response {
    let Some(r) = &s.replication else {
        return (StatusCode::NOT_FOUND, "replication is off (--enable_oplog)").into_response();
    };
    let st = r.status();
    #[derive(Serialize)]
    struct Body {
        member: String,
        role: &'static str,
        term: u64,
        leader: Option<String>,
        last_seq: u64,
        applied_seq: u64,
        committed_seq: u64,
        log_bytes: usize,
        log_base: u64,
        snapshot_seq: u64,
        in_sync: Vec<String>,
        standbys: Vec<(String, u64)>,
    }
    json(
        StatusCode::OK,
        &Body {
            role: view(&s).role,
            member: st.member,
            term: st.term,
            leader: st.leader,
            last_seq: st.last_seq,
            applied_seq: st.applied_seq,
            committed_seq: st.committed_seq,
            log_bytes: st.log_bytes,
            log_base: st.log_base,
            snapshot_seq: st.snapshot_seq,
            in_sync: st.in_sync,
            standbys: st.standbys,
        },
    )
}

/// Data endpoints on a master that does not serve: the reference's 503.
async fn leader_only(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if s.replication
        .as_ref()
        .is_some_and(|r| r.role() != Role::Leader)
    {
        let body = format!(
            r#"{{"success":false,"error_code":{},"error_message":"service plane is not active"}}"#,
            ErrorCode::UNAVAILABLE_IN_CURRENT_MODE.code()
        );
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
    }
    next.run(req).await
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
        // One copy of the key bytes: the answer is written as the
        // shards are visited, each locked only while its keys are copied.
        let mut out = String::new();
        s.service.visit_keys(|k| {
            out.push_str(k);
            out.push('\n');
        });
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

/// Every mounted segment as JSON, in the reference's fields. Ids print as
/// the reference prints a UUID (two decimal halves); a segment id is the
/// master's own counter. Our engine moves bytes over TCP only.
async fn segments_detail(State(s): State<Arc<Shared>>) -> Response {
    let segments: Vec<serde_json::Value> = s
        .service
        .segment_summaries()
        .into_iter()
        .map(|seg| {
            let percent = if seg.capacity == 0 {
                0.0
            } else {
                seg.used as f64 * 100.0 / seg.capacity as f64
            };
            serde_json::json!({
                "segment_name": seg.name,
                "segment_id": format!("0-{}", seg.id),
                "client_id": format!("{}-{}", seg.owner >> 64, seg.owner as u64),
                "base_address": format!("{:#x}", seg.base),
                "size_bytes": seg.capacity,
                "size_human": format!("{} GiB", seg.capacity as f64 / (1u64 << 30) as f64),
                "te_endpoint": seg.endpoint,
                "protocol": "tcp",
                "status": seg.status,
                "allocator_used_bytes": seg.used,
                "allocator_capacity_bytes": seg.capacity,
                "allocator_usage_percent": percent,
            })
        })
        .collect();
    let body = serde_json::json!({"total_segments": segments.len(), "segments": segments});
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/json; charset=utf-8",
        )],
        body.to_string(),
    )
        .into_response()
}
