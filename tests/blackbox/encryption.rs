//! Encrypted queues on real nodes: with `QUEEN_ENCRYPTION_KEY` and `encryptionEnabled`, no file
//! of the data directory holds a pushed payload's bytes (pushes, transactions and timers alike),
//! while pops, `fetch`, dead letters and the lake give every payload back byte for byte; a node
//! with another key serves the stored envelope and writes it into the lake as a string; a node
//! without a key refuses to store payloads of a flagged queue and says so on `/status`.

use std::path::Path;
use std::time::Duration;

use queen_tests::{Node, eventually};
use serde_json::{Value, json};

const KEY: &str = "7f3c1a9e5b2d4f60817263544536271809a1b2c3d4e5f60718293a4b5c6d7e8f";
const OTHER_KEY: &str = "0000000000000000000000000000000000000000000000000000000000000001";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// Every byte of every file under `dir`.
fn files(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    queen_tests::files_under(dir)
        .into_iter()
        .filter_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
        .collect()
}

fn holds(dir: &Path, needle: &str) -> Vec<std::path::PathBuf> {
    queen_tests::files_holding(dir, needle.as_bytes())
}

/// The payloads of the lake's records of `queue` (uncompressed JSONL).
fn lake_payloads(lake: &Path, queue: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for (p, b) in files(lake) {
        let path = p.to_string_lossy().to_string();
        if !path.ends_with(".jsonl") || !path.contains(&format!("queue={queue}/")) {
            continue;
        }
        for line in String::from_utf8_lossy(&b).lines() {
            if let Ok(v) = serde_json::from_str::<Value>(line) {
                out.push(v["payload"].clone());
            }
        }
    }
    out
}

fn env<'a>(lake: &'a str, key: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut e = queen_tests::folder_sink_env(lake);
    if let Some(k) = key {
        e.push(("QUEEN_ENCRYPTION_KEY", k));
    }
    e
}

