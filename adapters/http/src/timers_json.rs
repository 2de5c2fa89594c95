//! Timer routes: schedule / reschedule / cancel, standalone cancel, peek and list.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use queen_domain::model::MAX_DURATION_MS;
use queen_domain::names::{PartitionName, QueueName};
use queen_domain::reads;
use queen_domain::timers::{TimerOp, TimerRec, TimerResult};
use serde_json::{Map, Value, json};

use crate::api::ApiError;
use crate::error::json_response;
use crate::fields::{object, opt_str, uuid_v7};
use crate::pop_query::parse_query;
use queen_ports::ClientApi;

/// Fields the server owns: refused in an operation.
const SERVER_OWNED: &[&str] = &[
    "producerSub",
    "producer_sub",
    "messageId",
    "message_id",
    "tenant",
    "tenantId",
    "tenant_id",
    "deliverAt",
    "deliver_at",
    "delaySeconds",
    "delay_seconds",
    "attempts",
    "claimToken",
    "claim_token",
    "claimedUntil",
];

fn key_ok(k: &str) -> bool {
    !k.is_empty() && k.len() <= 1024 && !k.contains('\0')
}

fn parse_ops(body: &[u8]) -> Result<Vec<TimerOp>, ApiError> {
    let m = object(body, false)?;
    match m.get("operations") {
        Some(Value::Array(a)) => parse_list(a, "operations"),
        _ => Err(ApiError::bad_request(
            "operations",
            "must be a list of 1 to 1000 operations",
        )),
    }
}

/// A list of timer operations (also a transaction's `timers` rider).
pub(crate) fn parse_list(a: &[Value], name: &str) -> Result<Vec<TimerOp>, ApiError> {
    if a.is_empty() || a.len() > 1000 {
        return Err(ApiError::bad_request(
            name,
            "must have 1 to 1000 operations",
        ));
    }
    a.iter()
        .enumerate()
        .map(|(i, v)| parse_op(v, i, name))
        .collect()
}

fn parse_op(v: &Value, i: usize, name: &str) -> Result<TimerOp, ApiError> {
    let f = |k: &str| format!("{name}[{i}].{k}");
    let Value::Object(o) = v else {
        return Err(ApiError::bad_request(
            &format!("{name}[{i}]"),
            "must be an object",
        ));
    };
    if let Some(k) = o
        .keys()
        .find(|k| k.starts_with('_') || SERVER_OWNED.contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(&f(k), "is owned by the server"));
    }
    let queue = opt_str(o, "queue", &f("queue"))?
        .ok_or_else(|| ApiError::bad_request(&f("queue"), "is required"))?;
    let queue =
        QueueName::new(queue).map_err(|e| ApiError::bad_request(&f("queue"), &e.to_string()))?;
    let key = opt_str(o, "timerKey", &f("timerKey"))?
        .filter(|k| key_ok(k))
        .ok_or_else(|| ApiError::bad_request(&f("timerKey"), "must be 1 to 1024 bytes"))?;
    crate::fields::no_control(&f("timerKey"), &key)?;
    match opt_str(o, "op", &f("op"))?.as_deref() {
        Some(op @ ("schedule" | "reschedule")) => schedule(o, &f, queue, key, op == "reschedule"),
        Some("cancel") => Ok(TimerOp::Cancel { queue, key }),
        Some(other) => Err(ApiError::bad_request(
            &f("op"),
            &format!("'{other}' is not a timer operation"),
        )),
        None => Err(ApiError::bad_request(&f("op"), "is required")),
    }
}

fn schedule(
    o: &Map<String, Value>,
    f: &dyn Fn(&str) -> String,
    queue: QueueName,
    key: String,
    reschedule: bool,
) -> Result<TimerOp, ApiError> {
    if o.get("payloadZstd").and_then(Value::as_bool) == Some(true) {
        return Err(ApiError::bad_request(
            &f("payloadZstd"),
            "is not supported by this broker yet",
        ));
    }
    let b64 = opt_str(o, "payload", &f("payload"))?
        .ok_or_else(|| ApiError::bad_request(&f("payload"), "is required (base64)"))?;
    let raw = STANDARD
        .decode(b64.as_bytes())
        .map_err(|_| ApiError::bad_request(&f("payload"), "must be base64"))?;
    // The message keeps JSON as it is; other bytes are delivered as a JSON string of their base64.
    // Checked without parsing into a value, so JSON text of any numbers (`1e400`, long
    // integers) is kept as it is.
    let payload = if serde_json::from_slice::<serde::de::IgnoredAny>(&raw).is_ok() {
        raw
    } else {
        Value::String(b64).to_string().into_bytes()
    };
    let delay_ms = o.get("delayMs").and_then(Value::as_u64).ok_or_else(|| {
        ApiError::bad_request(&f("delayMs"), "must be a non-negative integer (ms)")
    })?;
    if delay_ms > MAX_DURATION_MS {
        return Err(ApiError::bad_request(
            &f("delayMs"),
            &format!("must be 0 to {MAX_DURATION_MS} ms (ten years)"),
        ));
    }
    let txn = opt_str(o, "txn", &f("txn"))?
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| uuid_v7().to_string());
    let partition = opt_str(o, "partition", &f("partition"))?
        .map(|p| {
            PartitionName::new(p)
                .map_err(|e| ApiError::bad_request(&f("partition"), &e.to_string()))
        })
        .transpose()?;
    Ok(TimerOp::Schedule {
        queue,
        key,
        payload,
        delay_ms,
        txn,
        partition,
        message_id: *uuid_v7().as_bytes(),
        reschedule,
    })
}

