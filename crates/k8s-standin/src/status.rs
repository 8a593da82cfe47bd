//! `Status` bodies, as the API server sends them with every error.

use serde_json::{json, Value};

use crate::kind::Kind;

/// An API error: the HTTP status and the `Status` object that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Value,
}

impl ApiError {
    pub fn body(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !self.details.is_null() {
            status["details"] = self.details.clone();
        }
        status
    }

    fn new(code: u16, reason: &'static str, message: String, details: Value) -> ApiError {
        ApiError {
            code,
            reason,
            message,
            details,
        }
    }

    fn object_details(kind: Kind, name: &str) -> Value {
        let mut d = json!({ "name": name, "kind": kind.resource() });
        if !kind.group().is_empty() {
            d["group"] = json!(kind.group());
        }
        d
    }

    pub fn not_found(kind: Kind, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.qualified()),
            Self::object_details(kind, name),
        )
    }

    pub fn already_exists(kind: Kind, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", kind.qualified()),
            Self::object_details(kind, name),
        )
    }

    /// The optimistic-lock failure: the caller's resourceVersion is stale.
    pub fn conflict(kind: Kind, name: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                kind.qualified()
            ),
            Self::object_details(kind, name),
        )
    }

    /// A field validation failure (422), e.g. a PUT without resourceVersion.
    pub fn invalid(kind: Kind, name: &str, field: &str, value: &str, detail: &str) -> ApiError {
        let cause = format!("Invalid value: {value}: {detail}");
        let mut details = Self::object_details(kind, name);
        details["causes"] = json!([{
            "reason": "FieldValueInvalid",
            "message": cause,
            "field": field,
        }]);
        ApiError::new(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: {field}: {cause}",
                kind.qualified()
            ),
            details,
        )
    }

    pub fn bad_request(message: String) -> ApiError {
        ApiError::new(400, "BadRequest", message, Value::Null)
    }

    pub fn internal(message: String) -> ApiError {
        ApiError::new(500, "InternalError", message, Value::Null)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized".into(), Value::Null)
    }

    /// RBAC's denial, worded as the API server words it.
    pub fn forbidden(kind: Kind, name: Option<&str>, user: &str, verb: &str, ns: &str) -> ApiError {
        let what = match name {
            Some(n) => format!("{} \"{n}\"", kind.qualified()),
            None => kind.qualified(),
        };
        ApiError::new(
            403,
            "Forbidden",
            format!(
                "{what} is forbidden: User \"{user}\" cannot {verb} resource \"{}\" in API group \"{}\" \
                 in the namespace \"{ns}\"",
                kind.resource(),
                kind.group()
            ),
            Self::object_details(kind, name.unwrap_or("")),
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({content_type:?}) - \
                 accepted media types include: application/json"
            ),
            Value::Null,
        )
    }

    pub fn not_acceptable() -> ApiError {
        ApiError::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json".into(),
            Value::Null,
        )
    }

    pub fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
            json!({}),
        )
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
            json!({}),
        )
    }
}
