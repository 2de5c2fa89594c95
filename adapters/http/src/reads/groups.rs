//! The consumer-group admin routes: listing groups with their lag, one group, seeking, deleting.

use super::*;

struct GroupRow {
    queue: QueueRec,
    group: String,
    start: SubscriptionStart,
    created: Stamp,
    parts: Vec<(PartitionRec, u64, Option<Stamp>, bool, Stamp)>,
}

/// The groups of the tenant's queues (their names as the tenant knows them).
fn group_rows(
    state: &dyn StateRead,
    scope: &Scope,
    now: Stamp,
    only: Option<&str>,
) -> Result<Vec<GroupRow>, StoreError> {
    let mut out = Vec::new();
    for (mut q, g, rec) in reads::groups(state)? {
        if only.is_some_and(|o| o != g) || !scope.owns(&q.name) {
            continue;
        }
        let view = reads::queue_view(state, &q.name)?;
        let mut parts = Vec::new();
        for p in view.map(|v| v.partitions).unwrap_or_default() {
            let (lag, oldest, leased, last) = reads::lag(state, &p, &g, rec.start, now)?;
            parts.push((p, lag, oldest, leased, last));
        }
        q.name = scope.local(&q.name).to_owned();
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
        ("GET", []) => {
            api.read_barrier().await?;
            let state = api.state();
            let rows = group_rows(&*state, scope, now, None).map_err(|e| store_err(&e))?;
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
            let rows = group_rows(&*state, scope, now, None).map_err(|e| store_err(&e))?;
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
            let rows = group_rows(&*state, scope, now, Some(group)).map_err(|e| store_err(&e))?;
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
