//! The consumer-group admin routes: listing groups with their lag, one group, seeking, deleting.
//! A group's queue may hold 100,000 partitions, so the listings are pages: the group list by
//! group rows (each row's lag summed over at most `pages::WALK_BUDGET` partitions), the lagging
//! list and one group's detail by (group row, partition); the cursor of the next page is in the
//! `x-queen-next-cursor` header (the answers' shapes stay the contract's). The work runs off the
//! runtime's threads (see `heavy`).

use queen_domain::pages::{self, Flow, GroupRow, WALK_BUDGET};

use super::heavy::{after_bytes, hex, off_runtime, page_limit, with_next};
use super::*;

/// Default rows of a group list page.
const GROUPS_PAGE: usize = 100;
/// Default rows of a lagging or group detail page.
const PARTITIONS_PAGE: usize = 1000;

/// A group's standing on one partition: (offset lag, oldest unconsumed, leased, last consumed).
type Standing = (u64, Option<Stamp>, bool, Stamp);

fn secs_since(now: Stamp, t: Option<Stamp>) -> u64 {
    t.map_or(0, |t| now.0.saturating_sub(t.0) / 1_000_000)
}

/// Where a (group row, partition) walk continues: the row's key, and the partition to continue
/// after in it (none: start after the row).
type LagCursor = (Vec<u8>, Option<u64>);

/// A [`LagCursor`] as text: `<row key hex>.<partition id>` continues that row after the
/// partition, `<row key hex>.` starts after that row.
fn parse_cursor(q: &[(String, String)]) -> Result<Option<LagCursor>, ApiError> {
    let bad = || ApiError::bad_request("after", "is not a cursor this broker issued");
    let Some(a) = q_get(q, "after") else {
        return Ok(None);
    };
    let (key, pid) = a.split_once('.').ok_or_else(bad)?;
    let key = after_bytes(&[("after".to_owned(), key.to_owned())])?.ok_or_else(bad)?;
    let pid = match pid {
        "" => None,
        p => Some(p.parse::<u64>().map_err(|_| bad())?),
    };
    Ok(Some((key, pid)))
}

fn cursor(key: &[u8], pid: Option<u64>) -> String {
    format!(
        "{}.{}",
        hex(key),
        pid.map(|p| p.to_string()).unwrap_or_default()
    )
}

/// Walk the (group row, partition) pairs of the tenant's groups (of group `only`, when named)
/// after `from`, rows in key order and partitions in creation order; `visit` answers whether it
/// added a row to the page. Stops after `limit` rows or [`WALK_BUDGET`] partitions; answers
/// the next page's cursor.
fn walk_lag(
    state: &dyn StateRead,
    scope: &Scope,
    from: Option<LagCursor>,
    only: Option<&str>,
    limit: usize,
    now: Stamp,
    visit: &mut dyn FnMut(&GroupRow, &PartitionRec, Standing) -> bool,
) -> Result<Option<String>, StoreError> {
    let (key, mut pid_after) = match from {
        Some((k, pid)) => (Some(k), pid),
        None => (None, None),
    };
    let keep = |q: &QueueRec, g: &str| scope.owns(&q.name) && only.is_none_or(|o| o == g);
    let (rows, more) = pages::group_rows(
        state,
        key.as_deref(),
        pid_after.is_some(),
        WALK_BUDGET,
        WALK_BUDGET,
        &keep,
    )?;
    let (mut added, mut visited) = (0usize, 0usize);
    let mut done: Option<&[u8]> = None;
    for (i, r) in rows.iter().enumerate() {
        let left = WALK_BUDGET - visited;
        if left == 0 {
            return Ok(done.map(|k| cursor(k, None)));
        }
        let walked =
            pages::walk_partitions(state, r.queue.qid, pid_after.take(), left, &mut |p| {
                if visit(r, p, reads::lag(state, p, &r.group, r.rec.start, now)?) {
                    added += 1;
                }
                Ok(if added == limit {
                    Flow::Stop
                } else {
                    Flow::Continue
                })
            })?;
        visited += walked.visited;
        if let Some(pid) = walked.next {
            return Ok(Some(cursor(&r.key, Some(pid))));
        }
        if added == limit && (i + 1 < rows.len() || more.is_some()) {
            return Ok(Some(cursor(&r.key, None)));
        }
        done = Some(r.key.as_slice());
    }
    Ok(more.map(|k| cursor(&k, None)))
}