#[test]
fn flagged_queues_are_ciphertext_on_disk_and_plaintext_to_readers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let lake = dir.path().join("lake");
    let lake_url = format!("file://{}", lake.display());
    let mut n = Node::start(bin(), &data, &env(&lake_url, Some(KEY)));
    let c = n.post(
        "/api/v1/configure",
        &json!({"queue": "secret", "options": {"encryptionEnabled": true, "retryLimit": 0}}),
    );
    assert_eq!(c.status, 200, "{}", c.text);
    // Payloads with markers to look for, in the producer's own spelling.
    let pushed = r#"{"items": [
        {"queue": "secret", "partition": "a", "transactionId": "s1", "payload": {"card": "MARK-PUSH-1", "n": 12345678901234567890123}},
        {"queue": "secret", "partition": "a", "transactionId": "s2", "payload": "MARK-PUSH-2"},
        {"queue": "clear", "partition": "a", "transactionId": "c1", "payload": {"note": "MARK-CLEAR"}}
    ]}"#;
    let p = n.post_raw("/api/v1/push", pushed);
    assert_eq!(p.status, 200, "{}", p.text);
    // A queue pushed to in the clear, then flagged: a push after the configure is sealed (the
    // node keeps no flag it read before the configure applied).
    let later = |t: &str, payload: &str| {
        format!(
            r#"{{"items": [{{"queue": "later", "partition": "a", "transactionId": "{t}", "payload": "{payload}"}}]}}"#
        )
    };
    for _ in 0..2 {
        let p = n.post_raw("/api/v1/push", &later("l1", "before"));
        assert_eq!(p.status, 200, "{}", p.text);
    }
    let c = n.post(
        "/api/v1/configure",
        &json!({"queue": "later", "options": {"encryptionEnabled": true}}),
    );
    assert_eq!(c.status, 200, "{}", c.text);
    let p = n.post_raw("/api/v1/push", &later("l2", "MARK-LATER"));
    assert_eq!(p.status, 200, "{}", p.text);
    let t = n.post(
        "/api/v1/transaction",
        &json!({"operations": [{"type": "push", "items": [{"queue": "secret", "partition": "a", "transactionId": "s3", "payload": {"t": "MARK-TXN"}}]}], "requiredLeases": []}),
    );
    assert_eq!(t.json["success"], true, "{}", t.text);
    // base64 of {"timer":"MARK-TIMER"}
    let s = n.post(
        "/api/v1/timers",
        &json!({"operations": [{"op": "schedule", "queue": "secret", "timerKey": "k", "partition": "a", "payload": "eyJ0aW1lciI6Ik1BUkstVElNRVIifQ==", "delayMs": 200}]}),
    );
    assert_eq!(s.status, 200, "{}", s.text);
    assert_eq!(n.get("/status").json["encryption"]["keyLoaded"], true);

    // Readers get plaintext: fetch, then a pop (the timer's message once it fired).
    let want = [
        r#"{"card": "MARK-PUSH-1", "n": 12345678901234567890123}"#,
        r#""MARK-PUSH-2""#,
        r#"{"t":"MARK-TXN"}"#,
        r#"{"timer":"MARK-TIMER"}"#,
    ];
    let f = n.post(
        "/api/v1/fetch",
        &json!({"entries": [{"queue": "secret", "partition": "a", "offset": 0}]}),
    );
    assert!(
        f.text.contains(want[0]),
        "fetch gives the stored text back: {}",
        f.text
    );
    assert!(
        eventually(Duration::from_secs(20), || {
            n.post(
                "/api/v1/fetch",
                &json!({"entries": [{"queue": "secret", "partition": "a", "offset": 3}]}),
            )
            .text
            .contains("MARK-TIMER")
        }),
        "the timer fires into the queue"
    );
    let popped = n.get("/api/v1/pop/queue/secret?batch=10&wait=false&consumerGroup=g");
    for w in want {
        assert!(popped.text.contains(w), "pop shows {w}: {}", popped.text);
    }
    // A dead letter shows its plaintext too.
    let m = &popped.json["messages"][0];
    let a = n.post(
        "/api/v1/ack",
        &json!({"transactionId": "s1", "partitionId": m["partitionId"], "leaseId": popped.json["leaseId"], "status": "failed", "error": "x", "consumerGroup": "g"}),
    );
    assert_eq!(a.json[0]["dlq"], true, "{}", a.text);
    let d = n.get("/api/v1/dlq?queue=secret&consumerGroup=g");
    assert!(d.text.contains("MARK-PUSH-1"), "{}", d.text);

    // The lake holds the plaintext, as the producer wrote it.
    assert!(
        eventually(Duration::from_secs(30), || lake_payloads(&lake, "secret")
            .len()
            >= 4),
        "the sink writes the queue: {:?}\n{}",
        lake_payloads(&lake, "secret"),
        n.log_text()
    );
    let in_lake = lake_payloads(&lake, "secret");
    assert!(
        !holds(&lake, want[0]).is_empty(),
        "the lake keeps the producer's text byte for byte: {in_lake:?}"
    );
    assert!(in_lake.contains(&json!("MARK-PUSH-2")), "{in_lake:?}");
    assert!(
        in_lake.contains(&json!({"timer": "MARK-TIMER"})),
        "{in_lake:?}"
    );

    // No file of the data directory holds a flagged payload's bytes, after a restart too (the
    // log, the store, the segments); the clear queue's marker is there, so the scan can see.
    n.sigterm(Duration::from_secs(40));
    for marker in [
        "MARK-PUSH-1",
        "MARK-PUSH-2",
        "MARK-TXN",
        "MARK-TIMER",
        "MARK-LATER",
        "12345678901234567890123",
    ] {
        let found = holds(&data, marker);
        assert!(
            found.is_empty(),
            "{marker} is stored in the clear in {found:?}"
        );
    }
    assert!(
        !holds(&data, "MARK-CLEAR").is_empty(),
        "the scan finds an unflagged payload"
    );

    // Another key: the node serves what it cannot open as stored, and the lake gets it as a
    // JSON string of the stored bytes.
    n.set_env("QUEEN_ENCRYPTION_KEY", OTHER_KEY);
    n.restart();
    let p = n.post_raw(
        "/api/v1/push",
        r#"{"items": [{"queue": "secret", "partition": "b", "transactionId": "s9", "payload": {"late": "MARK-LATE"}}]}"#,
    );
    assert_eq!(p.status, 200, "{}", p.text);
    let other = n.get("/api/v1/pop/queue/secret?batch=10&wait=false&consumerGroup=h");
    let datas: Vec<Value> = other.json["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m["data"].clone())
        .collect();
    assert!(
        datas
            .iter()
            .filter(|d| d["encrypted"].is_string()
                && d["iv"].is_string()
                && d["authTag"].is_string())
            .count()
            >= 4,
        "the old messages come back as stored envelopes: {datas:?}"
    );
    let late = n.get("/api/v1/pop/queue/secret/partition/b?batch=10&wait=false&consumerGroup=h");
    assert_eq!(
        late.json["messages"][0]["data"],
        json!({"late": "MARK-LATE"}),
        "{}",
        late.text
    );
}

