//! One real node on loopback: the walkthrough, dedup, leases, retries, groups, long polls.

use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::Node;
use serde_json::{Value, json};

fn node(dir: &Path) -> Node {
    Node::start(Path::new(env!("CARGO_BIN_EXE_queen")), &dir.join("n1"), &[])
}

fn push(n: &Node, queue: &str, partition: &str, txn: &str, payload: Value) -> Value {
    let a = n.post("/api/v1/push", &json!({"items": [{"queue": queue, "partition": partition, "transactionId": txn, "payload": payload}]}));
    assert_eq!(a.status, 200, "{}", a.text);
    a.json[0].clone()
}

fn pop(n: &Node, path: &str) -> Option<Value> {
    let a = n.get(path);
    match a.status {
        200 => Some(a.json),
        204 => None,
        s => panic!("pop answered {s}: {}", a.text),
    }
}

fn ack(n: &Node, msg: &Value, lease: &Value, status: &str, group: Option<&str>) -> Value {
    let a = n.post(
        "/api/v1/ack",
        &json!({"transactionId": msg["transactionId"], "partitionId": msg["partitionId"], "leaseId": lease, "status": status, "consumerGroup": group, "error": if status == "failed" { json!("handler failed") } else { Value::Null }}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    a.json[0].clone()
}

#[test]
fn the_cluster_documents_walkthrough_on_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let h = n.get("/health");
    assert_eq!(h.status, 200);
    assert_eq!(h.json["raft"]["role"], "leader");
    assert_eq!(h.json["raft"]["storageReady"], true);

    let p = push(
        &n,
        "orders",
        "customer-42",
        "order-1001-created",
        json!({"orderId": 1001, "total": 42}),
    );
    assert_eq!(p["status"], "queued");
    assert_eq!(p["offset"], 0);
    assert_eq!(p["transaction_id"], "order-1001-created");
    assert_eq!(p["message_id"].as_str().unwrap().len(), 36);

    let got = pop(
        &n,
        "/api/v1/pop/queue/orders?batch=1&wait=true&timeout=5000",
    )
    .expect("a message");
    let m = &got["messages"][0];
    assert_eq!(m["transactionId"], "order-1001-created");
    assert_eq!(m["partition"], "customer-42");
    assert_eq!(m["data"], json!({"orderId": 1001, "total": 42}));
    assert_eq!(m["offset"], 0);
    assert_eq!(m["deliveryAttempt"], 1);
    assert!(m["createdAt"].as_str().unwrap().ends_with('Z'));

    let a = ack(&n, m, &got["leaseId"], "completed", None);
    assert_eq!(
        a,
        json!({"index": 0, "transactionId": "order-1001-created", "success": true, "error": null, "leaseReleased": true, "dlq": false, "noop": false})
    );
    let again = ack(&n, m, &got["leaseId"], "completed", None);
    assert_eq!(
        again["success"], true,
        "a repeated ack is answered as the first"
    );
    assert_eq!(again["noop"], true);

    assert!(pop(&n, "/api/v1/pop/queue/orders?batch=1&wait=false").is_none());
    let status = n.get("/status");
    assert_eq!(status.status, 200);
    assert_eq!(status.json["queues"]["messages"], 1);
    let metrics = n.get("/metrics/prometheus");
    assert!(
        metrics.text.contains("queen_http_requests_total"),
        "{}",
        metrics.text
    );
    // A lone voter is its own quorum: it stays healthy past an election timeout.
    assert!(
        queen_tests::holds_for(Duration::from_millis(2500), || n.get("/health").status
            == 200),
        "{}",
        n.get("/health").text
    );
}

#[test]
fn a_resent_push_is_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let first = push(&n, "q", "p", "same", json!(1));
    let second = push(&n, "q", "p", "same", json!(2));
    assert_eq!(second["status"], "duplicate");
    assert_eq!(second["message_id"], first["message_id"]);
    let got = pop(&n, "/api/v1/pop/queue/q?batch=10&wait=false").unwrap();
    assert_eq!(got["messages"].as_array().unwrap().len(), 1);
    assert_eq!(got["messages"][0]["data"], 1);
    // Without a transactionId the node mints one: two pushes are two messages.
    let a = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "q2", "payload": "x"}, {"queue": "q2", "payload": "x"}]}),
    );
    assert_eq!(a.json[0]["status"], "queued");
    assert_eq!(a.json[1]["status"], "queued");
    assert_ne!(a.json[0]["transaction_id"], a.json[1]["transaction_id"]);
}

