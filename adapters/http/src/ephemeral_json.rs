//! The ephemeral queues' routes, `/api/v1/ephemeral/*`: bodies and queries in, answers out.
//!
//! A 404 on this family means one thing to the official client: an unknown queue on `depth`
//! (`ephemeral_queue_not_found`); any other 404 reads as "broker too old". So every other
//! refusal here is a 400, 405, 429 or 503.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use queen_domain::ephemeral::{self, AckOutcome, AckStatus, Declared, Delivered, Options};
use queen_ports::{ClientApi, EphemeralAnswer, EphemeralOp, EphemeralQueue};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::api::ApiError;
use crate::error::{json_answer, json_response};
use crate::fields;
use crate::pop_query::{self, parse_query};
use crate::tenancy::Scope;

/// Queues on one page of the listing when the request names no `limit`.
const DEFAULT_PAGE: u32 = 100;
/// Most queues on one page of the listing.
const MAX_PAGE: u32 = 1_000;
/// Largest batch one pop may ask for.
const MAX_BATCH: u32 = 10_000;
/// Longest wait a pop may ask for.
const MAX_WAIT_MS: u64 = 60_000;
/// A waiting pop's timeout when it names none.
const DEFAULT_WAIT_MS: u64 = 30_000;

/// Route one request of the family; `rest` is the path after `/api/v1/ephemeral`.
pub(crate) async fn route<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    method: &str,
    rest: &[&str],
    query: &str,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    match (method, rest) {
        ("POST", ["configure"]) => {
            let m = fields::object(body, false)?;
            let name = queue_field(m.get("queue"))?;
            let declared = Declared::parse(m.get("options")).map_err(|(f, p)| bad(&f, &p))?;
            let queue = stored(scope, &name, "queue")?;
            let EphemeralAnswer::Configured(opts) = api
                .ephemeral(EphemeralOp::Configure { queue, declared })
                .await?
            else {
                return Err(unexpected());
            };
            Ok(json_response(
                200,
                &json!({"success": true, "queue": name, "options": opts.to_json()}),
            ))
        }
        ("POST", ["reset"]) => {
            let m = fields::object(body, false)?;
            let name = queue_field(m.get("queue"))?;
            let queue = stored(scope, &name, "queue")?;
            let EphemeralAnswer::Dropped(n) = api.ephemeral(EphemeralOp::Reset { queue }).await?
            else {
                return Err(unexpected());
            };
            Ok(json_response(200, &json!({"queue": name, "dropped": n})))
        }
        ("DELETE", ["queue", name]) => {
            let queue = stored(scope, name, "queue")?;
            let EphemeralAnswer::Deleted(d) = api.ephemeral(EphemeralOp::Delete { queue }).await?
            else {
                return Err(unexpected());
            };
            Ok(json_response(200, &json!({"queue": name, "deleted": d})))
        }
        ("POST", ["push"]) => push(api, scope, body).await,
        ("GET", ["pop"]) => pop(api, scope, query).await,
        ("POST", ["ack"]) => ack(api, scope, body).await,
        ("GET", ["queues"]) => queues(api, scope, query).await,
        ("GET", ["queues", name, "depth"]) => {
            let queue = stored(scope, name, "queue")?;
            let q = parse_query(query);
            let group = q
                .iter()
                .find(|(k, _)| k == "group" || k == "consumerGroup")
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty());
            if let Some(g) = &group {
                ephemeral::check_name(g).map_err(|p| bad("group", p))?;
            }
            let EphemeralAnswer::Depth(d) = api
                .ephemeral(EphemeralOp::Depth {
                    queue,
                    group: group.clone(),
                })
                .await?
            else {
                return Err(unexpected());
            };
            Ok(json_response(200, &depth(scope, &d, group.as_deref())))
        }
        (_, ["configure" | "reset" | "push" | "pop" | "ack" | "queues"])
        | (_, ["queue", _])
        | (_, ["queues", _, "depth"]) => Err(ApiError::new(
            405,
            "method_not_allowed",
            format!("{method} is not served on this route"),
        )),
        _ => Err(ApiError::new(
            404,
            "no_such_route",
            format!("no route for {method} /api/v1/ephemeral/{}", rest.join("/")),
        )),
    }
}

fn bad(field: &str, problem: &str) -> ApiError {
    ApiError::bad_request(field, problem).with_reason("ephemeral_bad_request")
}

fn unexpected() -> ApiError {
    ApiError::new(500, "internal", "unexpected answer")
}

/// The `queue` field of a body: a valid ephemeral queue name.
fn queue_field(v: Option<&Value>) -> Result<String, ApiError> {
    let Some(Value::String(s)) = v else {
        return Err(bad("queue", "is required (a string)"));
    };
    ephemeral::check_name(s).map_err(|p| bad("queue", p))?;
    Ok(s.clone())
}

/// A client's queue name, checked, as the tenant stores it.
fn stored(scope: &Scope, name: &str, field: &str) -> Result<String, ApiError> {
    ephemeral::check_name(name).map_err(|p| bad(field, p))?;
    Ok(scope.name(name))
}

