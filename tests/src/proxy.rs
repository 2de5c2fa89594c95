//! Requests through the embedded proxy as its clients and its control plane make them: an API
//! key of the documented form, a bearer key with an optional `Host`, and the control plane's
//! token header. Shared by the proxy's black-box tests so each states only its own cases.

use serde_json::Value;

use crate::{Answer, Node};

/// An API key of the documented form (`qk_` and 48 more characters), different per `seed`.
pub fn key(seed: char) -> String {
    format!("qk_test_{}", seed.to_string().repeat(43))
}

/// A request through `via` with a bearer key (or none) and a `Host` (or none); panics when the
/// request cannot be made at all (a refused connection, a timeout).
pub fn call(
    via: &Node,
    key: Option<&str>,
    host: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Answer {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers: Vec<(&str, &str)> = Vec::new();
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    if let Some(h) = host {
        headers.push(("host", h));
    }
    let text = body.map(Value::to_string);
    via.try_request_with(method, path, text.as_deref(), &headers)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// A control-plane request through `via` carrying `token` in `x-queen-cp-token`.
pub fn control(via: &Node, token: &str, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let text = body.map(Value::to_string);
    via.try_request_with(
        method,
        path,
        text.as_deref(),
        &[("x-queen-cp-token", token)],
    )
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}
