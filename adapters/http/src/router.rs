//! Routing: method and percent-decoded path segments to handlers.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response};
use queen_domain::command::Outcome;
use queen_domain::ids::LeaseId;
use serde_json::{Value, json};

use crate::api::ApiError;
use crate::error::{
    error_response, json_answer, json_answer_sized, json_response, no_content, text_response,
};
use crate::tenancy::Scope;
use crate::writes::{BodyKind, push, push_body, transaction};
use crate::{json, kv_json, pop_frames, pop_query, push_binary, reads, render};
use queen_ports::{ClientApi, Member, NotReady};

/// Decode every path segment; empty segments (doubled slashes) are dropped. A segment whose
/// percent-escapes do not decode to UTF-8 (`%ff`) is a 400, never a replacement character.
pub(crate) fn segments(path: &str) -> Result<Vec<String>, ApiError> {
    path.split('/')
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(std::borrow::Cow::into_owned)
                .map_err(|_| {
                    ApiError::new(
                        400,
                        "bad_path",
                        format!(
                            "path segment {} does not decode to UTF-8 (a bad percent-escape)",
                            i + 1
                        ),
                    )
                })
        })
        .collect()
}

/// The route a request matched, as a metrics label.
pub(crate) fn route_label(method: &Method, segs: &[&str]) -> &'static str {
    match (method.as_str(), segs) {
        ("POST", ["api", "v1", "push"]) => "push",
        ("GET", ["api", "v1", "pop", "queue", _])
        | ("GET", ["api", "v1", "pop", "queue", _, "partition", _])
        | ("GET", ["api", "v1", "pop"]) => "pop",
        ("POST", ["api", "v1", "ack"]) => "ack",
        ("POST", ["api", "v1", "ack", "batch"]) => "ack_batch",
        ("POST", ["api", "v1", "lease", _, "extend"]) => "lease_extend",
        ("POST", ["api", "v1", "transaction"]) => "transaction",
        ("POST", ["api", "v1", "kv"]) | (_, ["api", "v1", "kv", _, ..]) => "kv",
        ("POST", ["api", "v1", "locks"]) => "locks",
        ("POST", ["api", "v1", "fetch"]) => "fetch",
        ("POST", ["api", "v1", "partitions", "changed"]) => "partitions_changed",
        ("GET", ["api", "v1", "dlq"]) => "dlq",
        (_, ["api", "v1", "messages", ..]) => "messages",
        (_, ["api", "v1", "ephemeral", ..]) => "ephemeral",
        (_, ["api", "v1", "timers", ..]) => "timers",
        (_, ["api", "v1", "traces", ..]) => "traces",
        (_, ["streams", "v1", ..]) => "streams",
        (_, ["api", "v1", "consumer-groups", ..]) => "consumer_groups",
        ("GET", ["api", "v1", "status", "analytics"] | ["api", "v1", "analytics", _]) => {
            "analytics"
        }
        ("GET", ["api", "v1", "status" | "resources", ..]) => "resources",
        ("POST", ["api", "v1", "configure"]) => "configure",
        ("DELETE", ["api", "v1", "resources", "queues", _]) => "queue_delete",
        ("GET", ["health"]) => "health",
        (_, ["api", "v1", "system", "raft", ..]) => "membership",
        ("GET", ["status"]) => "status",
        ("GET", ["metrics", "prometheus"]) => "metrics",
        ("GET" | "HEAD", [] | ["dashboard", ..]) => "dashboard",
        _ => "other",
    }
}

