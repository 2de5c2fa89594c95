//! Bad input gets a 4xx naming the field, and the node keeps serving.

use std::path::Path;

use queen_tests::{Node, qpb1_txn};
use serde_json::json;

#[test]
fn malformed_and_invalid_requests_are_refused_with_named_fields() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &dir.path().join("n1"),
        &[("QUEEN_MAX_BODY_BYTES", "4096")],
    );
    let long_lease = format!("/api/v1/lease/{}/extend", "x".repeat(300));
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("POST", "/api/v1/push", "{not json".into(), 400, "bad_json"),
        ("POST", "/api/v1/push", "[]".into(), 400, "body"),
        ("POST", "/api/v1/push", "".into(), 400, "body"),
        (
            "POST",
            "/api/v1/push",
            json!({"items": "x"}).to_string(),
            400,
            "items",
        ),
        (
            "POST",
            "/api/v1/push",
            json!({"items": [{"payload": 1}]}).to_string(),
            400,
            "items[0].queue",
        ),
        (
            "POST",
            "/api/v1/push",
            json!({"items": [{"queue": 7}]}).to_string(),
            400,
            "items[0].queue",
        ),
        (
            "POST",
            "/api/v1/push",
            json!({"items": [{"queue": "a/b"}]}).to_string(),
            400,
            "items[0].queue",
        ),
        (
            "POST",
            "/api/v1/push",
            json!({"items": [{"queue": "q", "partition": ""}]}).to_string(),
            400,
            "items[0].partition",
        ),
        (
            "POST",
            "/api/v1/push",
            json!({"items": [{"queue": "q", "transactionId": 5}]}).to_string(),
            400,
            "items[0].transactionId",
        ),
        (
            "POST",
            "/api/v1/push",
            json!({"items": [{"queue": "q", "payload": "x".repeat(5000)}]}).to_string(),
            413,
            "payload_too_large",
        ),
        (
            "POST",
            "/api/v1/ack",
            json!({"partitionId": "1"}).to_string(),
            400,
            "transactionId",
        ),
        (
            "POST",
            "/api/v1/ack",
            json!({"transactionId": "t", "partitionId": true}).to_string(),
            400,
            "partitionId",
        ),
        (
            "POST",
            "/api/v1/ack/batch",
            json!({"acknowledgments": [{"transactionId": "t"}]}).to_string(),
            400,
            "acknowledgments[0].partitionId",
        ),
        // Ids are checked once, at the edge (issue 16): not empty, not too long, no control
        // characters in a lease id.
        (
            "POST",
            "/api/v1/ack",
            json!({"transactionId": "", "partitionId": "1"}).to_string(),
            400,
            "transactionId",
        ),
        (
            "POST",
            "/api/v1/ack/batch",
            json!({"acknowledgments": [{"transactionId": "t", "partitionId": "1", "leaseId": "a\u{1}b"}]}).to_string(),
            400,
            "acknowledgments[0].leaseId",
        ),
        (
            "POST",
            "/api/v1/transaction",
            json!({"operations": [{"type": "push", "items": [{"queue": "q"}]}], "requiredLeases": ["x".repeat(300)]}).to_string(),
            400,
            "requiredLeases[0]",
        ),
        (
            "POST",
            &long_lease,
            String::new(),
            400,
            "leaseId",
        ),
        (
            "POST",
            "/api/v1/configure",
            json!({"options": {}}).to_string(),
            400,
            "queue",
        ),
        (
            "POST",
            "/api/v1/configure",
            json!({"queue": "q", "options": {"leaseTime": "long"}}).to_string(),
            400,
            "options.leaseTime",
        ),
        (
            "POST",
            "/api/v1/configure",
            json!({"queue": "q", "options": 3}).to_string(),
            400,
            "options",
        ),
        (
            "GET",
            "/api/v1/pop/queue/q?batch=zero",
            String::new(),
            400,
            "batch",
        ),
        (
            "GET",
            "/api/v1/pop/queue/q?batch=0",
            String::new(),
            400,
            "batch",
        ),
        (
            "GET",
            "/api/v1/pop/queue/q?wait=maybe",
            String::new(),
            400,
            "wait",
        ),
        (
            "GET",
            "/api/v1/pop/queue/q?frames=maybe",
            String::new(),
            400,
            "frames",
        ),
        (
            "GET",
            "/api/v1/pop/queue/q?subscriptionFrom=yesterday",
            String::new(),
            400,
            "subscriptionFrom",
        ),
        (
            "GET",
            "/api/v1/nowhere",
            String::new(),
            404,
            "no_such_route",
        ),
        // A streams cycle is read once, its lists item by item: each part is named.
        ("POST", "/streams/v1/cycle", "{not json".into(), 400, "bad_json"),
        ("POST", "/streams/v1/cycle", "[1]".into(), 400, "body"),
        (
            "POST",
            "/streams/v1/cycle",
            json!({"partition_id": "p"}).to_string(),
            400,
            "query_id",
        ),
        (
            "POST",
            "/streams/v1/cycle",
            json!({"query_id": "q", "partition_id": "p", "push_items": {"queue": "x"}})
                .to_string(),
            400,
            "push_items must be lists",
        ),
        (
            "POST",
            "/streams/v1/cycle",
            json!({"query_id": "q", "partition_id": "p", "state_ops": [{"type": "upsert", "key": ""}]})
                .to_string(),
            400,
            "state_ops[0].key",
        ),
        (
            "POST",
            "/streams/v1/cycle",
            json!({"query_id": "q", "partition_id": "p", "push_items": [{"payload": 1}]})
                .to_string(),
            400,
            "push_items[0].queue",
        ),
        (
            "POST",
            "/streams/v1/cycle",
            json!({"query_id": "q", "partition_id": "p", "ack": 5}).to_string(),
            400,
            "ack",
        ),
    ];
    for (method, path, body, status, needle) in &cases {
        let a = n.request(
            method,
            path,
            if *method == "GET" { None } else { Some(body) },
        );
        assert_eq!(
            a.status, *status,
            "{method} {path} {body:.80} -> {}",
            a.text
        );
        assert!(
            a.json["code"].is_string(),
            "error envelope has a code: {}",
            a.text
        );
        assert!(
            a.text.contains(needle),
            "{method} {path}: error should name '{needle}': {}",
            a.text
        );
    }
    // Nothing was half-applied: no queue was created by the refused pushes.
    let s = n.get("/status");
    assert_eq!(s.json["queues"]["count"], 0, "{}", s.text);
    // And the node still serves.
    let ok = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "q", "payload": {"ok": true}}]}),
    );
    assert_eq!(ok.status, 200);
    assert_eq!(n.get("/health").status, 200);
}