/// A push body; the payloads are kept as the client wrote them.
#[derive(Deserialize)]
struct PushBody<'a> {
    #[serde(borrow)]
    queue: Option<&'a RawValue>,
    #[serde(borrow, default)]
    partition: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<Vec<&'a RawValue>>,
}

async fn push<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let b: PushBody<'_> = serde_json::from_slice(body)
        .map_err(|e| bad("body", &format!("is not a push body: {e}")))?;
    let name = queue_field(
        b.queue
            .map(|r| serde_json::from_str::<Value>(r.get()).unwrap_or(Value::Null))
            .as_ref(),
    )?;
    let partition = match b.partition.map(RawValue::get) {
        None | Some("null") => ephemeral::DEFAULT_PARTITION.to_owned(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::String(p)) => {
                ephemeral::check_name(&p).map_err(|e| bad("partition", e))?;
                p
            }
            _ => return Err(bad("partition", "must be a string")),
        },
    };
    let Some(messages) = b.messages else {
        return Err(bad("messages", "is required (a list of {payload})"));
    };
    let mut payloads = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        // A map, not a struct with an optional field: a `null` payload is a payload.
        let item: std::collections::BTreeMap<&str, &RawValue> = serde_json::from_str(m.get())
            .map_err(|_| bad(&format!("messages[{i}]"), "must be an object {payload}"))?;
        let Some(p) = item.get("payload") else {
            return Err(bad(&format!("messages[{i}].payload"), "is required"));
        };
        payloads.push(p.get().as_bytes().to_vec());
    }
    if payloads.is_empty() {
        return Ok(json_response(201, &json!({"pushed": 0})));
    }
    let queue = stored(scope, &name, "queue")?;
    let EphemeralAnswer::Pushed(n) = api
        .ephemeral(EphemeralOp::Push {
            queue,
            partition,
            payloads,
        })
        .await?
    else {
        return Err(unexpected());
    };
    Ok(json_response(201, &json!({"pushed": n})))
}

/// One page of the tenant's queues in name order: `limit` (default 100, at most 1000) after
/// the name `after`; `next` is the cursor of the next page (`null` on the last).
async fn queues<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let get = |k: &str| pop_query::get(&q, k).filter(|v| !v.is_empty());
    let limit = match get("limit") {
        None => DEFAULT_PAGE,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| {
                bad(
                    "limit",
                    &format!("must be a whole number from 1 to {MAX_PAGE}"),
                )
            })?,
    };
    let after = get("after").map(str::to_owned);
    if let Some(a) = &after {
        ephemeral::check_name(a).map_err(|p| bad("after", p))?;
    }
    let EphemeralAnswer::QueuesPage { queues, more } = api
        .ephemeral(EphemeralOp::QueuesPage {
            tenant: scope.tenant.id().to_owned(),
            after,
            limit,
        })
        .await?
    else {
        return Err(unexpected());
    };
    let bytes: u64 = queues.iter().map(|q| q.view.bytes).sum();
    let rows: Vec<Value> = queues.iter().map(|q| queue_row(scope, q)).collect();
    let next = queues
        .last()
        .filter(|_| more)
        .map(|q| scope.local(&q.queue).to_owned());
    Ok(json_response(
        200,
        &json!({"queues": rows, "count": rows.len(), "bytes": bytes, "next": next}),
    ))
}

/// A delivered message as the client reads it (the payload verbatim).
#[derive(Serialize)]
struct Out<'a> {
    id: &'a str,
    partition: &'a str,
    payload: Box<RawValue>,
    attempts: u32,
}

#[derive(Serialize)]
struct PopAnswer<'a> {
    queue: &'a str,
    messages: Vec<Out<'a>>,
}

async fn pop<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let get = |k: &str| pop_query::get(&q, k).filter(|v| !v.is_empty());
    let Some(name) = get("queue") else {
        return Err(bad("queue", "is required"));
    };
    let queue = stored(scope, name, "queue")?;
    let partition = get("partition").map(str::to_owned);
    if let Some(p) = &partition {
        ephemeral::check_name(p).map_err(|e| bad("partition", e))?;
    }
    let group = get("group")
        .or_else(|| get("consumerGroup"))
        .unwrap_or(ephemeral::QUEUE_MODE_GROUP)
        .to_owned();
    ephemeral::check_name(&group).map_err(|e| bad("group", e))?;
    let batch = match get("batch") {
        None => 1,
        Some(b) => b
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_BATCH).contains(n))
            .ok_or_else(|| {
                bad(
                    "batch",
                    &format!("must be a whole number from 1 to {MAX_BATCH}"),
                )
            })?,
    };
    let flag = |k: &str| -> Result<bool, ApiError> {
        pop_query::flag(&q, k)
            .map(Option::unwrap_or_default)
            .map_err(|e| e.with_reason("ephemeral_bad_request"))
    };
    let wait = flag("wait")?;
    let auto_ack = flag("autoAck")? || flag("commitOnDelivery")?;
    let wait_ms = if wait {
        Some(match get("timeout") {
            None => DEFAULT_WAIT_MS,
            Some(t) => t
                .parse::<u64>()
                .map_err(|_| bad("timeout", "must be milliseconds (a whole number)"))?
                .min(MAX_WAIT_MS),
        })
    } else {
        None
    };
    let EphemeralAnswer::Delivered(out) = api
        .ephemeral(EphemeralOp::Pop {
            queue,
            partition,
            group,
            batch,
            wait_ms,
            auto_ack,
        })
        .await?
    else {
        return Err(unexpected());
    };
    Ok(json_answer(
        200,
        &PopAnswer {
            queue: name,
            messages: out.iter().map(delivered).collect(),
        },
    ))
}

