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
    let r = kv(
        &n,
        json!([{"op": "put", "ns": "app", "key": "cfg", "value": {"a": 1}, "forever": true}]),
    );
    let v1 = r["results"][0]["version"].as_u64().unwrap();
    assert_eq!(r["results"][0]["applied"], true);
    let r = kv(
        &n,
        json!([{"op": "putIfAbsent", "ns": "app", "key": "cfg", "value": 2, "ttlSeconds": 60}, {"op": "get", "ns": "app", "key": "cfg"}]),
    );
    assert_eq!(r["results"][0]["applied"], false);
    assert_eq!(r["results"][0]["reason"], "exists");
    assert_eq!(
        r["results"][0]["version"], v1,
        "the loser gets the current version"
    );
    assert_eq!(r["results"][1]["value"], json!({"a": 1}));
    // A lost required precondition rolls the whole call back.
    let r = kv(
        &n,
        json!([
            {"op": "put", "ns": "app", "key": "other", "value": 1, "forever": true},
            {"op": "check", "ns": "app", "key": "cfg", "expect": v1 + 1000, "required": true}
        ]),
    );
    assert_eq!(r["ok"], false);
    assert_eq!(r["reason"], "kv_precondition");
    assert_eq!(r["failedIndex"], 1);
    assert_eq!(r["kvReason"], "version");
    assert_eq!(r["results"].as_array().unwrap().len(), 2);
    let r = kv(&n, json!([{"op": "get", "ns": "app", "key": "other"}]));
    assert_eq!(r["results"][0]["found"], false);
    // Prefix pages.
    for i in 0..5 {
        kv(
            &n,
            json!([{"op": "put", "ns": "pages", "key": format!("k/{i}"), "value": i, "forever": true}]),
        );
    }
    let p = kv(
        &n,
        json!([{"op": "getPrefix", "ns": "pages", "prefix": "k/", "limit": 2}]),
    );
    assert_eq!(p["results"][0]["rows"].as_array().unwrap().len(), 2);
    assert_eq!(p["results"][0]["truncated"], true);
    let next = p["results"][0]["nextAfter"].clone();
    let p2 = kv(
        &n,
        json!([{"op": "getPrefix", "ns": "pages", "prefix": "k/", "limit": 10, "after": next}]),
    );
    assert_eq!(p2["results"][0]["rows"].as_array().unwrap().len(), 3);
    // The cluster document's write probe, and its path reads.
    let w = n.request(
        "PUT",
        "/api/v1/kv/ops/probe",
        Some(r#"{"value":"probe","ttlSeconds":60}"#),
    );
    assert_eq!(w.status, 200, "{}", w.text);
    assert_eq!(w.json["applied"], true);
    assert_eq!(n.get("/api/v1/kv/ops/probe").json["value"], "probe");
    assert_eq!(
        n.request("DELETE", "/api/v1/kv/ops/probe", None).json["applied"],
        true
    );
    assert_eq!(n.get("/api/v1/kv/ops/probe").status, 404);
    // Bad input names the field.
    let bad = n.post(
        "/api/v1/kv",
        &json!({"operations": [{"op": "put", "ns": "app", "key": "x", "value": 1}]}),
    );
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json["code"], "kv_expiry_not_specified");
    let bad = n.post(
        "/api/v1/kv",
        &json!({"operations": [{"op": "get", "ns": "Bad NS", "key": "x"}]}),
    );
    assert!(bad.text.contains("operations[0].ns"), "{}", bad.text);
    let bad = n.post(
        "/api/v1/kv",
        &json!({"operations": [{"op": "frobnicate", "ns": "app", "key": "x"}]}),
    );
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
    n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "guarded", "transactionId": "g1", "payload": 1}]}),
    );
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
    assert_eq!(
        popped.json["messages"].as_array().unwrap().len(),
        1,
        "o2 was rolled back"
    );
    let rel = n.post("/api/v1/locks", &json!({"operations": [{"op": "release", "name": "leader", "token": renew.json["results"][0]["token"]}]}));
    assert_eq!(rel.json["results"][0]["released"], true);
}

