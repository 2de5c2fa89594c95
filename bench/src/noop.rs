//! `queen-bench noop-server --port P` (hidden; started by `queen-bench cluster --floor`): an
//! HTTP server that answers `POST /api/v1/push` the way queen does — it reads the body, parses
//! every item (queue, partition, transactionId, payload) and answers one `queued` entry per item
//! in item order — but stores, replicates and fsyncs nothing. It is served by the same hyper
//! HTTP/1.1 connection code as queen's client port and driven by the same client, so its
//! throughput is the ceiling any broker behind this HTTP/JSON contract can reach on this
//! machine: the cost of the requests and answers alone.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

#[derive(Deserialize)]
struct PushBody<'a> {
    #[serde(borrow)]
    items: Vec<Item<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Item<'a> {
    queue: &'a str,
    #[serde(default)]
    partition: Option<&'a str>,
    transaction_id: &'a str,
    #[serde(borrow)]
    payload: &'a RawValue,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    index: usize,
    message_id: String,
    transaction_id: &'a str,
    queue_name: &'a str,
    status: &'static str,
    offset: u64,
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// Answers a push body with one `queued` entry per item; `Err` names what did not parse.
fn answer(body: &[u8]) -> Result<Vec<u8>, String> {
    let push: PushBody = serde_json::from_slice(body).map_err(|e| format!("items: {e}"))?;
    let answers: Vec<Answer> = push
        .items
        .iter()
        .enumerate()
        .map(|(index, it)| {
            let offset = NEXT.fetch_add(1, Ordering::Relaxed);
            // Touch the fields queen reads, so the parse is not optimised away.
            let _ = (
                it.partition.unwrap_or("Default").len(),
                it.payload.get().len(),
            );
            Answer {
                index,
                message_id: format!("00000000-0000-7000-8000-{offset:012x}"),
                transaction_id: it.transaction_id,
                queue_name: it.queue,
                status: "queued",
                offset,
            }
        })
        .collect();
    serde_json::to_vec(&answers).map_err(|e| e.to_string())
}

async fn handle(
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let path_ok = req.method() == hyper::Method::POST && req.uri().path() == "/api/v1/push";
    let body = req.into_body().collect().await?.to_bytes();
    let (status, out) = match (path_ok, answer(&body)) {
        (false, _) => (
            StatusCode::NOT_FOUND,
            br#"{"error":"only POST /api/v1/push"}"#.to_vec(),
        ),
        (true, Ok(out)) => (StatusCode::OK, out),
        (true, Err(e)) => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({ "error": e }).to_string().into_bytes(),
        ),
    };
    let resp = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(out)));
    Ok(resp.unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}

/// Serves until the process is stopped.
pub async fn serve(port: u16) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    loop {
        let (stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("accept: {e}"))?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(handle))
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::answer;

    #[test]
    fn answers_one_queued_entry_per_item_in_order() {
        let body = br#"{"items":[{"queue":"q","partition":"p","transactionId":"a","payload":{"d":"x"}},{"queue":"q","transactionId":"b","payload":null}]}"#;
        let v: serde_json::Value = serde_json::from_slice(&answer(body).unwrap()).unwrap();
        let items = v.as_array().unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(
            (
                items[0]["transactionId"].as_str(),
                items[0]["status"].as_str(),
                items[0]["index"].as_u64()
            ),
            (Some("a"), Some("queued"), Some(0))
        );
        assert_eq!(
            (
                items[1]["transactionId"].as_str(),
                items[1]["index"].as_u64()
            ),
            (Some("b"), Some(1))
        );
    }

    #[test]
    fn a_body_that_is_not_a_push_is_refused() {
        assert!(answer(b"{}").unwrap_err().starts_with("items"));
        assert!(answer(br#"{"items":[{"queue":"q"}]}"#).is_err());
    }
}
