//! The trace routes, `/api/v1/traces*`: a consumer records an event against a message it
//! handles, and anyone with read access reads them back per message, per name, and the names in
//! use. The rows and their layout are `queen_domain::traces`; this module reads bodies and
//! queries and writes answers.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use queen_domain::time::Stamp;
use queen_domain::traces::{self, Trace};
use queen_ports::ClientApi;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::api::{ApiError, store_error};
use crate::error::json_answer;
use crate::pop_query::parse_query;
use crate::reads::{q_get, q_num};
use crate::tenancy::Scope;

/// A page of stored rows, answered verbatim (a trace's `data` keeps its numbers as written).
#[derive(Serialize)]
struct Page<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    traces: Option<&'a [Box<RawValue>]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_names: Option<&'a [Box<RawValue>]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pagination: Option<Value>,
}

impl<'a> Page<'a> {
    fn traces(rows: &'a [Box<RawValue>]) -> Self {
        Self {
            traces: Some(rows),
            trace_names: None,
            total: None,
            pagination: None,
        }
    }

    fn paged(mut self, total: usize, limit: u64, offset: u64) -> Self {
        self.total = Some(total);
        self.pagination = Some(json!({"limit": limit, "offset": offset, "total": total}));
        self
    }
}

/// Most traces one read answers.
const MAX_PAGE: u64 = 1000;

/// Route one request of the family; `rest` is the path after `/api/v1/traces`.
pub(crate) async fn route<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    method: &str,
    rest: &[&str],
    query: &str,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    match (method, rest) {
        ("POST", []) => record(api, scope, body).await,
        ("GET", ["names"]) => names(api, scope, query).await,
        ("GET", ["by-name", name @ ..]) if !name.is_empty() => {
            by_name(api, scope, &name.join("/"), query).await
        }
        ("GET", [partition_id, transaction @ ..]) if !transaction.is_empty() => {
            of_message(api, scope, partition_id, &transaction.join("/")).await
        }
        (_, [] | ["names"] | ["by-name", ..] | [_, _, ..]) => Err(ApiError::new(
            405,
            "method_not_allowed",
            format!("{method} is not served on this trace route"),
        )),
        _ => Err(ApiError::new(
            404,
            "no_such_route",
            format!("no route for {method} /api/v1/traces/{}", rest.join("/")),
        )),
    }
}

/// The body of `POST /api/v1/traces`.
#[derive(Deserialize)]
struct TraceIn {
    #[serde(rename = "transactionId")]
    transaction_id: Option<Value>,
    #[serde(rename = "partitionId")]
    partition_id: Option<Value>,
    #[serde(rename = "consumerGroup")]
    consumer_group: Option<Value>,
    #[serde(rename = "traceNames")]
    trace_names: Option<Value>,
    #[serde(rename = "eventType")]
    event_type: Option<Value>,
    data: Option<Box<RawValue>>,
}

/// A required text field; a partition id may come as a number.
fn required_text(v: Option<Value>, field: &str) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s),
        Some(Value::Number(n)) if field == "partitionId" => Ok(n.to_string()),
        None | Some(Value::Null) => Err(ApiError::bad_request(field, "is required")),
        Some(_) => Err(ApiError::bad_request(field, "must be a string")),
    }
}

/// An optional text field with its default.
fn text_or(v: Option<Value>, field: &str, default: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(default.to_owned()),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ApiError::bad_request(field, "must be a string")),
    }
}

/// `traceNames`: null, one name, or a list of names.
fn names_of(v: Option<Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::bad_request("traceNames", "must be null, a string or a list of strings");
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s]),
        Some(Value::Array(a)) => {
            let mut out: Vec<String> = Vec::with_capacity(a.len());
            for n in a {
                let Value::String(s) = n else {
                    return Err(bad());
                };
                if !out.contains(&s) {
                    out.push(s);
                }
            }
            Ok(out)
        }
        Some(_) => Err(bad()),
    }
}

