//! The streams routes, `/streams/v1/{queries,cycle,state/get}`, that the official client's
//! streaming runtime calls. The rows and decisions are `queen_domain::streams`; a cycle is one
//! transaction entry (state writes as its KV rider, sink pushes and the source ack as its
//! operations, the ack's lease required), so it applies whole or not at all.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use queen_domain::command::TxnOp;
use queen_domain::ids::{LeaseId, TransactionId};
use queen_domain::names::GroupName;
use queen_domain::streams::{self, QueryRow, Registration, StateOp, StateQuery};
use queen_domain::tenant::Tenant;
use queen_ports::ClientApi;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::api::{ApiError, store_error};
use crate::error::json_answer;
use crate::tenancy::Scope;

/// Most state operations or pushes one cycle carries.
const MAX_CYCLE_ITEMS: usize = 10_000;

/// Rows one reset deletes per entry.
const WIPE_PAGE: usize = 1000;

/// Most entries one reset proposes before it gives up (10 million rows).
const MAX_WIPE_PAGES: usize = 10_000;

/// Route one request of the family; `rest` is the path after `/streams/v1`.
pub(crate) async fn route<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    method: &str,
    rest: &[&str],
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    match (method, rest) {
        ("POST", ["queries"]) => register(api, scope, body).await,
        ("POST", ["cycle"]) => cycle(api, scope, body).await,
        ("POST", ["state", "get"]) => state_get(api, scope, body).await,
        (_, ["queries"] | ["cycle"] | ["state", "get"]) => Err(ApiError::new(
            405,
            "method_not_allowed",
            format!("{method} is not served on this streams route; use POST"),
        )),
        _ => Err(ApiError::new(
            404,
            "no_such_route",
            format!("no route for {method} /streams/v1/{}", rest.join("/")),
        )),
    }
}

/// A required text of 1 to 256 bytes; ids may come as numbers.
fn text(m: &Map<String, Value>, k: &str) -> Result<String, ApiError> {
    let v = match m.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) if k.ends_with("_id") => n.to_string(),
        None | Some(Value::Null) => return Err(ApiError::bad_request(k, "is required")),
        Some(_) => return Err(ApiError::bad_request(k, "must be a string")),
    };
    if v.is_empty() || v.len() > streams::MAX_TEXT {
        return Err(ApiError::bad_request(
            k,
            &format!("must be 1 to {} bytes", streams::MAX_TEXT),
        ));
    }
    crate::fields::no_control(k, &v)?;
    Ok(v)
}

fn flag(m: &Map<String, Value>, k: &str, default: bool) -> Result<bool, ApiError> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(k, "must be true or false")),
    }
}

/// `POST /streams/v1/queries`: register a query, idempotently.
async fn register<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let m = crate::fields::object(body, false)?;
    let name = text(&m, "name")?;
    let source = text(&m, "source_queue")?;
    scope.queue(&source, "source_queue")?;
    let hash = text(&m, "config_hash")?;
    let sink = match m.get("sink_queue") {
        None | Some(Value::Null) => None,
        Some(_) => {
            let s = text(&m, "sink_queue")?;
            scope.queue(&s, "sink_queue")?;
            Some(s)
        }
    };
    let reset = flag(&m, "reset", false)?;
    // Two clients registering at once: the loser of the precondition reads again (bounded).
    for _ in 0..5 {
        api.read_barrier().await?;
        let now = api.now();
        let existing = streams::query(&*api.state(), &scope.tenant, &name, now)
            .map_err(|e| store_error(&e))?;
        let decision = streams::decide(existing.as_ref().map(|(q, _)| q), &hash, reset);
        let (row, version) = match (decision, existing) {
            (Registration::Mismatch { stored }, _) => {
                return Err(ApiError::new(
                    409,
                    "config_hash_mismatch",
                    format!(
                        "query '{name}' is registered with another operator chain (config_hash {stored}); pass reset to wipe its state"
                    ),
                ));
            }
            (Registration::Same, Some((q, _))) => return Ok(registered(&q, false, false)),
            (Registration::Reset, Some((q, version))) => {
                wipe(api, scope, &q.id).await?;
                let row = QueryRow {
                    config_hash: hash.clone(),
                    source_queue: source.clone(),
                    sink_queue: sink.clone(),
                    created_at: now.iso_millis(),
                    ..q
                };
                (row, Some(version))
            }
            _ => (
                QueryRow {
                    id: uuid::Uuid::now_v7().to_string(),
                    name: name.clone(),
                    source_queue: source.clone(),
                    sink_queue: sink.clone(),
                    config_hash: hash.clone(),
                    created_at: now.iso_millis(),
                },
                None,
            ),
        };
        let op = streams::store_query(&scope.tenant, &row, version).map_err(|e| {
            ApiError::new(
                500,
                "internal",
                format!("the query could not be encoded: {e}"),
            )
        })?;
        let out = api.kv(vec![op]).await?;
        if out.failed.is_none() {
            return Ok(registered(&row, version.is_none(), version.is_some()));
        }
    }
    Err(ApiError::new(
        409,
        "conflict",
        format!("query '{name}' kept changing while it was registered; try again"),
    ))
}

