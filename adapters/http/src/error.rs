//! The error envelope.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};

use crate::api::ApiError;

/// `{"error": "...", "code": "..."}` with the error's status and `retry-after` when set.
pub(crate) fn error_response(e: &ApiError) -> Response<Full<Bytes>> {
    let mut body = serde_json::json!({"error": e.message, "code": e.code});
    if let Some(r) = e.reason {
        body["reason"] = serde_json::Value::from(r);
    }
    let mut b = Response::builder()
        .status(e.status)
        .header("content-type", "application/json");
    if let Some(s) = e.retry_after {
        b = b.header("retry-after", s.to_string());
    }
    b.body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::from_static(b"{}"))))
}

/// A JSON answer from a value.
pub(crate) fn json_response(status: u16, v: &serde_json::Value) -> Response<Full<Bytes>> {
    json_answer(status, v)
}

/// A JSON answer from anything serializable. Answers that carry stored text (payloads, KV
/// values) are built as structs holding it raw, so it is written verbatim; never route them
/// through `serde_json::to_value`, which would parse the text again.
pub(crate) fn json_answer<T: serde::Serialize + ?Sized>(
    status: u16,
    v: &T,
) -> Response<Full<Bytes>> {
    json_answer_sized(status, v, 128)
}

/// A JSON answer written into a buffer of about `capacity` bytes (a large answer, such as the
/// acks of a batch, is then not grown and copied step by step).
pub(crate) fn json_answer_sized<T: serde::Serialize + ?Sized>(
    status: u16,
    v: &T,
    capacity: usize,
) -> Response<Full<Bytes>> {
    let mut body = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut body, v).map(|()| body) {
        Ok(body) => text_response(status, "application/json", body),
        Err(e) => {
            tracing::error!(target: "queen-http", error = %e, "an answer could not be encoded");
            error_response(&ApiError::new(
                500,
                "internal",
                "the answer could not be encoded; see the node's log",
            ))
        }
    }
}

/// An answer of `body` as it is (text, or JSON already written).
pub(crate) fn text_response(
    status: u16,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// 204 with no body.
pub(crate) fn no_content() -> Response<Full<Bytes>> {
    Response::builder()
        .status(204)
        .body(Full::new(Bytes::new()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// Whether `req` carries a body (a length above zero, or chunks).
pub(crate) fn has_body<B>(req: &Request<B>) -> bool {
    declares_body(req.headers())
}

/// Whether request headers declare a body (a length above zero, or chunks).
pub(crate) fn declares_body(h: &hyper::HeaderMap) -> bool {
    h.contains_key(hyper::header::TRANSFER_ENCODING)
        || h.get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// `r`, with `connection: close` when `req` carries a body that was not read.
pub(crate) fn closing_if_body<B>(
    req: &Request<B>,
    r: Response<Full<Bytes>>,
) -> Response<Full<Bytes>> {
    if has_body(req) { closing(r) } else { r }
}

/// `r` with `connection: close`: hyper closes a connection whose request body was left unread,
/// and this tells the client before it reuses it.
pub(crate) fn closing(mut r: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    r.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    r
}
