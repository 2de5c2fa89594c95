//! The pop autopilot (contract 2.0.7) on one real node: `autopilot=true` pops are sized from
//! what the queue holds, echo the knobs they used, keep a knob the client set exactly, advise a
//! growing `waitMs` after empty pops, and let the official client's default consumer loop
//! drain a queue of thousands of one-message partitions.

use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::Node;
use serde_json::{Value, json};

fn node(dir: &Path) -> Node {
    Node::start(Path::new(env!("CARGO_BIN_EXE_queen")), &dir.join("n1"), &[])
}

/// One message in each of `partitions` partitions (`p0`, `p1`, ...), 100 per push request.
fn one_per_partition(n: &Node, queue: &str, partitions: usize) {
    for start in (0..partitions).step_by(100) {
        let items: Vec<Value> = (start..partitions.min(start + 100))
            .map(|i| json!({"queue": queue, "partition": format!("p{i}"), "transactionId": format!("t{i}"), "payload": {"i": i}}))
            .collect();
        let a = n.post("/api/v1/push", &json!({ "items": items }));
        assert_eq!(a.status, 200, "{}", a.text);
    }
}

/// `count` messages in the partition `p` of `queue` (transactions `{prefix}0`, `{prefix}1`,
/// ...), 100 per push request.
fn deep_partition(n: &Node, queue: &str, prefix: &str, count: usize) {
    for start in (0..count).step_by(100) {
        let items: Vec<Value> = (start..count.min(start + 100))
            .map(|i| json!({"queue": queue, "partition": "p", "transactionId": format!("{prefix}{i}"), "payload": i}))
            .collect();
        let a = n.post("/api/v1/push", &json!({ "items": items }));
        assert_eq!(a.status, 200, "{}", a.text);
    }
}

/// A pop that must answer 200 with a body.
fn pop(n: &Node, queue: &str, query: &str) -> Value {
    let a = n.get(&format!("/api/v1/pop/queue/{queue}?{query}"));
    assert_eq!(a.status, 200, "pop {queue}?{query}: {}", a.text);
    a.json
}

fn echo(answer: &Value) -> (u64, u64, u64) {
    let a = &answer["autopilot"];
    let n = |k: &str| {
        a[k].as_u64()
            .unwrap_or_else(|| panic!("autopilot.{k} in {answer}"))
    };
    (n("partitions"), n("batch"), n("waitMs"))
}

fn delivered(answer: &Value) -> usize {
    answer["messages"].as_array().map_or(0, Vec::len)
}

#[test]
fn the_autopilot_sizes_a_pop_from_the_queue_and_keeps_the_knobs_the_client_set() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    one_per_partition(&n, "wide", 2_000);
    deep_partition(&n, "deep", "d", 1_000);

    // Two thousand partitions of one message: a wide sweep, a budget of one message each.
    let got = pop(&n, "wide", "autopilot=true&wait=false&consumerGroup=a");
    assert_eq!(echo(&got), (100, 100, 0), "{}", got["autopilot"]);
    assert_eq!(got["partitionsClaimed"], 100);
    assert_eq!(delivered(&got), 100);
    // One deep partition: a sweep of one, a large batch.
    let got = pop(&n, "deep", "autopilot=true&wait=false&consumerGroup=a");
    assert_eq!(echo(&got), (1, 500, 0), "{}", got["autopilot"]);
    assert_eq!(delivered(&got), 500);

    // A knob the client set is used as set and echoed as set; the other is still chosen.
    let got = pop(
        &n,
        "wide",
        "autopilot=true&partitions=3&wait=false&consumerGroup=b",
    );
    let (partitions, batch, _) = echo(&got);
    assert_eq!(partitions, 3, "{}", got["autopilot"]);
    assert!(batch >= 3, "{}", got["autopilot"]);
    assert_eq!(got["partitionsClaimed"], 3);
    let got = pop(
        &n,
        "deep",
        "autopilot=true&batch=7&wait=false&consumerGroup=b",
    );
    assert_eq!(echo(&got), (1, 7, 0), "{}", got["autopilot"]);
    assert_eq!(delivered(&got), 7);
    let got = pop(
        &n,
        "wide",
        "autopilot=true&batch=1&wait=false&consumerGroup=c",
    );
    let (partitions, batch, _) = echo(&got);
    assert_eq!((batch, delivered(&got)), (1, 1), "{}", got["autopilot"]);
    assert_eq!(partitions, 1, "one message fills a budget of one");

    // Without autopilot nothing is chosen and nothing is echoed.
    let got = pop(
        &n,
        "wide",
        "batch=2&partitions=2&wait=false&consumerGroup=d",
    );
    assert!(got.get("autopilot").is_none(), "{got}");
    assert_eq!(delivered(&got), 2);
}

