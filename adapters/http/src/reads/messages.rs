//! The message browsing routes: a queue's stored messages with where each stands for one
//! consumer group (`pending`, `processing`, `completed`, `dead_letter`), and one message by its
//! partition and transactionId. Payloads of encrypted queues are answered opened, and every
//! payload verbatim (numbers as the producer wrote them).

use queen_domain::browse::{self, Browsed, Status};

use super::*;

/// Most messages one page lists.
const MAX_PAGE: u64 = 1000;

/// One browsed message.
#[derive(Serialize)]
struct BrowsedOut<'a> {
    id: String,
    #[serde(rename = "transactionId")]
    transaction_id: &'a str,
    #[serde(rename = "partitionId")]
    partition_id: String,
    partition: &'a str,
    queue: &'a str,
    offset: u64,
    status: &'static str,
    #[serde(rename = "consumerGroup")]
    consumer_group: &'a str,
    #[serde(rename = "createdAt")]
    created_at: String,
    #[serde(rename = "traceId")]
    trace_id: Option<&'a str>,
    #[serde(rename = "producerSub")]
    producer_sub: Option<&'a str>,
    data: StoredJson<'a>,
    /// The detail route also names it `payload`.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<StoredJson<'a>>,
}

#[derive(Serialize)]
struct Page<'a> {
    messages: Vec<BrowsedOut<'a>>,
    pagination: Value,
}

fn out<'a>(
    scope: &Scope,
    b: &'a Browsed,
    payload: &'a [u8],
    group: &'a str,
    detail: bool,
) -> BrowsedOut<'a> {
    BrowsedOut {
        id: uuid::Uuid::from_bytes(b.message.id).to_string(),
        transaction_id: &b.message.transaction_id,
        partition_id: b.partition.pid.to_string(),
        partition: &b.partition.name,
        queue: scope.local(&b.partition.queue),
        offset: b.offset,
        status: b.status.as_str(),
        consumer_group: crate::render::group_on_wire(group),
        created_at: b.message.stamp.iso_millis(),
        trace_id: b.message.trace_id.as_deref(),
        producer_sub: b.message.producer.as_deref(),
        data: StoredJson(payload),
        payload: detail.then_some(StoredJson(payload)),
    }
}

fn group_of(q: &[(String, String)]) -> Result<String, ApiError> {
    let g = GroupName::or_queue_mode(q_get(q, "consumerGroup"))
        .map_err(|e| ApiError::bad_request("consumerGroup", &e.to_string()))?;
    Ok(g.as_str().to_owned())
}

/// The cursor of a message listing: `<partition id>.<offset>`, exclusive.
fn after_message(q: &[(String, String)]) -> Result<Option<(u64, u64)>, ApiError> {
    let bad = || ApiError::bad_request("after", "is not a cursor this broker issued");
    q_get(q, "after")
        .map(|a| {
            let (pid, offset) = a.split_once('.').ok_or_else(bad)?;
            Ok((
                pid.parse().map_err(|_| bad())?,
                offset.parse().map_err(|_| bad())?,
            ))
        })
        .transpose()
}

/// `GET /api/v1/messages?queue=&partition=&status=&consumerGroup=&limit=&offset=&after=`: one
/// page, read off the runtime's threads; at most `browse::MAX_SCANNED` messages are read per
/// call, so a filtered page may come back short with a `nextCursor` to continue from.
pub(crate) async fn list<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let queue = q_get(&q, "queue").ok_or_else(|| ApiError::bad_request("queue", "is required"))?;
    let queue = scope.queue(queue, "queue")?;
    let only = match q_get(&q, "status") {
        None => None,
        Some(w) => Some(Status::parse(w).ok_or_else(|| {
            ApiError::bad_request(
                "status",
                "must be pending, processing, completed or dead_letter",
            )
        })?),
    };
    let group = group_of(&q)?;
    let limit = q_num(&q, "limit", 100)?.clamp(1, MAX_PAGE);
    let offset = q_num(&q, "offset", 0)?;
    let after = after_message(&q)?;
    api.read_barrier().await?;
    let scope = scope.clone();
    super::heavy::off_runtime(api, move |api| {
        let state = api.state();
        let listing = browse::list(
            &*state,
            queue.as_str(),
            q_get(&q, "partition"),
            &group,
            only,
            usize::try_from(offset).unwrap_or(usize::MAX),
            limit as usize,
            after,
            api.now(),
        )
        .map_err(|e| store_err(&e))?;
        let payloads: Vec<std::borrow::Cow<'_, [u8]>> = listing
            .page
            .iter()
            .map(|b| api.open_payload(&b.message.payload))
            .collect();
        let messages = listing
            .page
            .iter()
            .zip(&payloads)
            .map(|(b, p)| out(&scope, b, p, &group, false))
            .collect();
        let next = listing.next.map(|(pid, off)| format!("{pid}.{off}"));
        Ok(json_answer(
            200,
            &Page {
                messages,
                pagination: json!({"limit": limit, "offset": offset, "total": listing.total,
                    "truncated": next.is_some(), "nextCursor": next}),
            },
        ))
    })
    .await
}