/// `GET /api/v1/consumer-groups?limit=&after=`: a page of group rows, each with its lag summed
/// over at most [`WALK_BUDGET`] partitions for the whole page. A row that would exceed what is
/// left waits for the next page; the first row of a page never waits (its sums are then over
/// the first partitions only, `lagApproximate: true`).
fn list(
    state: &dyn StateRead,
    scope: &Scope,
    q: &[(String, String)],
    now: Stamp,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let err = |e: StoreError| store_err(&e);
    let limit = page_limit(q, GROUPS_PAGE)?;
    let after = after_bytes(q)?;
    let keep = |q: &QueueRec, _: &str| scope.owns(&q.name);
    let (rows, more) = pages::group_rows(state, after.as_deref(), false, limit, WALK_BUDGET, &keep)
        .map_err(err)?;
    let mut list = Vec::new();
    let mut visited = 0usize;
    let mut next = more.as_deref().map(hex);
    for (i, r) in rows.iter().enumerate() {
        let (mut members, mut lagging, mut total, mut max_time) = (0u64, 0u64, 0u64, 0u64);
        let left = WALK_BUDGET - visited;
        let walked = pages::walk_partitions(state, r.queue.qid, None, left, &mut |p| {
            let (lag, oldest, leased, _) = reads::lag(state, p, &r.group, r.rec.start, now)?;
            members += u64::from(leased);
            lagging += u64::from(lag > 0);
            total += lag;
            max_time = max_time.max(secs_since(now, oldest));
            Ok(Flow::Continue)
        })
        .map_err(err)?;
        let cut = walked.next.is_some();
        if cut && i > 0 {
            // This row starts the next page, with the whole budget.
            next = rows.get(i - 1).map(|p| hex(&p.key));
            break;
        }
        visited += walked.visited;
        let name = scope.local(&r.queue.name);
        list.push(json!({
            "name": r.group, "topics": [name], "queueName": name, "members": members,
            "partitionsWithLag": lagging, "totalLag": total, "maxTimeLag": max_time,
            "state": if total == 0 { "Stable" } else { "Lagging" },
            "subscriptionMode": match r.rec.start { SubscriptionStart::All => "all", SubscriptionStart::From(_) => "timestamp" },
            "subscriptionTimestamp": match r.rec.start { SubscriptionStart::All => Value::Null, SubscriptionStart::From(t) => json!(t.iso_millis()) },
            "subscriptionCreatedAt": r.rec.created.iso_millis(),
            "lagApproximate": cut, "partitionsCounted": walked.visited,
        }));
        if cut || visited == WALK_BUDGET {
            next = (i + 1 < rows.len() || more.is_some()).then(|| hex(&r.key));
            break;
        }
    }
    Ok(with_next(json_response(200, &Value::Array(list)), next))
}

/// The reading routes, on a blocking thread.
fn read(
    state: &dyn StateRead,
    scope: &Scope,
    rest: &[&str],
    q: &[(String, String)],
    now: Stamp,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let err = |e: StoreError| store_err(&e);
    match rest {
        [] => list(state, scope, q, now),
        ["lagging"] => {
            let min = q_num(q, "minLagSeconds", 60)?;
            if min > queen_domain::model::MAX_DURATION_SECONDS {
                return Err(ApiError::bad_request(
                    "minLagSeconds",
                    &format!(
                        "must be 0 to {} seconds (ten years)",
                        queen_domain::model::MAX_DURATION_SECONDS
                    ),
                ));
            }
            let limit = page_limit(q, PARTITIONS_PAGE)?;
            let mut list = Vec::new();
            let next = walk_lag(state, scope, parse_cursor(q)?, None, limit, now, &mut |r, p, (lag, oldest, _, last)| {
                let age = secs_since(now, oldest);
                if lag == 0 || age < min {
                    return false;
                }
                list.push(json!({
                    "consumer_group": r.group, "queue_name": scope.local(&r.queue.name), "partition_name": p.name,
                    "partition_id": p.pid.to_string(), "offset_lag": lag, "time_lag_seconds": age,
                    "oldest_unconsumed_at": oldest.map(|o| o.iso_millis()),
                    "last_consumed_at": if last.0 == 0 { Value::Null } else { json!(last.iso_millis()) },
                }));
                true
            })
            .map_err(err)?;
            Ok(with_next(json_response(200, &Value::Array(list)), next))
        }
        [group] => {
            let limit = page_limit(q, PARTITIONS_PAGE)?;
            let mut out = Map::new();
            let next = walk_lag(state, scope, parse_cursor(q)?, Some(*group), limit, now, &mut |r, p, (lag, oldest, leased, last)| {
                let row = json!({"partition": p.name, "partitionId": p.pid.to_string(), "lastConsumedAt": if last.0 == 0 { Value::Null } else { json!(last.iso_millis()) },
                       "offsetLag": lag, "timeLagSeconds": secs_since(now, oldest), "leaseActive": leased});
                let entry = out
                    .entry(scope.local(&r.queue.name).to_owned())
                    .or_insert_with(|| json!({ "partitions": [] }));
                if let Some(a) = entry["partitions"].as_array_mut() {
                    a.push(row);
                }
                true
            })
            .map_err(err)?;
            Ok(with_next(json_response(200, &Value::Object(out)), next))
        }
        _ => Err(ApiError::new(
            404,
            "no_such_route",
            "no such consumer-group route",
        )),
    }
}

/// The consumer-group routes.
pub(crate) async fn groups<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
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
        ("GET", _) => {
            api.read_barrier().await?;
            let scope = scope.clone();
            let rest: Vec<String> = rest.iter().map(|s| (*s).to_owned()).collect();
            off_runtime(api, move |api| {
                let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
                read(&*api.state(), &scope, &rest, &q, now)
            })
            .await
        }
        ("DELETE", [group]) | ("DELETE", [group, "queues", _]) => {
            let queue = match rest {
                [_, "queues", queue] => Some(scope.queue(queue, "queue")?),
                _ => None,
            };
            let cmd = Command::DeleteGroup {
                // Without a queue the command reaches every queue of the group's tenant.
                group: if queue.is_some() {
                    group_name(group)?
                } else {
                    scope.group_everywhere(group_name(group)?)
                },
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
                v["queueName"] = json!(scope.local(q.as_str()));
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
            let qn = scope.queue(queue, "queue")?;
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
                    group: scope.group_everywhere(group_name(group)?),
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
