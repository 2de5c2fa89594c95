//! What the three-node S3 sink tests share: the sink's settings, one test at a time, pushing to
//! any live node, reading manifests, waiting for placement to settle, and signals.

#![allow(dead_code)] // each test binary uses its own part of it

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use queen_tests::s3::{self, S3Server};
use queen_tests::sink::{WriterPlan, instance, owners, reports, rows, sink};
use queen_tests::{Node, eventually};
use serde_json::{Value, json};

pub(crate) const TTL: Duration = Duration::from_millis(3000);

pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// One test at a time: three brokers and moto each.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The same sink settings for every node.
pub(crate) fn sink_env(endpoint: &str, queues: &str) -> Vec<(&'static str, String)> {
    s3::sink_env(
        endpoint,
        queues,
        &[
            ("QUEEN_S3_LEASE_TTL_MS", TTL.as_millis().to_string()),
            ("QUEEN_S3_CHECKPOINT_EVERY", "3".into()),
        ],
    )
}

/// One record a request to `queues` in turn, 50 a second at most, for three minutes at most.
pub(crate) fn plan(queues: &[&str], prefix: &str) -> WriterPlan {
    WriterPlan {
        queues: queues.iter().map(|q| (*q).to_owned()).collect(),
        prefix: prefix.to_owned(),
        per_push: 1,
        pause: Duration::from_millis(20),
        limit: Duration::from_secs(180),
    }
}

/// Push `items` through the first live node that takes them (same items, same transactionIds on
/// a retry), within a minute.
pub(crate) fn push_any(nodes: &[Node], live: &[bool], items: &Value) {
    let body = json!({ "items": items }).to_string();
    let mut last = Vec::new();
    let ok = eventually(Duration::from_secs(60), || {
        (0..nodes.len()).filter(|i| live[*i]).any(|i| {
            match queen_tests::post_url(
                &format!("http://127.0.0.1:{}/api/v1/push", nodes[i].port),
                &body,
            ) {
                Ok((200, _)) => true,
                other => {
                    last.push(format!("node {i}: {other:?}"));
                    false
                }
            }
        })
    });
    last.reverse();
    last.truncate(6);
    assert!(ok, "no live node took the push: {last:#?}");
}

/// Each committed manifest's objects, as (key, sha256), by manifest key.
pub(crate) fn manifest_objects(server: &S3Server) -> BTreeMap<String, Vec<(String, String)>> {
    let mut args = server.lake_args("lake");
    args.extend(["--prefix", "queen"]);
    let lake = s3::read_lake(&args);
    lake["manifests"]
        .as_object()
        .expect("manifests")
        .iter()
        .map(|(k, m)| {
            let objects = m["objects"]
                .as_array()
                .map(|os| {
                    os.iter()
                        .map(|o| {
                            (
                                o["key"].as_str().unwrap_or_default().to_owned(),
                                o["sha256"].as_str().unwrap_or_default().to_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            (k.clone(), objects)
        })
        .collect()
}

/// Wait for a placement where the live nodes run every queue once, each runs `share`, and every
/// live node counts `live` sink nodes and names the same holder for every queue.
pub(crate) fn settle(
    nodes: &[Node],
    live: &[bool],
    queues: &[&str],
    share: u64,
    limit: Duration,
) -> BTreeMap<String, usize> {
    let n_live = live.iter().filter(|l| **l).count() as u64;
    let mut last = String::new();
    let mut found = None;
    let ok = eventually(limit, || {
        let Some(o) = owners(nodes, live, queues) else {
            last = "a queue without exactly one runner".into();
            return false;
        };
        for i in (0..nodes.len()).filter(|i| live[*i]) {
            let s = sink(&nodes[i]);
            let p = &s["placement"];
            if p["nodes"] != n_live || p["held"] != share || p["share"] != share {
                last = format!("node {i} placement {p}");
                return false;
            }
            let r = rows(&s);
            for (q, holder) in &o {
                if r.get(q)
                    .is_none_or(|row| row["heldBy"] != instance(*holder))
                {
                    last = format!(
                        "node {i} names another holder for {q}: {}",
                        r.get(q).cloned().unwrap_or_default()
                    );
                    return false;
                }
            }
        }
        found = Some(o);
        true
    });
    assert!(
        ok,
        "no settled placement within {limit:?} ({last}):\n{:#?}",
        reports(nodes, live)
    );
    found.unwrap_or_default()
}

pub(crate) fn held_by(o: &BTreeMap<String, usize>, i: usize) -> BTreeSet<String> {
    o.iter()
        .filter(|(_, h)| **h == i)
        .map(|(q, _)| q.clone())
        .collect()
}
