//! Routes that read the answering node's applied state (after a read barrier) and the admin
//! routes of consumer groups: offset reads, partitions changed, dead letters, group listings,
//! status and resources.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use queen_domain::command::{Command, Outcome};
use queen_domain::model::{PartitionRec, QueueRec, SubscriptionStart};
use queen_domain::names::GroupName;
use queen_domain::reads;
use queen_domain::time::Stamp;
use queen_domain::{StateRead, StoreError};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::api::ApiError;
use crate::error::{json_answer, json_response};
use crate::fields::{object, opt_str};
use crate::pop_query::parse_query;
use crate::raw::StoredJson;
use crate::tenancy::Scope;
use queen_ports::ClientApi;

mod groups;
pub(crate) use groups::groups;

mod resources;
pub(crate) use resources::resources;

pub(crate) mod messages;

mod heavy;

/// Most entries one fetch may carry.
const MAX_FETCH_ENTRIES: usize = 1024;
/// The default and largest byte budget of a fetch.
const MAX_FETCH_BYTES: u64 = 8 << 20;

use crate::api::store_error as store_err;

/// A query value, when present and not empty.
pub(crate) fn q_get<'a>(q: &'a [(String, String)], k: &str) -> Option<&'a str> {
    q.iter()
        .find(|(a, _)| a == k)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// A non-negative integer query value, or `default` when absent.
pub(crate) fn q_num(q: &[(String, String)], k: &str, default: u64) -> Result<u64, ApiError> {
    q_get(q, k).map_or(Ok(default), |v| {
        v.parse()
            .map_err(|_| ApiError::bad_request(k, "must be a non-negative integer"))
    })
}

/// One fetched record; `payload` is the producer's text, verbatim.
#[derive(Serialize)]
struct FetchRecord<'a> {
    offset: u64,
    #[serde(rename = "transactionId")]
    transaction_id: String,
    payload: StoredJson<'a>,
    ts: String,
}

/// One fetch entry's answer.
#[derive(Serialize)]
struct FetchEntry<'a> {
    #[serde(rename = "highWatermark")]
    high_watermark: u64,
    #[serde(rename = "logStartOffset")]
    log_start_offset: u64,
    records: Vec<FetchRecord<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
}

/// One dead letter; `data` is the producer's text, verbatim.
#[derive(Serialize)]
struct DlqMessage<'a> {
    id: String,
    #[serde(rename = "transactionId")]
    transaction_id: &'a str,
    #[serde(rename = "partitionId")]
    partition_id: String,
    queue: &'a str,
    partition: &'a str,
    #[serde(rename = "consumerGroup")]
    consumer_group: Option<&'a str>,
    #[serde(rename = "errorMessage")]
    error_message: Option<&'a str>,
    #[serde(rename = "retryCount")]
    retry_count: u32,
    data: StoredJson<'a>,
    #[serde(rename = "createdAt")]
    created_at: String,
    #[serde(rename = "failedAt")]
    failed_at: String,
    offset: u64,
}

#[derive(Serialize)]
struct FetchOut<'a> {
    entries: Vec<FetchEntry<'a>>,
}

#[derive(Serialize)]
struct DlqOut<'a> {
    messages: Vec<DlqMessage<'a>>,
    total: usize,
}

