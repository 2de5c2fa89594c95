//! The error envelope.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;

use crate::api::ApiError;

/// `{"error": "...", "code": "..."}` with the error's status and `retry-after` when set.
pub(crate) fn error_response(e: &ApiError) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"error": e.message, "code": e.code});
    let mut b = Response::builder()
        .status(e.status)
        .header("content-type", "application/json");
    if let Some(s) = e.retry_after {
        b = b.header("retry-after", s.to_string());
    }
    b.body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::from_static(b"{}"))))
}

/// A JSON answer.
pub(crate) fn json_response(status: u16, v: &serde_json::Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// A text answer.
pub(crate) fn text_response(status: u16, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// 204 with no body.
pub(crate) fn no_content() -> Response<Full<Bytes>> {
    Response::builder()
        .status(204)
        .body(Full::new(Bytes::new()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}