fn delivered(d: &Delivered) -> Out<'_> {
    let payload = String::from_utf8(d.payload.clone())
        .ok()
        .and_then(|s| RawValue::from_string(s).ok())
        .unwrap_or_else(|| RawValue::from_string("null".into()).expect("null is JSON"));
    Out {
        id: &d.id,
        partition: &d.partition,
        payload,
        attempts: d.attempts,
    }
}

async fn ack<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let m = fields::object(body, false)?;
    let name = queue_field(m.get("queue"))?;
    let group = match m.get("group") {
        None | Some(Value::Null) => ephemeral::QUEUE_MODE_GROUP.to_owned(),
        Some(Value::String(g)) => {
            ephemeral::check_name(g).map_err(|e| bad("group", e))?;
            g.clone()
        }
        Some(_) => return Err(bad("group", "must be a string")),
    };
    let Some(Value::Array(list)) = m.get("acks") else {
        return Err(bad("acks", "is required (a list of {id, status?})"));
    };
    let mut acks = Vec::with_capacity(list.len());
    for (i, a) in list.iter().enumerate() {
        let Some(id) = a
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        else {
            return Err(bad(
                &format!("acks[{i}].id"),
                "is required (the popped message's id)",
            ));
        };
        let status = match a.get("status") {
            None | Some(Value::Null) => AckStatus::Completed,
            Some(Value::String(s)) if s == "completed" => AckStatus::Completed,
            Some(Value::String(s)) if s == "failed" || s == "retry" => AckStatus::Failed,
            Some(Value::Bool(true)) => AckStatus::Completed,
            Some(Value::Bool(false)) => AckStatus::Failed,
            Some(_) => {
                return Err(bad(
                    &format!("acks[{i}].status"),
                    "must be \"completed\", \"failed\" or \"retry\"",
                ));
            }
        };
        acks.push((id.to_owned(), status));
    }
    let ids: Vec<String> = acks.iter().map(|(id, _)| id.clone()).collect();
    let outcomes = if acks.is_empty() {
        Vec::new()
    } else {
        let queue = stored(scope, &name, "queue")?;
        let EphemeralAnswer::Acked(out) = api
            .ephemeral(EphemeralOp::Ack { queue, group, acks })
            .await?
        else {
            return Err(unexpected());
        };
        out
    };
    let results: Vec<Value> = ids
        .iter()
        .zip(
            outcomes
                .iter()
                .copied()
                .chain(std::iter::repeat(AckOutcome::Unknown)),
        )
        .map(|(id, o)| json!({"id": id, "outcome": o.as_str()}))
        .collect();
    Ok(json_response(200, &json!({"results": results})))
}

fn tier(q: &EphemeralQueue) -> &'static str {
    if q.declared { "declared" } else { "implicit" }
}

fn drops(q: &EphemeralQueue) -> Value {
    json!({"bounds": q.view.drops.bounds, "ttl": q.view.drops.ttl, "retry": q.view.drops.retry})
}

fn options(o: &Options) -> Value {
    o.to_json()
}

/// A row of the queue listing.
fn queue_row(scope: &Scope, q: &EphemeralQueue) -> Value {
    json!({
        "queue": scope.local(&q.queue),
        "tier": tier(q),
        "depth": q.view.length,
        "bytes": q.view.bytes,
        "partitions": q.view.partitions.len(),
        "groups": q.view.groups.len(),
        "drops": drops(q),
        "options": options(&q.options),
    })
}

/// The depth answer.
fn depth(scope: &Scope, q: &EphemeralQueue, group: Option<&str>) -> Value {
    let pending: u64 = q.view.partitions.iter().map(|p| p.pending).sum();
    json!({
        "queue": scope.local(&q.queue),
        "group": group,
        "tier": tier(q),
        "length": q.view.length,
        "pending": pending,
        "partitionsPending": q.view.partitions.iter().filter(|p| p.pending > 0).count(),
        "bytes": q.view.bytes,
        "partitions": q.view.partitions.iter().map(|p| json!({
            "partition": p.partition, "length": p.length, "pending": p.pending, "bytes": p.bytes,
        })).collect::<Vec<_>>(),
        "groups": q.view.groups.iter().map(|g| json!({
            "group": g.group, "pending": g.pending, "inFlight": g.in_flight, "skipped": g.skipped,
        })).collect::<Vec<_>>(),
        "drops": drops(q),
        "options": options(&q.options),
    })
}
