//! Ephemeral queues on three real nodes: every node serves every partition (a node that does
//! not own one hands the operation to its owner over the raft port); configuration is
//! replicated and survives restarts while contents do not; a kill -9 loses only the killed
//! node's share and the others keep serving.

use std::path::Path;
use std::time::Duration;

use queen_tests::{Node, eventually, three_nodes};
use serde_json::{Value, json};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

fn push(n: &Node, queue: &str, partition: &str, payloads: &[Value]) -> queen_tests::Answer {
    let messages: Vec<Value> = payloads.iter().map(|p| json!({"payload": p})).collect();
    n.post(
        "/api/v1/ephemeral/push",
        &json!({"queue": queue, "partition": partition, "messages": messages}),
    )
}

fn pop(n: &Node, query: &str) -> Vec<Value> {
    let a = n.get(&format!("/api/v1/ephemeral/pop?{query}"));
    assert_eq!(a.status, 200, "pop {query}: {}", a.text);
    a.json["messages"].as_array().cloned().unwrap_or_default()
}

#[test]
fn three_nodes_serve_every_partition_and_a_crash_loses_only_its_share() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut nodes = three_nodes(bin(), dir.path(), "eph-token", |_| Vec::new());
    let q = "rooms";
    let a = nodes[0].post(
        "/api/v1/ephemeral/configure",
        &json!({"queue": q, "options": {"leaseSeconds": 30}}),
    );
    assert_eq!(a.status, 200, "{}", a.text);

    // Twelve partitions pushed through node 1, each with its index as payload.
    let parts: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
    for (i, p) in parts.iter().enumerate() {
        let a = push(&nodes[0], q, p, &[json!(i), json!(i + 100)]);
        assert_eq!(a.status, 201, "push {p}: {}", a.text);
        assert_eq!(a.json["pushed"], 2);
    }
    // Partitions are spread over the members: node 1 does not hold them all.
    let metric = |n: &Node| -> u64 {
        let text = n.get("/metrics/prometheus").text;
        text.lines()
            .find(|l| l.starts_with("queen_ephemeral_messages"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    assert!(
        eventually(Duration::from_secs(5), || {
            let held: Vec<u64> = nodes.iter().map(metric).collect();
            held.iter().sum::<u64>() == 24 && held.iter().filter(|h| **h > 0).count() >= 2
        }),
        "messages per node: {:?}",
        nodes.iter().map(metric).collect::<Vec<_>>()
    );

    // Pop each partition through node 2, ack through node 3.
    let mut ids = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let got = pop(
            &nodes[1],
            &format!("queue={q}&partition={p}&batch=10&group=g"),
        );
        let payloads: Vec<Value> = got.iter().map(|m| m["payload"].clone()).collect();
        assert_eq!(payloads, vec![json!(i), json!(i + 100)], "partition {p}");
        ids.extend(got.iter().map(|m| json!({"id": m["id"]})));
    }
    let acked = nodes[2].post(
        "/api/v1/ephemeral/ack",
        &json!({"queue": q, "group": "g", "acks": ids}),
    );
    assert_eq!(acked.status, 200, "{}", acked.text);
    let outcomes: Vec<&str> = acked.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["acked"; 24]);

    // A pop without a partition through any node reaches every member's rings.
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(push(&nodes[2], q, p, &[json!(i)]).status, 201);
    }
    let mut seen = Vec::new();
    for _ in 0..20 {
        seen.extend(pop(
            &nodes[0],
            &format!("queue={q}&batch=5&group=h&autoAck=true"),
        ));
        if seen.len() >= 12 {
            break;
        }
    }
    assert_eq!(seen.len(), 12, "{seen:?}");
    // A waiting pop through node 1 is answered by a push through node 3 into a partition
    // another node owns.
    let waiter = {
        let url = format!(
            "http://127.0.0.1:{}/api/v1/ephemeral/pop?queue=waits&batch=1&group=w&wait=true&timeout=8000",
            nodes[0].port
        );
        std::thread::spawn(move || queen_tests::get_url(&url))
    };
    // Give the pop a moment to park, then push.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        push(&nodes[2], "waits", "late", &[json!("late")]).status,
        201
    );
    let (status, body) = waiter.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"late\""), "{body}");

    // Depth and the listing sum every member's share.
    let depth = nodes[1].get(&format!("/api/v1/ephemeral/queues/{q}/depth"));
    assert_eq!(depth.status, 200, "{}", depth.text);
    assert_eq!(depth.json["tier"], "declared");
    let listed = nodes[2].get("/api/v1/ephemeral/queues");
    assert!(listed.text.contains("\"rooms\""), "{}", listed.text);

    // kill -9 one node: only its share is lost, the others keep serving.
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(push(&nodes[0], q, p, &[json!(format!("k{i}"))]).status, 201);
    }
    let before: Vec<u64> = nodes.iter().map(metric).collect();
    nodes[2].kill9();
    let survivors = before[0] + before[1];
    let mut after = Vec::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            after.extend(pop(
                &nodes[0],
                &format!("queue={q}&batch=50&group=k&autoAck=true"),
            ));
            after.len() as u64 >= survivors
        }),
        "popped {} of the {survivors} the live nodes held ({before:?})",
        after.len()
    );
    assert_eq!(after.len() as u64, survivors, "{after:?}");
    // New pushes into the dead node's partitions are served by the live ones.
    assert!(
        eventually(Duration::from_secs(20), || {
            parts
                .iter()
                .all(|p| push(&nodes[1], q, p, &[json!("again")]).status == 201)
        }),
        "pushes were not served after the kill"
    );

    // Configuration is replicated and survives a restart; contents do not.
    nodes[2].restart();
    nodes[2].wait_healthy(Duration::from_secs(60));
    let depth = nodes[2].get(&format!("/api/v1/ephemeral/queues/{q}/depth"));
    assert_eq!(depth.status, 200, "{}", depth.text);
    assert_eq!(depth.json["options"]["leaseSeconds"], 30);
    let gone = nodes[0].request("DELETE", &format!("/api/v1/ephemeral/queue/{q}"), None);
    assert_eq!(gone.json["deleted"], true, "{}", gone.text);
    let depth = nodes[1].get(&format!("/api/v1/ephemeral/queues/{q}/depth"));
    assert_eq!(depth.status, 404, "{}", depth.text);
    assert_eq!(depth.json["code"], "ephemeral_queue_not_found");
}