#[test]
fn a_node_without_a_key_refuses_to_store_a_flagged_queue_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let lake = dir.path().join("lake");
    let lake_url = format!("file://{}", lake.display());
    let mut n = Node::start(bin(), &data, &[("QUEEN_ENCRYPTION_KEY", KEY)]);
    assert_eq!(
        n.post(
            "/api/v1/configure",
            &json!({"queue": "secret", "options": {"encryptionEnabled": true}})
        )
        .status,
        200
    );
    let p = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "secret", "partition": "a", "payload": {"x": "MARK-SEALED"}}]}),
    );
    assert_eq!(p.status, 200, "{}", p.text);
    n.sigterm(Duration::from_secs(40));
    // Started again without the key, with the sink on.
    n.set_env("QUEEN_ENCRYPTION_KEY", "");
    for (k, v) in env(&lake_url, None) {
        n.set_env(k, v);
    }
    n.restart();
    let p = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "secret", "payload": {"x": "MARK-NOKEY"}}]}),
    );
    assert_eq!(
        (p.status, p.json["code"].as_str()),
        (409, Some("encryption_required")),
        "{}",
        p.text
    );
    let t = n.post(
        "/api/v1/transaction",
        &json!({"operations": [{"type": "push", "items": [{"queue": "secret", "payload": 1}]}], "requiredLeases": []}),
    );
    assert_eq!(t.status, 409, "{}", t.text);
    let c = n.post(
        "/api/v1/configure",
        &json!({"queue": "other", "options": {"encryptionEnabled": true}}),
    );
    assert_eq!(
        (c.status, c.json["code"].as_str()),
        (409, Some("encryption_required")),
        "{}",
        c.text
    );
    let status = n.get("/status").json;
    assert_eq!(status["encryption"]["keyLoaded"], false);
    assert_eq!(status["encryption"]["encryptedQueues"], json!(["secret"]));
    assert!(
        n.log_text()
            .contains("encryptionEnabled but this node has no QUEEN_ENCRYPTION_KEY")
    );
    // What is stored sealed is served as stored, and the lake gets it as a JSON string.
    let popped = n.get("/api/v1/pop/queue/secret?batch=10&wait=false");
    assert!(
        popped.json["messages"][0]["data"]["authTag"].is_string(),
        "{}",
        popped.text
    );
    assert!(
        eventually(Duration::from_secs(30), || !lake_payloads(&lake, "secret")
            .is_empty()),
        "the sink writes the queue:\n{}",
        n.log_text()
    );
    let in_lake = lake_payloads(&lake, "secret");
    let text = in_lake[0]
        .as_str()
        .unwrap_or_else(|| panic!("a string: {in_lake:?}"));
    assert!(
        serde_json::from_str::<Value>(text).is_ok_and(|v| v["authTag"].is_string()),
        "{text}"
    );
    n.sigterm(Duration::from_secs(40));
    assert!(holds(&data, "MARK-NOKEY").is_empty() && holds(&data, "MARK-SEALED").is_empty());
    assert!(holds(&lake, "MARK-SEALED").is_empty());

    // A key of the wrong shape stops the boot with one line that does not echo it.
    n.set_env("QUEEN_ENCRYPTION_KEY", "abc123");
    n.launch();
    let code = n.wait_exit(Duration::from_secs(30)).expect("refused");
    assert_eq!(code.code(), Some(2), "{}", n.log_text());
    assert!(
        n.log_text()
            .contains("QUEEN_ENCRYPTION_KEY must be exactly 64 hexadecimal characters")
    );
    assert!(!n.log_text().contains("abc123"));
}
