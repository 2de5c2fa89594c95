//! Three real nodes on loopback: any node serves any client, SIGTERM hands leadership over,
//! kill -9 of a follower costs nothing, and stopped nodes catch up.

use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::{Node, eventually, free_port};
use serde_json::{Value, json};

const TOKEN: &str = "test-cluster-token";

fn cluster(dir: &Path) -> Vec<Node> {
    let http: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let raft: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let peers = (0..3).map(|i| format!("{}=127.0.0.1:{}/127.0.0.1:{}", i + 1, raft[i], http[i])).collect::<Vec<_>>().join(",");
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            Node::prepare(
                Path::new(env!("CARGO_BIN_EXE_queen")),
                &dir.join(format!("n{}", i + 1)),
                http[i],
                &[("QUEEN_RAFT_NODE_ID", &id), ("QUEEN_RAFT_PEERS", &peers), ("QUEEN_RAFT_TOKEN", TOKEN)],
            )
        })
        .collect();
    for n in &mut nodes {
        n.launch();
    }
    for n in &mut nodes {
        n.wait_healthy(Duration::from_secs(60));
    }
    nodes
}

fn role(n: &Node) -> String {
    n.try_request("GET", "/health", None).map(|a| a.json["raft"]["role"].as_str().unwrap_or("").to_owned()).unwrap_or_default()
}

fn leader_index(nodes: &[Node], skip: Option<usize>) -> Option<usize> {
    (0..nodes.len()).filter(|i| Some(*i) != skip).find(|i| role(&nodes[*i]) == "leader")
}

fn applied(n: &Node) -> u64 {
    n.try_request("GET", "/health", None).map(|a| a.json["raft"]["applied"].as_u64().unwrap_or(0)).unwrap_or(0)
}

fn push(n: &Node, queue: &str, txn: &str) -> Value {
    let a = n.post("/api/v1/push", &json!({"items": [{"queue": queue, "transactionId": txn, "payload": {"t": txn}}]}));
    assert_eq!(a.status, 200, "{}", a.text);
    a.json[0].clone()
}

#[test]
fn any_node_serves_any_client_and_a_sigterm_hands_leadership_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let leader = leader_index(&nodes, None).expect("a leader");
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();

    // The walkthrough: push through a follower, pop through the other, ack through the leader.
    let p = push(&nodes[followers[0]], "orders", "order-1001-created");
    assert_eq!(p["status"], "queued");
    let got = nodes[followers[1]].get("/api/v1/pop/queue/orders?batch=1&wait=true&timeout=5000");
    assert_eq!(got.status, 200, "{}", got.text);
    let m = got.json["messages"][0].clone();
    assert_eq!(m["transactionId"], "order-1001-created");
    let a = nodes[leader].post("/api/v1/ack", &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": got.json["leaseId"], "status": "completed"}));
    assert_eq!(a.json[0]["success"], true, "{}", a.text);
    // Reads through any node see the write (read index).
    for n in &nodes {
        let f = n.post("/api/v1/fetch", &json!({"entries": [{"queue": "orders", "partition": "Default", "offset": 0}]}));
        assert_eq!(f.json["entries"][0]["highWatermark"], 1, "{}", f.text);
    }

    // SIGTERM the leader: a new leader quickly, writes go on with two of three.
    let started = Instant::now();
    let status = nodes[leader].sigterm(Duration::from_secs(40));
    assert!(status.success(), "{}", nodes[leader].log_text());
    assert!(
        eventually(Duration::from_secs(10), || leader_index(&nodes, Some(leader)).is_some()),
        "no new leader after SIGTERM"
    );
    eprintln!("new leader {:?} after {:?}", leader_index(&nodes, Some(leader)), started.elapsed());
    assert!(nodes[leader].log_text().contains("leadership handed off"), "{}", nodes[leader].log_text());
    for i in 0..20 {
        push(&nodes[followers[i % 2]], "orders", &format!("after-{i}"));
    }
    nodes[leader].restart();
    let target = applied(&nodes[followers[0]]);
    assert!(eventually(Duration::from_secs(30), || applied(&nodes[leader]) >= target), "the restarted node did not catch up");
}

#[test]
fn a_follower_killed_with_9_catches_up_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let leader = leader_index(&nodes, None).expect("a leader");
    let victim = (0..3).find(|i| *i != leader).unwrap();
    let other = (0..3).find(|i| *i != leader && *i != victim).unwrap();
    for i in 0..10 {
        push(&nodes[i % 3], "k9", &format!("before-{i}"));
    }
    nodes[victim].kill9();
    for i in 0..30 {
        push(&nodes[if i % 2 == 0 { leader } else { other }], "k9", &format!("during-{i}"));
    }
    nodes[victim].restart();
    let target = applied(&nodes[leader]);
    assert!(eventually(Duration::from_secs(30), || applied(&nodes[victim]) >= target), "no catch-up");
    let f = nodes[victim].post("/api/v1/fetch", &json!({"entries": [{"queue": "k9", "partition": "Default", "offset": 0}]}));
    let ids: std::collections::BTreeSet<String> =
        f.json["entries"][0]["records"].as_array().unwrap().iter().map(|r| r["transactionId"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids.len(), 40, "every acknowledged write, once: {}", f.text);
}
