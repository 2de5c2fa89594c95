//! The hardening probe, kept as regression tests against real processes: what a hostile or
//! careless client tried on the release binary, and what the node must answer. Payload text,
//! lake names, the disk gate and membership have their own files (`payload_text.rs`,
//! `lake_names.rs`, `disk_gate.rs`, `cluster.rs`); the malformed-input cases that always passed
//! are in `bad_input.rs`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::{Node, eventually};
use serde_json::json;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// Resident memory of a process, in bytes (from `/proc`).
fn rss_bytes(pid: u32) -> u64 {
    queen_tests::memory_kib(pid, "VmRSS") * 1024
}

/// A connection that declares `declared` body bytes, sends `sent` of them, and stops.
fn stall(port: u16, declared: usize, sent: usize) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /api/v1/push HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b' '; 64 * 1024];
    let mut left = sent;
    while left > 0 {
        let n = left.min(chunk.len());
        if s.write_all(&chunk[..n]).is_err() {
            break;
        }
        left -= n;
    }
    s
}

/// What a stalled connection reads back: the status line, or nothing when it was closed.
fn status_line(s: &mut TcpStream, limit: Duration) -> String {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 512];
    match s.read(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned(),
        Err(_) => String::new(),
    }
}

/// Clients that declare large bodies, send most of them and stall hold no more memory than the
/// node's body budget, are answered 503 `busy` at once once it is spent, and are cut off with
/// 408 at the body deadline; then the node serves as before.
#[test]
fn stalled_bodies_stay_within_the_body_budget_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let max_body = 8usize << 20;
    let budget = 24usize << 20;
    let n = Node::start(
        bin(),
        &dir.path().join("n1"),
        &[
            ("QUEEN_MAX_BODY_BYTES", &max_body.to_string()),
            ("QUEEN_BODY_BUDGET_BYTES", &budget.to_string()),
            ("QUEEN_BODY_TIMEOUT_MS", "3000"),
        ],
    );
    let pid = n.pid().unwrap();
    let before = rss_bytes(pid);
    // Twenty clients, each declaring 8 MiB and sending 7: without a budget that is 140 MiB held
    // until the clients leave.
    let mut stalled: Vec<TcpStream> = Vec::new();
    let started = Instant::now();
    for _ in 0..20 {
        stalled.push(stall(n.port, max_body, 7 << 20));
    }
    let grown = rss_bytes(pid).saturating_sub(before);
    assert!(
        grown < (budget as u64) + (40 << 20),
        "RSS grew by {} MiB with a {} MiB body budget",
        grown >> 20,
        budget >> 20
    );
    // Those past the budget were answered at once.
    let busy = stalled
        .iter_mut()
        .map(|s| status_line(s, Duration::from_millis(200)))
        .filter(|l| l.contains(" 503"))
        .count();
    assert!(
        busy >= 17,
        "{busy} of 20 stalled clients were refused 503 at once (the budget holds 3)"
    );
    // The ones admitted are cut off at the deadline.
    let timed_out: Vec<String> = stalled
        .iter_mut()
        .map(|s| status_line(s, Duration::from_secs(10)))
        .collect();
    assert!(started.elapsed() < Duration::from_secs(15));
    let admitted = timed_out.iter().filter(|l| l.contains(" 408")).count();
    assert!(
        (1..=3).contains(&admitted),
        "408 answers: {admitted} ({timed_out:?})"
    );
    drop(stalled);
    // The budget is free again: a normal push goes through.
    assert!(eventually(Duration::from_secs(5), || n
        .post(
            "/api/v1/push",
            &json!({"items": [{"queue": "q", "payload": 1}]})
        )
        .status
        == 200));
    assert_eq!(n.get("/health").status, 200);
}

/// A message above `QUEEN_MAX_MESSAGE_BYTES` is refused with 413 naming the item, whichever
/// way it comes in, and nothing of the request is stored.
#[test]
fn oversized_messages_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        bin(),
        &dir.path().join("n1"),
        &[("QUEEN_MAX_MESSAGE_BYTES", "2048")],
    );
    let big = "x".repeat(3000);
    let push = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "q", "payload": 1}, {"queue": "q", "payload": big}]}),
    );
    assert_eq!(push.status, 413, "{}", push.text);
    assert!(
        push.text.contains("items[1].payload") && push.text.contains("QUEEN_MAX_MESSAGE_BYTES"),
        "{}",
        push.text
    );
    let kv = n.post("/api/v1/kv", &json!({"operations": [{"op": "put", "ns": "n", "key": "k", "value": big, "ttlSeconds": 60}]}));
    assert_eq!(kv.status, 413, "{}", kv.text);
    assert!(kv.text.contains("operations[0].value"), "{}", kv.text);
    let txn = n.post(
        "/api/v1/transaction",
        &json!({"operations": [{"type": "push", "items": [{"queue": "q", "payload": big}]}]}),
    );
    assert_eq!(txn.status, 413, "{}", txn.text);
    // Nothing was stored by the refused requests.
    assert_eq!(n.get("/status").json["queues"]["count"], 0);
    let ok = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "q", "payload": "x".repeat(1500)}]}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text);
}