#[test]
fn offset_reads_partitions_changed_and_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    for i in 0..5 {
        n.post("/api/v1/push", &json!({"items": [{"queue": "log", "partition": "a", "transactionId": format!("a{i}"), "payload": {"i": i}}]}));
    }
    n.post("/api/v1/push", &json!({"items": [{"queue": "log", "partition": "b", "transactionId": "b0", "payload": "x"}]}));
    let f = n.post(
        "/api/v1/fetch",
        &json!({"entries": [
            {"queue": "log", "partition": "a", "offset": 2, "maxBytes": 1_000_000},
            {"queue": "log", "partition": "a", "offset": 9},
            {"queue": "log", "partition": "zzz", "offset": 0},
            {"queue": "log", "partition": "a", "offset": 0, "maxBytes": 1}
        ]}),
    );
    assert_eq!(f.status, 200, "{}", f.text);
    let e = &f.json["entries"];
    assert_eq!(e[0]["highWatermark"], 5);
    assert_eq!(
        e[0]["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["offset"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [2, 3, 4]
    );
    assert_eq!(e[0]["records"][0]["payload"], json!({"i": 2}));
    assert_eq!(e[1]["error"], "OFFSET_OUT_OF_RANGE");
    assert_eq!(e[2]["error"], "UNKNOWN_TOPIC_OR_PARTITION");
    assert_eq!(
        e[3]["records"].as_array().unwrap().len(),
        1,
        "a tiny budget still returns one record"
    );
    // Fetch reads without a lease or cursor: a pop still gets the first message.
    assert_eq!(
        n.get("/api/v1/pop/queue/log/partition/a?batch=1&wait=false")
            .json["messages"][0]["offset"],
        0
    );

    let c = n.post(
        "/api/v1/partitions/changed",
        &json!({"entries": [{"queue": "log", "limit": 1}]}),
    );
    assert_eq!(c.status, 200, "{}", c.text);
    let safe = c.json["safeTime"].as_str().unwrap().to_owned();
    assert_eq!(safe.len(), 27, "fixed width: {safe}");
    assert_eq!(c.json["entries"][0]["partitions"][0]["name"], "a");
    assert_eq!(c.json["entries"][0]["partitions"][0]["lastOffset"], 4);
    let next = c.json["entries"][0]["next"].as_str().unwrap().to_owned();
    let c2 = n.post(
        "/api/v1/partitions/changed",
        &json!({"entries": [{"queue": "log", "limit": 1, "after": next}]}),
    );
    assert_eq!(c2.json["entries"][0]["partitions"][0]["name"], "b");
    let later = n.post(
        "/api/v1/partitions/changed",
        &json!({"entries": [{"queue": "log", "since": safe}]}),
    );
    assert_eq!(
        later.json["entries"][0]["partitions"]
            .as_array()
            .unwrap()
            .len(),
        0,
        "nothing written since"
    );
    let unknown = n.post(
        "/api/v1/partitions/changed",
        &json!({"entries": [{"queue": "nope"}]}),
    );
    assert_eq!(
        unknown.json["entries"][0]["error"],
        "UNKNOWN_TOPIC_OR_PARTITION"
    );

    // A message failed past its retry limit is listed in the dead letters.
    n.post(
        "/api/v1/configure",
        &json!({"queue": "fragile", "options": {"retryLimit": 0}}),
    );
    n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "fragile", "transactionId": "bad", "payload": {"p": 1}}]}),
    );
    let p = n.get("/api/v1/pop/queue/fragile?batch=1&wait=false&consumerGroup=workers");
    let m = &p.json["messages"][0];
    let a = n.post("/api/v1/ack", &json!({"transactionId": "bad", "partitionId": m["partitionId"], "leaseId": p.json["leaseId"], "status": "failed", "error": "kaput", "consumerGroup": "workers"}));
    assert_eq!(a.json[0]["dlq"], true, "{}", a.text);
    let d = n.get("/api/v1/dlq?queue=fragile&limit=10&consumerGroup=workers");
    assert_eq!(d.json["total"], 1, "{}", d.text);
    assert_eq!(d.json["messages"][0]["errorMessage"], "kaput");
    assert_eq!(d.json["messages"][0]["data"], json!({"p": 1}));
    assert_eq!(
        n.get("/api/v1/dlq?queue=fragile&consumerGroup=other").json["total"],
        0
    );
}

