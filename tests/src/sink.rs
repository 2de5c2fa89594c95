//! The S3 sink on three real nodes: start them, read who runs which queue from the nodes' own
//! reports, keep a writer going over every node, and check the lake against the log. Shared by
//! the `s3_cluster` tests and the soak (`queen-soak`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::s3::{self, S3Server};
use crate::{Node, eventually};

/// The raft token of these clusters.
pub const TOKEN: &str = "s3-cluster-token";
/// The tenant the sink writes under by default.
pub const TENANT: &str = "00000000-0000-0000-0000-000000000001";
/// The states of a queue a node is running (`placement.held` counts these).
pub const RUNNING: [&str; 7] = [
    "held",
    "restoring",
    "filling",
    "intent",
    "upload",
    "commit",
    "draining",
];

/// The sink's instance name on node `i` (0-based): the default, `node-<id>`.
#[must_use]
pub fn instance(i: usize) -> String {
    format!("node-{}", i + 1)
}

/// Three nodes, each with the cluster settings and `env`, healthy together.
#[must_use]
pub fn cluster(bin: &Path, dir: &Path, env: &[(&'static str, String)]) -> Vec<Node> {
    crate::three_nodes(bin, dir, TOKEN, |_| {
        env.iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    })
}

/// The node's sink report (`/status` `.s3.sinks[0]`), Null when it does not answer.
#[must_use]
pub fn sink(n: &Node) -> Value {
    n.try_request("GET", "/status", None)
        .map(|a| a.json["s3"]["sinks"][0].clone())
        .unwrap_or(Value::Null)
}

/// The live nodes' sink reports (Null for the others), for failure messages.
#[must_use]
pub fn reports(nodes: &[Node], live: &[bool]) -> Vec<Value> {
    nodes
        .iter()
        .zip(live)
        .map(|(n, l)| if *l { sink(n) } else { Value::Null })
        .collect()
}

/// The report's queue rows by queue name.
#[must_use]
pub fn rows(sink: &Value) -> BTreeMap<String, Value> {
    sink["queues"]
        .as_array()
        .map(|qs| {
            qs.iter()
                .map(|q| {
                    (
                        q["queue"].as_str().unwrap_or_default().to_owned(),
                        q.clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether node `i`'s row says it runs the queue.
#[must_use]
pub fn runs(i: usize, row: &Value) -> bool {
    row["heldBy"] == instance(i) && row["state"].as_str().is_some_and(|s| RUNNING.contains(&s))
}

/// Who runs each queue, from the live nodes' own reports: None while any queue has no runner
/// or more than one.
#[must_use]
pub fn owners<Q: AsRef<str>>(
    nodes: &[Node],
    live: &[bool],
    queues: &[Q],
) -> Option<BTreeMap<String, usize>> {
    let reports: Vec<(usize, BTreeMap<String, Value>)> = (0..nodes.len())
        .filter(|i| live[*i])
        .map(|i| (i, rows(&sink(&nodes[i]))))
        .collect();
    let mut out = BTreeMap::new();
    for q in queues {
        let q = q.as_ref();
        let runners: Vec<usize> = reports
            .iter()
            .filter(|(i, r)| r.get(q).is_some_and(|row| runs(*i, row)))
            .map(|(i, _)| *i)
            .collect();
        let [one] = runners[..] else { return None };
        out.insert(q.to_owned(), one);
    }
    Some(out)
}

/// The owner of one queue, when exactly one live node runs it.
#[must_use]
pub fn owner(nodes: &[Node], live: &[bool], queue: &str) -> Option<usize> {
    owners(nodes, live, &[queue]).and_then(|o| o.get(queue).copied())
}

/// The queue's row on node `i`.
#[must_use]
pub fn row(nodes: &[Node], i: usize, queue: &str) -> Value {
    rows(&sink(&nodes[i])).remove(queue).unwrap_or(Value::Null)
}

/// The last committed window of a queue as its owner reports it (0 when no live node runs it).
#[must_use]
pub fn owner_k(nodes: &[Node], live: &[bool], queue: &str) -> (Option<usize>, u64) {
    match owner(nodes, live, queue) {
        Some(i) => (Some(i), row(nodes, i, queue)["k"].as_u64().unwrap_or(0)),
        None => (None, 0),
    }
}

/// The sum of every series of a counter on the node's `/metrics/prometheus`.
#[must_use]
pub fn metric(n: &Node, name: &str) -> f64 {
    let text = n
        .try_request("GET", "/metrics/prometheus", None)
        .map(|a| a.text)
        .unwrap_or_default();
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// What a writer pushes: records `<prefix>-<i>` to `queues` in turn, `per_push` to a request
/// (partitions `p0`..`p2`), a pause between requests, and a time limit.
#[derive(Debug, Clone)]
pub struct WriterPlan {
    /// The queues, written in turn.
    pub queues: Vec<String>,
    /// The transactionIds' prefix.
    pub prefix: String,
    /// Records per request (all to one queue).
    pub per_push: u64,
    /// Pause after each acknowledged request.
    pub pause: Duration,
    /// Stop after this long, whatever happens.
    pub limit: Duration,
}

/// A writer that follows `plan`, round-robin over the nodes marked live, until told to stop; a
/// failed push is retried on the next node with the same transactionIds, as a client holding
/// every node's URL does. Fills `acked` with every acknowledged transactionId.
#[must_use]
pub fn spawn_writer(
    ports: Vec<u16>,
    live: Arc<Vec<AtomicBool>>,
    plan: WriterPlan,
    acked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let started = Instant::now();
        for i in 0..10_000_000u64 {
            if stop.load(Ordering::Relaxed) || started.elapsed() > plan.limit {
                break;
            }
            let queue = &plan.queues[(i % plan.queues.len() as u64) as usize];
            let ids: Vec<String> = (0..plan.per_push)
                .map(|j| format!("{}-{}", plan.prefix, i * plan.per_push + j))
                .collect();
            let items: Vec<Value> = ids
                .iter()
                .enumerate()
                .map(|(j, t)| {
                    if plan.per_push == 1 {
                        json!({"queue": queue, "transactionId": t, "payload": {"i": i}})
                    } else {
                        json!({"queue": queue, "partition": format!("p{}", j % 3), "transactionId": t, "payload": {"i": i, "j": j}})
                    }
                })
                .collect();
            let body = json!({ "items": items }).to_string();
            for attempt in 0..600u64 {
                let n = ((i + attempt) % ports.len() as u64) as usize;
                if !live[n].load(Ordering::Relaxed) {
                    if attempt % ports.len() as u64 == ports.len() as u64 - 1 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    continue;
                }
                match crate::post_url(&format!("http://127.0.0.1:{}/api/v1/push", ports[n]), &body)
                {
                    Ok((200, text)) if text.contains("queued") || text.contains("duplicate") => {
                        acked
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .extend(ids.iter().cloned());
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(100)),
                }
                if stop.load(Ordering::Relaxed) && started.elapsed() > plan.limit {
                    break;
                }
            }
            std::thread::sleep(plan.pause);
        }
    })
}

/// Every transactionId stored in a queue (its partitions `Default` and `p0`..`p2`), read
/// through one node.
#[must_use]
pub fn stored(n: &Node, queue: &str) -> Vec<String> {
    ["Default", "p0", "p1", "p2"]
        .iter()
        .flat_map(|p| n.stored_ids(queue, p))
        .collect()
}

/// `queen lake verify` on the bucket (read directly, never through a fault proxy): whether it
/// found no problem, and its report.
#[must_use]
pub fn verify(bin: &Path, server: &S3Server) -> (bool, Value) {
    let out = Command::new(bin)
        .args([
            "lake",
            "verify",
            "--bucket",
            "lake",
            "--endpoint",
            &server.endpoint,
            "--path-style",
            "true",
            "--region",
            s3::REGION,
        ])
        .env("QUEEN_S3_ACCESS_KEY", s3::ACCESS_KEY)
        .env("QUEEN_S3_SECRET_KEY", s3::SECRET_KEY)
        .output()
        .expect("run queen lake verify");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.success(), report)
}

/// Records per queue as verify counts them.
#[must_use]
pub fn verified_records(report: &Value) -> BTreeMap<String, u64> {
    report["queues"]
        .as_array()
        .map(|qs| {
            qs.iter()
                .map(|q| {
                    (
                        q["queue"].as_str().unwrap_or_default().to_owned(),
                        q["records"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Wait (up to `limit`) until the lake holds exactly what the log holds (every queue), then
/// check it: verify is clean, DuckDB and pyarrow each read every stored record once and nothing
/// else, and every acknowledged transactionId is among them. Answers the verify report.
///
/// # Panics
/// On any of those failing, with what was found.
pub fn assert_lake_is_the_log<Q: AsRef<str>>(
    bin: &Path,
    server: &S3Server,
    nodes: &[Node],
    reader: usize,
    queues: &[Q],
    acked: &[String],
    limit: Duration,
) -> Value {
    let want: BTreeMap<String, Vec<String>> = queues
        .iter()
        .map(|q| (q.as_ref().to_owned(), stored(&nodes[reader], q.as_ref())))
        .collect();
    for (q, ids) in &want {
        let unique: BTreeSet<&String> = ids.iter().collect();
        assert_eq!(
            unique.len(),
            ids.len(),
            "the log of {q} holds a transactionId twice"
        );
    }
    let counts: BTreeMap<String, u64> = want
        .iter()
        .map(|(q, ids)| (q.clone(), ids.len() as u64))
        .collect();
    let mut last = (false, Value::Null);
    let caught_up = eventually(limit, || {
        last = verify(bin, server);
        let ok = verified_records(&last.1) == counts;
        if !ok {
            std::thread::sleep(Duration::from_secs(1));
        }
        ok
    });
    let status: Vec<Value> = nodes.iter().map(sink).collect();
    assert!(
        caught_up,
        "the lake did not catch up with the log {counts:?}: verify {:#}\nstatus {status:#?}",
        last.1
    );
    assert!(last.0, "lake verify found problems: {:#}", last.1);
    let mut args = server.lake_args("lake");
    args.extend(["--prefix", "queen"]);
    let lake = s3::read_lake(&args);
    let in_log: BTreeSet<&String> = want.values().flatten().collect();
    let by_queue: BTreeMap<&str, BTreeSet<&str>> = want
        .iter()
        .map(|(q, ids)| (q.as_str(), ids.iter().map(String::as_str).collect()))
        .collect();
    for reader in ["duckdb", "pyarrow"] {
        let recs = lake[reader]["records"]
            .as_array()
            .unwrap_or_else(|| panic!("{reader}: no records in {lake:#}"));
        let mut seen: BTreeMap<String, u32> = BTreeMap::new();
        for r in recs {
            assert_eq!(r[0], TENANT);
            let txn = r[4].as_str().unwrap_or_default().to_owned();
            let queue = r[1].as_str().unwrap_or_default();
            assert!(
                by_queue
                    .get(queue)
                    .is_some_and(|ids| ids.contains(txn.as_str())),
                "{reader}: {txn} is in the lake under {queue} but not in its log"
            );
            *seen.entry(txn).or_default() += 1;
        }
        let doubled: Vec<(&String, &u32)> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
        assert!(
            doubled.is_empty(),
            "{reader}: records in the lake more than once: {doubled:?}"
        );
        assert_eq!(
            seen.len(),
            in_log.len(),
            "{reader}: the lake should hold every stored record once"
        );
        let missing: Vec<&String> = acked
            .iter()
            .filter(|t| !seen.contains_key(*t))
            .take(5)
            .collect();
        assert!(
            missing.is_empty(),
            "{reader}: acknowledged records missing from the lake, e.g. {missing:?} (of {})",
            acked.len()
        );
    }
    last.1
}
