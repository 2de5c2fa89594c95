//! Conflation (contract 2.0.8) on one real node: the official Python client's conflating
//! consumers (pop() and consume()) run against it without its `ConflationUnsupportedError`
//! (tests/client/conflation.py), and the answers on the wire are the ones the client checks:
//! 200 with `"conflation": true` even when empty (never 204), `conflationConflict` when the
//! group registered the other way, JSON even when frames were asked for, 400 naming the field.
//! In a cluster, a conflating pop waits (503) until every member reads log format 5, and is
//! then answered alike through a follower.

use std::path::Path;
use std::time::Duration;

use queen_tests::{Node, eventually};
use serde_json::json;

#[path = "cluster_support.rs"]
mod support;
use support::{cluster_with, health, leader_index};

fn node(dir: &Path) -> Node {
    Node::start(Path::new(env!("CARGO_BIN_EXE_queen")), &dir.join("n1"), &[])
}

fn push(n: &Node, queue: &str, partition: &str, txns: &[&str]) {
    let items: Vec<_> = txns
        .iter()
        .map(|t| json!({"queue": queue, "partition": partition, "transactionId": t, "payload": {"t": t}}))
        .collect();
    let a = n.post("/api/v1/push", &json!({ "items": items }));
    assert_eq!(a.status, 200, "{}", a.text);
}

#[test]
fn the_official_client_consumes_a_conflating_group() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/client/run.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("--script")
        .arg("conflation.py")
        .arg(format!("http://127.0.0.1:{}", n.port))
        .output()
        .expect("bash runs tests/client/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("conflation ok"),
        "the official client with conflation: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn conflating_pops_answer_the_echo_the_client_checks() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    push(&n, "cq", "p", &["t1", "t2", "t3"]);
    let pop = |query: &str| n.get(&format!("/api/v1/pop/queue/cq?wait=false&{query}"));

    // The newest only, echoed; framed pops of a conflating group are answered as JSON.
    let got = pop("consumerGroup=latest&conflation=true&batch=10&frames=true");
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(got.json["conflation"], true, "{}", got.text);
    assert!(got.json.get("conflationConflict").is_none(), "{}", got.text);
    let txns: Vec<_> = got.json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(txns, ["t3"]);
    // Empty: still a 200 with the echo, never a 204 (which the client reads as unsupported).
    let empty = pop("consumerGroup=latest&conflation=true");
    assert_eq!(empty.status, 200, "{}", empty.text);
    assert_eq!(empty.json["conflation"], true);
    assert_eq!(empty.json["messages"], json!([]));

    // A group registered without conflation: the conflict, and no `conflation` key.
    let plain = pop("consumerGroup=plain&batch=1");
    assert_eq!(plain.status, 200, "{}", plain.text);
    assert!(plain.json.get("conflation").is_none(), "{}", plain.text);
    let declared = pop("consumerGroup=plain&conflation=true&batch=10");
    assert_eq!(declared.status, 200, "{}", declared.text);
    assert_eq!(
        declared.json["conflationConflict"], true,
        "{}",
        declared.text
    );
    assert!(
        declared.json.get("conflation").is_none(),
        "{}",
        declared.text
    );

    // Refusals name the field.
    for (query, field) in [
        ("conflation=true", "consumerGroup"),
        (
            "consumerGroup=latest&conflation=true&autoAck=true",
            "autoAck",
        ),
        ("consumerGroup=latest&conflation=maybe", "conflation"),
    ] {
        let a = pop(query);
        assert_eq!(a.status, 400, "{query}: {}", a.text);
        assert!(a.text.contains(field), "{query}: {}", a.text);
    }

    // Depth: the conflating group owes one delivery per partition.
    push(&n, "cq", "p", &["t4", "t5"]);
    let d = n.get("/api/v1/resources/queues/cq/depth?group=latest");
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.json["conflation"], true, "{}", d.text);
    assert_eq!(d.json["pending"], 3, "{}", d.text);
    assert_eq!(d.json["effectivePending"], 1, "{}", d.text);
    let d = n.get("/api/v1/resources/queues/cq/depth?group=plain");
    assert_eq!(d.json["conflation"], false, "{}", d.text);
    assert_eq!(d.json["effectivePending"], d.json["pending"], "{}", d.text);
}

#[test]
fn a_cluster_serves_conflation_once_every_member_reads_format_5() {
    // Node 3 pretends an earlier build that reads format 4 (test-only switch).
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster_with(dir.path(), |i| {
        let mut env = vec![("QUEEN_TEST_FAULTS", "1")];
        if i == 2 {
            env.push(("QUEEN_TEST_LOG_KINDS", "4"));
        }
        env
    });
    let version = |nodes: &[Node], v: u64| {
        assert!(
            eventually(Duration::from_secs(30), || {
                nodes
                    .iter()
                    .all(|n| health(n)["raft"]["clusterVersion"].as_u64() == Some(v))
            }),
            "the cluster version did not reach {v}: {:?}",
            nodes.iter().map(health).collect::<Vec<_>>()
        );
    };
    version(&nodes, 4);
    let leader = leader_index(&nodes, None).expect("a leader");
    let follower = (leader + 1) % 3;
    push(&nodes[leader], "cc", "p", &["t1", "t2", "t3"]);
    let pop = |n: &Node, group: &str| {
        n.get(&format!(
            "/api/v1/pop/queue/cc?wait=false&batch=10&consumerGroup={group}&conflation=true"
        ))
    };
    let refused = pop(&nodes[follower], "latest");
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert!(refused.text.contains("format 5"), "{}", refused.text);

    // Upgrade node 3: the version rises, and a pop through a follower is conflated and echoed
    // (the leader's answer carries the echo to the node that forwarded the pop).
    assert!(nodes[2].sigterm(Duration::from_secs(40)).success());
    nodes[2].set_env("QUEEN_TEST_LOG_KINDS", "5");
    nodes[2].restart();
    version(&nodes, 5);
    let leader = leader_index(&nodes, None).expect("a leader");
    let follower = (leader + 1) % 3;
    let got = pop(&nodes[follower], "latest");
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(got.json["conflation"], true, "{}", got.text);
    let txns: Vec<_> = got.json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(txns, ["t3"], "{}", got.text);
}