/// Whether the route takes a body (others refuse nothing; their body is ignored).
pub(crate) async fn handle<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    method: &Method,
    segs: &[&str],
    query: &str,
    body: &[u8],
    kind: BodyKind,
) -> Result<Response<Full<Bytes>>, ApiError> {
    if let BodyKind::Binary { max_decoded } = kind {
        return binary(api, scope, method, segs, body, max_decoded).await;
    }
    // The node-wide pages name every tenant's queues: they are the operator's, not a tenant's.
    if scope.names_a_tenant() && matches!(segs, ["status"] | ["metrics", ..]) {
        return Err(ApiError::new(
            403,
            "forbidden",
            "the node-wide status and metrics name every tenant's queues; a request acting for a tenant cannot read them",
        ));
    }
    match (method.as_str(), segs) {
        ("POST", ["api", "v1", "push"]) => push(api, scope, push_body(body, kind)?).await,
        ("GET", ["api", "v1", "pop", "queue", queue]) => pop(api, scope, queue, None, query).await,
        ("GET", ["api", "v1", "pop"]) => {
            let q = pop_query::parse_query(query);
            let tag = |k: &str| {
                q.iter()
                    .find(|(a, _)| a == k)
                    .map(|(_, v)| v.clone())
                    .filter(|v| !v.is_empty())
            };
            // Tags are stored under the tenant's scope, so only its queues match.
            let (namespace, task) = (
                tag("namespace").map(|n| scope.name(&n)),
                tag("task").map(|t| scope.name(&t)),
            );
            if namespace.is_none() && task.is_none() {
                return Err(ApiError::bad_request("namespace", "or task is required"));
            }
            // The queue is chosen among the tagged ones; the placeholder name is never used.
            let mut req = pop_query::pop_request("tagged", None, query)?;
            scope.name_consumer(&mut req);
            let frames = pop_query::wants_frames(query)?;
            let group = req.command.group.as_str().to_owned();
            let (queue, out) = api.pop_tagged(namespace, task, req).await?;
            Ok(pop_answer(scope.local(&queue), &group, &out, frames))
        }
        ("GET", ["api", "v1", "pop", "queue", queue, "partition", partition]) => {
            pop(api, scope, queue, Some(partition), query).await
        }
        ("POST", ["api", "v1", "ack"]) => {
            let (group, mut item) = json::ack_single(body)?;
            if scope.guarded() {
                scope.acks(&*api.state(), std::iter::once(&mut item))?;
            }
            let out = api.ack(group, vec![item]).await?;
            Ok(json_answer_sized(
                200,
                &render::acks(&out),
                render::acks_len_hint(&out),
            ))
        }
        ("POST", ["api", "v1", "ack", "batch"]) => {
            let (group, mut items) = json::ack_batch(body)?;
            if items.is_empty() {
                return Ok(json_response(200, &json!([])));
            }
            if scope.guarded() {
                scope.acks(&*api.state(), items.iter_mut())?;
            }
            let out = api.ack(group, items).await?;
            Ok(json_answer_sized(
                200,
                &render::acks(&out),
                render::acks_len_hint(&out),
            ))
        }
        ("POST", ["api", "v1", "transaction"]) => {
            let (ops, leases, kv, timers) = json::transaction(body)?;
            let id = json::uuid_v7().to_string();
            let out = transaction(api, scope, ops, leases, &kv, timers).await?;
            Ok(json_answer(200, &render::transaction(&out, &kv, &id)))
        }
        ("POST", ["api", "v1", "kv"]) => {
            let ops = kv_json::kv_ops(body, false)?;
            let mut scoped = ops.clone();
            scope.kv(&mut scoped);
            let out = api.kv(scoped).await?;
            if let Some(e) = overflow_refusal(&ops, &out) {
                return Err(e);
            }
            Ok(json_answer(200, &kv_json::outcome(&ops, &out)))
        }
        ("POST", ["api", "v1", "locks"]) => {
            let ops = kv_json::lock_ops(body, &|| format!("anon:{}", json::uuid_v7()))?;
            let mut scoped = ops.clone();
            scope.locks(&mut scoped);
            let out = api.locks(scoped).await?;
            Ok(json_response(200, &kv_json::lock_results(&ops, &out)))
        }
        (method @ ("GET" | "PUT" | "DELETE"), ["api", "v1", "kv", ns, key @ ..])
            if !key.is_empty() =>
        {
            kv_path(api, scope, method, ns, &key.join("/"), body).await
        }
        ("POST", ["api", "v1", "lease", lease_id, "extend"]) => {
            let id = LeaseId::new(*lease_id)
                .map_err(|e| ApiError::bad_request("leaseId", &e.to_string()))?;
            // Another tenant's lease is answered as an unknown one.
            let out = if scope.lease_ours(&*api.state(), id.as_str())? {
                api.extend(id).await?
            } else {
                Outcome::Extend {
                    success: false,
                    renewed: 0,
                    expires: None,
                }
            };
            let Outcome::Extend {
                success,
                renewed,
                expires,
            } = out
            else {
                return Err(ApiError::new(500, "internal", "unexpected outcome"));
            };
            let mut v = json!({
                "leaseId": lease_id,
                "success": success,
                "renewed": renewed,
                "newExpiresAt": expires.map(|e| e.iso_millis()),
            });
            if !success {
                v["error"] = json!("lease expired, released or unknown");
            }
            Ok(json_response(200, &v))
        }
        ("POST", ["api", "v1", "configure"]) => {
            let (queue, namespace, task, options) = json::configure(body)?;
            let name = queue.as_str().to_owned();
            let eff = api
                .configure(
                    scope.tenant.scope_queue(queue),
                    namespace.as_deref().map(|n| scope.name(n)),
                    task.as_deref().map(|t| scope.name(t)),
                    options,
                )
                .await?;
            Ok(json_response(
                200,
                &json!({"success": true, "queue": name, "namespace": namespace, "task": task, "options": eff.to_json()}),
            ))
        }
        ("DELETE", ["api", "v1", "resources", "queues", queue]) => {
            let q = scope.queue(queue, "queue")?;
            let existed = api.delete_queue(q).await?;
            Ok(json_response(
                200,
                &json!({"deleted": true, "queue": queue, "existed": existed}),
            ))
        }
        ("POST", ["api", "v1", "fetch"]) => reads::fetch(api, scope, body).await,
        ("POST", ["api", "v1", "partitions", "changed"]) => reads::changed(api, scope, body).await,
        ("GET", ["api", "v1", "dlq"]) => reads::dlq(api, scope, query).await,
        ("GET", ["api", "v1", "messages"]) => reads::messages::list(api, scope, query).await,
        ("GET", ["api", "v1", "messages", pid, txn]) => {
            reads::messages::one(api, scope, pid, txn, query).await
        }
        ("DELETE", ["api", "v1", "messages", pid, txn]) => {
            reads::messages::delete(api, scope, pid, txn).await
        }
        ("POST", ["api", "v1", "messages", pid, txn, "retry"]) => {
            reads::messages::retry(api, scope, pid, txn, query).await
        }
        (m, ["api", "v1", "consumer-groups", rest @ ..]) => {
            reads::groups(api, scope, m, rest, query, body).await
        }
        (m, ["api", "v1", "ephemeral", rest @ ..]) => {
            crate::ephemeral_json::route(api, scope, m, rest, query, body).await
        }
        ("GET", ["api", "v1", rest @ ..])
            if matches!(rest, ["status", "analytics"] | ["analytics", _]) =>
        {
            crate::analytics_json::route(api, scope, rest, query).await
        }
        (m, ["streams", "v1", rest @ ..]) => {
            crate::streams_json::route(api, scope, m, rest, body).await
        }
        (m, ["api", "v1", "traces", rest @ ..]) => {
            crate::traces_json::route(api, scope, m, rest, query, body).await
        }
        (m, ["api", "v1", "timers", rest @ ..]) => {
            crate::timers_json::route(api, scope, m, rest, query, body).await
        }
        ("DELETE", ["api", "v1", "resources", "tenant"]) => {
            reads::purge_tenant(api, scope, query).await
        }
        ("POST", ["api", "v1", "stats", "refresh"]) => {
            Ok(json_response(200, &json!({"success": true})))
        }
        ("GET", ["api", "v1", rest @ ("status" | "resources"), tail @ ..]) => {
            let mut segs = vec![*rest];
            segs.extend_from_slice(tail);
            reads::resources(api, scope, &segs, query).await
        }
        ("GET", ["metrics"]) => {
            let h = api.health();
            Ok(json_response(
                200,
                &json!({"uptime": Value::Null, "raft": h.progress, "ready": h.not_ready.is_none()}),
            ))
        }
        ("GET", ["api", "v1", "system", "raft", "nodes"]) => {
            Ok(json_response(200, &api.nodes().await?))
        }
        ("GET", ["api", "v1", "system", "raft", "membership"]) => Ok(json_response(
            200,
            &members_answer(api.membership(queen_ports::MembershipOp::List).await?),
        )),
        ("DELETE", ["api", "v1", "system", "raft", "membership", "members", _])
        | (
            "POST",
            [
                "api",
                "v1",
                "system",
                "raft",
                "membership",
                "learners" | "promote",
            ],
        ) => {
            let op = membership_op(method, segs, body)?;
            Ok(json_response(
                200,
                &members_answer(api.membership(op).await?),
            ))
        }
        ("GET", ["health"]) => Ok(health(&[&**api])),
        ("GET", ["status"]) => Ok(json_response(200, &status(&**api).await?)),
        ("GET", ["metrics", "prometheus"]) => Ok(text_response(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            api.metrics_text(),
        )),
        (_, ["api", "v1", "push" | "ack" | "configure" | "transaction"])
        | (_, ["api", "v1", "ack", "batch"]) => Err(ApiError::new(
            405,
            "method_not_allowed",
            format!("{method} is not served on this route"),
        )),
        _ => Err(ApiError::new(
            404,
            "no_such_route",
            format!("no route for {method} /{}", segs.join("/")),
        )),
    }
}