#[test]
fn a_bad_setting_stops_the_boot_with_one_line_naming_it() {
    for (var, value) in [
        ("PORT", "abc"),
        ("QUEEN_RAFT_NODE_ID", "zero"),
        ("QUEEN_RAFT_PEERS", "1=nonsense"),
        ("QUEEN_LOG_FORMAT", "xml"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_queen"))
            .env_clear()
            .env(var, value)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{var}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.starts_with(var), "{err}");
    }
}

#[test]
fn above_the_disk_gate_writes_answer_507_and_consumers_still_drain() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = Node::start(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &dir.path().join("n1"),
        &[],
    );
    let ok = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "q", "transactionId": "t1", "payload": 1}]}),
    );
    assert_eq!(ok.status, 200);
    n.sigterm(std::time::Duration::from_secs(30));
    // 0% would never trip on a real file system; 1% does on any disk holding this checkout.
    let mut gated = Node::start(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &dir.path().join("n1"),
        &[("QUEEN_RAFT_DISK_HIGH_PCT", "1")],
    );
    let refused = gated.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "q", "transactionId": "t2", "payload": 2}]}),
    );
    assert_eq!(refused.status, 507, "{}", refused.text);
    assert_eq!(refused.json["code"], "disk_full");
    let got = gated.get("/api/v1/pop/queue/q?batch=5&wait=false");
    assert_eq!(got.status, 200, "pops go on: {}", got.text);
    let m = &got.json["messages"][0];
    let a = gated.post("/api/v1/ack", &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": got.json["leaseId"], "status": "completed"}));
    assert_eq!(a.json[0]["success"], true, "acks go on");
    gated.kill9();
}