pub(crate) fn result(r: &TimerResult) -> Value {
    json!({
        "ok": r.ok, "status": r.status, "queue": r.queue, "timerKey": r.key, "txn": r.txn,
        "messageId": r.message_id.map(|m| uuid::Uuid::from_bytes(m).to_string()),
        "deliverAt": r.deliver_at.map(|d| d.iso_millis()),
    })
}

fn row(queue: &str, key: &str, t: &TimerRec) -> Value {
    json!({
        "queue": queue, "timerKey": key, "txn": t.txn, "messageId": uuid::Uuid::from_bytes(t.message_id).to_string(),
        "deliverAt": t.deliver_at.iso_millis(), "partition": t.partition, "payload": STANDARD.encode(&t.payload),
        "encrypted": false, "attempts": 0, "scheduledAt": t.scheduled.iso_millis(),
    })
}

/// `/api/v1/timers...`.
pub(crate) async fn route<A: ClientApi>(
    api: &Arc<A>,
    scope: &crate::tenancy::Scope,
    method: &str,
    rest: &[&str],
    query: &str,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let get = |k: &str| {
        q.iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    match (method, rest) {
        ("POST", []) => {
            let mut ops = parse_ops(body)?;
            scope.timers(&mut ops);
            let mut out = api.timers(ops, scope.producer.clone()).await?;
            scope.timer_answers(&mut out);
            Ok(json_response(
                200,
                &json!({ "results": out.iter().map(result).collect::<Vec<_>>() }),
            ))
        }
        ("DELETE", [queue, key @ ..]) if !key.is_empty() => {
            let qn = scope.queue(queue, "queue")?;
            let key = key.join("/");
            let mut out = api
                .timers(vec![TimerOp::Cancel { queue: qn, key }], None)
                .await?;
            scope.timer_answers(&mut out);
            let mut v = out.first().map(result).unwrap_or(Value::Null);
            if v["status"] == "absent"
                && let Some(t) = get("txn")
            {
                v["txn"] = json!(t);
            }
            Ok(json_response(200, &v))
        }
        ("GET", [queue, key @ ..]) if !key.is_empty() => {
            api.read_barrier().await?;
            let state = api.state();
            let key = key.join("/");
            let stored = scope.queue(queue, "queue")?;
            match reads::timer(&*state, stored.as_str(), &key)
                .map_err(|e| ApiError::new(500, "internal", e.to_string()))?
            {
                Some(t) => {
                    let mut v = row(queue, &key, &t);
                    v["found"] = json!(true);
                    Ok(json_response(200, &v))
                }
                None => Ok(json_response(200, &json!({"found": false}))),
            }
        }
        ("GET", [queue]) => {
            let limit = get("limit")
                .and_then(|l| l.parse::<usize>().ok())
                .unwrap_or(100)
                .clamp(1, 1000);
            api.read_barrier().await?;
            let state = api.state();
            let after = get("after");
            let stored = scope.queue(queue, "queue")?;
            let (rows, more) = reads::timers(&*state, stored.as_str(), after.as_deref(), limit)
                .map_err(|e| ApiError::new(500, "internal", e.to_string()))?;
            let next = if more {
                rows.last().map(|(k, _)| k.clone())
            } else {
                None
            };
            Ok(json_response(
                200,
                &json!({"rows": rows.iter().map(|(k, t)| row(queue, k, t)).collect::<Vec<_>>(), "truncated": more, "nextAfter": next}),
            ))
        }
        _ => Err(ApiError::new(404, "no_such_route", "no such timer route")),
    }
}