/// `POST /api/v1/fetch`.
pub(crate) async fn fetch<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let m = object(body, false)?;
    let entries = match m.get("entries") {
        Some(Value::Array(a)) if a.len() <= MAX_FETCH_ENTRIES => a.clone(),
        Some(Value::Array(_)) => {
            return Err(ApiError::bad_request(
                "entries",
                &format!("must have at most {MAX_FETCH_ENTRIES} entries"),
            ));
        }
        _ => return Err(ApiError::bad_request("entries", "must be a list")),
    };
    let ceiling = match m.get("maxBytes") {
        None | Some(Value::Null) => MAX_FETCH_BYTES,
        Some(v) => v
            .as_u64()
            .filter(|b| *b > 0)
            .ok_or_else(|| ApiError::bad_request("maxBytes", "must be an integer above 0"))?
            .min(MAX_FETCH_BYTES),
    };
    let mut parsed = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let f = |k: &str| format!("entries[{i}].{k}");
        let Value::Object(o) = e else {
            return Err(ApiError::bad_request(
                &format!("entries[{i}]"),
                "must be an object",
            ));
        };
        let queue = opt_str(o, "queue", &f("queue"))?
            .ok_or_else(|| ApiError::bad_request(&f("queue"), "is required"))?;
        let queue = String::from(scope.queue(&queue, &f("queue"))?);
        let partition =
            opt_str(o, "partition", &f("partition"))?.unwrap_or_else(|| "Default".to_owned());
        let offset = o
            .get("offset")
            .and_then(Value::as_u64)
            .ok_or_else(|| ApiError::bad_request(&f("offset"), "must be a non-negative integer"))?;
        let max = match o.get("maxBytes") {
            None | Some(Value::Null) => ceiling,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| {
                    ApiError::bad_request(&f("maxBytes"), "must be a non-negative integer")
                })?
                .min(ceiling),
        };
        parsed.push((queue, partition, offset, max));
    }
    api.read_barrier().await?;
    let state = api.state();
    let mut budget = ceiling as usize;
    // Read every entry first: the answer borrows the stored payloads.
    let mut read = Vec::with_capacity(parsed.len());
    for (queue, partition, offset, max) in parsed {
        let Some(p) =
            reads::partition_by_name(&*state, &queue, &partition).map_err(|e| store_err(&e))?
        else {
            read.push((0, 0, Vec::new(), Some("UNKNOWN_TOPIC_OR_PARTITION")));
            continue;
        };
        if offset < p.log_start || offset > p.next_offset {
            read.push((
                p.next_offset,
                p.log_start,
                Vec::new(),
                Some("OFFSET_OUT_OF_RANGE"),
            ));
            continue;
        }
        let limit = (max as usize).min(budget.max(1));
        let mut msgs =
            reads::messages(&*state, &p, offset, limit, 100_000).map_err(|e| store_err(&e))?;
        for (_, m) in &mut msgs {
            open(api, &mut m.payload);
        }
        let used: usize = msgs.iter().map(|(_, m)| m.payload.len() + 64).sum();
        budget = budget.saturating_sub(used);
        read.push((p.next_offset, p.log_start, msgs, None));
    }
    let entries: Vec<FetchEntry<'_>> = read
        .iter()
        .map(|(high, start, msgs, error)| FetchEntry {
            high_watermark: *high,
            log_start_offset: *start,
            records: msgs
                .iter()
                .map(|(off, m)| FetchRecord {
                    offset: *off,
                    transaction_id: m.transaction_id.clone(),
                    payload: StoredJson(&m.payload),
                    ts: m.stamp.iso_micros(),
                })
                .collect(),
            error: *error,
        })
        .collect();
    Ok(json_answer(200, &FetchOut { entries }))
}

/// Replace a sealed payload (an encrypted queue's) by its plaintext when this node can open it.
fn open<A: ClientApi>(api: &Arc<A>, payload: &mut Vec<u8>) {
    if let std::borrow::Cow::Owned(plain) = api.open_payload(payload) {
        *payload = plain;
    }
}

/// `POST /api/v1/partitions/changed`.
pub(crate) async fn changed<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let m = object(body, false)?;
    let Some(Value::Array(entries)) = m.get("entries") else {
        return Err(ApiError::bad_request("entries", "must be a list"));
    };
    if entries.is_empty() || entries.len() > 64 {
        return Err(ApiError::bad_request(
            "entries",
            "must have 1 to 64 entries",
        ));
    }
    let mut parsed = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let f = |k: &str| format!("entries[{i}].{k}");
        let Value::Object(o) = e else {
            return Err(ApiError::bad_request(
                &format!("entries[{i}]"),
                "must be an object",
            ));
        };
        let queue = opt_str(o, "queue", &f("queue"))?
            .ok_or_else(|| ApiError::bad_request(&f("queue"), "is required"))?;
        let queue = String::from(scope.queue(&queue, &f("queue"))?);
        let limit = match o.get("limit") {
            None | Some(Value::Null) => 1000,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| {
                    ApiError::bad_request(&f("limit"), "must be a non-negative integer")
                })?
                .clamp(1, 1000),
        };
        let since = opt_str(o, "since", &f("since"))?
            .map(|s| {
                Stamp::parse_iso(&s).map_err(|e| ApiError::bad_request(&f("since"), &e.to_string()))
            })
            .transpose()?;
        let after = match opt_str(o, "after", &f("after"))? {
            Some(a) if !a.is_empty() => Some(a.parse::<u64>().map_err(|_| {
                ApiError::bad_request(&f("after"), "is not a cursor this broker issued")
            })?),
            _ => None,
        };
        parsed.push((queue, limit as usize, since, after));
    }
    api.read_barrier().await?;
    heavy::off_runtime(api, move |api| changed_pages(api, &parsed)).await
}

/// One entry of `partitions/changed`: (stored queue name, limit, since, after).
type ChangedEntry = (String, usize, Option<Stamp>, Option<u64>);

