//! What the three-node black-box tests share: starting a cluster, finding its leader, pushing,
//! and checking that every acknowledged write is on every node once.

#![allow(dead_code)] // each test binary uses its own part of it

use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::{Node, eventually};
use serde_json::{Value, json};

pub(crate) const TOKEN: &str = "test-cluster-token";

pub(crate) fn cluster(dir: &Path) -> Vec<Node> {
    cluster_with(dir, |_| Vec::new())
}

/// Three nodes, node `i` (0-based) started with `extra(i)` on top of the cluster settings.
pub(crate) fn cluster_with(
    dir: &Path,
    extra: impl Fn(usize) -> Vec<(&'static str, &'static str)>,
) -> Vec<Node> {
    let owned = |i| {
        extra(i)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    queen_tests::three_nodes(Path::new(env!("CARGO_BIN_EXE_queen")), dir, TOKEN, owned)
}

pub(crate) fn role(n: &Node) -> String {
    n.try_request("GET", "/health", None)
        .map(|a| a.json["raft"]["role"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default()
}

pub(crate) fn leader_index(nodes: &[Node], skip: Option<usize>) -> Option<usize> {
    (0..nodes.len())
        .filter(|i| Some(*i) != skip)
        .find(|i| role(&nodes[*i]) == "leader")
}

pub(crate) fn applied(n: &Node) -> u64 {
    n.try_request("GET", "/health", None)
        .map(|a| a.json["raft"]["applied"].as_u64().unwrap_or(0))
        .unwrap_or(0)
}

pub(crate) fn push(n: &Node, queue: &str, txn: &str) -> Value {
    let a = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": queue, "transactionId": txn, "payload": {"t": txn}}]}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    a.json[0].clone()
}

pub(crate) fn healthy_leader(nodes: &[Node], within: Duration) -> Option<(usize, Duration)> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Some(l) = leader_index(nodes, None) {
            return Some((l, started.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Every acknowledged write is on every node exactly once, once all caught up.
pub(crate) fn assert_all_once(nodes: &[Node], queue: &str, acked: &[String]) {
    let target = nodes.iter().map(applied).max().unwrap();
    for (i, node) in nodes.iter().enumerate() {
        assert!(
            eventually(Duration::from_secs(30), || applied(node) >= target),
            "node {i} did not catch up"
        );
        let ids = node.stored_ids(queue, "Default");
        let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "node {i} stores a message twice");
        let missing: Vec<&String> = acked
            .iter()
            .filter(|t| !unique.contains(t))
            .take(5)
            .collect();
        assert!(
            missing.is_empty(),
            "node {i} lost acknowledged writes, e.g. {missing:?} (of {})",
            acked.len()
        );
    }
}

pub(crate) fn health(n: &Node) -> Value {
    n.try_request("GET", "/health", None)
        .map(|a| a.json)
        .unwrap_or(Value::Null)
}