/// A KV call that wrote nothing because an `incr` overflowed is a 400 naming the operation
/// (overflow is known only when the entry applies, on every replica alike; the call then had
/// no effect). A call in which other writes took effect answers 200 with the per-operation
/// results instead, `reason: "overflow"` on the one that did not.
fn overflow_refusal(
    ops: &[queen_domain::kv::KvOp],
    out: &queen_domain::kv::KvOutcome,
) -> Option<ApiError> {
    use queen_domain::kv::{KvOp, KvResult};
    let overflowed = out.results.iter().position(|r| matches!(r, KvResult::Write { applied: false, reason: Some(why), .. } if why == "overflow"))?;
    let wrote = ops.iter().zip(&out.results).any(|(op, r)| {
        !matches!(
            op,
            KvOp::Get { .. } | KvOp::GetMany { .. } | KvOp::GetPrefix { .. } | KvOp::Check { .. }
        ) && matches!(r, KvResult::Write { applied: true, .. })
    });
    if wrote && out.failed.is_none() {
        return None;
    }
    Some(ApiError::new(
        400,
        "kv_overflow",
        format!(
            "operations[{overflowed}].delta would take the value out of range (exact integers are 64-bit signed; a float sum must be finite); nothing was written"
        ),
    ))
}

/// The path form of KV: `PUT|GET|DELETE /api/v1/kv/<ns>/<key>`.
async fn kv_path<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    method: &str,
    ns: &str,
    key: &str,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    use queen_domain::kv::{KvOp, KvResult, check_key, check_ns};
    check_ns(ns).map_err(|e| ApiError::bad_request("ns", &e.to_string()))?;
    check_key(key).map_err(|e| ApiError::bad_request("key", &e.to_string()))?;
    crate::fields::no_control("key", key)?;
    let (ns, key) = (ns.to_owned(), key.to_owned());
    let op = match method {
        "GET" => KvOp::Get { ns, key },
        "DELETE" => KvOp::Delete {
            ns,
            key,
            expect: None,
            required: false,
        },
        // The value is stored as the client wrote it.
        _ => kv_json::path_put(body, ns, key)?,
    };
    kv_json::client_write(&op, "ns")?;
    let mut scoped = [op.clone()];
    scope.kv(&mut scoped);
    let out = api.kv(scoped.into()).await?;
    let Some(r) = out.results.first() else {
        return Err(ApiError::new(500, "internal", "no result"));
    };
    if matches!(r, KvResult::Get(None)) {
        return Err(ApiError::new(404, "not_found", "no such key"));
    }
    Ok(json_answer(200, &kv_json::result(0, &op, r)))
}

