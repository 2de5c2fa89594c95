//! The payload is the producer's own text, byte for byte, on every path that answers it (pop,
//! fetch, dead letters, transaction pushes, KV values); KV `incr` is exact in integers and
//! refuses overflow; durations and configure are bounded. Answers are compared as raw text,
//! never re-parsed, since parsing is what lost digits before.

use std::path::Path;

use queen_tests::Node;
use serde_json::{Value, json};

/// Each must come back exactly as written.
const PAYLOADS: &[&str] = &[
    "123456789012345678901234567890",
    "42.00",
    "-0",
    "18446744073709551616",
    "1e400",
    "{ \"z\" : 1 ,\n\t\"a\":[ 1.10, -0.0e-0 ] , \"m\" : {\"y\":null,\"b\":true} }",
    r#""caf\u00e9 \ud83d\ude00 \"q\" \/""#,
    r#"{"\u0041":"\u00e9","n":9007199254740993}"#,
];

fn node(dir: &tempfile::TempDir) -> Node {
    Node::start(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &dir.path().join("n1"),
        &[],
    )
}

/// A push body with every payload, written by hand so the text is ours.
fn push_items(queue: &str, tag: &str) -> String {
    let items: Vec<String> = PAYLOADS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(r#"{{"queue":"{queue}","transactionId":"{tag}-{i}","payload": {p} }}"#)
        })
        .collect();
    format!("[{}]", items.join(","))
}

fn assert_has_all(text: &str, before: &str, after: &str, what: &str) {
    for p in PAYLOADS {
        let needle = format!("{before}{p}{after}");
        assert!(
            text.contains(&needle),
            "{what}: {needle:?} missing in {text}"
        );
    }
}

