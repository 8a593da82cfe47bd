//! The objects the stand-in keeps, with the API server's write rules:
//! resourceVersion compare-and-swap, create-only POST, the Lease strategy
//! (no unconditional update, create on update), JSON merge patch, field
//! validation and normalisation (null fields dropped, MicroTime in UTC).
//! Pure logic: no sockets, the caller passes the wall-clock time.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{json, Map, Value};

pub use crate::kind::Kind;
use crate::micro_time;
use crate::status::ApiError;

type Key = (Kind, String, String);

/// Total bytes of an object's annotation keys and values.
const MAX_ANNOTATION_BYTES: usize = 256 << 10;

pub struct Store {
    next_rv: u64,
    next_uid: u64,
    objects: BTreeMap<Key, Value>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            next_rv: 1000,
            next_uid: 1,
            objects: BTreeMap::new(),
        }
    }
}

/// What a successful write did: the object as stored, and whether it was
/// created (201) rather than updated (200).
#[derive(Debug)]
pub struct Written {
    pub object: Value,
    pub created: bool,
}

impl Store {
    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&(kind, ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))
    }

    pub fn list(&self, kind: Kind, ns: &str) -> Value {
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|((k, n, _), _)| *k == kind && n == ns)
            .map(|(_, v)| v.clone())
            .collect();
        json!({
            "kind": format!("{}List", kind.kind()),
            "apiVersion": kind.api_version(),
            "metadata": { "resourceVersion": self.next_rv.to_string() },
            "items": items,
        })
    }

    /// POST: creates, or 409 AlreadyExists.
    pub fn create(
        &mut self,
        kind: Kind,
        ns: &str,
        body: Value,
        now: SystemTime,
    ) -> Result<Written, ApiError> {
        let mut obj = decode(kind, ns, body)?;
        let name = meta_str(&obj, "name").unwrap_or_default().to_string();
        if name.is_empty() {
            return Err(ApiError::invalid(
                kind,
                "",
                "metadata.name",
                "\"\"",
                "name or generateName is required",
            ));
        }
        if meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created".into(),
            ));
        }
        let key = (kind, ns.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(kind, &name));
        }
        validate(kind, &name, &obj)?;
        let meta = meta_mut(&mut obj);
        meta.insert("namespace".into(), json!(ns));
        meta.insert("uid".into(), json!(self.uid()));
        meta.insert(
            "creationTimestamp".into(),
            json!(micro_time::format_time(now)),
        );
        Ok(Written {
            object: self.store(key, obj),
            created: true,
        })
    }

    /// PUT: a compare-and-swap on `metadata.resourceVersion`, which must be
    /// given (422 otherwise) and current (409 otherwise).
    pub fn replace(
        &mut self,
        kind: Kind,
        ns: &str,
        name: &str,
        body: Value,
        now: SystemTime,
    ) -> Result<Written, ApiError> {
        let mut obj = decode(kind, ns, body)?;
        let body_name = meta_str(&obj, "name").unwrap_or_default();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let key = (kind, ns.to_string(), name.to_string());
        let Some(existing) = self.objects.get(&key) else {
            if !kind.create_on_update() {
                return Err(ApiError::not_found(kind, name));
            }
            // Create on update: the server drops the given version.
            meta_mut(&mut obj).remove("resourceVersion");
            return self.create(kind, ns, obj, now);
        };
        let rv = meta_str(&obj, "resourceVersion").unwrap_or_default();
        if rv.is_empty() {
            return Err(ApiError::invalid(
                kind,
                name,
                "metadata.resourceVersion",
                "0x0",
                "must be specified for an update",
            ));
        }
        if Some(rv) != meta_str(existing, "resourceVersion") {
            return Err(ApiError::conflict(kind, name));
        }
        validate(kind, name, &obj)?;
        let existing = existing.clone();
        Ok(self.update(key, existing, obj))
    }

    /// PATCH with a JSON merge patch (RFC 7386): `null` removes a field. A
    /// `metadata.resourceVersion` in the patch is a precondition.
    pub fn merge_patch(
        &mut self,
        kind: Kind,
        ns: &str,
        name: &str,
        patch: Value,
    ) -> Result<Written, ApiError> {
        let key = (kind, ns.to_string(), name.to_string());
        let existing = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        if !patch.is_object() {
            return Err(ApiError::bad_request(
                "a merge patch must be a JSON object".into(),
            ));
        }
        if let Some(rv) = patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            if Some(rv) != meta_str(&existing, "resourceVersion") {
                return Err(ApiError::conflict(kind, name));
            }
        }
        for field in ["name", "namespace", "uid"] {
            if let Some(v) = patch.pointer(&format!("/metadata/{field}")) {
                if Some(v) != existing.pointer(&format!("/metadata/{field}")) {
                    return Err(ApiError::invalid(
                        kind,
                        name,
                        &format!("metadata.{field}"),
                        &v.to_string(),
                        "field is immutable",
                    ));
                }
            }
        }
        let mut merged = existing.clone();
        merge(&mut merged, &patch);
        let obj = decode(kind, ns, merged)?;
        validate(kind, name, &obj)?;
        Ok(self.update(key, existing, obj))
    }

    pub fn delete(&mut self, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
        let key = (kind, ns.to_string(), name.to_string());
        let gone = self
            .objects
            .remove(&key)
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        let mut details = json!({ "name": name, "kind": kind.resource() });
        if !kind.group().is_empty() {
            details["group"] = json!(kind.group());
        }
        if let Some(uid) = gone.pointer("/metadata/uid") {
            details["uid"] = uid.clone();
        }
        Ok(json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }))
    }

    /// Stores `obj` over `existing`, keeping the server-managed fields; a
    /// write that changes nothing keeps the old resourceVersion.
    fn update(&mut self, key: Key, existing: Value, mut obj: Value) -> Written {
        let meta = meta_mut(&mut obj);
        for field in ["uid", "creationTimestamp", "namespace", "resourceVersion"] {
            match existing.pointer(&format!("/metadata/{field}")) {
                Some(v) => meta.insert(field.into(), v.clone()),
                None => meta.remove(field),
            };
        }
        if obj == existing {
            return Written {
                object: existing,
                created: false,
            };
        }
        Written {
            object: self.store(key, obj),
            created: false,
        }
    }

    fn store(&mut self, key: Key, mut obj: Value) -> Value {
        self.next_rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.next_rv.to_string()));
        self.objects.insert(key, obj.clone());
        obj
    }

    fn uid(&mut self) -> String {
        self.next_uid += 1;
        format!("5ca1ab1e-0000-4000-8000-{:012x}", self.next_uid)
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in fields {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    obj.as_object_mut()
        .unwrap()
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .unwrap()
}

/// The decoding step: the body's type must match the URL, fields must have
/// their types; null fields are dropped and MicroTimes normalised, as a
/// round trip through the server's Go types does.
fn decode(kind: Kind, ns: &str, body: Value) -> Result<Value, ApiError> {
    let cannot = |why: String| {
        ApiError::bad_request(format!(
            "{} in version \"v1\" cannot be handled as a {}: {why}",
            kind.kind(),
            kind.kind()
        ))
    };
    let Value::Object(mut obj) = body else {
        return Err(cannot("the body is not a JSON object".into()));
    };
    for (field, want) in [("apiVersion", kind.api_version()), ("kind", kind.kind())] {
        match obj.get(field) {
            None | Some(Value::Null) => {
                obj.insert(field.into(), json!(want));
            }
            Some(Value::String(s)) if s == want => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({other}) does not match the expected {field} ({want})"
                )))
            }
        }
    }
    match obj.get_mut("metadata") {
        None | Some(Value::Null) => {
            obj.insert("metadata".into(), json!({}));
        }
        Some(Value::Object(meta)) => {
            meta.retain(|_, v| !v.is_null());
            for (k, v) in meta.iter() {
                let ok = match k.as_str() {
                    "labels" | "annotations" => v
                        .as_object()
                        .is_some_and(|m| m.values().all(|x| x.is_string())),
                    "name" | "namespace" | "resourceVersion" | "uid" | "creationTimestamp" => {
                        v.is_string()
                    }
                    _ => true,
                };
                if !ok {
                    return Err(cannot(format!("metadata.{k}: wrong type")));
                }
            }
            if let Some(given) = meta.get("namespace").and_then(Value::as_str) {
                if given != ns {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request".into(),
                    ));
                }
            }
        }
        Some(_) => return Err(cannot("metadata is not an object".into())),
    }
    if kind == Kind::Lease {
        let spec = match obj.remove("spec") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(s)) => s,
            Some(_) => return Err(cannot("spec is not an object".into())),
        };
        obj.insert(
            "spec".into(),
            Value::Object(lease_spec(spec).map_err(cannot)?),
        );
    }
    Ok(Value::Object(obj))
}

