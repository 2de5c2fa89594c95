//! The resources routes: queues, partitions and the broker's overview, read from applied state.
//! A queue may hold 100,000 partitions, so no route walks them all per call: lists of
//! partitions are pages (`limit`, `after`, answered with `nextCursor` and `truncated`), queue
//! and overview totals come from the counters the queue record keeps, and a pending total sums
//! over at most `pages::WALK_BUDGET` partitions and says when it stopped short (`approximate`).
//! The work runs off the runtime's threads (see `heavy`).

use queen_domain::pages::{self, Flow, Partial, WALK_BUDGET};

use super::heavy::{after_pid, off_runtime, page_limit};
use super::*;

/// The group whose standing the resources routes show (queue mode).
const QUEUE_MODE: &str = queen_domain::names::QUEUE_MODE_GROUP;

/// Default rows of a queue's partition page (`resources/queues/{q}`).
const QUEUE_PAGE: usize = 100;
/// Default rows of a depth or partitions page, and of a queue list page.
const LIST_PAGE: usize = 1000;
/// Default queues of a queue list page.
const QUEUES_PAGE: usize = 100;

/// A queue's tag as its tenant wrote it.
fn tag(scope: &Scope, t: Option<&String>) -> Option<String> {
    t.map(|t| scope.local(t).to_owned())
}

/// One partition as the queue routes show it (its queue-mode standing).
fn partition_json(
    state: &dyn StateRead,
    p: &PartitionRec,
    now: Stamp,
) -> Result<Value, StoreError> {
    let (lag, oldest, leased, _) = reads::lag(state, p, QUEUE_MODE, SubscriptionStart::All, now)?;
    Ok(
        json!({"name": p.name, "id": p.pid.to_string(), "messages": p.next_offset - p.log_start, "pending": lag,
        "highWatermark": p.next_offset, "logStart": p.log_start, "leaseActive": leased,
        "oldestPendingAt": oldest.map(|o| o.iso_millis()), "lastWriteAt": if p.next_offset == 0 { Value::Null } else { json!(p.last_write.iso_millis()) }}),
    )
}

/// A queue's totals, from its record's counters and a pending sum bounded by `budget`
/// partitions; no partition list.
fn queue_summary(
    state: &dyn StateRead,
    scope: &Scope,
    q: &QueueRec,
    budget: usize,
) -> Result<Value, StoreError> {
    let pending = pages::pending(state, q, QUEUE_MODE, SubscriptionStart::All, budget)?;
    Ok(json!({
        "name": scope.local(&q.name), "namespace": tag(scope, q.namespace.as_ref()), "task": tag(scope, q.task.as_ref()), "createdAt": q.created.iso_millis(),
        "partitionCount": q.partitions,
        "messages": {"total": q.messages, "pending": pending.sum, "deadLetter": q.dead_lettered},
        "approximate": !pending.complete, "pendingPartitionsCounted": pending.counted,
        "options": q.options.to_json(),
    }))
}

/// A queue with one page of its partitions after partition id `after`.
fn queue_detail(
    state: &dyn StateRead,
    scope: &Scope,
    q: &QueueRec,
    after: Option<u64>,
    limit: usize,
    now: Stamp,
) -> Result<Value, StoreError> {
    let mut v = queue_summary(state, scope, q, WALK_BUDGET)?;
    let mut list = Vec::new();
    let walked = pages::walk_partitions(state, q.qid, after, limit, &mut |p| {
        list.push(partition_json(state, p, now)?);
        Ok(Flow::Continue)
    })?;
    v["partitions"] = Value::Array(list);
    page_fields(&mut v, limit, walked.next.map(|n| n.to_string()));
    Ok(v)
}

/// The page fields of an object answer: `limit`, `nextCursor` (the `after` of the next page,
/// null on the last) and `truncated`.
fn page_fields(v: &mut Value, limit: usize, next: Option<String>) {
    v["limit"] = json!(limit);
    v["truncated"] = json!(next.is_some());
    v["nextCursor"] = json!(next);
}