#[test]
fn consumer_group_admin_and_status_routes() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    for i in 0..4 {
        n.post("/api/v1/push", &json!({"items": [{"queue": "work", "partition": format!("p{}", i % 2), "transactionId": format!("w{i}"), "payload": i}]}));
    }
    let p = n.get("/api/v1/pop/queue/work?batch=1&wait=false&consumerGroup=reporting");
    assert_eq!(p.status, 200);
    let groups = n.get("/api/v1/consumer-groups");
    let g = groups
        .json
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "reporting")
        .cloned()
        .expect("group listed");
    assert_eq!(g["queueName"], "work");
    assert_eq!(g["totalLag"], 4);
    let one = n.get("/api/v1/consumer-groups/reporting");
    assert_eq!(one.json["work"]["partitions"].as_array().unwrap().len(), 2);
    assert_eq!(
        n.get("/api/v1/consumer-groups/lagging?minLagSeconds=0")
            .json
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Seek to the end: nothing left to deliver, lease released.
    let s = n.request(
        "POST",
        "/api/v1/consumer-groups/reporting/queues/work/seek",
        Some(r#"{"toEnd": true}"#),
    );
    assert_eq!(s.json["partitionsUpdated"], 2, "{}", s.text);
    assert_eq!(
        n.get("/api/v1/pop/queue/work?batch=10&partitions=2&wait=false&consumerGroup=reporting")
            .status,
        204
    );
    assert_eq!(
        n.request(
            "POST",
            "/api/v1/consumer-groups/reporting/queues/work/seek",
            None
        )
        .status,
        400
    );
    // Delete the group: it starts over from the oldest message.
    let d = n.request(
        "DELETE",
        "/api/v1/consumer-groups/reporting?deleteMetadata=true",
        None,
    );
    assert_eq!(d.json["success"], true, "{}", d.text);
    let again =
        n.get("/api/v1/pop/queue/work?batch=10&partitions=2&wait=false&consumerGroup=reporting");
    assert_eq!(again.json["messages"].as_array().unwrap().len(), 4);
    // Status and resources.
    assert_eq!(n.get("/api/v1/status").json["queues"], 1);
    assert_eq!(
        n.get("/api/v1/status/queues").json["queues"][0]["name"],
        "work"
    );
    assert_eq!(
        n.get("/api/v1/resources/queues/work").json["messages"]["total"],
        4
    );
    assert_eq!(n.get("/api/v1/resources/queues/nope").status, 404);
    let depth = n.get("/api/v1/resources/queues/work/depth");
    assert_eq!(depth.json["pending"], 4, "{}", depth.text);
    assert_eq!(
        n.get("/api/v1/resources/partitions?queue=work").json["partitions"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert!(n.get("/metrics").json.is_object());
    assert_eq!(n.request("POST", "/api/v1/stats/refresh", None).status, 200);
}

#[test]
fn timers_schedule_peek_list_cancel_and_deliver() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    // base64 of {"remind":true}
    let payload = "eyJyZW1pbmQiOnRydWV9";
    let s = n.post("/api/v1/timers", &json!({"operations": [
        {"op": "schedule", "queue": "reminders", "timerKey": "user/42", "payload": payload, "delayMs": 300, "txn": "remind-42"},
        {"op": "schedule", "queue": "reminders", "timerKey": "user/43", "payload": payload, "delayMs": 600_000}
    ]}));
    assert_eq!(s.status, 200, "{}", s.text);
    assert_eq!(s.json["results"][0]["status"], "scheduled");
    let promised = s.json["results"][0]["messageId"].clone();
    let list = n.get("/api/v1/timers/reminders?limit=1");
    assert_eq!(list.json["rows"].as_array().unwrap().len(), 1);
    assert_eq!(list.json["truncated"], true);
    let peek = n.get("/api/v1/timers/reminders/user/43");
    assert_eq!(peek.json["found"], true, "{}", peek.text);
    assert_eq!(peek.json["payload"], payload);
    let c = n.request("DELETE", "/api/v1/timers/reminders/user/43", None);
    assert_eq!(c.json["status"], "cancelled");
    assert_eq!(
        n.request("DELETE", "/api/v1/timers/reminders/user/43?txn=abc", None)
            .json["status"],
        "absent"
    );
    // The due timer is delivered by a tick (about once a second) as the promised message.
    let got = n.get("/api/v1/pop/queue/reminders?batch=5&wait=true&timeout=10000");
    assert_eq!(got.status, 200, "{}", got.text);
    let m = &got.json["messages"][0];
    assert_eq!(m["transactionId"], "remind-42");
    assert_eq!(m["id"], promised);
    assert_eq!(m["data"], json!({"remind": true}));
    assert_eq!(
        got.json["messages"].as_array().unwrap().len(),
        1,
        "the cancelled timer never fires"
    );
    assert_eq!(
        n.get("/api/v1/timers/reminders/user/42").json["found"],
        false
    );
    // Server-owned fields and bad payloads are refused, naming the field.
    let bad = n.post("/api/v1/timers", &json!({"operations": [{"op": "schedule", "queue": "r", "timerKey": "k", "payload": payload, "delayMs": 1, "deliverAt": 5}]}));
    assert_eq!(bad.status, 400);
    assert!(bad.text.contains("operations[0].deliverAt"), "{}", bad.text);
    let bad = n.post("/api/v1/timers", &json!({"operations": [{"op": "schedule", "queue": "r", "timerKey": "k", "payload": "%%%", "delayMs": 1}]}));
    assert!(bad.text.contains("operations[0].payload"), "{}", bad.text);
}

#[test]
fn bad_input_on_the_read_and_admin_routes_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        (
            "POST",
            "/api/v1/fetch",
            json!({"entries": [{"queue": "q", "offset": -1}]}),
            "entries[0].offset",
        ),
        ("POST", "/api/v1/fetch", json!({"entries": "x"}), "entries"),
        (
            "POST",
            "/api/v1/partitions/changed",
            json!({"entries": [{"queue": "q", "since": "noon"}]}),
            "entries[0].since",
        ),
        (
            "POST",
            "/api/v1/partitions/changed",
            json!({"entries": []}),
            "entries",
        ),
        (
            "POST",
            "/api/v1/consumer-groups/g/subscription",
            json!({}),
            "subscriptionTimestamp",
        ),
        (
            "POST",
            "/api/v1/locks",
            json!({"operations": [{"op": "acquire", "name": "a#b", "ttlSeconds": 5}]}),
            "operations[0].name",
        ),
        (
            "POST",
            "/api/v1/locks",
            json!({"operations": [{"op": "acquire", "name": "a", "ttlSeconds": 0}]}),
            "operations[0].ttlSeconds",
        ),
        (
            "POST",
            "/api/v1/transaction",
            json!({"operations": [{"type": "ack", "partitionId": "1"}], "requiredLeases": []}),
            "operations[0].transactionId",
        ),
    ];
    for (method, path, body, needle) in cases {
        let a = n.request(method, path, Some(&body.to_string()));
        assert_eq!(a.status, 400, "{path} {body} -> {}", a.text);
        assert!(
            a.text.contains(needle),
            "{path}: should name {needle}: {}",
            a.text
        );
    }
    assert_eq!(n.get("/api/v1/dlq").status, 400, "queue is required");
    assert_eq!(n.get("/api/v1/dlq?queue=q&limit=x").status, 400);
    assert_eq!(n.get("/health").status, 200);
}