fn registered(q: &QueryRow, fresh: bool, reset: bool) -> Response<Full<Bytes>> {
    json_answer(
        200,
        &json!({
            "success": true,
            "query_id": q.id,
            "name": q.name,
            "source_queue": q.source_queue,
            "sink_queue": q.sink_queue,
            "fresh": fresh,
            "reset": reset,
        }),
    )
}

/// Delete every state row of a query, a page per entry.
async fn wipe<A: ClientApi>(api: &Arc<A>, scope: &Scope, query_id: &str) -> Result<(), ApiError> {
    for _ in 0..MAX_WIPE_PAGES {
        api.read_barrier().await?;
        let page = streams::wipe_page(&*api.state(), &scope.tenant, query_id, WIPE_PAGE)
            .map_err(|e| store_error(&e))?;
        if page.is_empty() {
            return Ok(());
        }
        api.kv(page).await?;
    }
    Err(ApiError::new(
        503,
        "unavailable",
        "the query's state is too large to wipe in one call; try again",
    ))
}

/// The shard a cycle or a read is about: the server's id of the query (`query_id` of its
/// registration's answer) and the source partition's id.
fn shard(m: &Map<String, Value>) -> Result<(String, String), ApiError> {
    Ok((text(m, "query_id")?, text(m, "partition_id")?))
}

/// The body of `POST /streams/v1/cycle`, read once: its small fields as values, and its two lists
/// (`state_ops`, `push_items`) as the raw text of each item, parsed later item by item (so a
/// payload's numbers stay as the client wrote them).
struct CycleIn<'a> {
    fields: Map<String, Value>,
    state_ops: Vec<&'a RawValue>,
    push_items: Vec<&'a RawValue>,
}

fn cycle_body(body: &[u8]) -> Result<CycleIn<'_>, ApiError> {
    let Ok(top) = serde_json::from_slice::<std::collections::BTreeMap<String, &RawValue>>(body)
    else {
        // Not an object: the same answer as every other route's body (read again only here).
        crate::fields::object(body, false)?;
        return Err(ApiError::bad_request("body", "must be a JSON object"));
    };
    let mut out = CycleIn {
        fields: Map::new(),
        state_ops: Vec::new(),
        push_items: Vec::new(),
    };
    for (key, raw) in top {
        let list = match key.as_str() {
            "state_ops" => &mut out.state_ops,
            "push_items" => &mut out.push_items,
            _ => {
                let v = serde_json::from_str(raw.get())
                    .map_err(|_| ApiError::bad_request(&key, "is not valid JSON"))?;
                out.fields.insert(key, v);
                continue;
            }
        };
        *list = serde_json::from_str::<Option<Vec<&RawValue>>>(raw.get())
            .map_err(|_| ApiError::bad_request("body", "state_ops and push_items must be lists"))?
            .unwrap_or_default();
    }
    Ok(out)
}

fn state_op(raw: &RawValue, i: usize) -> Result<StateOp, ApiError> {
    let at = |k: &str| format!("state_ops[{i}].{k}");
    #[derive(Deserialize)]
    struct Op<'a> {
        #[serde(rename = "type")]
        kind: Option<String>,
        key: Option<Value>,
        #[serde(borrow)]
        value: Option<&'a RawValue>,
    }
    let op: Op<'_> = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::bad_request(&format!("state_ops[{i}]"), "must be an object"))?;
    let key = match op.key {
        Some(Value::String(k)) if !k.is_empty() => k,
        _ => {
            return Err(ApiError::bad_request(
                &at("key"),
                "must be a non-empty string",
            ));
        }
    };
    match op.kind.as_deref() {
        Some("upsert") => Ok(StateOp::Upsert {
            key,
            value: op
                .value
                .map_or(b"null".to_vec(), |v| v.get().as_bytes().to_vec()),
        }),
        Some("delete") => Ok(StateOp::Delete { key }),
        _ => Err(ApiError::bad_request(
            &at("type"),
            "must be upsert or delete",
        )),
    }
}

