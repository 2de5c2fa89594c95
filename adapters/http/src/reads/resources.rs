//! The resources routes: queues, partitions and the broker's overview, read from applied state.

use super::*;

/// A queue's tag as its tenant wrote it.
fn tag(scope: &Scope, t: Option<&String>) -> Option<String> {
    t.map(|t| scope.local(t).to_owned())
}

fn queue_json(
    state: &dyn StateRead,
    scope: &Scope,
    q: &QueueRec,
    now: Stamp,
) -> Result<Value, StoreError> {
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
        "name": scope.local(&q.name), "namespace": tag(scope, q.namespace.as_ref()), "task": tag(scope, q.task.as_ref()), "createdAt": q.created.iso_millis(),
        "partitions": plist, "partitionCount": parts.len(),
        "messages": {"total": q.messages, "pending": pending_total, "deadLetter": q.dead_lettered},
        "options": q.options.to_json(),
    }))
}

/// Status and resources routes.
pub(crate) async fn resources<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    segs: &[&str],
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    api.read_barrier().await?;
    let state = api.state();
    let now = api.now();
    // Only the request's tenant's queues, in its own range of the table.
    let queues =
        reads::tenant_queues(&*state, &scope.tenant, 100_000).map_err(|e| store_err(&e))?;
    let local = |qr: &QueueRec| scope.local(&qr.name).to_owned();
    let err = |e: StoreError| store_err(&e);
    match segs {
        ["status"] | ["resources", "overview"] => {
            let total: u64 = queues.iter().map(|q| q.messages).sum();
            let dead: u64 = queues.iter().map(|q| q.dead_lettered).sum();
            let mut pending = 0;
            let mut partitions = 0;
            for qr in &queues {
                let v = queue_json(&*state, scope, qr, now).map_err(err)?;
                pending += v["messages"]["pending"].as_u64().unwrap_or(0);
                partitions += v["partitionCount"].as_u64().unwrap_or(0);
            }
            let namespaces: std::collections::BTreeSet<_> =
                queues.iter().filter_map(|q| q.namespace.as_ref()).collect();
            let tasks: std::collections::BTreeSet<_> =
                queues.iter().filter_map(|q| q.task.as_ref()).collect();
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
                let tag = tag(
                    scope,
                    if *kind == "namespaces" {
                        qr.namespace.as_ref()
                    } else {
                        qr.task.as_ref()
                    },
                );
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
                .filter(|qr| {
                    ns.is_none_or(|n| tag(scope, qr.namespace.as_ref()).as_deref() == Some(n))
                })
                .filter(|qr| {
                    task.is_none_or(|t| tag(scope, qr.task.as_ref()).as_deref() == Some(t))
                })
                .filter(|qr| search.is_none_or(|s| local(qr).contains(s)))
                .collect();
            let total = filtered.len();
            let mut list = Vec::new();
            for qr in filtered.into_iter().skip(offset).take(limit) {
                list.push(queue_json(&*state, scope, qr, now).map_err(err)?);
            }
            Ok(json_response(
                200,
                &json!({"queues": list, "pagination": {"total": total, "limit": limit, "offset": offset}}),
            ))
        }
        ["resources", "queues", name] | ["status", "queues", name] => {
            match queues.iter().find(|qr| local(qr) == *name) {
                Some(qr) => Ok(json_response(
                    200,
                    &queue_json(&*state, scope, qr, now).map_err(err)?,
                )),
                None => Err(ApiError::new(404, "queue_not_found", "Queue not found")),
            }
        }
        ["resources", "queues", name, "depth"] => {
            let Some(qr) = queues.iter().find(|qr| local(qr) == *name) else {
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
                &json!({"queue": local(qr), "group": group, "pending": pending, "partitionsPending": partitions_pending,
                "conflation": false, "effectivePending": pending, "partitions": parts}),
            ))
        }
        ["resources", "partitions"] => {
            let only = q_get(&q, "queue");
            let limit = q_num(&q, "limit", 1000)? as usize;
            let mut list = Vec::new();
            for qr in queues
                .iter()
                .filter(|qr| only.is_none_or(|o| local(qr) == o))
            {
                let v = queue_json(&*state, scope, qr, now).map_err(err)?;
                for p in v["partitions"].as_array().cloned().unwrap_or_default() {
                    let mut p = p;
                    p["queue"] = json!(local(qr));
                    list.push(p);
                }
            }
            list.truncate(limit);
            Ok(json_response(200, &json!({ "partitions": list })))
        }
        _ => Err(ApiError::new(404, "no_such_route", "no such resource")),
    }
}