/// Percent-escapes that do not decode to UTF-8 are a 400, never a replacement character.
#[test]
fn bad_percent_escapes_in_paths_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(bin(), &dir.path().join("n1"), &[]);
    for path in [
        "/api/v1/pop/queue/%ff",
        "/api/v1/kv/ns/%c3%28",
        "/api/v1/resources/queues/a%80b",
    ] {
        let a = n.get(path);
        assert_eq!(a.status, 400, "{path}: {}", a.text);
        assert_eq!(a.json["code"], "bad_path", "{path}: {}", a.text);
    }
    // Valid escapes still decode.
    assert_eq!(
        n.post(
            "/api/v1/push",
            &json!({"items": [{"queue": "caf\u{e9}", "payload": 1}]})
        )
        .status,
        200
    );
    assert_eq!(n.get("/api/v1/pop/queue/caf%C3%A9?batch=1").status, 200);
}

/// On a node without `QUEEN_RAFT_TOKEN`, membership changes are refused: there is no
/// credential that could allow them.
#[test]
fn membership_changes_are_refused_without_a_configured_token() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(bin(), &dir.path().join("n1"), &[]);
    let a = n.post(
        "/api/v1/system/raft/membership/learners",
        &json!({"id": 2, "raft": "127.0.0.1:9", "http": "127.0.0.1:9"}),
    );
    assert_eq!(a.status, 403, "{}", a.text);
    assert!(a.text.contains("QUEEN_RAFT_TOKEN"), "{}", a.text);
    let d = n.request("DELETE", "/api/v1/system/raft/membership/members/1", None);
    assert_eq!(d.status, 403, "{}", d.text);
    assert_eq!(n.get("/api/v1/system/raft/membership").status, 200);
}

/// The raft port, even with the right token, refuses a body larger than its bound at once
/// (before reading it) instead of buffering it.
#[test]
fn the_raft_port_bounds_bodies_even_with_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = "probe-token";
    let nodes = queen_tests::three_nodes(bin(), dir.path(), token, |_| {
        vec![("QUEEN_MAX_BODY_BYTES".into(), "4194304".into())]
    });
    let raft_addr = nodes[0]
        .env_value("QUEEN_RAFT_PEERS")
        .and_then(|p| {
            p.split(',')
                .find(|e| e.starts_with("1="))
                .map(str::to_owned)
        })
        .and_then(|e| {
            e.split_once('=')
                .map(|(_, a)| a.split('/').next().unwrap_or_default().to_owned())
        })
        .unwrap();
    let pid = nodes[0].pid().unwrap();
    let before = rss_bytes(pid);
    let mut s = TcpStream::connect(&raft_addr).unwrap();
    let head = format!(
        "POST /raft/append_entries HTTP/1.1\r\nhost: x\r\nx-queen-raft-token: {token}\r\ncontent-length: {}\r\n\r\n",
        300u64 << 20
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(&vec![0u8; 1 << 20]);
    let line = status_line(&mut s, Duration::from_secs(5));
    assert!(line.contains(" 413"), "a 300 MB raft body: {line:?}");
    assert!(
        rss_bytes(pid).saturating_sub(before) < 64 << 20,
        "the raft port buffered the body"
    );
    // And the cluster still replicates.
    let a = nodes[1].post(
        "/api/v1/push",
        &json!({"items": [{"queue": "q", "payload": 1}]}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
}

/// A request whose client leaves is cancelled at once, not served to the end: a long poll that
/// would wait 30 s stops waiting when its connection closes.
#[test]
fn a_request_stops_when_its_client_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(bin(), &dir.path().join("n1"), &[]);
    let mut s = TcpStream::connect(("127.0.0.1", n.port)).unwrap();
    s.write_all(
        b"GET /api/v1/pop/queue/empty?batch=1&wait=true&timeout=30000 HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .unwrap();
    let waiting = || queen_tests::waiting_pops(&n);
    assert!(
        eventually(Duration::from_secs(5), || waiting() == 1),
        "the long poll never parked"
    );
    drop(s);
    let left = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || waiting() == 0),
        "the long poll went on after its client left"
    );
    assert!(left.elapsed() < Duration::from_secs(5));
}