/// `POST /streams/v1/cycle`: state writes, sink pushes and the source ack as one entry.
async fn cycle<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let parts = cycle_body(body)?;
    let m = &parts.fields;
    let (query_id, partition_id) = shard(m)?;
    let group = match m.get("consumer_group") {
        None | Some(Value::Null) => GroupName::queue_mode(),
        Some(Value::String(g)) => GroupName::or_queue_mode(Some(g.as_str()))
            .map_err(|e| ApiError::bad_request("consumer_group", &e.to_string()))?,
        Some(_) => return Err(ApiError::bad_request("consumer_group", "must be a string")),
    };
    let (raw_ops, raw_pushes) = (parts.state_ops, parts.push_items);
    if raw_ops.len() > MAX_CYCLE_ITEMS || raw_pushes.len() > MAX_CYCLE_ITEMS {
        return Err(ApiError::bad_request(
            "state_ops",
            &format!("state_ops and push_items hold at most {MAX_CYCLE_ITEMS} items each"),
        ));
    }
    let ops = raw_ops
        .iter()
        .enumerate()
        .map(|(i, r)| state_op(r, i))
        .collect::<Result<Vec<_>, _>>()?;

    // The ack: the last message of the partition's batch, which moves the group's cursor past
    // every message before it, under the batch's lease (required: a lost lease fails the cycle).
    let mut leases: Vec<LeaseId> = Vec::new();
    let mut txn: Vec<TxnOp> = Vec::new();
    // What makes this cycle's pushes its own: the message it acknowledges. A cycle without an
    // ack (an idle flush) has none: its pushes get fresh ids.
    let mut anchor = String::new();
    match m.get("ack") {
        None | Some(Value::Null) => {}
        Some(Value::Object(a)) => {
            let mut item = a.clone();
            item.insert("partitionId".into(), Value::String(partition_id.clone()));
            item.remove("count");
            let ack = crate::json::ack_item(&item, &|k| format!("ack.{k}"))?;
            if let Some(l) = &ack.lease_id {
                leases.push(l.clone());
            }
            anchor = ack.transaction_id.as_str().to_owned();
            txn.push(TxnOp::Ack { group, item: ack });
        }
        Some(_) => return Err(ApiError::bad_request("ack", "must be null or an object")),
    }
    for (i, raw) in raw_pushes.iter().enumerate() {
        let mut item = crate::json::push_item(raw, &format!("push_items[{i}]"))?;
        if !anchor.is_empty() {
            item.transaction_id =
                TransactionId::minted(streams::emit_id(&query_id, &partition_id, &anchor, i));
        }
        txn.push(TxnOp::Push(item));
    }
    let pushed = raw_pushes.len();
    let state_count = ops.len();
    // Written with the client's names: the router's helper puts them (and the pushes) under the
    // tenant, and checks the ack's partition and lease belong to it.
    let kv =
        streams::state_writes(&Tenant::default(), &query_id, &partition_id, ops).map_err(|i| {
            ApiError::bad_request(
                &format!("state_ops[{i}].key"),
                "is too long (a state key is at most about 900 bytes) or holds a NUL",
            )
        })?;
    let out = crate::writes::transaction(api, scope, txn, leases, &kv, Vec::new()).await?;
    Ok(json_answer(
        200,
        &json!({
            "success": out.success,
            "error": out.error,
            "query_id": query_id,
            "partition_id": partition_id,
            "state_ops": state_count,
            "pushed": pushed,
        }),
    ))
}

/// One state row as answered: the client's key and its JSON as written.
#[derive(Serialize)]
struct Row<'a> {
    key: &'a str,
    value: &'a RawValue,
}

/// The answer of a state read.
#[derive(Serialize)]
struct Rows<'a> {
    success: bool,
    rows: Vec<Row<'a>>,
}

/// `POST /streams/v1/state/get`: a shard's rows, all or by key, prefix and ripeness.
async fn state_get<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let m = crate::fields::object(body, false)?;
    let (query_id, partition_id) = shard(&m)?;
    let keys: Vec<String> = match m.get("keys") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|k| {
                k.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ApiError::bad_request("keys", "must be a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad_request("keys", "must be a list of strings")),
    };
    let key_prefix = match m.get("key_prefix") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) => Some(p.as_str()),
        Some(_) => return Err(ApiError::bad_request("key_prefix", "must be a string")),
    };
    let ripe = match m.get("ripe_at_or_before") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_f64(),
        Some(_) => {
            return Err(ApiError::bad_request(
                "ripe_at_or_before",
                "must be epoch milliseconds",
            ));
        }
    };
    api.read_barrier().await?;
    let want = StateQuery {
        keys: &keys,
        key_prefix,
        ripe_at_or_before: ripe,
    };
    let rows = streams::state_rows(
        &*api.state(),
        &scope.tenant,
        &query_id,
        &partition_id,
        &want,
        api.now(),
    )
    .map_err(|e| match e {
        streams::StateReadError::Store(e) => store_error(&e),
        e @ streams::StateReadError::TooMany => ApiError::new(413, "too_large", e.to_string()),
    })?;
    let rows: Vec<Row<'_>> = rows.iter().map(|(k, v)| Row { key: k, value: v }).collect();
    Ok(json_answer(
        200,
        &Rows {
            success: true,
            rows,
        },
    ))
}