/// The LeaseSpec fields, typed as the Go struct has them; unknown fields
/// and the gated coordinated-election fields are dropped.
fn lease_spec(spec: Map<String, Value>) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    for (k, v) in spec {
        if v.is_null() {
            continue;
        }
        let v = match k.as_str() {
            "holderIdentity" => match v {
                Value::String(_) => v,
                _ => return Err(format!("spec.holderIdentity: expected a string, got {v}")),
            },
            "leaseDurationSeconds" | "leaseTransitions" => match v.as_i64() {
                Some(n) if i32::try_from(n).is_ok() => v,
                _ => return Err(format!("spec.{k}: expected an int32, got {v}")),
            },
            "acquireTime" | "renewTime" => {
                let s = v.as_str().ok_or(format!("spec.{k}: expected a string"))?;
                json!(micro_time::format(micro_time::parse(s)?))
            }
            _ => continue,
        };
        out.insert(k, v);
    }
    Ok(out)
}

/// The validation step (422s).
fn validate(kind: Kind, name: &str, obj: &Value) -> Result<(), ApiError> {
    if let Some(why) = subdomain_error(name) {
        return Err(ApiError::invalid(
            kind,
            name,
            "metadata.name",
            &format!("{name:?}"),
            why,
        ));
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let v = v.as_str().unwrap_or_default();
            if let Some(why) = label_key_error(k) {
                return Err(ApiError::invalid(
                    kind,
                    name,
                    "metadata.labels",
                    &format!("{k:?}"),
                    why,
                ));
            }
            if !v.is_empty() && !is_label_word(v) {
                return Err(ApiError::invalid(
                    kind,
                    name,
                    "metadata.labels",
                    &format!("{v:?}"),
                    "a valid label must be an empty string or consist of alphanumeric characters, \
                     '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
        }
    }
    if let Some(annotations) = obj
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        let mut total = 0;
        for (k, v) in annotations {
            if let Some(why) = label_key_error(k) {
                return Err(ApiError::invalid(
                    kind,
                    name,
                    "metadata.annotations",
                    &format!("{k:?}"),
                    why,
                ));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        // The API server's limit on all annotations of one object.
        if total > MAX_ANNOTATION_BYTES {
            return Err(ApiError::invalid(
                kind,
                name,
                "metadata.annotations",
                "",
                "Too long: must have at most 262144 bytes",
            ));
        }
    }
    if kind == Kind::Lease {
        for (field, min) in [("leaseDurationSeconds", 1), ("leaseTransitions", 0)] {
            if let Some(n) = obj
                .pointer(&format!("/spec/{field}"))
                .and_then(Value::as_i64)
            {
                if n < min {
                    let why = if min == 1 {
                        "must be greater than 0"
                    } else {
                        "must be greater than or equal to 0"
                    };
                    return Err(ApiError::invalid(
                        kind,
                        name,
                        &format!("spec.{field}"),
                        &n.to_string(),
                        why,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A lowercase RFC 1123 subdomain, or why not.
fn subdomain_error(name: &str) -> Option<&'static str> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    (!ok).then_some(
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
         '-' or '.', and must start and end with an alphanumeric character",
    )
}

fn label_key_error(key: &str) -> Option<&'static str> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| subdomain_error(p).is_some()) {
        return Some("prefix part must be a lowercase RFC 1123 subdomain");
    }
    (!is_label_word(name)).then_some(
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
         and end with an alphanumeric character",
    )
}

/// At most 63 of `[A-Za-z0-9_.-]`, alphanumeric at both ends.
fn is_label_word(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, holder: &str) -> Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": { "name": name },
            "spec": { "holderIdentity": holder, "leaseDurationSeconds": 5,
                      "renewTime": "2024-01-01T00:00:00.000001Z" },
        })
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH
    }

    #[test]
    fn create_then_compare_and_swap() {
        let mut s = Store::default();
        let w = s.create(Kind::Lease, "ns", lease("l", "a"), now()).unwrap();
        assert!(w.created);
        let rv1 = w.object["metadata"]["resourceVersion"].clone();
        assert_eq!(w.object["metadata"]["namespace"], "ns");
        assert_eq!(
            s.create(Kind::Lease, "ns", lease("l", "b"), now())
                .unwrap_err()
                .reason,
            "AlreadyExists"
        );
        // Same name elsewhere is another object.
        s.create(Kind::Lease, "other", lease("l", "b"), now())
            .unwrap();

        let mut next = w.object.clone();
        next["spec"]["holderIdentity"] = json!("b");
        let w2 = s
            .replace(Kind::Lease, "ns", "l", next.clone(), now())
            .unwrap();
        assert!(!w2.created);
        assert_ne!(w2.object["metadata"]["resourceVersion"], rv1);
        assert_eq!(w2.object["metadata"]["uid"], w.object["metadata"]["uid"]);
        // The same stale version again: 409 Conflict.
        let e = s
            .replace(Kind::Lease, "ns", "l", next.clone(), now())
            .unwrap_err();
        assert_eq!((e.code, e.reason), (409, "Conflict"));
        // No version at all: 422.
        next["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        let e = s.replace(Kind::Lease, "ns", "l", next, now()).unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert!(
            e.message.contains("must be specified for an update"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_write_that_changes_nothing_keeps_the_version() {
        let mut s = Store::default();
        let w = s.create(Kind::Lease, "ns", lease("l", "a"), now()).unwrap();
        let again = s
            .replace(Kind::Lease, "ns", "l", w.object.clone(), now())
            .unwrap();
        assert_eq!(again.object, w.object);
    }

    #[test]
    fn put_creates_a_missing_lease_but_not_a_pod() {
        let mut s = Store::default();
        let w = s
            .replace(Kind::Lease, "ns", "l", lease("l", "a"), now())
            .unwrap();
        assert!(w.created);
        let e = s
            .replace(
                Kind::Pod,
                "ns",
                "p",
                json!({"metadata": {"name": "p"}}),
                now(),
            )
            .unwrap_err();
        assert_eq!(e.code, 404);
        let e = s
            .replace(Kind::Lease, "ns", "x", lease("l", "a"), now())
            .unwrap_err();
        assert_eq!(e.code, 400);
    }

    #[test]
    fn decoding_drops_nulls_and_checks_types() {
        let mut s = Store::default();
        let mut body = lease("l", "a");
        body["spec"]["holderIdentity"] = Value::Null;
        body["spec"]["renewTime"] = json!("2024-01-01T02:00:00.000001+02:00");
        let w = s.create(Kind::Lease, "ns", body, now()).unwrap();
        assert!(w.object["spec"].get("holderIdentity").is_none());
        assert_eq!(w.object["spec"]["renewTime"], "2024-01-01T00:00:00.000001Z");

        for (field, v) in [
            ("renewTime", json!("2024-01-01T00:00:00Z")),
            ("leaseDurationSeconds", json!("5")),
            ("holderIdentity", json!(5)),
        ] {
            let mut body = lease("m", "a");
            body["spec"][field] = v;
            let e = s.create(Kind::Lease, "ns", body, now()).unwrap_err();
            assert_eq!(e.code, 400, "{field}: {}", e.message);
        }
        let mut body = lease("m", "a");
        body["spec"]["leaseDurationSeconds"] = json!(0);
        assert_eq!(
            s.create(Kind::Lease, "ns", body, now()).unwrap_err().code,
            422
        );
        let mut body = lease("m", "a");
        body["metadata"]["namespace"] = json!("elsewhere");
        assert_eq!(
            s.create(Kind::Lease, "ns", body, now()).unwrap_err().code,
            400
        );
        assert_eq!(
            s.create(Kind::Lease, "ns", lease("Bad_Name", "a"), now())
                .unwrap_err()
                .code,
            422
        );
    }

    #[test]
    fn merge_patch_sets_and_removes_labels() {
        let mut s = Store::default();
        s.create(
            Kind::Pod,
            "ns",
            json!({"metadata": {"name": "p", "labels": {"app": "m"}}}),
            now(),
        )
        .unwrap();
        let set = json!({"metadata": {"labels": {"mooncake.io/store-role": "leader"}}});
        let w = s.merge_patch(Kind::Pod, "ns", "p", set.clone()).unwrap();
        assert_eq!(
            w.object["metadata"]["labels"]["mooncake.io/store-role"],
            "leader"
        );
        assert_eq!(w.object["metadata"]["labels"]["app"], "m");
        let rv = w.object["metadata"]["resourceVersion"].clone();
        // Setting it again changes nothing, so the version stays.
        let w = s.merge_patch(Kind::Pod, "ns", "p", set).unwrap();
        assert_eq!(w.object["metadata"]["resourceVersion"], rv);
        let unset = json!({"metadata": {"labels": {"mooncake.io/store-role": null}}});
        let w = s.merge_patch(Kind::Pod, "ns", "p", unset).unwrap();
        assert!(w.object["metadata"]["labels"]
            .get("mooncake.io/store-role")
            .is_none());
        assert_ne!(w.object["metadata"]["resourceVersion"], rv);

        let stale = json!({"metadata": {"resourceVersion": rv, "labels": {"a": "b"}}});
        assert_eq!(
            s.merge_patch(Kind::Pod, "ns", "p", stale).unwrap_err().code,
            409
        );
        let bad = json!({"metadata": {"labels": {"a": "not ok!"}}});
        assert_eq!(
            s.merge_patch(Kind::Pod, "ns", "p", bad).unwrap_err().code,
            422
        );
        let rename = json!({"metadata": {"name": "q"}});
        assert_eq!(
            s.merge_patch(Kind::Pod, "ns", "p", rename)
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            s.merge_patch(Kind::Pod, "ns", "nope", json!({}))
                .unwrap_err()
                .code,
            404
        );
    }

    #[test]
    fn annotations_are_kept_and_checked_as_the_server_does() {
        let mut s = Store::default();
        let mut obj = s
            .create(Kind::Lease, "ns", lease("l", "a"), now())
            .unwrap()
            .object;
        obj["metadata"]["annotations"] = json!({"mooncake.io/in-sync": "term=1\n"});
        let w = s
            .replace(Kind::Lease, "ns", "l", obj.clone(), now())
            .unwrap();
        assert_eq!(
            w.object["metadata"]["annotations"]["mooncake.io/in-sync"],
            "term=1\n"
        );
        let mut bad = w.object.clone();
        bad["metadata"]["annotations"] = json!({"not a key!": "x"});
        let e = s.replace(Kind::Lease, "ns", "l", bad, now()).unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        let mut big = w.object.clone();
        big["metadata"]["annotations"] = json!({"a": "x".repeat(256 << 10)});
        let e = s.replace(Kind::Lease, "ns", "l", big, now()).unwrap_err();
        assert!(e.message.contains("at most 262144 bytes"), "{}", e.message);
    }

    #[test]
    fn rfc7386_examples() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
        let mut t = json!({"a": [1]});
        merge(&mut t, &json!({"a": [2, 3], "b": {"c": null}}));
        assert_eq!(t, json!({"a": [2, 3], "b": {}}));
    }
}