/// `GET /api/v1/messages/{partitionId}/{transactionId}`: 404 when the partition is unknown, is
/// another tenant's, or holds no such message.
pub(crate) async fn one<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    partition_id: &str,
    transaction_id: &str,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let group = group_of(&q)?;
    let not_found = || ApiError::new(404, "message_not_found", "no such message");
    let pid: u64 = partition_id.trim().parse().map_err(|_| not_found())?;
    api.read_barrier().await?;
    let state = api.state();
    let owner = reads::partition_queue(&*state, pid).map_err(|e| store_err(&e))?;
    if !owner.is_some_and(|q| scope.owns(&q)) {
        return Err(not_found());
    }
    let b = browse::one(&*state, pid, transaction_id, &group, api.now())
        .map_err(|e| store_err(&e))?
        .ok_or_else(not_found)?;
    let payload = api.open_payload(&b.message.payload);
    Ok(json_answer(200, &out(scope, &b, &payload, &group, true)))
}

/// The partition of a message route, checked to be this tenant's: 404 otherwise.
fn our_partition<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    partition_id: &str,
) -> Result<u64, ApiError> {
    let not_found = || ApiError::new(404, "message_not_found", "no such message");
    let pid: u64 = partition_id.trim().parse().map_err(|_| not_found())?;
    let owner = reads::partition_queue(&*api.state(), pid).map_err(|e| store_err(&e))?;
    if owner.is_some_and(|q| scope.owns(&q)) {
        Ok(pid)
    } else {
        Err(not_found())
    }
}

/// Propose the change `make` builds for a message of this tenant, and answer it.
async fn change<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    partition_id: &str,
    transaction_id: &str,
    make: impl FnOnce(u64, queen_domain::ids::TransactionId) -> Command,
) -> Result<Response<Full<Bytes>>, ApiError> {
    use queen_domain::command::MessageChange;
    let txn = queen_domain::ids::TransactionId::new(transaction_id)
        .map_err(|e| ApiError::bad_request("transactionId", &e.to_string()))?;
    api.read_barrier().await?;
    let pid = our_partition(api, scope, partition_id)?;
    let out = api.command(make(pid, txn)).await?;
    let Some(change) = out.into_message_change() else {
        return Err(ApiError::new(
            500,
            "internal",
            "the log answered another command",
        ));
    };
    let head =
        json!({"success": true, "partitionId": partition_id, "transactionId": transaction_id});
    match change {
        MessageChange::Deleted => Ok(json_response(200, &head)),
        MessageChange::Retried {
            offset,
            transaction_id: copy,
            group,
        } => {
            let mut v = head;
            v["retried"] = json!({
                "transactionId": copy,
                "offset": offset,
                "consumerGroup": crate::render::group_on_wire(&group),
            });
            Ok(json_response(200, &v))
        }
        MessageChange::NotFound => Err(ApiError::new(
            404,
            "message_not_found",
            "no such message (or no such dead letter) in this partition",
        )),
        MessageChange::Refused(why) => Err(ApiError::bad_request("consumerGroup", &why)),
    }
}

/// `DELETE /api/v1/messages/{partitionId}/{transactionId}`: no pop delivers the message again.
pub(crate) async fn delete<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    partition_id: &str,
    transaction_id: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    change(api, scope, partition_id, transaction_id, |pid, txn| {
        Command::DeleteMessage {
            pid,
            transaction_id: txn,
        }
    })
    .await
}

/// `POST /api/v1/messages/{partitionId}/{transactionId}/retry[?consumerGroup=]`: the dead
/// letter is delivered again to the group it died in.
pub(crate) async fn retry<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    partition_id: &str,
    transaction_id: &str,
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let group = match q_get(&q, "consumerGroup") {
        None => None,
        Some(g) => Some(
            GroupName::or_queue_mode(Some(g))
                .map_err(|e| ApiError::bad_request("consumerGroup", &e.to_string()))?,
        ),
    };
    change(api, scope, partition_id, transaction_id, |pid, txn| {
        Command::RetryDeadLetter {
            pid,
            transaction_id: txn,
            group,
            message_id: *crate::json::uuid_v7().as_bytes(),
        }
    })
    .await
}