#[test]
fn an_expired_lease_redelivers_and_retries_end_in_the_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let c = n.post("/api/v1/configure", &json!({"queue": "jobs", "namespace": null, "task": null, "options": {"leaseTime": 1, "retryLimit": 1}}));
    assert_eq!(c.status, 200, "{}", c.text);
    assert_eq!(c.json["options"]["leaseTime"], 1);
    push(&n, "jobs", "Default", "j1", json!({"n": 1}));

    let first = pop(&n, "/api/v1/pop/queue/jobs?batch=1&wait=false").unwrap();
    // Nothing else is delivered while the lease lives; after it expires, the same message is.
    assert!(pop(&n, "/api/v1/pop/queue/jobs?batch=1&wait=false").is_none());
    let again = pop(&n, "/api/v1/pop/queue/jobs?batch=1&wait=true&timeout=5000")
        .expect("redelivered after expiry");
    assert_eq!(again["messages"][0]["transactionId"], "j1");
    assert_eq!(
        again["messages"][0]["deliveryAttempt"], 1,
        "expiry does not count a retry"
    );
    assert_ne!(again["leaseId"], first["leaseId"]);
    let stale = ack(
        &n,
        &first["messages"][0],
        &first["leaseId"],
        "completed",
        None,
    );
    assert_eq!(stale["success"], false);

    // Fail it: retried once, then dead-lettered.
    let a = ack(&n, &again["messages"][0], &again["leaseId"], "failed", None);
    assert_eq!(
        (a["success"].clone(), a["dlq"].clone()),
        (json!(true), json!(false))
    );
    let retry = pop(&n, "/api/v1/pop/queue/jobs?batch=1&wait=false").unwrap();
    assert_eq!(retry["messages"][0]["deliveryAttempt"], 2);
    let a = ack(&n, &retry["messages"][0], &retry["leaseId"], "failed", None);
    assert_eq!(a["dlq"], true);
    assert!(
        pop(&n, "/api/v1/pop/queue/jobs?batch=1&wait=false").is_none(),
        "the cursor moved past it"
    );
    let status = n.get("/status");
    let q = status.json["queues"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "jobs")
        .unwrap()
        .clone();
    assert_eq!(q["deadLettered"], 1);
}

#[test]
fn two_consumer_groups_each_see_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    for i in 0..5 {
        push(
            &n,
            "events",
            &format!("p{}", i % 2),
            &format!("e{i}"),
            json!(i),
        );
    }
    for group in ["billing", "audit"] {
        let mut seen = Vec::new();
        while let Some(got) = pop(
            &n,
            &format!(
                "/api/v1/pop/queue/events?batch=10&partitions=4&wait=false&consumerGroup={group}"
            ),
        ) {
            assert_eq!(got["consumerGroup"], group);
            let msgs = got["messages"].as_array().unwrap().clone();
            let acks: Vec<Value> = msgs
                .iter()
                .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": got["leaseId"], "status": "completed"}))
                .collect();
            let a = n.post(
                "/api/v1/ack/batch",
                &json!({"acknowledgments": acks, "consumerGroup": group}),
            );
            assert!(
                a.json
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["success"] == true),
                "{}",
                a.text
            );
            seen.extend(
                msgs.into_iter()
                    .map(|m| m["transactionId"].as_str().unwrap().to_owned()),
            );
        }
        seen.sort();
        assert_eq!(seen, ["e0", "e1", "e2", "e3", "e4"], "group {group}");
    }
}

