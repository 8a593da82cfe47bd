//! The drain routes of the master's HTTP service, with the reference's
//! paths, JSON bodies and error answers (`{"success":false,"error_code":N,
//! "error_message":...}`, 400 for bad arguments, 404 for an unknown job or
//! segment, 409 for a segment or job in the wrong state).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mooncake_common::ErrorCode;
use serde_json::json;

use super::drain_jobs::{format_job_id, parse_job_id, DrainRequest, JobView};
use super::shared::{wall_ms, Shared};

type Params = Query<HashMap<String, String>>;

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/v1/drain_jobs", post(create))
        .route("/api/v1/drain_jobs/query", get(query))
        .route("/api/v1/drain_jobs/cancel", post(cancel))
        .route("/api/v1/segments/status", get(segment_status))
}

fn http_status(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::INVALID_PARAMS => StatusCode::BAD_REQUEST,
        ErrorCode::JOB_NOT_FOUND | ErrorCode::SEGMENT_NOT_FOUND | ErrorCode::OBJECT_NOT_FOUND => {
            StatusCode::NOT_FOUND
        }
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE | ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS => {
            StatusCode::CONFLICT
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The reference's error body; the message defaults to the code's name.
fn error(status: StatusCode, code: ErrorCode, message: Option<String>) -> Response {
    let body = json!({
        "success": false,
        "error_code": code.code(),
        "error_message": message.unwrap_or_else(|| code.name().to_string()),
    });
    (status, Json(body)).into_response()
}

fn failed(code: ErrorCode) -> Response {
    error(http_status(code), code, None)
}

/// The `job_id` parameter; `None` when missing or not a UUID.
fn job_id(p: &Params) -> Option<u128> {
    p.get("job_id").and_then(|s| parse_job_id(s))
}

fn bad_job_id() -> Response {
    error(
        StatusCode::BAD_REQUEST,
        ErrorCode::INVALID_PARAMS,
        Some("Missing or invalid job_id".into()),
    )
}

async fn create(State(s): State<Arc<Shared>>, body: String) -> Response {
    let request: DrainRequest = match serde_json::from_str(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::INVALID_PARAMS,
                Some(format!("Invalid JSON body: {e}")),
            )
        }
    };
    match s.drain.create(&s.service, request, wall_ms()) {
        Ok(id) => Json(json!({
            "success": true,
            "job_id": format_job_id(id),
            "status": "CREATED",
            "error_code": 0,
            "error_message": "",
        }))
        .into_response(),
        Err(code) => failed(code),
    }
}

fn view_json(v: &JobView) -> serde_json::Value {
    json!({
        "success": true,
        "job_id": format_job_id(v.id),
        "type": 0,
        "type_name": "DRAIN",
        "status": v.status as i32,
        "status_name": v.status.name(),
        "created_at_ms_epoch": v.created_ms,
        "last_updated_at_ms_epoch": v.updated_ms,
        "segments": v.segments,
        "succeeded_units": v.succeeded_units,
        "failed_units": v.failed_units,
        "blocked_units": v.blocked_units,
        "active_units": v.active_units,
        "migrated_bytes": v.migrated_bytes,
        "message": v.message,
        "error_code": 0,
        "error_message": "",
    })
}

async fn query(State(s): State<Arc<Shared>>, p: Params) -> Response {
    let Some(id) = job_id(&p) else {
        return bad_job_id();
    };
    match s.drain.query(id) {
        Ok(v) => Json(view_json(&v)).into_response(),
        Err(code) => failed(code),
    }
}

async fn cancel(State(s): State<Arc<Shared>>, p: Params) -> Response {
    let Some(id) = job_id(&p) else {
        return bad_job_id();
    };
    match s.drain.cancel(&s.service, id, wall_ms()) {
        Ok(()) => Json(json!({
            "success": true,
            "job_id": format_job_id(id),
            "status": "CANCELED",
            "error_code": 0,
            "error_message": "",
        }))
        .into_response(),
        Err(code) => failed(code),
    }
}

async fn segment_status(State(s): State<Arc<Shared>>, p: Params) -> Response {
    let Some(name) = p.get("segment").filter(|n| !n.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            ErrorCode::INVALID_PARAMS,
            Some("Missing segment query parameter".into()),
        );
    };
    match s.service.segment_status(name) {
        Some(st) => Json(json!({
            "success": true,
            "segment": name,
            "status": st as i32,
            "status_name": st.name(),
            "error_code": 0,
            "error_message": "",
        }))
        .into_response(),
        None => failed(ErrorCode::SEGMENT_NOT_FOUND),
    }
}
