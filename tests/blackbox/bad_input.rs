//! Bad input gets a 4xx naming the field, and the node keeps serving.

use std::path::Path;

use queen_tests::Node;
use serde_json::json;

#[test]
fn malformed_and_invalid_requests_are_refused_with_named_fields() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(Path::new(env!("CARGO_BIN_EXE_queen")), &dir.path().join("n1"), &[("QUEEN_MAX_BODY_BYTES", "4096")]);
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("POST", "/api/v1/push", "{not json".into(), 400, "bad_json"),
        ("POST", "/api/v1/push", "[]".into(), 400, "body"),
        ("POST", "/api/v1/push", "".into(), 400, "body"),
        ("POST", "/api/v1/push", json!({"items": "x"}).to_string(), 400, "items"),
        ("POST", "/api/v1/push", json!({"items": [{"payload": 1}]}).to_string(), 400, "items[0].queue"),
        ("POST", "/api/v1/push", json!({"items": [{"queue": 7}]}).to_string(), 400, "items[0].queue"),
        ("POST", "/api/v1/push", json!({"items": [{"queue": "a/b"}]}).to_string(), 400, "items[0].queue"),
        ("POST", "/api/v1/push", json!({"items": [{"queue": "q", "partition": ""}]}).to_string(), 400, "items[0].partition"),
        ("POST", "/api/v1/push", json!({"items": [{"queue": "q", "transactionId": 5}]}).to_string(), 400, "items[0].transactionId"),
        ("POST", "/api/v1/push", json!({"items": [{"queue": "q", "payload": "x".repeat(5000)}]}).to_string(), 413, "payload_too_large"),
        ("POST", "/api/v1/ack", json!({"partitionId": "1"}).to_string(), 400, "transactionId"),
        ("POST", "/api/v1/ack", json!({"transactionId": "t", "partitionId": true}).to_string(), 400, "partitionId"),
        ("POST", "/api/v1/ack/batch", json!({"acknowledgments": [{"transactionId": "t"}]}).to_string(), 400, "acknowledgments[0].partitionId"),
        ("POST", "/api/v1/configure", json!({"options": {}}).to_string(), 400, "queue"),
        ("POST", "/api/v1/configure", json!({"queue": "q", "options": {"leaseTime": "long"}}).to_string(), 400, "options.leaseTime"),
        ("POST", "/api/v1/configure", json!({"queue": "q", "options": 3}).to_string(), 400, "options"),
        ("GET", "/api/v1/pop/queue/q?batch=zero", String::new(), 400, "batch"),
        ("GET", "/api/v1/pop/queue/q?batch=0", String::new(), 400, "batch"),
        ("GET", "/api/v1/pop/queue/q?wait=maybe", String::new(), 400, "wait"),
        ("GET", "/api/v1/pop/queue/q?subscriptionFrom=yesterday", String::new(), 400, "subscriptionFrom"),
        ("GET", "/api/v1/nowhere", String::new(), 404, "no_such_route"),
    ];
    for (method, path, body, status, needle) in &cases {
        let a = n.request(method, path, if *method == "GET" { None } else { Some(body) });
        assert_eq!(a.status, *status, "{method} {path} {body:.80} -> {}", a.text);
        assert!(a.json["code"].is_string(), "error envelope has a code: {}", a.text);
        assert!(a.text.contains(needle), "{method} {path}: error should name '{needle}': {}", a.text);
    }
    // Nothing was half-applied: no queue was created by the refused pushes.
    let s = n.get("/status");
    assert_eq!(s.json["queues"]["count"], 0, "{}", s.text);
    // And the node still serves.
    let ok = n.post("/api/v1/push", &json!({"items": [{"queue": "q", "payload": {"ok": true}}]}));
    assert_eq!(ok.status, 200);
    assert_eq!(n.get("/health").status, 200);
}

#[test]
fn a_bad_setting_stops_the_boot_with_one_line_naming_it() {
    for (var, value) in [("PORT", "abc"), ("QUEEN_RAFT_NODE_ID", "zero"), ("QUEEN_RAFT_PEERS", "1=nonsense"), ("QUEEN_LOG_FORMAT", "xml")] {
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
    let mut n = Node::start(Path::new(env!("CARGO_BIN_EXE_queen")), &dir.path().join("n1"), &[]);
    let ok = n.post("/api/v1/push", &json!({"items": [{"queue": "q", "transactionId": "t1", "payload": 1}]}));
    assert_eq!(ok.status, 200);
    n.sigterm(std::time::Duration::from_secs(30));
    // 0% would never trip on a real file system; 1% does on any disk holding this checkout.
    let mut gated = Node::start(Path::new(env!("CARGO_BIN_EXE_queen")), &dir.path().join("n1"), &[("QUEEN_RAFT_DISK_HIGH_PCT", "1")]);
    let refused = gated.post("/api/v1/push", &json!({"items": [{"queue": "q", "transactionId": "t2", "payload": 2}]}));
    assert_eq!(refused.status, 507, "{}", refused.text);
    assert_eq!(refused.json["code"], "disk_full");
    let got = gated.get("/api/v1/pop/queue/q?batch=5&wait=false");
    assert_eq!(got.status, 200, "pops go on: {}", got.text);
    let m = &got.json["messages"][0];
    let a = gated.post("/api/v1/ack", &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": got.json["leaseId"], "status": "completed"}));
    assert_eq!(a.json[0]["success"], true, "acks go on");
    gated.kill9();
}