#[test]
fn a_timer_rides_a_transaction_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let payload = "eyJ4IjoxfQ=="; // {"x":1}
    let ok = n.post("/api/v1/transaction", &json!({
        "operations": [{"type": "push", "items": [{"queue": "now", "transactionId": "n1", "payload": 1}]}],
        "requiredLeases": [],
        "timers": [{"op": "schedule", "queue": "soon", "timerKey": "t", "payload": payload, "delayMs": 0, "txn": "soon-1"}]
    }));
    assert_eq!(ok.json["success"], true, "{}", ok.text);
    assert_eq!(ok.json["results"][1]["type"], "timer");
    assert_eq!(ok.json["results"][1]["status"], "scheduled");
    let failed = n.post("/api/v1/transaction", &json!({
        "operations": [{"type": "push", "items": [{"queue": "now", "transactionId": "n2", "payload": 2}]}],
        "requiredLeases": ["no-such-lease"],
        "timers": [{"op": "schedule", "queue": "soon", "timerKey": "never", "payload": payload, "delayMs": 0}]
    }));
    assert_eq!(failed.json["success"], false);
    assert_eq!(
        n.get("/api/v1/timers/soon/never").json["found"],
        false,
        "rolled back with the bundle"
    );
    let got = n.get("/api/v1/pop/queue/soon?batch=5&wait=true&timeout=10000");
    assert_eq!(
        got.json["messages"][0]["transactionId"], "soon-1",
        "{}",
        got.text
    );
}