#[test]
fn empty_autopilot_pops_advise_a_growing_wait_and_a_delivery_resets_it() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    deep_partition(&n, "idle", "a", 1);
    let got = pop(&n, "idle", "autopilot=true&wait=false");
    assert_eq!(delivered(&got), 1);
    assert_eq!(echo(&got).2, 0, "a delivery gives no advice");
    let ack = n.post(
        "/api/v1/ack",
        &json!({"transactionId": "a0", "partitionId": got["messages"][0]["partitionId"], "leaseId": got["leaseId"], "status": "completed"}),
    );
    assert_eq!(ack.status, 200, "{}", ack.text);

    // Empty: 200 with the echo (a 204 could not carry it), the advice doubling each time.
    let mut advice = Vec::new();
    for _ in 0..4 {
        let got = pop(&n, "idle", "autopilot=true&wait=false");
        assert_eq!(delivered(&got), 0, "{got}");
        advice.push(echo(&got).2);
    }
    assert_eq!(advice, [100, 200, 400, 800]);

    // A client that did not say whether to wait is held for the advice (800 ms) before the
    // broker answers that nothing came.
    let started = Instant::now();
    let got = pop(&n, "idle", "autopilot=true&timeout=30000");
    assert!(
        started.elapsed() >= Duration::from_millis(750),
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!((delivered(&got), echo(&got).2), (0, 1_600), "{got}");

    // A delivery resets the advice; the next empty pop starts over.
    deep_partition(&n, "idle", "b", 1);
    let got = pop(&n, "idle", "autopilot=true&wait=false");
    assert_eq!((delivered(&got), echo(&got).2), (1, 0), "{got}");
    let got = pop(&n, "idle", "autopilot=true&wait=false&consumerGroup=late");
    assert_eq!(delivered(&got), 2, "a new group sees both: {got}");
    let got = pop(&n, "idle", "autopilot=true&wait=false&consumerGroup=late");
    assert_eq!((delivered(&got), echo(&got).2), (0, 100), "{got}");
}

#[test]
fn the_official_clients_default_consumer_drains_five_thousand_partitions() {
    const PARTITIONS: usize = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    one_per_partition(&n, "many", PARTITIONS);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/client/run.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("--script")
        .arg("autopilot_drain.py")
        .arg(n.url(""))
        .arg("many")
        .arg(PARTITIONS.to_string())
        .env("QUEEN_CLIENT_SUITE_LIMIT", "240")
        .output()
        .expect("bash runs tests/client/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the official client's drain: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no report in {stdout}"));
    assert_eq!(report["delivered"], PARTITIONS, "{report}");
    assert_eq!(
        report["distinct"], PARTITIONS,
        "every message once: {report}"
    );
    assert_eq!(report["left"], 0, "{report}");
    // One partition a pop would take a handler call per message; the autopilot's sweep takes
    // many partitions a pop.
    let calls = report["calls"].as_u64().unwrap();
    assert!(
        calls <= (PARTITIONS / 10) as u64,
        "{calls} handler calls for {PARTITIONS} messages: {report}"
    );
    // Nothing is left for the queue-mode group, and nothing is leased.
    let a = n.get("/api/v1/pop/queue/many?batch=10&partitions=10&wait=false");
    assert_eq!(a.status, 204, "{}", a.text);
}
