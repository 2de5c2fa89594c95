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

/// Messages `n` holds in ephemeral rings (its gauge, refreshed every second).
fn held_messages(n: &Node) -> u64 {
    let text = n.get("/metrics/prometheus").text;
    text.lines()
        .find(|l| l.starts_with("queen_ephemeral_messages"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
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
    assert!(
        eventually(Duration::from_secs(5), || {
            let held: Vec<u64> = nodes.iter().map(held_messages).collect();
            held.iter().sum::<u64>() == 24 && held.iter().filter(|h| **h > 0).count() >= 2
        }),
        "messages per node: {:?}",
        nodes.iter().map(held_messages).collect::<Vec<_>>()
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
            "http://127.0.0.1:{}/api/v1/ephemeral/pop?queue=waits&batch=1&group=w&autoAck=true&wait=true&timeout=8000",
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

    // The official Python client, one node per client: push through node 1, pop through
    // node 2, ack through node 3.
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("http://127.0.0.1:{}", n.port))
        .collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/client/run.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("--script")
        .arg("ephemeral_cluster.py")
        .args(&urls)
        .output()
        .expect("bash runs tests/client/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ephemeral cluster ok"),
        "the official client against three nodes: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

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
    // The gauges are refreshed every second: let them catch up with the pushes.
    std::thread::sleep(Duration::from_millis(2500));
    let before: Vec<u64> = nodes.iter().map(held_messages).collect();
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
    // Once node 3 is back, the others know what its crash lost: what it held when they
    // last asked.
    assert!(
        eventually(Duration::from_secs(20), || {
            nodes[0].get("/status").json["ephemeral"]["lostOnCrash"].as_u64() == Some(before[2])
        }),
        "status: {}",
        nodes[0].get("/status").json["ephemeral"]
    );
    let depth = nodes[2].get(&format!("/api/v1/ephemeral/queues/{q}/depth"));
    assert_eq!(depth.status, 200, "{}", depth.text);
    assert_eq!(depth.json["options"]["leaseSeconds"], 30);
    let gone = nodes[0].request("DELETE", &format!("/api/v1/ephemeral/queue/{q}"), None);
    assert_eq!(gone.json["deleted"], true, "{}", gone.text);
    let depth = nodes[1].get(&format!("/api/v1/ephemeral/queues/{q}/depth"));
    assert_eq!(depth.status, 404, "{}", depth.text);
    assert_eq!(depth.json["code"], "ephemeral_queue_not_found");
}

/// Push `rounds` rounds over `parts` through the node at `port`, one message per partition
/// per round (`{"p": i, "n": round}`); answers how many each partition got accepted.
fn write_rounds(
    port: u16,
    queue: &str,
    parts: usize,
    rounds: usize,
    pause: Duration,
) -> Vec<usize> {
    let url = format!("http://127.0.0.1:{port}/api/v1/ephemeral/push");
    let mut accepted = vec![0; parts];
    for n in 0..rounds {
        for (p, got) in accepted.iter_mut().enumerate() {
            let body = json!({"queue": queue, "partition": format!("p{p}"), "messages": [{"payload": {"p": p, "n": n}}]});
            // Retried until accepted, so each partition's sequence has no holes.
            for _ in 0..200 {
                match queen_tests::post_url(&url, &body.to_string()) {
                    Ok((201, _)) => {
                        *got += 1;
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(25)),
                }
            }
        }
        std::thread::sleep(pause);
    }
    accepted
}

/// Pop with autoAck through the node at `port` until `want` messages came or `limit` passed.
fn read_all(port: u16, queue: &str, group: &str, want: usize, limit: Duration) -> Vec<Value> {
    let url = format!(
        "http://127.0.0.1:{port}/api/v1/ephemeral/pop?queue={queue}&group={group}&batch=200&autoAck=true&wait=true&timeout=300"
    );
    let until = std::time::Instant::now() + limit;
    let mut got = Vec::new();
    while got.len() < want && std::time::Instant::now() < until {
        if let Ok((200, body)) = queen_tests::try_get_url(&url, Duration::from_secs(10)) {
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            got.extend(v["messages"].as_array().cloned().unwrap_or_default());
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    got
}

/// Each partition's `n` values in the order they were delivered.
fn sequences(msgs: &[Value], parts: usize) -> Vec<Vec<u64>> {
    let mut seq = vec![Vec::new(); parts];
    for m in msgs {
        let p = m["payload"]["p"].as_u64().unwrap() as usize;
        seq[p].push(m["payload"]["n"].as_u64().unwrap());
    }
    seq
}

#[test]
fn a_stopping_owner_hands_its_rings_over_and_takes_them_back_without_loss() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut nodes = three_nodes(bin(), dir.path(), "eph-token", |_| Vec::new());
    let (parts, rounds) = (12, 120);
    let (p1, p2) = (nodes[0].port, nodes[1].port);
    // A queue nobody reads until the end: node 3's share of it must travel at SIGTERM.
    let held = write_rounds(p1, "held", parts, 10, Duration::ZERO);

    // A writer through node 1 and a reader through node 2 while node 3 stops on SIGTERM.
    let writer = std::thread::spawn(move || {
        write_rounds(p1, "moving", parts, rounds, Duration::from_millis(10))
    });
    let reader = std::thread::spawn(move || {
        read_all(p2, "moving", "r", parts * rounds, Duration::from_secs(90))
    });
    std::thread::sleep(Duration::from_millis(800));
    let status = nodes[2].sigterm(Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
    let log = nodes[2].log_text();
    let line = log
        .lines()
        .find(|l| l.contains("ephemeral rings handed over"))
        .unwrap_or_else(|| panic!("no hand-over line:\n{log}"));
    assert!(line.contains("lost=0"), "{line}");
    assert!(
        !line.contains("rings=0"),
        "node 3 owned partitions of the queue: {line}"
    );
    assert!(
        !line.contains("delivered=0"),
        "node 3 held messages of 'held': {line}"
    );
    eprintln!("{line}");

    // While node 3 is away, a second queue fills on the others; node 3 comes back while a
    // writer keeps pushing, and what moves back to it is all still there.
    let during =
        std::thread::spawn(move || write_rounds(p1, "back", parts, 40, Duration::from_millis(20)));
    std::thread::sleep(Duration::from_millis(300));
    nodes[2].restart();
    nodes[2].wait_healthy(Duration::from_secs(60));

    let accepted = writer.join().unwrap();
    assert!(accepted.iter().all(|a| *a == rounds), "{accepted:?}");
    let got = reader.join().unwrap();
    let seq = sequences(&got, parts);
    let want: Vec<u64> = (0..rounds as u64).collect();
    for (p, s) in seq.iter().enumerate() {
        assert_eq!(s, &want, "partition p{p}: lost, repeated or reordered");
    }

    let got = read_all(p2, "held", "end", parts * 10, Duration::from_secs(30));
    let seq = sequences(&got, parts);
    for (p, s) in seq.iter().enumerate() {
        let want: Vec<u64> = (0..held[p] as u64).collect();
        assert_eq!(s, &want, "partition p{p} of the queue nobody read");
    }

    let back = during.join().unwrap();
    let total: usize = back.iter().sum();
    // Node 3 takes its partitions back.
    assert!(
        eventually(Duration::from_secs(20), || held_messages(&nodes[2]) > 0),
        "node 3 holds nothing of the queue after it came back"
    );
    let got = read_all(p1, "back", "late", total, Duration::from_secs(30));
    assert_eq!(got.len(), total, "{back:?}");
    let seq = sequences(&got, parts);
    for (p, s) in seq.iter().enumerate() {
        let want: Vec<u64> = (0..back[p] as u64).collect();
        assert_eq!(s, &want, "partition p{p} of the queue that moved back");
    }
    // A stop that handed its rings over is no crash.
    let status = nodes[0].get("/status").json;
    assert_eq!(
        status["ephemeral"]["lostOnCrash"], 0,
        "{}",
        status["ephemeral"]
    );
}

#[test]
fn the_node_budget_answers_503_and_memory_stays_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut node = Node::start(
        bin(),
        dir.path(),
        &[
            ("QUEEN_EPHEMERAL_MAX_BYTES", "8388608"),
            ("QUEEN_EPHEMERAL_QUEUE_MAX_BYTES", "8388608"),
            ("QUEEN_EPHEMERAL_QUEUE_MAX_LENGTH", "10000000"),
        ],
    );
    node.wait_healthy(Duration::from_secs(60));
    let pid = node.pid().expect("running");
    let base = queen_tests::memory_kib(pid, "VmRSS");
    // 64 KiB payloads into ten queues until the node refuses: 8 MiB of budget.
    let payload = json!("x".repeat(64 << 10));
    let (mut accepted, mut refused) = (0, None);
    for i in 0..2000 {
        let a = push(
            &node,
            &format!("q{}", i % 10),
            "p",
            std::slice::from_ref(&payload),
        );
        if a.status == 201 {
            accepted += 1;
        } else {
            refused = Some(a);
            break;
        }
    }
    let a = refused.expect("the budget refused a push");
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["code"], "ephemeral_unavailable", "{}", a.text);
    assert!(a.retry_after.is_some());
    assert!(
        (100..=128).contains(&accepted),
        "{accepted} pushes of 64 KiB fit in 8 MiB"
    );
    // Keep pushing (refused) for a while: memory does not grow past the budget.
    for i in 0..500 {
        assert_eq!(
            push(
                &node,
                &format!("q{}", i % 10),
                "p",
                std::slice::from_ref(&payload)
            )
            .status,
            503
        );
    }
    let grown = queen_tests::memory_kib(pid, "VmRSS").saturating_sub(base);
    assert!(
        grown < 64 * 1024,
        "RSS grew {grown} KiB for an 8 MiB budget"
    );
    // Draining makes room again.
    for i in 0..10 {
        let got = pop(&node, &format!("queue=q{i}&batch=100&autoAck=true"));
        assert!(!got.is_empty());
    }
    assert_eq!(push(&node, "q0", "p", &[payload]).status, 201);
}
