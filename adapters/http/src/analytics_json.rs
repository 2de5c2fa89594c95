//! The analytics routes: `GET /api/v1/status/analytics` (a tenant's queues) and
//! `GET /api/v1/analytics/{system,worker}-metrics` (this node), as time series of buckets.
//!
//! Each bucket is `{"at": <ISO start>, ...}`: a counter appears under its name without
//! `_total` as what it grew by in the bucket (`pushed`), a gauge as its last value (`depth`)
//! and its highest (`maxDepth`); names are camelCase.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use queen_domain::analytics::{Interval, Point};
use queen_domain::time::Stamp;
use queen_ports::{AnalyticsQuery, AnalyticsScope, ClientApi};
use serde_json::{Map, Value, json};

use crate::api::ApiError;
use crate::error::json_response;
use crate::pop_query::parse_query;
use crate::tenancy::Scope;

/// Which figures of the node a route shows.
const SYSTEM: &[&str] = &[
    "rss_bytes",
    "cpu_seconds_total",
    "disk_used_bytes",
    "disk_total_bytes",
    "raft_term",
    "raft_applied",
    "raft_commit",
    "leader",
    "ephemeral_bytes",
    "ephemeral_messages",
    "analytics_bytes",
];
const WORKER: &[&str] = &[
    "requests_total",
    "errors_total",
    "pushed_total",
    "consumed_total",
    "waiting_pops",
    "depth",
    "lag",
];

/// Route one analytics request (`segs` after `/api/v1`).
pub(crate) async fn route<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    segs: &[&str],
    query: &str,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let q = parse_query(query);
    let arg = |k: &str| crate::reads::q_get(&q, k);
    let now_ms = api.now().0 / 1000;
    let to = crate::traces_json::time_of(&q, "to")?.map_or(now_ms, |s| s.0 / 1000);
    let from = crate::traces_json::time_of(&q, "from")?
        .map_or(to.saturating_sub(3_600_000), |s| s.0 / 1000);
    let interval = match arg("interval") {
        Some(w) => Interval::parse(w)
            .ok_or_else(|| ApiError::bad_request("interval", "must be minute, hour or day"))?,
        None if to.saturating_sub(from) <= 86_400_000 => Interval::Minute,
        None if to.saturating_sub(from) <= 60 * 86_400_000 => Interval::Hour,
        None => Interval::Day,
    };
    let (scope_of, names): (AnalyticsScope, Option<&[&str]>) = match segs {
        ["status", "analytics"] => (
            AnalyticsScope::Queues {
                tenant: scope.tenant.clone(),
                queue: arg("queue").map(str::to_owned),
            },
            None,
        ),
        ["analytics", which @ ("system-metrics" | "worker-metrics")] => {
            if scope.names_a_tenant() {
                return Err(ApiError::new(
                    403,
                    "forbidden",
                    "the node's own figures are the operator's; a request acting for a tenant cannot read them",
                ));
            }
            let names = if *which == "system-metrics" {
                SYSTEM
            } else {
                WORKER
            };
            (AnalyticsScope::Node, Some(names))
        }
        _ => {
            return Err(ApiError::new(
                404,
                "no_such_route",
                format!("no route for GET /api/v1/{}", segs.join("/")),
            ));
        }
    };
    let answer = api
        .analytics(AnalyticsQuery {
            scope: scope_of,
            from_ms: from,
            to_ms: to,
            interval,
        })
        .await?;
    let iso = |ms: u64| Stamp(ms.saturating_mul(1000)).iso_millis();
    let mut out = json!({
        "nodeId": answer.node_id,
        "from": iso(from),
        "to": iso(to),
        "interval": interval.as_str(),
        "samples": answer.samples,
        "partial": answer.partial,
    });
    let series = |points: &[Point]| -> Value {
        Value::Array(points.iter().map(|p| bucket(p, names, &iso)).collect())
    };
    if names.is_some() {
        out["series"] = series(&answer.totals);
    } else {
        out["totals"] = series(&answer.totals);
        out["queues"] = Value::Array(
            answer
                .queues
                .iter()
                .map(|s| json!({"queue": s.queue, "series": series(&s.points)}))
                .collect(),
        );
    }
    Ok(json_response(200, &out))
}

/// `rss_bytes` -> `rssBytes`.
fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut up = false;
    for c in name.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// One bucket as answered, with only `names` when given.
fn bucket(p: &Point, names: Option<&[&str]>, iso: &dyn Fn(u64) -> String) -> Value {
    let wanted = |n: &str| names.is_none_or(|ns| ns.contains(&n));
    let mut m = Map::new();
    m.insert("at".into(), Value::String(iso(p.at)));
    for (k, v) in &p.counts {
        if wanted(k) {
            m.insert(camel(k.trim_end_matches("_total")), json!(v));
        }
    }
    for (k, v) in &p.last {
        if wanted(k) {
            m.insert(camel(k), json!(v));
        }
    }
    for (k, v) in &p.max {
        if wanted(k) {
            m.insert(camel(&format!("max_{k}")), json!(v));
        }
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_turn_camel_and_counters_lose_their_suffix() {
        assert_eq!(camel("rss_bytes"), "rssBytes");
        let p = Point {
            at: 60_000,
            counts: [("pushed_total".to_owned(), 5.0)].into(),
            last: [("depth".to_owned(), 2.0)].into(),
            max: [("depth".to_owned(), 7.0)].into(),
        };
        let v = bucket(&p, None, &|ms| ms.to_string());
        assert_eq!(
            v,
            json!({"at": "60000", "pushed": 5.0, "depth": 2.0, "maxDepth": 7.0})
        );
        let only = bucket(&p, Some(&["depth"]), &|ms| ms.to_string());
        assert_eq!(only, json!({"at": "60000", "depth": 2.0, "maxDepth": 7.0}));
    }
}