#[test]
fn payloads_come_back_byte_for_byte_from_pop_fetch_dlq_transactions_and_kv() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(&dir);
    let a = n.post(
        "/api/v1/configure",
        &json!({"queue": "exact", "options": {"retryLimit": 0}}),
    );
    assert_eq!(a.status, 200, "{}", a.text);

    let pushed = n.post_raw(
        "/api/v1/push",
        &format!(r#"{{"items":{}}}"#, push_items("exact", "p")),
    );
    assert_eq!(pushed.status, 200, "{}", pushed.text);
    assert!(pushed.json.as_array().is_some_and(|a| a.len() == PAYLOADS.len() && a.iter().all(|r| r["status"] == "queued")), "{}", pushed.text);

    // Pop (a group that only reads).
    let p = n.get("/api/v1/pop/queue/exact?batch=100&wait=false&consumerGroup=readers");
    assert_eq!(p.status, 200, "{}", p.text);
    assert_has_all(&p.text, r#""data":"#, r#","producerSub""#, "pop");

    // Fetch.
    let f = n.post_raw(
        "/api/v1/fetch",
        r#"{"entries":[{"queue":"exact","partition":"Default","offset":0}]}"#,
    );
    assert_eq!(f.status, 200, "{}", f.text);
    assert_has_all(&f.text, r#""payload":"#, r#","ts""#, "fetch");

    // Dead letters: each message fails past its retry limit (0), one pop and nack at a time.
    for i in 0..PAYLOADS.len() {
        let p = n.get("/api/v1/pop/queue/exact?batch=1&wait=false&consumerGroup=workers");
        assert_eq!(p.status, 200, "pop {i}: {}", p.text);
        // Some payloads (1e400) are more than a parsed value can hold: read the rest without them.
        let v = readable(&p.text, r#""data":"#);
        let m = &v["messages"][0];
        assert_eq!(m["transactionId"], format!("p-{i}"), "{}", p.text);
        let ack = json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": v["leaseId"], "status": "failed", "error": "no", "consumerGroup": "workers"});
        let a = n.post("/api/v1/ack", &ack);
        assert_eq!(a.json[0]["dlq"], true, "{}", a.text);
    }
    let d = n.get("/api/v1/dlq?queue=exact&limit=100&consumerGroup=workers");
    assert_eq!(
        readable(&d.text, r#""data":"#)["total"],
        PAYLOADS.len(),
        "{}",
        d.text
    );
    assert_has_all(&d.text, r#""data":"#, r#","createdAt""#, "dlq");

    // A transaction's pushes.
    let t = n.post_raw(
        "/api/v1/transaction",
        &format!(
            r#"{{"operations":[{{"type":"push","items":{}}}]}}"#,
            push_items("txq", "t")
        ),
    );
    assert_eq!(t.status, 200, "{}", t.text);
    assert_eq!(t.json["success"], true, "{}", t.text);
    let p = n.get("/api/v1/pop/queue/txq?batch=100&wait=false");
    assert_has_all(
        &p.text,
        r#""data":"#,
        r#","producerSub""#,
        "transaction push, popped",
    );

    // KV values: put, get, getMany, getPrefix, the path form, and a transaction's kv rider.
    for (i, v) in PAYLOADS.iter().enumerate() {
        let put = n.post_raw("/api/v1/kv", &format!(r#"{{"operations":[{{"op":"put","ns":"app","key":"v{i}","value": {v} ,"forever":true}}]}}"#));
        assert_eq!(put.status, 200, "{}", put.text);
        assert!(
            put.text.contains(&format!(r#""value":{v},"#)),
            "put answer: {}",
            put.text
        );
        let path_put = n.request(
            "PUT",
            &format!("/api/v1/kv/app/w{i}"),
            Some(&format!(r#"{{"value": {v} , "ttlSeconds": 600}}"#)),
        );
        assert_eq!(path_put.status, 200, "{}", path_put.text);
        let path_get = n.get(&format!("/api/v1/kv/app/w{i}"));
        assert!(
            path_get
                .text
                .contains(&format!(r#""value":{v},"found":true"#)),
            "path get: {}",
            path_get.text
        );
    }
    let keys: Vec<String> = (0..PAYLOADS.len()).map(|i| format!("v{i}")).collect();
    let many = n.post("/api/v1/kv", &json!({"operations": [{"op": "getMany", "ns": "app", "keys": keys}, {"op": "getPrefix", "ns": "app", "prefix": "v"}]}));
    assert_eq!(many.status, 200, "{}", many.text);
    for v in PAYLOADS {
        assert_eq!(
            many.text.matches(&format!(r#""value":{v}}}"#)).count(),
            2,
            "getMany and getPrefix show {v}: {}",
            many.text
        );
    }
    let get = n.post(
        "/api/v1/kv",
        &json!({"operations": [{"op": "get", "ns": "app", "key": "v0"}]}),
    );
    assert!(
        get.text
            .contains(&format!(r#""value":{},"found":true"#, PAYLOADS[0])),
        "{}",
        get.text
    );
    let rider = format!(
        r#"{{"operations":[{{"type":"push","items":[{{"queue":"txq","payload":{}}}]}}],"kv":[{{"op":"put","ns":"app","key":"r","value":{},"forever":true}}]}}"#,
        PAYLOADS[1], PAYLOADS[5]
    );
    let t = n.post_raw("/api/v1/transaction", &rider);
    assert_eq!(t.json["success"], true, "{}", t.text);
    assert!(
        t.text.contains(&format!(r#""value":{},"#, PAYLOADS[5])),
        "transaction kv result: {}",
        t.text
    );
}

#[test]
fn a_streams_cycle_keeps_its_pushes_and_state_values_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(&dir);
    // A cycle without an ack (an idle flush): every payload pushed, every payload a state value.
    let ops: Vec<String> = PAYLOADS
        .iter()
        .enumerate()
        .map(|(i, p)| format!(r#"{{"type":"upsert","key":"k{i}","value": {p} }}"#))
        .collect();
    let body = format!(
        r#"{{"query_id":"agg","partition_id":"p1","state_ops":[{}],"push_items":{}}}"#,
        ops.join(","),
        push_items("sunk", "s")
    );
    let c = n.post_raw("/streams/v1/cycle", &body);
    assert_eq!(c.status, 200, "{}", c.text);
    assert_eq!(c.json["success"], true, "{}", c.text);
    assert_eq!(c.json["pushed"], PAYLOADS.len(), "{}", c.text);
    assert_eq!(c.json["state_ops"], PAYLOADS.len(), "{}", c.text);
    let p = n.get("/api/v1/pop/queue/sunk?batch=100&wait=false");
    assert_has_all(
        &p.text,
        r#""data":"#,
        r#","producerSub""#,
        "streams push, popped",
    );
    let rows = n.post_raw(
        "/streams/v1/state/get",
        r#"{"query_id":"agg","partition_id":"p1"}"#,
    );
    assert_eq!(rows.status, 200, "{}", rows.text);
    assert_has_all(&rows.text, r#""value":"#, "}", "streams state");
}

/// The answer parsed with each payload after `before` replaced by 0.
fn readable(text: &str, before: &str) -> Value {
    let mut t = text.to_owned();
    for p in PAYLOADS {
        t = t.replace(&format!("{before}{p}"), &format!("{before}0"));
    }
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}"))
}

fn kv(n: &Node, ops: &str) -> queen_tests::Answer {
    n.post_raw("/api/v1/kv", &format!(r#"{{"operations":[{ops}]}}"#))
}

#[test]
fn kv_incr_is_exact_in_integers_and_refuses_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(&dir);
    kv(
        &n,
        r#"{"op":"put","ns":"app","key":"c","value":9007199254740992,"forever":true}"#,
    );
    let r = kv(
        &n,
        r#"{"op":"incr","ns":"app","key":"c","delta":1,"forever":true}"#,
    );
    assert!(
        r.text
            .contains(r#""applied":true,"value":9007199254740993,"#),
        "2^53 + 1: {}",
        r.text
    );
    let g = kv(&n, r#"{"op":"get","ns":"app","key":"c"}"#);
    assert!(
        g.text.contains(r#""value":9007199254740993,"#),
        "{}",
        g.text
    );

    kv(
        &n,
        r#"{"op":"put","ns":"app","key":"c","value":9223372036854775807,"forever":true}"#,
    );
    // A call that wrote nothing because its incr overflowed is a 400 naming the operation.
    let r = kv(
        &n,
        r#"{"op":"incr","ns":"app","key":"c","delta":1,"forever":true}"#,
    );
    assert_eq!(
        (r.status, r.json["code"].clone()),
        (400, json!("kv_overflow")),
        "{}",
        r.text
    );
    assert!(r.text.contains("operations[0].delta"), "{}", r.text);
    let r = kv(
        &n,
        r#"{"op":"incr","ns":"app","key":"c","delta":1,"forever":true,"required":true}"#,
    );
    assert_eq!(
        (r.status, r.json["code"].clone()),
        (400, json!("kv_overflow")),
        "{}",
        r.text
    );
    // In a call whose other writes took effect, the overflowed one says why in its result.
    let r = kv(
        &n,
        r#"{"op":"put","ns":"app","key":"other","value":1,"forever":true},{"op":"incr","ns":"app","key":"c","delta":1,"forever":true}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        (
            r.json["results"][1]["applied"].clone(),
            r.json["results"][1]["reason"].clone()
        ),
        (json!(false), json!("overflow")),
        "{}",
        r.text
    );
    assert!(
        r.text.contains(r#""value":9223372036854775807,"#),
        "the current value is shown: {}",
        r.text
    );
    let g = kv(&n, r#"{"op":"get","ns":"app","key":"c"}"#);
    assert!(
        g.text.contains(r#""value":9223372036854775807,"#),
        "nothing changed: {}",
        g.text
    );

    let r = kv(
        &n,
        r#"{"op":"incr","ns":"app","key":"c","delta":9223372036854775808,"forever":true}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.text.contains("operations[0].delta"), "{}", r.text);

    kv(
        &n,
        r#"{"op":"put","ns":"app","key":"f","value":1e308,"forever":true}"#,
    );
    let r = kv(
        &n,
        r#"{"op":"incr","ns":"app","key":"f","delta":1e308,"forever":true}"#,
    );
    assert_eq!(
        (r.status, r.json["code"].clone()),
        (400, json!("kv_overflow")),
        "1e308 + 1e308: {}",
        r.text
    );
    let g = kv(&n, r#"{"op":"get","ns":"app","key":"f"}"#);
    assert!(g.text.contains(r#""value":1e308,"#), "{}", g.text);
    let r = kv(
        &n,
        r#"{"op":"incr","ns":"app","key":"f","delta":-0.5e308,"forever":true}"#,
    );
    assert_eq!(r.json["results"][0]["applied"], true, "{}", r.text);
}

#[test]
fn durations_and_configure_are_bounded_and_errors_name_the_exact_field() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(&dir);
    let huge = "9223372036854775807";
    let cases: Vec<(&str, String, String, &str)> = vec![
        ("POST", "/api/v1/kv".into(), format!(r#"{{"operations":[{{"op":"put","ns":"a","key":"k","value":1,"ttlSeconds":{huge}}}]}}"#), "operations[0].ttlSeconds must be 1 to 315360000"),
        ("POST", "/api/v1/kv".into(), format!(r#"{{"operations":[{{"op":"incr","ns":"a","key":"k","ttlSeconds":{huge}}}]}}"#), "operations[0].ttlSeconds"),
        ("PUT", "/api/v1/kv/a/k".into(), format!(r#"{{"value":1,"ttlSeconds":{huge}}}"#), "ttlSeconds must be 1 to 315360000"),
        ("POST", "/api/v1/locks".into(), format!(r#"{{"operations":[{{"op":"acquire","name":"n","ttlSeconds":{huge}}}]}}"#), "operations[0].ttlSeconds"),
        ("POST", "/api/v1/timers".into(), format!(r#"{{"operations":[{{"op":"schedule","queue":"q","timerKey":"k","payload":"MQ==","delayMs":{huge}}}]}}"#), "operations[0].delayMs must be 0 to 315360000000"),
        ("GET", format!("/api/v1/pop/queue/q?wait=false&timeout={huge}"), String::new(), "timeout must be 0 to"),
        ("GET", format!("/api/v1/consumer-groups/lagging?minLagSeconds={huge}"), String::new(), "minLagSeconds"),
        ("POST", "/api/v1/configure".into(), format!(r#"{{"queue":"q","options":{{"leaseTime":{huge}}}}}"#), "options.leaseTime must be 0 to 315360000"),
        ("POST", "/api/v1/configure".into(), format!(r#"{{"queue":"q","options":{{"retentionSeconds":{huge}}}}}"#), "options.retentionSeconds"),
        ("POST", "/api/v1/configure".into(), format!(r#"{{"queue":"q","options":{{"delayedProcessing":{huge}}}}}"#), "options.delayedProcessing"),
        ("POST", "/api/v1/configure".into(), json!({"queue": "q", "namespace": "n".repeat(1 << 20)}).to_string(), "namespace must be at most 255 bytes"),
        ("POST", "/api/v1/configure".into(), json!({"queue": "q", "task": "t".repeat(256)}).to_string(), "task must be at most 255 bytes"),
        ("POST", "/api/v1/configure".into(), json!({"queue": "q", "options": {"custom": "x".repeat(1 << 20)}}).to_string(), "options.custom"),
        ("POST", "/api/v1/configure".into(), many_options(100_000), "at most 64"),
        (
            "POST",
            "/api/v1/transaction".into(),
            r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"bogus","ns":"a","key":"k"}]}"#.into(),
            "kv[0].op",
        ),
        ("POST", "/api/v1/transaction".into(), r#"{"operations":[{"type":"push","items":[{"queue":"q"},{"queue":5}]}]}"#.into(), "operations[0].items[1].queue must be a string"),
        ("POST", "/api/v1/transaction".into(), r#"{"operations":[{"type":"push"}]}"#.into(), "operations[0].items is required"),
    ];
    for (method, path, body, needle) in &cases {
        let a = n.request(method, path, (*method != "GET").then_some(body.as_str()));
        assert_eq!(
            a.status, 400,
            "{method} {path} {body:.100} -> {:.300}",
            a.text
        );
        assert!(a.json["code"].is_string(), "{}", a.text);
        let error = a.json["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(needle),
            "{method} {path}: error should say '{needle}': {error:.300}"
        );
        assert!(
            !error.contains(". "),
            "no stray space in the path: {error:.300}"
        );
    }
    // Nothing refused reached the state: the queue was never created.
    assert_eq!(n.get("/api/v1/resources/queues/q").status, 404);
    // The bounds themselves are accepted.
    let ok = n.post("/api/v1/configure", &json!({"queue": "q", "namespace": "n".repeat(255), "options": {"leaseTime": 315_360_000, "custom": {"a": 1}}}));
    assert_eq!(ok.status, 200, "{}", ok.text);
    assert_eq!(ok.json["options"]["custom"], json!({"a": 1}));
    let lease = n.post(
        "/api/v1/locks",
        &json!({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 315_360_000}]}),
    );
    assert_eq!(lease.json["results"][0]["acquired"], true, "{}", lease.text);
    let t = n.post("/api/v1/timers", &json!({"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "MQ==", "delayMs": 315_360_000_000_u64}]}));
    assert_eq!(t.status, 200, "{}", t.text);
    let deliver = t.json["results"][0]["deliverAt"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        !deliver.starts_with("1970"),
        "a real time, not a saturated one: {}",
        t.text
    );
    assert_eq!(n.get("/health").status, 200);
}

fn many_options(count: usize) -> String {
    let keys: Vec<String> = (0..count).map(|i| format!(r#""k{i}":1"#)).collect();
    format!(r#"{{"queue":"q","options":{{{}}}}}"#, keys.join(","))
}