/// The pending total of many queues, at most [`WALK_BUDGET`] partitions over all of them.
fn pending_of(state: &dyn StateRead, queues: &[QueueRec]) -> Result<Partial, StoreError> {
    let mut total = Partial {
        complete: true,
        ..Partial::default()
    };
    for q in queues {
        let left = WALK_BUDGET - total.counted;
        if left == 0 {
            total.complete &= q.partitions == 0;
            continue;
        }
        let p = pages::pending(state, q, QUEUE_MODE, SubscriptionStart::All, left)?;
        total.sum += p.sum;
        total.counted += p.counted;
        total.complete &= p.complete;
    }
    Ok(total)
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
    let segs: Vec<String> = segs.iter().map(|s| (*s).to_owned()).collect();
    let scope = scope.clone();
    off_runtime(api, move |api| {
        let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
        read(api, &scope, &segs, &q)
    })
    .await
}

/// The routes' work, on a blocking thread.
fn read<A: ClientApi>(
    api: &A,
    scope: &Scope,
    segs: &[&str],
    q: &[(String, String)],
) -> Result<Response<Full<Bytes>>, ApiError> {
    let state = api.state();
    let now = api.now();
    // Only the request's tenant's queues, in its own range of the table.
    let queues =
        reads::tenant_queues(&*state, &scope.tenant, 100_000).map_err(|e| store_err(&e))?;
    let local = |qr: &QueueRec| scope.local(&qr.name).to_owned();
    let err = |e: StoreError| store_err(&e);
    let find = |name: &str| {
        queues
            .iter()
            .find(|qr| local(qr) == name)
            .ok_or_else(|| ApiError::new(404, "queue_not_found", "Queue not found"))
    };
    match segs {
        ["status"] | ["resources", "overview"] => {
            let total: u64 = queues.iter().map(|q| q.messages).sum();
            let dead: u64 = queues.iter().map(|q| q.dead_lettered).sum();
            let partitions: u64 = queues.iter().map(|q| q.partitions).sum();
            let pending = pending_of(&*state, &queues).map_err(err)?;
            let namespaces: std::collections::BTreeSet<_> =
                queues.iter().filter_map(|q| q.namespace.as_ref()).collect();
            let tasks: std::collections::BTreeSet<_> =
                queues.iter().filter_map(|q| q.task.as_ref()).collect();
            Ok(json_response(
                200,
                &json!({
                    "queues": queues.len(), "partitions": partitions, "namespaces": namespaces.len(), "tasks": tasks.len(),
                    "messages": {"total": total, "pending": pending.sum, "processing": Value::Null, "completed": Value::Null, "failed": Value::Null, "deadLetter": dead},
                    "lag": pending.sum, "throughput": Value::Null, "timestamp": now.iso_millis(),
                    "approximate": !pending.complete, "pendingPartitionsCounted": pending.counted,
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
            let limit = page_limit(q, QUEUES_PAGE)?;
            let offset = q_num(q, "offset", 0)? as usize;
            let ns = q_get(q, "namespace");
            let task = q_get(q, "task");
            let search = q_get(q, "search");
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
            let page: Vec<&QueueRec> = filtered.into_iter().skip(offset).take(limit).collect();
            // Each queue of the page sums its pending over its share of the budget.
            let share = (WALK_BUDGET / page.len().max(1)).max(1);
            let mut list = Vec::new();
            for qr in page {
                list.push(queue_summary(&*state, scope, qr, share).map_err(err)?);
            }
            Ok(json_response(
                200,
                &json!({"queues": list, "pagination": {"total": total, "limit": limit, "offset": offset}}),
            ))
        }
        ["resources", "queues", name] | ["status", "queues", name] => {
            let qr = find(name)?;
            let limit = page_limit(q, QUEUE_PAGE)?;
            let v = queue_detail(&*state, scope, qr, after_pid(q)?, limit, now).map_err(err)?;
            Ok(json_response(200, &v))
        }
        ["resources", "queues", name, "depth"] => {
            let qr = find(name)?;
            let group = q_get(q, "group").map(str::to_owned);
            let limit = page_limit(q, LIST_PAGE)?;
            let after = after_pid(q)?;
            let start = match &group {
                Some(g) => pages::group(&*state, qr.qid, g)
                    .map_err(err)?
                    .map_or(SubscriptionStart::All, |r| r.start),
                None => SubscriptionStart::All,
            };
            // The log depth behind the group, or behind the worst cursor without one.
            let depth = |p: &PartitionRec| -> Result<u64, StoreError> {
                match &group {
                    Some(g) => Ok(p
                        .next_offset
                        .saturating_sub(pages::group_next(&*state, p, g, start)?)),
                    None => {
                        let mut worst = p.next_offset.saturating_sub(pages::group_next(
                            &*state,
                            p,
                            QUEUE_MODE,
                            SubscriptionStart::All,
                        )?);
                        for (g, _) in reads::cursors(&*state, p.pid)? {
                            let next = pages::group_next(&*state, p, &g, SubscriptionStart::All)?;
                            worst = worst.max(p.next_offset.saturating_sub(next));
                        }
                        Ok(worst)
                    }
                }
            };
            let (mut pending, mut partitions_pending) = (0u64, 0u64);
            let totals = pages::walk_partitions(&*state, qr.qid, None, WALK_BUDGET, &mut |p| {
                let d = depth(p)?;
                pending += d;
                partitions_pending += u64::from(d > 0);
                Ok(Flow::Continue)
            })
            .map_err(err)?;
            let mut parts = Vec::new();
            let walked = pages::walk_partitions(&*state, qr.qid, after, limit, &mut |p| {
                parts.push(
                    json!({"partition": p.name, "id": p.pid.to_string(), "pending": depth(p)?}),
                );
                Ok(Flow::Continue)
            })
            .map_err(err)?;
            // A conflating group owes one delivery per partition with something pending.
            let conflation = match &group {
                Some(g) => reads::group_conflates(&*state, qr.qid, g).map_err(err)?,
                None => false,
            };
            let effective = if conflation {
                partitions_pending
            } else {
                pending
            };
            let mut v = json!({"queue": local(qr), "group": group, "pending": pending, "partitionsPending": partitions_pending,
                "conflation": conflation, "effectivePending": effective, "partitions": parts,
                "approximate": totals.next.is_some(), "pendingPartitionsCounted": totals.visited});
            page_fields(&mut v, limit, walked.next.map(|n| n.to_string()));
            Ok(json_response(200, &v))
        }
        ["resources", "partitions"] => partitions(&*state, scope, &queues, q, now),
        _ => Err(ApiError::new(404, "no_such_route", "no such resource")),
    }
}

/// `GET /api/v1/resources/partitions?queue=&limit=&after=`: partitions of the tenant's queues
/// (or of one), queue by queue in name order; the cursor is `<queue id>.<partition id>`.
fn partitions(
    state: &dyn StateRead,
    scope: &Scope,
    queues: &[QueueRec],
    q: &[(String, String)],
    now: Stamp,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let bad = || ApiError::bad_request("after", "is not a cursor this broker issued");
    let only = q_get(q, "queue");
    let limit = page_limit(q, LIST_PAGE)?;
    let after = match q_get(q, "after") {
        None => None,
        Some(a) => {
            let (qid, pid) = a.split_once('.').ok_or_else(bad)?;
            let pid = match pid {
                "" => None,
                p => Some(p.parse::<u64>().map_err(|_| bad())?),
            };
            Some((qid.parse::<u64>().map_err(|_| bad())?, pid))
        }
    };
    let mine: Vec<&QueueRec> = queues
        .iter()
        .filter(|qr| only.is_none_or(|o| scope.local(&qr.name) == o))
        .collect();
    let first = match after {
        Some((qid, _)) => mine.iter().position(|qr| qr.qid == qid).ok_or_else(bad)?,
        None => 0,
    };
    let mut list = Vec::new();
    let mut next = None;
    for (i, qr) in mine.iter().enumerate().skip(first) {
        let from = after
            .filter(|(qid, _)| *qid == qr.qid)
            .and_then(|(_, pid)| pid);
        let name = scope.local(&qr.name).to_owned();
        let left = limit - list.len();
        let walked = pages::walk_partitions(state, qr.qid, from, left, &mut |p| {
            let mut v = partition_json(state, p, now)?;
            v["queue"] = json!(name);
            list.push(v);
            Ok(Flow::Continue)
        })
        .map_err(|e| store_err(&e))?;
        if let Some(pid) = walked.next {
            next = Some(format!("{}.{pid}", qr.qid));
            break;
        }
        if list.len() == limit {
            // The page is full at a queue's end: the next page starts with the next queue.
            // (`<queue id>.` with no partition id: from that queue's first partition.)
            next = mine.get(i + 1).map(|n| format!("{}.", n.qid));
            break;
        }
    }
    let mut v = json!({ "partitions": list });
    page_fields(&mut v, limit, next);
    Ok(json_response(200, &v))
}