#[test]
fn a_waiting_pop_is_woken_by_a_push() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let port = n.port;
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let body = queen_tests::get_url(&format!(
            "http://127.0.0.1:{port}/api/v1/pop/queue/later?batch=1&wait=true&timeout=20000"
        ));
        (body, started.elapsed())
    });
    assert!(
        queen_tests::a_pop_waits(&n, Duration::from_secs(10)),
        "the long poll never parked"
    );
    push(&n, "later", "Default", "wake", json!("up"));
    let ((status, text), took) = waiter.join().unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("wake"));
    assert!(
        took < Duration::from_secs(15),
        "woken by the push, not by the timeout: {took:?}"
    );
    // An empty long poll answers 204 after its timeout.
    let started = Instant::now();
    assert!(pop(&n, "/api/v1/pop/queue/empty?wait=true&timeout=500").is_none());
    assert!(started.elapsed() >= Duration::from_millis(450));
}

#[test]
fn lease_extend_and_queue_delete() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    push(&n, "tmp", "Default", "t", json!(null));
    let got = pop(&n, "/api/v1/pop/queue/tmp?batch=1&wait=false").unwrap();
    let lease = got["leaseId"].as_str().unwrap();
    let e = n.request("POST", &format!("/api/v1/lease/{lease}/extend"), None);
    assert_eq!(e.status, 200);
    assert_eq!(e.json["success"], true);
    assert_eq!(e.json["renewed"], 1);
    let e = n.request("POST", "/api/v1/lease/no-such-lease/extend", None);
    assert_eq!(e.json["success"], false);
    let d = n.request("DELETE", "/api/v1/resources/queues/tmp", None);
    assert_eq!(
        d.json,
        json!({"deleted": true, "queue": "tmp", "existed": true})
    );
    let d = n.request("DELETE", "/api/v1/resources/queues/tmp", None);
    assert_eq!(d.json["existed"], false);
    assert!(pop(&n, "/api/v1/pop/queue/tmp?batch=1&wait=false").is_none());
}

#[test]
fn a_transaction_acks_and_pushes_as_one_unit() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    push(&n, "in", "Default", "m1", json!({"v": 1}));
    let got = pop(&n, "/api/v1/pop/queue/in?batch=1&wait=false").unwrap();
    let m = &got["messages"][0];
    let body = json!({
        "operations": [
            {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "completed"},
            {"type": "push", "items": [{"queue": "out", "payload": {"v": 2}, "transactionId": "derived-1"}]}
        ],
        "requiredLeases": [got["leaseId"]]
    });
    let t = n.post("/api/v1/transaction", &body);
    assert_eq!(t.status, 200, "{}", t.text);
    assert_eq!(t.json["success"], true, "{}", t.text);
    assert_eq!(t.json["results"][0]["type"], "ack");
    assert_eq!(t.json["results"][1]["status"], "queued");
    let out = pop(&n, "/api/v1/pop/queue/out?batch=5&wait=false").unwrap();
    assert_eq!(out["messages"][0]["data"], json!({"v": 2}));
    // The lease is gone now: the same bundle fails whole and pushes nothing.
    let again = n.post("/api/v1/transaction", &body);
    assert_eq!(again.json["success"], false);
    assert!(again.json["error"].as_str().unwrap().contains("lease"));
    // Malformed bundles are 400s naming the field.
    let bad = n.post(
        "/api/v1/transaction",
        &json!({"operations": [{"type": "bogus"}], "requiredLeases": []}),
    );
    assert_eq!(bad.status, 400);
    assert!(bad.text.contains("operations[0].type"), "{}", bad.text);
    let empty = n.post(
        "/api/v1/transaction",
        &json!({"operations": [], "requiredLeases": []}),
    );
    assert_eq!(empty.status, 400);
}
