//! Durability against real process deaths: every acknowledged push survives kill -9, exactly
//! once; SIGTERM finishes and exits 0.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_tests::{Node, post_url};
use serde_json::{Value, json};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// Drain a queue with autoAck pops, returning every transactionId seen (with repeats).
fn drain(n: &Node, queue: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let a = n.get(&format!(
            "/api/v1/pop/queue/{queue}?batch=1000&partitions=16&wait=false&autoAck=true"
        ));
        if a.status == 204 {
            return seen;
        }
        assert_eq!(a.status, 200, "{}", a.text);
        assert_eq!(a.json["leaseId"], "", "autoAck takes no lease");
        for m in a.json["messages"].as_array().unwrap() {
            seen.push(m["transactionId"].as_str().unwrap().to_owned());
        }
    }
}

#[test]
fn every_acknowledged_push_survives_kill_9_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = Node::start(bin(), &dir.path().join("n1"), &[]);
    let port = n.port;
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    // Eight writers push as fast as they can; the test kills the node under them.
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let acked = acked.clone();
            std::thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(20);
                for i in 0..100_000 {
                    if Instant::now() > until {
                        break;
                    }
                    let txn = format!("w{w}-{i}");
                    let body = json!({"items": [{"queue": "durable", "partition": format!("p{}", w % 4), "transactionId": txn, "payload": {"i": i}}]});
                    match post_url(&format!("http://127.0.0.1:{port}/api/v1/push"), &body.to_string()) {
                        Ok((200, text)) => {
                            let v: Value = serde_json::from_str(&text).unwrap();
                            assert_eq!(v[0]["status"], "queued");
                            acked.lock().unwrap().insert(txn);
                        }
                        _ => break,
                    }
                }
            })
        })
        .collect();
    assert!(
        queen_tests::eventually(Duration::from_secs(20), || acked.lock().unwrap().len()
            >= 300),
        "writers made no progress:\n{}",
        n.log_text()
    );
    n.kill9();
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    n.restart();
    let seen = drain(&n, "durable");
    eprintln!(
        "acknowledged before kill -9: {}, stored after restart: {}",
        acked.len(),
        seen.len()
    );
    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "a message was stored twice");
    let missing: Vec<_> = acked.difference(&unique).take(5).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged pushes lost after kill -9, e.g. {missing:?}",
        acked.difference(&unique).count()
    );
    // Resending acknowledged pushes after the restart writes nothing new.
    let some: Vec<&String> = acked.iter().take(20).collect();
    for txn in some {
        let (w, _) = txn.split_once('-').unwrap();
        let p = format!("p{}", w[1..].parse::<u32>().unwrap() % 4);
        let a = n.post("/api/v1/push", &json!({"items": [{"queue": "durable", "partition": p, "transactionId": txn, "payload": 0}]}));
        assert_eq!(a.json[0]["status"], "duplicate", "{txn}");
    }
}

#[test]
fn leases_and_cursors_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = Node::start(bin(), &dir.path().join("n1"), &[]);
    for i in 0..3 {
        n.post(
            "/api/v1/push",
            &json!({"items": [{"queue": "c", "transactionId": format!("t{i}"), "payload": i}]}),
        );
    }
    let got = n.get("/api/v1/pop/queue/c?batch=1&wait=false");
    let m = got.json["messages"][0].clone();
    let a = n.post("/api/v1/ack", &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": got.json["leaseId"], "status": "completed"}));
    assert_eq!(a.json[0]["success"], true);
    let held = n.get("/api/v1/pop/queue/c?batch=1&wait=false");
    assert_eq!(held.json["messages"][0]["transactionId"], "t1");
    n.kill9();
    n.restart();
    // The cursor kept the ack; the lease on t1 still holds the partition after the restart.
    assert_eq!(n.get("/api/v1/pop/queue/c?batch=1&wait=false").status, 204);
    let m = held.json["messages"][0].clone();
    let a = n.post("/api/v1/ack", &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": held.json["leaseId"], "status": "completed"}));
    assert_eq!(a.json[0]["success"], true, "{}", a.text);
    let next = n.get("/api/v1/pop/queue/c?batch=5&wait=false");
    assert_eq!(next.json["messages"][0]["transactionId"], "t2");
}

#[test]
fn sigterm_finishes_and_exits_zero_then_restarts_with_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = Node::start(bin(), &dir.path().join("n1"), &[]);
    let a = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "t", "transactionId": "x", "payload": 1}]}),
    );
    assert_eq!(a.status, 200);
    // A long poll in flight when SIGTERM arrives is answered, not cut.
    let port = n.port;
    let poll = std::thread::spawn(move || {
        queen_tests::get_url(&format!(
            "http://127.0.0.1:{port}/api/v1/pop/queue/nothing?wait=true&timeout=2000"
        ))
    });
    assert!(
        queen_tests::a_pop_waits(&n, Duration::from_secs(10)),
        "the long poll never parked"
    );
    let status = n.sigterm(Duration::from_secs(40));
    assert!(status.success(), "exit status {status}:\n{}", n.log_text());
    assert_eq!(poll.join().unwrap().0, 204);
    n.restart();
    let got = n.get("/api/v1/pop/queue/t?batch=1&wait=false");
    assert_eq!(got.json["messages"][0]["transactionId"], "x");
}