#[test]
fn pop_by_namespace_and_task() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    n.post(
        "/api/v1/configure",
        &json!({"queue": "eu-invoices", "namespace": "billing", "task": "invoice", "options": {}}),
    );
    n.post(
        "/api/v1/configure",
        &json!({"queue": "eu-refunds", "namespace": "billing", "task": "refund", "options": {}}),
    );
    n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "eu-refunds", "transactionId": "r1", "payload": 1}]}),
    );
    assert_eq!(
        n.get("/api/v1/pop?namespace=billing&task=invoice&wait=false")
            .status,
        204
    );
    let got = n.get("/api/v1/pop?namespace=billing&batch=5&wait=false");
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(got.json["queue"], "eu-refunds");
    assert_eq!(got.json["messages"][0]["transactionId"], "r1");
    assert_eq!(n.get("/api/v1/pop?wait=false").status, 400);
}

#[test]
fn message_browsing_lists_each_message_where_it_stands_and_finds_one() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let c = n.post(
        "/api/v1/configure",
        &json!({"queue": "browse", "options": {"retryLimit": 0}}),
    );
    assert_eq!(c.status, 200, "{}", c.text);
    // The first payload's number must come back as written.
    let p = n.post_raw(
        "/api/v1/push",
        r#"{"items": [
            {"queue": "browse", "partition": "p", "transactionId": "a", "payload": {"n": 12345678901234567890123}},
            {"queue": "browse", "partition": "p", "transactionId": "b", "payload": 2},
            {"queue": "browse", "partition": "p", "transactionId": "c", "payload": 3},
            {"queue": "browse", "partition": "p", "transactionId": "d", "payload": 4}
        ]}"#,
    );
    assert_eq!(p.status, 200, "{}", p.text);
    let first = n.get("/api/v1/pop/queue/browse?batch=2&wait=false");
    let msgs = first.json["messages"].as_array().unwrap().clone();
    for (m, status) in msgs.iter().zip(["completed", "failed"]) {
        let a = n.post("/api/v1/ack", &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": first.json["leaseId"], "status": status}));
        assert_eq!(a.status, 200, "{}", a.text);
    }
    n.get("/api/v1/pop/queue/browse?batch=1&wait=false");
    let list = n.get("/api/v1/messages?queue=browse");
    assert_eq!(list.status, 200, "{}", list.text);
    let seen: Vec<(&str, &str)> = list.json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["transactionId"].as_str().unwrap(),
                m["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("a", "completed"),
            ("b", "dead_letter"),
            ("c", "processing"),
            ("d", "pending")
        ],
        "{}",
        list.text
    );
    assert_eq!(list.json["pagination"]["total"], 4);
    assert!(
        list.text
            .contains(r#""data":{"n": 12345678901234567890123}"#),
        "{}",
        list.text
    );
    let pending = n.get("/api/v1/messages?queue=browse&status=pending&limit=10");
    assert_eq!(pending.json["messages"].as_array().unwrap().len(), 1);
    assert_eq!(
        n.get("/api/v1/messages?queue=browse&status=odd").status,
        400
    );
    assert_eq!(n.get("/api/v1/messages").status, 400);
    let pid = msgs[0]["partitionId"].as_str().unwrap();
    let one = n.get(&format!("/api/v1/messages/{pid}/a"));
    assert_eq!(one.status, 200, "{}", one.text);
    assert_eq!(one.json["status"], "completed");
    assert!(
        one.text
            .contains(r#""payload":{"n": 12345678901234567890123}"#),
        "{}",
        one.text
    );
    for missing in [
        format!("/api/v1/messages/{pid}/zz"),
        "/api/v1/messages/999999/a".to_owned(),
        "/api/v1/messages/x/a".to_owned(),
    ] {
        let r = n.get(&missing);
        assert_eq!(r.status, 404, "{missing}: {}", r.text);
        assert_eq!(r.json["code"], "message_not_found");
    }
}

/// The transactionIds a group pops from `queue` now (acked at once, so the next pop goes on).
fn pop_ids(n: &Node, queue: &str, group: &str) -> Vec<String> {
    let r = n.get(&format!(
        "/api/v1/pop/queue/{queue}?batch=20&wait=false&autoAck=true&consumerGroup={group}"
    ));
    assert!(r.status == 200 || r.status == 204, "{}", r.text);
    r.json["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| m["transactionId"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_deleted_message_is_delivered_to_no_group_and_a_retried_dead_letter_to_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    let c = n.post(
        "/api/v1/configure",
        &json!({"queue": "fix", "options": {"retryLimit": 0}}),
    );
    assert_eq!(c.status, 200, "{}", c.text);
    let items: Vec<Value> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|t| json!({"queue": "fix", "partition": "p", "transactionId": t, "payload": {"t": t}}))
        .collect();
    let p = n.post("/api/v1/push", &json!({"items": items}));
    assert_eq!(p.status, 200, "{}", p.text);
    let pid = p.json[0]["partitionId"].as_str().unwrap().to_owned();

    // Delete b, and e (the last): neither group is handed them.
    for t in ["b", "e"] {
        let d = n.request("DELETE", &format!("/api/v1/messages/{pid}/{t}"), None);
        assert_eq!(d.status, 200, "{}", d.text);
        assert_eq!(d.json["success"], true, "{}", d.text);
    }
    // Deleting again answers the same; an unknown message is a 404.
    assert_eq!(
        n.request("DELETE", &format!("/api/v1/messages/{pid}/b"), None)
            .status,
        200
    );
    assert_eq!(
        n.request("DELETE", &format!("/api/v1/messages/{pid}/zz"), None)
            .status,
        404
    );
    assert_eq!(pop_ids(&n, "fix", "g1"), ["a", "c", "d"]);
    assert_eq!(pop_ids(&n, "fix", "g1"), Vec::<String>::new());
    assert_eq!(n.get(&format!("/api/v1/messages/{pid}/b")).status, 404);
    let listed = n.get("/api/v1/messages?queue=fix");
    let ids: Vec<&str> = listed.json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "c", "d"], "{}", listed.text);

    // g2 fails c: with retryLimit 0 it is a dead letter of g2.
    let first = n.get("/api/v1/pop/queue/fix?batch=1&wait=false&consumerGroup=g2");
    assert_eq!(
        first.json["messages"][0]["transactionId"], "a",
        "{}",
        first.text
    );
    let ack = |t: &str, lease: &Value, status: &str| {
        let a = n.post(
            "/api/v1/ack",
            &json!({"transactionId": t, "partitionId": pid, "leaseId": lease, "status": status, "consumerGroup": "g2"}),
        );
        assert_eq!(a.status, 200, "{}", a.text);
    };
    ack("a", &first.json["leaseId"], "completed");
    let second = n.get("/api/v1/pop/queue/fix?batch=1&wait=false&consumerGroup=g2");
    assert_eq!(
        second.json["messages"][0]["transactionId"], "c",
        "{}",
        second.text
    );
    ack("c", &second.json["leaseId"], "failed");
    let dlq = n.get("/api/v1/dlq?queue=fix&consumerGroup=g2");
    assert_eq!(
        dlq.json["messages"].as_array().map(Vec::len),
        Some(1),
        "{}",
        dlq.text
    );

    // Retry it: g2 gets a copy, g1 (which completed c) does not, and the dead letter is gone.
    let r = n.post_raw(&format!("/api/v1/messages/{pid}/c/retry"), "");
    assert_eq!(r.status, 200, "{}", r.text);
    let copy = r.json["retried"]["transactionId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(copy.starts_with("c#retry"), "{}", r.text);
    assert_eq!(r.json["retried"]["consumerGroup"], "g2", "{}", r.text);
    assert_eq!(pop_ids(&n, "fix", "g2"), ["d", copy.as_str()]);
    assert_eq!(pop_ids(&n, "fix", "g1"), Vec::<String>::new());
    let dlq = n.get("/api/v1/dlq?queue=fix&consumerGroup=g2");
    assert_eq!(
        dlq.json["messages"].as_array().map(Vec::len),
        Some(0),
        "{}",
        dlq.text
    );
    // Nothing left to retry.
    let again = n.post_raw(&format!("/api/v1/messages/{pid}/c/retry"), "");
    assert_eq!(again.status, 404, "{}", again.text);
    // A new group starts at the oldest message and sees neither the deleted ones nor g2's copy.
    assert_eq!(pop_ids(&n, "fix", "g3"), ["a", "c", "d"]);
}