/// The pages of `partitions/changed`, on a blocking thread: each entry walks at most its share
/// of `pages::WALK_BUDGET` partitions (so every entry progresses), and answers `next` while
/// partitions may follow (a page can be short, even empty, when `since` skips many).
fn changed_pages<A: ClientApi>(
    api: &A,
    parsed: &[ChangedEntry],
) -> Result<Response<Full<Bytes>>, ApiError> {
    use queen_domain::pages::{Flow, WALK_BUDGET, walk_partitions};
    let state = api.state();
    let safe = reads::safe_time(&*state).map_err(|e| store_err(&e))?;
    let share = WALK_BUDGET / parsed.len().max(1);
    let mut out = Vec::new();
    for (queue, limit, since, after) in parsed {
        let Some(q) = reads::queue(&*state, queue).map_err(|e| store_err(&e))? else {
            out.push(json!({"partitions": [], "error": "UNKNOWN_TOPIC_OR_PARTITION"}));
            continue;
        };
        let mut rows = Vec::new();
        let walked = walk_partitions(&*state, q.qid, *after, share, &mut |p| {
            if since.is_some_and(|s| p.last_write < s || p.next_offset == 0) {
                return Ok(Flow::Continue);
            }
            rows.push(json!({
                "name": p.name, "id": p.pid.to_string(),
                "lastOffset": if p.next_offset == 0 { -1 } else { (p.next_offset - 1) as i64 },
                "logStart": p.log_start,
                "lastWriteAt": if p.next_offset == 0 { Value::Null } else { json!(p.last_write.iso_micros()) },
            }));
            Ok(if rows.len() == *limit {
                Flow::Stop
            } else {
                Flow::Continue
            })
        })
        .map_err(|e| store_err(&e))?;
        let mut e = json!({ "partitions": rows });
        if let Some(next) = walked.next {
            e["next"] = json!(next.to_string());
        }
        out.push(e);
    }
    Ok(json_response(
        200,
        &json!({"safeTime": safe.iso_micros(), "entries": out}),
    ))
}

/// `GET /api/v1/dlq`.
pub(crate) async fn dlq<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let queue = q_get(&q, "queue")
        .ok_or_else(|| ApiError::bad_request("queue", "is required"))?
        .to_owned();
    let limit = q_num(&q, "limit", 100)?.clamp(1, 10_000) as usize;
    let offset = q_num(&q, "offset", 0)? as usize;
    let group = q_get(&q, "consumerGroup").map(str::to_owned);
    let partition = q_get(&q, "partition").map(str::to_owned);
    let parse = |k: &str| {
        q_get(&q, k)
            .map(|t| Stamp::parse_iso(t).map_err(|e| ApiError::bad_request(k, &e.to_string())))
            .transpose()
    };
    let (from, to) = (parse("from")?, parse("to")?);
    api.read_barrier().await?;
    let state = api.state();
    let stored = scope.queue(&queue, "queue")?;
    let Some(qr) = reads::queue(&*state, stored.as_str()).map_err(|e| store_err(&e))? else {
        return Ok(json_response(200, &json!({"messages": [], "total": 0})));
    };
    let filter = |d: &queen_domain::model::DlqRec| {
        group.as_ref().is_none_or(|g| d.group == *g)
            && partition.as_ref().is_none_or(|p| d.partition == *p)
            && from.is_none_or(|f| d.failed >= f)
            && to.is_none_or(|t| d.failed <= t)
    };
    let (mut rows, total) =
        reads::dead_letters(&*state, qr.qid, &filter, offset, limit).map_err(|e| store_err(&e))?;
    for d in &mut rows {
        open(api, &mut d.payload);
    }
    let messages = rows
        .iter()
        .map(|d| DlqMessage {
            id: uuid::Uuid::from_bytes(d.id).to_string(),
            transaction_id: &d.transaction_id,
            partition_id: d.pid.to_string(),
            queue: &queue,
            partition: &d.partition,
            consumer_group: (d.group != queen_domain::names::QUEUE_MODE_GROUP)
                .then_some(d.group.as_str()),
            error_message: d.error.as_deref(),
            retry_count: d.retries,
            data: StoredJson(&d.payload),
            created_at: d.created.iso_millis(),
            failed_at: d.failed.iso_millis(),
            offset: d.offset,
        })
        .collect();
    Ok(json_answer(200, &DlqOut { messages, total }))
}

/// `DELETE /api/v1/resources/tenant?tenant=<uuid>`: one bounded pass of deleting a tenant's
/// queues, timers, KV rows and sink documents (never the lake). An operator's route: never
/// through the tenant's own token, and a trusted proxy may only name the tenant it purges.
pub(crate) async fn purge_tenant<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let text = q_get(&q, "tenant").ok_or_else(|| ApiError::bad_request("tenant", "is required"))?;
    let tenant = queen_domain::tenant::Tenant::parse(text)
        .map_err(|e| ApiError::bad_request("tenant", &e.to_string()))?;
    match scope.via {
        crate::tenancy::Via::Token => {
            return Err(ApiError::new(
                403,
                "forbidden",
                "a tenant's own token cannot purge a tenant; this is an operator's route",
            ));
        }
        crate::tenancy::Via::Header if scope.tenant != tenant => {
            return Err(ApiError::new(
                403,
                "forbidden",
                format!(
                    "{} names another tenant than the one purged",
                    crate::tenancy::TENANT_HEADER
                ),
            ));
        }
        _ => {}
    }
    if tenant.is_default() {
        return Err(ApiError::new(
            409,
            "default_tenant",
            "the default tenant holds the data of every client without tenancy and is not purged; delete its queues one by one",
        ));
    }
    let r = api.purge_tenant(tenant.clone()).await?;
    Ok(json_response(
        200,
        &json!({"success": true, "tenant": tenant.id(), "partitionsDeleted": r.partitions_deleted, "done": r.done}),
    ))
}

#[cfg(test)]
mod tests;