async fn pop<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    queue: &str,
    partition: Option<&str>,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let mut req = pop_query::pop_request(queue, partition, query)?;
    req.command.queue = scope.tenant.scope_queue(req.command.queue);
    scope.name_consumer(&mut req);
    // Read before the pop: a bad value must be refused before anything is leased.
    let frames = pop_query::wants_frames(query)?;
    let group = req.command.group.as_str().to_owned();
    let out = api.pop(req).await?;
    Ok(pop_answer(queue, &group, &out, frames))
}

/// A pop's answer: 204 when empty without an autopilot or conflation echo to carry
/// (contract 2.0.7, 2.0.8), QPF1 when the query asked for `frames` and every message can be
/// framed (never with a conflation echo), JSON otherwise.
fn pop_answer(
    queue: &str,
    group: &str,
    popped: &queen_ports::Popped,
    frames: bool,
) -> Response<Full<Bytes>> {
    let (out, echo) = (&popped.outcome, popped.autopilot);
    let echo_conflation = out.conflation.any();
    if out.is_empty() && echo.is_none() && !echo_conflation {
        return no_content();
    }
    if frames
        && !echo_conflation
        && let Some(framed) = pop_frames::encode(queue, group, out, echo)
    {
        return text_response(200, pop_frames::CONTENT_TYPE, framed);
    }
    text_response(
        200,
        "application/json",
        render::pop_json(queue, group, out, echo),
    )
}