#[test]
fn a_malformed_binary_push_is_a_400_naming_the_problem_and_stores_nothing() {
    const BINARY: &str = "application/x-queen-push";
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &dir.path().join("n1"),
        &[("QUEEN_MAX_BODY_BYTES", "4096")],
    );
    // The first group is valid; the second holds a payload that is not JSON. Nothing of the
    // body may be stored, not even the first group.
    let bad_payload = qpb1_txn(&[
        ("q", "Default", &[("t1", "1")]),
        ("q", "p2", &[("t2", "{")]),
    ]);
    let mut truncated = qpb1_txn(&[("q", "Default", &[("t1", "1"), ("t2", "2")])]);
    truncated.truncate(truncated.len() - 1);
    // One group whose zstd frame of stored frames would decompress to 1 MiB: far past the
    // 4096-byte body limit, in a body of a few hundred bytes.
    let mut frame = Vec::new();
    let payload = format!("\"{}\"", "x".repeat(1 << 20));
    frame.extend_from_slice(
        &u32::try_from(1 + 16 + 2 + 2 + payload.len())
            .unwrap()
            .to_le_bytes(),
    );
    frame.push(0);
    frame.extend_from_slice(&[7; 16]);
    frame.extend_from_slice(b"\x02\0t1");
    frame.extend_from_slice(payload.as_bytes());
    let z = zstd::bulk::compress(&frame, 1).unwrap();
    let mut bomb = b"QPB1\x08\x01\0\0\0\x01\0q\x07\0Default\x01\0\0\0".to_vec();
    bomb.extend_from_slice(&u32::try_from(z.len()).unwrap().to_le_bytes());
    bomb.extend_from_slice(&z);
    assert!(bomb.len() < 4096, "{}", bomb.len());
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "/api/v1/push",
            bad_payload,
            400,
            "QPB1 group 1 (q/p2) message 0: the payload is not one JSON document",
        ),
        (
            "/api/v1/push",
            truncated,
            400,
            "QPB1 group 0 (q/Default) message 1: ends inside its payload",
        ),
        (
            "/api/v1/push",
            br#"{"items":[{"queue":"q","payload":1}]}"#.to_vec(),
            400,
            "the body does not start with QPB1",
        ),
        (
            "/api/v1/push",
            bomb,
            413,
            "QPB1 group 0 (q/Default): would decompress to",
        ),
        (
            "/api/v1/transaction",
            b"QTB1\0\x02\0\0\0{}\x01\0\0\0".to_vec(),
            400,
            "QTB1 group 0: ends inside the length of the queue name",
        ),
        (
            "/api/v1/ack",
            b"QPB1\0".to_vec(),
            415,
            "unsupported_media_type",
        ),
    ];
    for (path, body, status, needle) in &cases {
        let a = n.post_bytes(path, BINARY, body);
        assert_eq!(a.status, *status, "{path} {needle}: {}", a.text);
        assert!(
            a.json["code"].is_string() && a.json["error"].is_string(),
            "error envelope: {}",
            a.text
        );
        assert!(
            a.text.contains(needle),
            "{path}: error should say '{needle}': {}",
            a.text
        );
    }
    let s = n.get("/status");
    assert_eq!(
        s.json["queues"]["count"], 0,
        "a refused binary body created a queue: {}",
        s.text
    );
    // A valid body of the same shape is stored, and the JSON default still works beside it.
    let ok = n.post_bytes(
        "/api/v1/push",
        BINARY,
        &qpb1_txn(&[("q", "Default", &[("t1", r#"{"n":1}"#), ("", "null")])]),
    );
    assert_eq!(ok.status, 200, "{}", ok.text);
    assert_eq!(ok.json[0]["status"], "queued", "{}", ok.text);
    assert_eq!(
        ok.json[1]["transaction_id"], ok.json[1]["message_id"],
        "an empty transactionId is the minted id: {}",
        ok.text
    );
    let json = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "q", "transactionId": "t3", "payload": 3}]}),
    );
    assert_eq!(json.status, 200, "{}", json.text);
    let got = n.get("/api/v1/pop/queue/q?batch=10&wait=false");
    let data: Vec<_> = got.json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"].clone())
        .collect();
    assert_eq!(
        data,
        [json!({"n": 1}), json!(null), json!(3)],
        "{}",
        got.text
    );
}
