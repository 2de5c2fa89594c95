//! The broker API beyond push/pop/ack on one real node: KV, locks, transactions with a KV rider,
//! offset reads, dead letters, consumer-group admin and status routes.

use std::path::Path;

use queen_tests::Node;
use serde_json::{Value, json};

fn node(dir: &Path) -> Node {
    Node::start(Path::new(env!("CARGO_BIN_EXE_queen")), &dir.join("n1"), &[])
}

fn kv(n: &Node, ops: Value) -> Value {
    let a = n.post("/api/v1/kv", &json!({ "operations": ops }));
    assert_eq!(a.status, 200, "{}", a.text);
    a.json
}

#[test]
fn kv_versions_preconditions_and_the_path_form() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let r = kv(&n, json!([{"op": "put", "ns": "app", "key": "cfg", "value": {"a": 1}, "forever": true}]));
    let v1 = r["results"][0]["version"].as_u64().unwrap();
    assert_eq!(r["results"][0]["applied"], true);
    let r = kv(&n, json!([{"op": "putIfAbsent", "ns": "app", "key": "cfg", "value": 2, "ttlSeconds": 60}, {"op": "get", "ns": "app", "key": "cfg"}]));
    assert_eq!(r["results"][0]["applied"], false);
    assert_eq!(r["results"][0]["reason"], "exists");
    assert_eq!(r["results"][0]["version"], v1, "the loser gets the current version");
    assert_eq!(r["results"][1]["value"], json!({"a": 1}));
    // A lost required precondition rolls the whole call back.
    let r = kv(&n, json!([
        {"op": "put", "ns": "app", "key": "other", "value": 1, "forever": true},
        {"op": "check", "ns": "app", "key": "cfg", "expect": v1 + 1000, "required": true}
    ]));
    assert_eq!(r["ok"], false);
    assert_eq!(r["reason"], "kv_precondition");
    assert_eq!(r["failedIndex"], 1);
    assert_eq!(r["kvReason"], "version");
    assert_eq!(r["results"].as_array().unwrap().len(), 2);
    let r = kv(&n, json!([{"op": "get", "ns": "app", "key": "other"}]));
    assert_eq!(r["results"][0]["found"], false);
    // Prefix pages.
    for i in 0..5 {
        kv(&n, json!([{"op": "put", "ns": "pages", "key": format!("k/{i}"), "value": i, "forever": true}]));
    }
    let p = kv(&n, json!([{"op": "getPrefix", "ns": "pages", "prefix": "k/", "limit": 2}]));
    assert_eq!(p["results"][0]["rows"].as_array().unwrap().len(), 2);
    assert_eq!(p["results"][0]["truncated"], true);
    let next = p["results"][0]["nextAfter"].clone();
    let p2 = kv(&n, json!([{"op": "getPrefix", "ns": "pages", "prefix": "k/", "limit": 10, "after": next}]));
    assert_eq!(p2["results"][0]["rows"].as_array().unwrap().len(), 3);
    // The cluster document's write probe, and its path reads.
    let w = n.request("PUT", "/api/v1/kv/ops/probe", Some(r#"{"value":"probe","ttlSeconds":60}"#));
    assert_eq!(w.status, 200, "{}", w.text);
    assert_eq!(w.json["applied"], true);
    assert_eq!(n.get("/api/v1/kv/ops/probe").json["value"], "probe");
    assert_eq!(n.request("DELETE", "/api/v1/kv/ops/probe", None).json["applied"], true);
    assert_eq!(n.get("/api/v1/kv/ops/probe").status, 404);
    // Bad input names the field.
    let bad = n.post("/api/v1/kv", &json!({"operations": [{"op": "put", "ns": "app", "key": "x", "value": 1}]}));
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json["code"], "kv_expiry_not_specified");
    let bad = n.post("/api/v1/kv", &json!({"operations": [{"op": "get", "ns": "Bad NS", "key": "x"}]}));
    assert!(bad.text.contains("operations[0].ns"), "{}", bad.text);
    let bad = n.post("/api/v1/kv", &json!({"operations": [{"op": "frobnicate", "ns": "app", "key": "x"}]}));
    assert!(bad.text.contains("operations[0].op"), "{}", bad.text);
}

#[test]
fn locks_are_exclusive_and_their_guard_rides_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let a = n.post("/api/v1/locks", &json!({"operations": [{"op": "acquire", "name": "leader", "ttlSeconds": 30, "owner": "me"}]}));
    let first = a.json["results"][0].clone();
    assert_eq!(first["acquired"], true, "{}", a.text);
    assert_eq!(first["guard"]["op"], "check");
    let b = n.post("/api/v1/locks", &json!({"operations": [{"op": "acquire", "name": "leader", "ttlSeconds": 30, "owner": "you"}, {"op": "get", "name": "leader"}]}));
    assert_eq!(b.json["results"][0]["acquired"], false);
    assert_eq!(b.json["results"][0]["reason"], "held");
    assert_eq!(b.json["results"][1]["holders"][0]["owner"], "me");
    // A transaction guarded by the lock commits; after a renewal the old guard fails it whole.
    n.post("/api/v1/push", &json!({"items": [{"queue": "guarded", "transactionId": "g1", "payload": 1}]}));
    let t = n.post("/api/v1/transaction", &json!({"operations": [{"type": "push", "items": [{"queue": "out", "transactionId": "o1", "payload": 1}]}], "requiredLeases": [], "kv": [first["guard"]]}));
    assert_eq!(t.json["success"], true, "{}", t.text);
    let renew = n.post("/api/v1/locks", &json!({"operations": [{"op": "renew", "name": "leader", "token": first["token"], "ttlSeconds": 30}]}));
    assert_eq!(renew.json["results"][0]["renewed"], true);
    let stale = n.post("/api/v1/transaction", &json!({"operations": [{"type": "push", "items": [{"queue": "out", "transactionId": "o2", "payload": 2}]}], "requiredLeases": [], "kv": [first["guard"]]}));
    assert_eq!(stale.json["success"], false, "{}", stale.text);
    assert_eq!(stale.json["reason"], "kv_precondition");
    assert_eq!(stale.json["kvReason"], "version");
    assert_eq!(stale.json["value"]["owner"], "me");
    let popped = n.get("/api/v1/pop/queue/out?batch=10&wait=false");
    assert_eq!(popped.json["messages"].as_array().unwrap().len(), 1, "o2 was rolled back");
    let rel = n.post("/api/v1/locks", &json!({"operations": [{"op": "release", "name": "leader", "token": renew.json["results"][0]["token"]}]}));
    assert_eq!(rel.json["results"][0]["released"], true);
}