/// A request with the binary content type: QPB1 on push, QTB1 on transaction. The whole body
/// is read and checked before the use case is called, so a bad body stores nothing.
async fn binary<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    method: &Method,
    segs: &[&str],
    body: &[u8],
    max_decoded: usize,
) -> Result<Response<Full<Bytes>>, ApiError> {
    match (method.as_str(), segs) {
        ("POST", ["api", "v1", "push"]) => {
            push(
                api,
                scope,
                push_body(body, BodyKind::Binary { max_decoded })?,
            )
            .await
        }
        ("POST", ["api", "v1", "transaction"]) => {
            let txn = push_binary::transaction(body, max_decoded)?;
            let (ops, leases, kv, timers) = txn.request;
            let id = json::uuid_v7().to_string();
            let out = transaction(api, scope, ops, leases, &kv, timers).await?;
            if txn.counts {
                return Ok(json_answer(
                    200,
                    &render::transaction_counted(&out, &kv, &id),
                ));
            }
            Ok(json_answer(200, &render::transaction(&out, &kv, &id)))
        }
        _ => Err(ApiError::new(
            415,
            "unsupported_media_type",
            format!(
                "{} bodies are read by POST /api/v1/push and POST /api/v1/transaction only; send JSON here",
                push_binary::CONTENT_TYPE
            ),
        )),
    }
}

/// A membership change, read from its route and body (`None`-free: the caller matched one of
/// the three change routes).
fn membership_op(
    method: &Method,
    segs: &[&str],
    body: &[u8],
) -> Result<queen_ports::MembershipOp, ApiError> {
    match (method.as_str(), segs) {
        ("GET", ["api", "v1", "system", "raft", "membership"]) => {
            Ok(queen_ports::MembershipOp::List)
        }
        ("DELETE", ["api", "v1", "system", "raft", "membership", "members", id]) => {
            let id = id
                .parse::<u64>()
                .map_err(|_| ApiError::bad_request("id", "must be a node id"))?;
            Ok(queen_ports::MembershipOp::Remove { id })
        }
        ("POST", ["api", "v1", "system", "raft", "membership", "learners"]) => {
            let m = json::object(body, false)?;
            let id = m
                .get("id")
                .and_then(Value::as_u64)
                .filter(|i| *i > 0)
                .ok_or_else(|| {
                    ApiError::bad_request("id", "must be a node id (a number from 1)")
                })?;
            let addr = |k: &str| -> Result<String, ApiError> {
                let v = json::opt_str(&m, k, k)?
                    .ok_or_else(|| ApiError::bad_request(k, "is required (host:port)"))?;
                match v.rsplit_once(':') {
                    Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0) => Ok(v),
                    _ => Err(ApiError::bad_request(k, "must be host:port")),
                }
            };
            Ok(queen_ports::MembershipOp::AddLearner {
                id,
                raft: addr("raft")?,
                http: addr("http")?,
            })
        }
        ("POST", ["api", "v1", "system", "raft", "membership", "promote"]) => {
            let m = json::object(body, false)?;
            let ids = match m.get("ids") {
                Some(Value::Array(a)) if !a.is_empty() => a
                    .iter()
                    .map(|v| v.as_u64().filter(|i| *i > 0))
                    .collect::<Option<Vec<u64>>>()
                    .ok_or_else(|| ApiError::bad_request("ids", "must hold node ids"))?,
                _ => {
                    return Err(ApiError::bad_request(
                        "ids",
                        "must be a non-empty list of node ids",
                    ));
                }
            };
            let force = match m.get("force") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(ApiError::bad_request("force", "must be true or false")),
            };
            Ok(queen_ports::MembershipOp::Promote { ids, force })
        }
        _ => Err(ApiError::new(
            404,
            "no_such_route",
            format!("no route for {method} /{}", segs.join("/")),
        )),
    }
}