/// `POST /api/v1/traces`: 201 `{"success": true, "traceId"}`.
async fn record<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let t: TraceIn = serde_json::from_slice(body)
        .map_err(|_| ApiError::bad_request("body", "must be a JSON object"))?;
    let now = api.now();
    let trace = Trace {
        id: uuid::Uuid::now_v7().to_string(),
        transaction_id: required_text(t.transaction_id, "transactionId")?,
        partition_id: required_text(t.partition_id, "partitionId")?,
        consumer_group: text_or(t.consumer_group, "consumerGroup", "__QUEUE_MODE__")?,
        event_type: text_or(t.event_type, "eventType", "info")?,
        names: names_of(t.trace_names)?,
        data: t
            .data
            .ok_or_else(|| ApiError::bad_request("data", "is required"))?,
        created_at: now.iso_millis(),
    };
    trace
        .check()
        .map_err(|e| ApiError::bad_request(e.field, &e.reason))?;
    let ops = traces::record(&scope.tenant, &trace, now).map_err(|e| {
        ApiError::new(
            500,
            "internal",
            format!("the trace could not be encoded: {e}"),
        )
    })?;
    api.kv(ops).await?;
    Ok(json_answer(
        201,
        &json!({"success": true, "traceId": trace.id}),
    ))
}

fn page_of(q: &[(String, String)], default_limit: u64) -> Result<(u64, u64), ApiError> {
    Ok((
        q_num(q, "limit", default_limit)?.clamp(1, MAX_PAGE),
        q_num(q, "offset", 0)?,
    ))
}

/// A time bound: epoch milliseconds or ISO 8601.
pub(crate) fn time_of(q: &[(String, String)], k: &str) -> Result<Option<Stamp>, ApiError> {
    let Some(v) = q_get(q, k) else {
        return Ok(None);
    };
    if let Ok(ms) = v.parse::<u64>() {
        return Ok(Some(Stamp(ms.saturating_mul(1000))));
    }
    Stamp::parse_iso(v)
        .map(Some)
        .map_err(|_| ApiError::bad_request(k, "must be epoch milliseconds or an ISO 8601 time"))
}

/// `GET /api/v1/traces/{partitionId}/{transactionId}`: `{"traces": [...]}`, oldest first.
async fn of_message<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    partition_id: &str,
    transaction_id: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    api.read_barrier().await?;
    let rows = traces::of_message(
        &*api.state(),
        &scope.tenant,
        partition_id,
        transaction_id,
        api.now(),
        MAX_PAGE as usize,
    )
    .map_err(|e| store_error(&e))?;
    Ok(json_answer(200, &Page::traces(&rows)))
}

/// `GET /api/v1/traces/by-name/{name}?limit=&offset=&from=&to=`: newest first.
async fn by_name<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    name: &str,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let (limit, offset) = page_of(&q, 100)?;
    let (from, to) = (time_of(&q, "from")?, time_of(&q, "to")?);
    api.read_barrier().await?;
    let (rows, total) = traces::by_name(
        &*api.state(),
        &scope.tenant,
        name,
        from,
        to,
        usize::try_from(offset).unwrap_or(usize::MAX),
        limit as usize,
        api.now(),
    )
    .map_err(|e| store_error(&e))?;
    Ok(json_answer(
        200,
        &Page::traces(&rows).paged(total, limit, offset),
    ))
}

/// `GET /api/v1/traces/names?limit=&offset=&search=`: in name order.
async fn names<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let (limit, offset) = page_of(&q, 50)?;
    api.read_barrier().await?;
    let (rows, total) = traces::names(
        &*api.state(),
        &scope.tenant,
        q_get(&q, "search"),
        usize::try_from(offset).unwrap_or(usize::MAX),
        limit as usize,
        api.now(),
    )
    .map_err(|e| store_error(&e))?;
    let page = Page {
        traces: None,
        trace_names: Some(&rows),
        total: None,
        pagination: None,
    };
    Ok(json_answer(200, &page.paged(total, limit, offset)))
}
