//! The HTTP side: routing, authentication (bearer tokens, 401),
//! authorisation (injected RBAC denials, 403), content negotiation and the
//! fault switches, in the order the API server's filter chain applies them.

use std::time::SystemTime;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{header, Method, Request, Response, StatusCode};
use serde_json::Value;

use crate::status::ApiError;
use crate::store::Kind;
use crate::StandIn;

/// The API server's request body limit.
const MAX_BODY: usize = 3 << 20;

pub(crate) async fn handle(si: StandIn, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    if let Some(resp) = control(&si, &parts.method, &parts.uri) {
        return resp;
    }
    si.wait_thawed().await;
    si.count_request();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return respond(Err(ApiError {
                code: 413,
                reason: "RequestEntityTooLarge",
                message: format!("request body: {e}"),
                details: Value::Null,
            }))
        }
    };
    respond(api(&si, &parts, body))
}

fn respond(r: Result<(u16, Value), ApiError>) -> Response<Full<Bytes>> {
    let (code, body) = match r {
        Ok(ok) => ok,
        Err(e) => (e.code, e.body()),
    };
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
        .unwrap()
}

/// `/standin/...`: the fault switches, for tests that run the stand-in as
/// a process. Not part of the Kubernetes API; never frozen, never denied.
fn control(si: &StandIn, method: &Method, uri: &hyper::Uri) -> Option<Response<Full<Bytes>>> {
    let what = uri.path().strip_prefix("/standin/")?;
    let query = |key: &str| {
        uri.query()?
            .split('&')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    };
    let ok = || respond(Ok((200, serde_json::json!({"ok": true}))));
    if method != Method::POST {
        return Some(respond(Err(ApiError::method_not_allowed())));
    }
    Some(match (what, query("verb"), query("resource")) {
        ("freeze", _, _) => {
            si.freeze();
            ok()
        }
        ("thaw", _, _) => {
            si.thaw();
            ok()
        }
        ("deny", Some(verb), Some(resource)) => {
            si.deny(&verb, &resource);
            ok()
        }
        ("allow", Some(verb), Some(resource)) => {
            si.allow(&verb, &resource);
            ok()
        }
        _ => respond(Err(ApiError::no_route())),
    })
}

/// Which object a path names: `(kind, namespace, name)`.
fn route(path: &str) -> Option<(Kind, String, Option<String>)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (kind, rest) = match segs.as_slice() {
        ["apis", "coordination.k8s.io", "v1", "namespaces", rest @ ..] => (Kind::Lease, rest),
        ["api", "v1", "namespaces", rest @ ..] => (Kind::Pod, rest),
        _ => return None,
    };
    let (ns, name) = match rest {
        [ns, res] if *res == kind.resource() => (ns, None),
        [ns, res, name] if *res == kind.resource() => (ns, Some(name.to_string())),
        _ => return None,
    };
    (!ns.is_empty()).then(|| (kind, ns.to_string(), name))
}

fn api(
    si: &StandIn,
    parts: &hyper::http::request::Parts,
    body: Bytes,
) -> Result<(u16, Value), ApiError> {
    let (kind, ns, name) = route(parts.uri.path()).ok_or_else(ApiError::no_route)?;
    let verb = match (&parts.method, &name) {
        (&Method::GET, Some(_)) => "get",
        (&Method::GET, None) => "list",
        (&Method::POST, None) => "create",
        (&Method::PUT, Some(_)) => "update",
        (&Method::PATCH, Some(_)) => "patch",
        (&Method::DELETE, Some(_)) => "delete",
        _ => return Err(ApiError::method_not_allowed()),
    };
    // Pods: only what a leader labelling itself needs.
    if kind == Kind::Pod && !matches!(verb, "get" | "patch") {
        return Err(ApiError::method_not_allowed());
    }
    let user = si.authenticate(bearer(parts))?;
    if si.is_denied(verb, kind.resource()) {
        return Err(ApiError::forbidden(kind, name.as_deref(), &user, verb, &ns));
    }
    if !accepts_json(parts) {
        return Err(ApiError::not_acceptable());
    }
    let name = name.unwrap_or_default();
    let now = SystemTime::now();
    match verb {
        "get" => si.with_store(|s| s.get(kind, &ns, &name)).map(|o| (200, o)),
        "list" => Ok((200, si.with_store(|s| s.list(kind, &ns)))),
        "delete" => si
            .with_store(|s| s.delete(kind, &ns, &name))
            .map(|o| (200, o)),
        "create" | "update" => {
            check_media(parts, &["application/json"])?;
            let obj = parse_json(&body)?;
            let w = si.with_store(|s| match verb {
                "create" => s.create(kind, &ns, obj, now),
                _ => s.replace(kind, &ns, &name, obj, now),
            })?;
            Ok((if w.created { 201 } else { 200 }, w.object))
        }
        _ => {
            // Strategic merge equals merge patch on maps such as labels,
            // which is all the stand-in's clients patch.
            check_media(
                parts,
                &[
                    "application/merge-patch+json",
                    "application/strategic-merge-patch+json",
                ],
            )?;
            let patch = parse_json(&body)?;
            let w = si.with_store(|s| s.merge_patch(kind, &ns, &name, patch))?;
            Ok((200, w.object))
        }
    }
}

fn bearer(parts: &hyper::http::request::Parts) -> Option<&str> {
    let v = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn media_type(v: &str) -> String {
    v.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Bodies must be JSON: protobuf (`application/vnd.kubernetes.protobuf`)
/// and YAML get 415, which a real server would accept.
fn check_media(parts: &hyper::http::request::Parts, allowed: &[&str]) -> Result<(), ApiError> {
    let Some(ct) = parts.headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or("");
    if allowed.contains(&media_type(ct).as_str()) {
        Ok(())
    } else {
        Err(ApiError::unsupported_media_type(ct))
    }
}

/// Answers are JSON; a client that accepts nothing JSON-like (protobuf
/// only) gets 406.
fn accepts_json(parts: &hyper::http::request::Parts) -> bool {
    let all: Vec<String> = parts
        .headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(media_type)
        .collect();
    all.is_empty()
        || all.iter().any(|m| {
            matches!(
                m.as_str(),
                "application/json" | "application/*" | "*/*" | ""
            )
        })
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"),
            Some((Kind::Lease, "ns".into(), Some("l".into())))
        );
        assert_eq!(
            route("/apis/coordination.k8s.io/v1/namespaces/ns/leases"),
            Some((Kind::Lease, "ns".into(), None))
        );
        assert_eq!(
            route("/api/v1/namespaces/ns/pods/p"),
            Some((Kind::Pod, "ns".into(), Some("p".into())))
        );
        for none in [
            "/api/v1/namespaces/ns/leases/l",
            "/apis/coordination.k8s.io/v1/namespaces/ns/pods/p",
            "/apis/coordination.k8s.io/v1/leases",
            "/api/v1/namespaces//pods/p",
            "/healthz",
        ] {
            assert_eq!(route(none), None, "{none}");
        }
    }
}