/// A membership change (or the listing) on a node of several raft groups: the same change in
/// every group, one group after the other from group 0 (a learner's raft address is group 0's; group `g` gets
/// its port plus `g`). A group that refuses stops the walk: the answer names it, and the
/// groups before it keep the change (repeat the call once the cause is fixed: a change a
/// group already has is harmless to repeat).
pub(crate) async fn membership_everywhere<A: ClientApi>(
    apis: &[Arc<A>],
    method: &Method,
    segs: &[&str],
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let op = membership_op(method, segs, body)?;
    let mut answers = Vec::with_capacity(apis.len());
    for (g, api) in apis.iter().enumerate() {
        let group = u16::try_from(g).unwrap_or(u16::MAX);
        let op = match &op {
            queen_ports::MembershipOp::AddLearner { id, raft, http } => {
                queen_ports::MembershipOp::AddLearner {
                    id: *id,
                    raft: queen_domain::groups::group_raft_addr(raft, group).ok_or_else(|| {
                        ApiError::bad_request(
                            "raft",
                            &format!("plus group {group} is past the last port"),
                        )
                    })?,
                    http: http.clone(),
                }
            }
            other => other.clone(),
        };
        match api.membership(op).await {
            Ok(members) => answers.push(members_answer(members)),
            Err(e) => {
                let e = ApiError::from(e);
                return Err(ApiError::new(
                    e.status,
                    e.code,
                    format!(
                        "group {g} refused the change ({}); groups before it have it",
                        e.message
                    ),
                ));
            }
        }
    }
    let mut v = answers.first().cloned().unwrap_or(Value::Null);
    v["groups"] = Value::Array(answers);
    Ok(json_response(200, &v))
}

/// One group's `/status` document, through a JSON value so the keys come out in the same
/// (sorted) order as every other document of the node.
async fn status<A: ClientApi>(api: &A) -> Result<Value, ApiError> {
    serde_json::to_value(api.status().await?).map_err(|e| {
        tracing::error!(target: "queen-http", error = %e, "the status could not be encoded");
        ApiError::new(
            500,
            "internal",
            "the status could not be encoded; see the node's log",
        )
    })
}

/// `GET /status` on a node of several raft groups: group 0's document (the node's own block,
/// the sink's, the ephemeral queues') with `groups`, every group's document in order.
pub(crate) async fn status_groups<A: ClientApi>(
    apis: &[Arc<A>],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let mut all = Vec::with_capacity(apis.len());
    for api in apis {
        all.push(status(&**api).await?);
    }
    let mut top = all.first().cloned().unwrap_or(Value::Null);
    top["groups"] = Value::Array(all);
    Ok(json_response(200, &top))
}

/// `GET /health`: group 0's figures under `raft` (a node's own with one group); with several
/// groups also `groups`, each group's figures, and the node serves only when every group does.
pub(crate) fn health<A: ClientApi>(apis: &[&A]) -> Response<Full<Bytes>> {
    let views: Vec<queen_ports::HealthView> = apis.iter().map(|a| a.health()).collect();
    let raft = |h: &queen_ports::HealthView| {
        let p = &h.progress;
        json!({
            "nodeId": p.node_id,
            "role": p.role,
            "leader": p.leader.is_some(),
            "leaderId": p.leader,
            "term": p.term,
            "applied": p.applied,
            "commit": p.commit,
            "lag": p.commit.saturating_sub(p.applied),
            "storageReady": p.storage_ready,
            "leaderContactMs": p.leader_contact_ms,
            "clusterVersion": h.cluster_version,
            "kinds": h.kinds,
            "apply": {"failure": h.apply_failure, "skipped": []},
        })
    };
    let not_ready = views.iter().find_map(|h| h.not_ready);
    let mut v = json!({
        "status": not_ready.map_or("healthy", NotReady::as_str),
        "raft": views.first().map(raft),
    });
    if views.len() > 1 {
        v["groups"] = views
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let mut g = raft(h);
                g["group"] = json!(i);
                g["status"] = json!(h.not_ready.map_or("healthy", NotReady::as_str));
                g
            })
            .collect();
    }
    json_response(if not_ready.is_none() { 200 } else { 503 }, &v)
}

/// Turn a handler result into a response.
pub(crate) fn finish(r: Result<Response<Full<Bytes>>, ApiError>) -> Response<Full<Bytes>> {
    r.unwrap_or_else(|e| error_response(&e))
}

/// The answer of every membership route: the members as the leader sees them.
fn members_answer(members: Vec<Member>) -> Value {
    json!({"success": true, "members": members})
}
