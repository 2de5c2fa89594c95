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
use queen_domain::names::{GroupName, QueueName};
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
use queen_ports::ClientApi;

/// Most entries one fetch may carry.
const MAX_FETCH_ENTRIES: usize = 1024;
/// The default and largest byte budget of a fetch.
const MAX_FETCH_BYTES: u64 = 8 << 20;

fn store_err(e: &StoreError) -> ApiError {
    tracing::error!(target: "queen-http", error = %e, "state read failed");
    ApiError::new(
        500,
        "internal",
        "reading the node's state failed; see its log",
    )
}

fn q_get<'a>(q: &'a [(String, String)], k: &str) -> Option<&'a str> {
    q.iter()
        .find(|(a, _)| a == k)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

fn q_num(q: &[(String, String)], k: &str, default: u64) -> Result<u64, ApiError> {
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
        let msgs =
            reads::messages(&*state, &p, offset, limit, 100_000).map_err(|e| store_err(&e))?;
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

/// `POST /api/v1/partitions/changed`.
pub(crate) async fn changed<A: ClientApi>(
    api: &Arc<A>,
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
    let state = api.state();
    let safe = reads::safe_time(&*state).map_err(|e| store_err(&e))?;
    let mut out = Vec::new();
    for (queue, limit, since, after) in parsed {
        let Some(view) = reads::queue_view(&*state, &queue).map_err(|e| store_err(&e))? else {
            out.push(json!({"partitions": [], "error": "UNKNOWN_TOPIC_OR_PARTITION"}));
            continue;
        };
        let mut rows = Vec::new();
        let mut next = None;
        for p in view
            .partitions
            .iter()
            .filter(|p| after.is_none_or(|a| p.pid > a))
        {
            if since.is_some_and(|s| p.last_write < s || p.next_offset == 0) {
                continue;
            }
            if rows.len() == limit {
                next = rows.last().map(|_: &Value| ());
                break;
            }
            rows.push(json!({
                "name": p.name, "id": p.pid.to_string(),
                "lastOffset": if p.next_offset == 0 { -1 } else { (p.next_offset - 1) as i64 },
                "logStart": p.log_start,
                "lastWriteAt": if p.next_offset == 0 { Value::Null } else { json!(p.last_write.iso_micros()) },
            }));
        }
        let mut e = json!({ "partitions": rows });
        if next.is_some() {
            e["next"] = json!(
                e["partitions"]
                    .as_array()
                    .and_then(|r| r.last())
                    .and_then(|r| r["id"].as_str())
                    .unwrap_or_default()
            );
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
    let Some(qr) = reads::queue(&*state, &queue).map_err(|e| store_err(&e))? else {
        return Ok(json_response(200, &json!({"messages": [], "total": 0})));
    };
    let filter = |d: &queen_domain::model::DlqRec| {
        group.as_ref().is_none_or(|g| d.group == *g)
            && partition.as_ref().is_none_or(|p| d.partition == *p)
            && from.is_none_or(|f| d.failed >= f)
            && to.is_none_or(|t| d.failed <= t)
    };
    let (rows, total) =
        reads::dead_letters(&*state, qr.qid, &filter, offset, limit).map_err(|e| store_err(&e))?;
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

struct GroupRow {
    queue: QueueRec,
    group: String,
    start: SubscriptionStart,
    created: Stamp,
    parts: Vec<(PartitionRec, u64, Option<Stamp>, bool, Stamp)>,
}

fn group_rows(
    state: &dyn StateRead,
    now: Stamp,
    only: Option<&str>,
) -> Result<Vec<GroupRow>, StoreError> {
    let mut out = Vec::new();
    for (q, g, rec) in reads::groups(state)? {
        if only.is_some_and(|o| o != g) {
            continue;
        }
        let view = reads::queue_view(state, &q.name)?;
        let mut parts = Vec::new();
        for p in view.map(|v| v.partitions).unwrap_or_default() {
            let (lag, oldest, leased, last) = reads::lag(state, &p, &g, rec.start, now)?;
            parts.push((p, lag, oldest, leased, last));
        }
        out.push(GroupRow {
            queue: q,
            group: g,
            start: rec.start,
            created: rec.created,
            parts,
        });
    }
    Ok(out)
}

fn secs_since(now: Stamp, t: Option<Stamp>) -> u64 {
    t.map_or(0, |t| now.0.saturating_sub(t.0) / 1_000_000)
}

/// The consumer-group routes.
pub(crate) async fn groups<A: ClientApi>(
    api: &Arc<A>,
    method: &str,
    rest: &[&str],
    query: &str,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let now = api.now();
    let group_name =
        |g: &str| GroupName::new(g).map_err(|e| ApiError::bad_request("group", &e.to_string()));
    let delete_metadata = match q_get(&q, "deleteMetadata") {
        None | Some("true") => true,
        Some("false") => false,
        Some(_) => {
            return Err(ApiError::bad_request(
                "deleteMetadata",
                "must be true or false",
            ));
        }
    };
    match (method, rest) {
        ("GET", []) => {
            api.read_barrier().await?;
            let state = api.state();
            let rows = group_rows(&*state, now, None).map_err(|e| store_err(&e))?;
            let list: Vec<Value> = rows
                .iter()
                .map(|r| {
                    let lagging: Vec<_> = r.parts.iter().filter(|p| p.1 > 0).collect();
                    let total: u64 = r.parts.iter().map(|p| p.1).sum();
                    let max_time = r.parts.iter().map(|p| secs_since(now, p.2)).max().unwrap_or(0);
                    json!({
                        "name": r.group, "topics": [r.queue.name], "queueName": r.queue.name, "members": r.parts.iter().filter(|p| p.3).count(),
                        "partitionsWithLag": lagging.len(), "totalLag": total, "maxTimeLag": max_time,
                        "state": if total == 0 { "Stable" } else { "Lagging" },
                        "subscriptionMode": match r.start { SubscriptionStart::All => "all", SubscriptionStart::From(_) => "timestamp" },
                        "subscriptionTimestamp": match r.start { SubscriptionStart::All => Value::Null, SubscriptionStart::From(t) => json!(t.iso_millis()) },
                        "subscriptionCreatedAt": r.created.iso_millis(),
                    })
                })
                .collect();
            Ok(json_response(200, &Value::Array(list)))
        }
        ("GET", ["lagging"]) => {
            let min = q_num(&q, "minLagSeconds", 60)?;
            if min > queen_domain::model::MAX_DURATION_SECONDS {
                return Err(ApiError::bad_request(
                    "minLagSeconds",
                    &format!(
                        "must be 0 to {} seconds (ten years)",
                        queen_domain::model::MAX_DURATION_SECONDS
                    ),
                ));
            }
            api.read_barrier().await?;
            let state = api.state();
            let rows = group_rows(&*state, now, None).map_err(|e| store_err(&e))?;
            let mut list = Vec::new();
            for r in &rows {
                for (p, lag, oldest, _, last) in &r.parts {
                    let age = secs_since(now, *oldest);
                    if *lag > 0 && age >= min {
                        list.push(json!({
                            "consumer_group": r.group, "queue_name": r.queue.name, "partition_name": p.name,
                            "partition_id": p.pid.to_string(), "offset_lag": lag, "time_lag_seconds": age,
                            "oldest_unconsumed_at": oldest.map(|o| o.iso_millis()),
                            "last_consumed_at": if last.0 == 0 { Value::Null } else { json!(last.iso_millis()) },
                        }));
                    }
                }
            }
            Ok(json_response(200, &Value::Array(list)))
        }
        ("GET", [group]) => {
            api.read_barrier().await?;
            let state = api.state();
            let rows = group_rows(&*state, now, Some(group)).map_err(|e| store_err(&e))?;
            let mut out = Map::new();
            for r in rows {
                let parts: Vec<Value> = r
                    .parts
                    .iter()
                    .map(|(p, lag, oldest, leased, last)| {
                        json!({"partition": p.name, "partitionId": p.pid.to_string(), "lastConsumedAt": if last.0 == 0 { Value::Null } else { json!(last.iso_millis()) },
                               "offsetLag": lag, "timeLagSeconds": secs_since(now, *oldest), "leaseActive": leased})
                    })
                    .collect();
                out.insert(r.queue.name.clone(), json!({ "partitions": parts }));
            }
            Ok(json_response(200, &Value::Object(out)))
        }
        ("DELETE", [group]) | ("DELETE", [group, "queues", _]) => {
            let queue = match rest {
                [_, "queues", queue] => Some(
                    QueueName::new(*queue)
                        .map_err(|e| ApiError::bad_request("queue", &e.to_string()))?,
                ),
                _ => None,
            };
            let cmd = Command::DeleteGroup {
                group: group_name(group)?,
                queue: queue.clone(),
                delete_metadata,
            };
            let Outcome::GroupDeleted {
                partitions,
                metadata,
            } = api.command(cmd).await?
            else {
                return Err(ApiError::new(500, "internal", "unexpected outcome"));
            };
            let mut v = json!({"success": true, "consumerGroup": group, "deletedPartitions": partitions, "metadataDeleted": delete_metadata && metadata > 0});
            if let Some(q) = queue {
                v["queueName"] = json!(q.as_str());
            }
            Ok(json_response(200, &v))
        }
        ("POST", [group, "queues", queue, "seek"]) => {
            let m = object(body, true)?;
            let to_end = m.get("toEnd").and_then(Value::as_bool).unwrap_or(false);
            let ts = opt_str(&m, "timestamp", "timestamp")?;
            let to = match (to_end, ts) {
                (true, _) => None,
                (false, Some(t)) => Some(
                    Stamp::parse_iso(&t)
                        .map_err(|e| ApiError::bad_request("timestamp", &e.to_string()))?,
                ),
                (false, None) => {
                    return Err(ApiError::bad_request("toEnd", "or timestamp is required"));
                }
            };
            let qn = QueueName::new(*queue)
                .map_err(|e| ApiError::bad_request("queue", &e.to_string()))?;
            let Outcome::Seeked { partitions } = api
                .command(Command::Seek {
                    group: group_name(group)?,
                    queue: qn,
                    to,
                })
                .await?
            else {
                return Err(ApiError::new(500, "internal", "unexpected outcome"));
            };
            Ok(json_response(
                200,
                &json!({"success": true, "consumerGroup": group, "queueName": queue, "seekToEnd": to.is_none(),
                "targetTimestamp": to.map(|t| t.iso_millis()), "partitionsUpdated": partitions}),
            ))
        }
        ("POST", [group, "subscription"]) => {
            let m = object(body, true)?;
            let t = opt_str(&m, "subscriptionTimestamp", "subscriptionTimestamp")?
                .ok_or_else(|| ApiError::bad_request("subscriptionTimestamp", "is required"))?;
            let from = Stamp::parse_iso(&t)
                .map_err(|e| ApiError::bad_request("subscriptionTimestamp", &e.to_string()))?;
            let Outcome::Resubscribed { rows } = api
                .command(Command::Resubscribe {
                    group: group_name(group)?,
                    from,
                })
                .await?
            else {
                return Err(ApiError::new(500, "internal", "unexpected outcome"));
            };
            Ok(json_response(
                200,
                &json!({"success": true, "consumerGroup": group, "newTimestamp": from.iso_millis(), "rowsUpdated": rows}),
            ))
        }
        _ => Err(ApiError::new(
            404,
            "no_such_route",
            "no such consumer-group route",
        )),
    }
}

fn queue_json(state: &dyn StateRead, q: &QueueRec, now: Stamp) -> Result<Value, StoreError> {
    let view = reads::queue_view(state, &q.name)?;
    let parts = view.map(|v| v.partitions).unwrap_or_default();
    let mut pending_total = 0;
    let mut plist = Vec::new();
    for p in &parts {
        let (lag, oldest, leased, _) = reads::lag(
            state,
            p,
            queen_domain::names::QUEUE_MODE_GROUP,
            SubscriptionStart::All,
            now,
        )?;
        pending_total += lag;
        plist.push(json!({"name": p.name, "id": p.pid.to_string(), "messages": p.next_offset - p.log_start, "pending": lag,
            "highWatermark": p.next_offset, "logStart": p.log_start, "leaseActive": leased,
            "oldestPendingAt": oldest.map(|o| o.iso_millis()), "lastWriteAt": if p.next_offset == 0 { Value::Null } else { json!(p.last_write.iso_millis()) }}));
    }
    Ok(json!({
        "name": q.name, "namespace": q.namespace, "task": q.task, "createdAt": q.created.iso_millis(),
        "partitions": plist, "partitionCount": parts.len(),
        "messages": {"total": q.messages, "pending": pending_total, "deadLetter": q.dead_lettered},
        "options": q.options.to_json(),
    }))
}

/// Status and resources routes.
pub(crate) async fn resources<A: ClientApi>(
    api: &Arc<A>,
    segs: &[&str],
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    api.read_barrier().await?;
    let state = api.state();
    let now = api.now();
    let queues = reads::queues(&*state, 100_000).map_err(|e| store_err(&e))?;
    let err = |e: StoreError| store_err(&e);
    match segs {
        ["status"] | ["resources", "overview"] => {
            let total: u64 = queues.iter().map(|q| q.messages).sum();
            let dead: u64 = queues.iter().map(|q| q.dead_lettered).sum();
            let mut pending = 0;
            let mut partitions = 0;
            for qr in &queues {
                let v = queue_json(&*state, qr, now).map_err(err)?;
                pending += v["messages"]["pending"].as_u64().unwrap_or(0);
                partitions += v["partitionCount"].as_u64().unwrap_or(0);
            }
            let namespaces: std::collections::BTreeSet<_> =
                queues.iter().filter_map(|q| q.namespace.clone()).collect();
            let tasks: std::collections::BTreeSet<_> =
                queues.iter().filter_map(|q| q.task.clone()).collect();
            Ok(json_response(
                200,
                &json!({
                    "queues": queues.len(), "partitions": partitions, "namespaces": namespaces.len(), "tasks": tasks.len(),
                    "messages": {"total": total, "pending": pending, "processing": Value::Null, "completed": Value::Null, "failed": Value::Null, "deadLetter": dead},
                    "lag": pending, "throughput": Value::Null, "timestamp": now.iso_millis(),
                }),
            ))
        }
        ["resources", kind @ ("namespaces" | "tasks")] => {
            let mut groups: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
            for qr in &queues {
                let tag = if *kind == "namespaces" {
                    qr.namespace.clone()
                } else {
                    qr.task.clone()
                };
                if let Some(t) = tag {
                    let e = groups.entry(t).or_default();
                    e.0 += 1;
                    e.1 += qr.partitions;
                    e.2 += qr.messages;
                }
            }
            let key = if *kind == "namespaces" {
                "namespace"
            } else {
                "task"
            };
            let list: Vec<Value> = groups.into_iter().map(|(t, (qs, ps, ms))| json!({key: t, "queues": qs, "partitions": ps, "messages": {"total": ms}})).collect();
            Ok(json_response(200, &json!({ *kind: list })))
        }
        ["resources", "queues"] | ["status", "queues"] => {
            let limit = q_num(&q, "limit", 1000)? as usize;
            let offset = q_num(&q, "offset", 0)? as usize;
            let ns = q_get(&q, "namespace");
            let task = q_get(&q, "task");
            let search = q_get(&q, "search");
            let filtered: Vec<&QueueRec> = queues
                .iter()
                .filter(|qr| ns.is_none_or(|n| qr.namespace.as_deref() == Some(n)))
                .filter(|qr| task.is_none_or(|t| qr.task.as_deref() == Some(t)))
                .filter(|qr| search.is_none_or(|s| qr.name.contains(s)))
                .collect();
            let total = filtered.len();
            let mut list = Vec::new();
            for qr in filtered.into_iter().skip(offset).take(limit) {
                list.push(queue_json(&*state, qr, now).map_err(err)?);
            }
            Ok(json_response(
                200,
                &json!({"queues": list, "pagination": {"total": total, "limit": limit, "offset": offset}}),
            ))
        }
        ["resources", "queues", name] | ["status", "queues", name] => {
            match queues.iter().find(|qr| qr.name == *name) {
                Some(qr) => Ok(json_response(
                    200,
                    &queue_json(&*state, qr, now).map_err(err)?,
                )),
                None => Err(ApiError::new(404, "queue_not_found", "Queue not found")),
            }
        }
        ["resources", "queues", name, "depth"] => {
            let Some(qr) = queues.iter().find(|qr| qr.name == *name) else {
                return Err(ApiError::new(404, "queue_not_found", "Queue not found"));
            };
            let group = q_get(&q, "group").map(str::to_owned);
            let view = reads::queue_view(&*state, &qr.name).map_err(err)?;
            let mut parts = Vec::new();
            let mut pending = 0;
            for p in view.map(|v| v.partitions).unwrap_or_default() {
                let lag = match &group {
                    Some(g) => {
                        let start = reads::groups(&*state)
                            .map_err(err)?
                            .into_iter()
                            .find(|(qq, gg, _)| qq.qid == qr.qid && gg == g)
                            .map_or(SubscriptionStart::All, |(_, _, r)| r.start);
                        reads::lag(&*state, &p, g, start, now).map_err(err)?.0
                    }
                    None => {
                        let mut worst = reads::lag(
                            &*state,
                            &p,
                            queen_domain::names::QUEUE_MODE_GROUP,
                            SubscriptionStart::All,
                            now,
                        )
                        .map_err(err)?
                        .0;
                        for (g, _) in reads::cursors(&*state, p.pid).map_err(err)? {
                            worst = worst.max(
                                reads::lag(&*state, &p, &g, SubscriptionStart::All, now)
                                    .map_err(err)?
                                    .0,
                            );
                        }
                        worst
                    }
                };
                pending += lag;
                parts.push(json!({"partition": p.name, "pending": lag}));
            }
            let partitions_pending = parts
                .iter()
                .filter(|p| p["pending"].as_u64().unwrap_or(0) > 0)
                .count();
            Ok(json_response(
                200,
                &json!({"queue": qr.name, "group": group, "pending": pending, "partitionsPending": partitions_pending,
                "conflation": false, "effectivePending": pending, "partitions": parts}),
            ))
        }
        ["resources", "partitions"] => {
            let only = q_get(&q, "queue");
            let limit = q_num(&q, "limit", 1000)? as usize;
            let mut list = Vec::new();
            for qr in queues.iter().filter(|qr| only.is_none_or(|o| qr.name == o)) {
                let v = queue_json(&*state, qr, now).map_err(err)?;
                for p in v["partitions"].as_array().cloned().unwrap_or_default() {
                    let mut p = p;
                    p["queue"] = json!(qr.name);
                    list.push(p);
                }
            }
            list.truncate(limit);
            Ok(json_response(200, &json!({ "partitions": list })))
        }
        _ => Err(ApiError::new(404, "no_such_route", "no such resource")),
    }
}

#[cfg(test)]
mod tests;
