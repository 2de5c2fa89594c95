//! Reading the fields of a JSON body: each refusal names the field.

use serde_json::{Map, Value};

use crate::api::ApiError;

/// Parse a body as a JSON object; an empty body is an empty object when `empty_ok`.
pub(crate) fn object(body: &[u8], empty_ok: bool) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        if empty_ok {
            return Ok(Map::new());
        }
        return Err(ApiError::bad_request(
            "body",
            "must be a JSON object, got nothing",
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request("body", "must be a JSON object")),
        Err(e) => Err(ApiError::new(
            400,
            "bad_json",
            format!("body is not valid JSON: {e}"),
        )),
    }
}

/// A name a client gives (a KV key, a timer key, a stream's name): control characters are
/// refused, so no name can break a log line, a header or a terminal that shows it.
pub(crate) fn no_control(field: &str, text: &str) -> Result<(), ApiError> {
    if text.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// A field as an optional string (`null` = absent).
pub(crate) fn opt_str(
    m: &Map<String, Value>,
    key: &str,
    field: &str,
) -> Result<Option<String>, ApiError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(field, "must be a string")),
    }
}

/// A required string field.
pub(crate) fn req_str(m: &Map<String, Value>, key: &str, field: &str) -> Result<String, ApiError> {
    opt_str(m, key, field)?.ok_or_else(|| ApiError::bad_request(field, "is required"))
}

/// A name through its validating constructor.
pub(crate) fn name<T>(
    value: String,
    field: &str,
    make: fn(String) -> Result<T, queen_domain::names::NameError>,
) -> Result<T, ApiError> {
    make(value).map_err(|e| ApiError::bad_request(field, &e.to_string()))
}

/// A list field.
pub(crate) fn list<'a>(
    m: &'a Map<String, Value>,
    key: &str,
    max: usize,
) -> Result<&'a Vec<Value>, ApiError> {
    match m.get(key) {
        Some(Value::Array(a)) if a.len() <= max => Ok(a),
        Some(Value::Array(_)) => Err(ApiError::bad_request(
            key,
            &format!("must have at most {max} entries"),
        )),
        None | Some(Value::Null) => Err(ApiError::bad_request(key, "is required")),
        Some(_) => Err(ApiError::bad_request(key, "must be a list")),
    }
}

/// Mint a UUIDv7.
pub(crate) fn uuid_v7() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}
