//! Analytics: a node that samples every 100 ms with ten seconds of retention answers time
//! series of its queues and of itself, and over a run more than twice its retention keeps no
//! sample older than the retention allows (plus one file's span) and a bounded number of bytes;
//! after kill -9 it reads them again.

use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::{Node, eventually};
use serde_json::{Value, json};

/// The samples on disk: (their total bytes, the oldest sample's time in epoch ms).
fn on_disk(dir: &Path) -> (u64, Option<u64>) {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("analytics"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    let bytes = files
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    let oldest = files.first().and_then(|f| {
        let text = std::fs::read_to_string(f).ok()?;
        let first: Value = serde_json::from_str(text.lines().next()?).ok()?;
        first["at"].as_u64()
    });
    (bytes, oldest)
}

#[allow(
    clippy::disallowed_methods,
    reason = "the test compares the broker's stamps with this machine's wall clock"
)]
fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis()),
    )
    .unwrap_or(0)
}

fn sum(series: &Value, field: &str) -> f64 {
    series.as_array().map_or(0.0, |a| {
        a.iter().map(|b| b[field].as_f64().unwrap_or(0.0)).sum()
    })
}

#[test]
fn analytics_answer_series_and_keep_only_their_retention() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("node");
    let n = Node::start(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &data,
        &[
            ("QUEEN_ANALYTICS_INTERVAL_MS", "100"),
            ("QUEEN_ANALYTICS_RETENTION_S", "10"),
        ],
    );
    let (mut pushed, mut consumed) = (0u64, 0u64);
    let started = Instant::now();
    let mut worst_age = 0u64;
    let mut most_bytes = 0u64;
    // 25 s of traffic on three queues: more than twice the retention.
    while started.elapsed() < Duration::from_secs(25) {
        for q in ["an-a", "an-b", "an-c"] {
            let items: Vec<Value> = (0..5)
                .map(|i| json!({"queue": q, "payload": {"i": i}}))
                .collect();
            let r = n.post("/api/v1/push", &json!({"items": items}));
            assert_eq!(r.status, 200, "{}", r.text);
            pushed += 5;
        }
        let popped = n.get("/api/v1/pop/queue/an-a?batch=5&wait=false&autoAck=true");
        consumed += popped.json["messages"]
            .as_array()
            .map_or(0, |m| m.len() as u64);
        if started.elapsed() > Duration::from_secs(12) {
            let (bytes, oldest) = on_disk(&n.dir);
            most_bytes = most_bytes.max(bytes);
            if let Some(at) = oldest {
                worst_age = worst_age.max(now_ms().saturating_sub(at));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Ten seconds kept, plus at most one file of an eighth of that still open, plus slack for a
    // loaded machine; and about ten seconds of samples of three queues at ten a second.
    assert!(
        worst_age <= 13_000,
        "a sample {worst_age} ms old was still on disk"
    );
    assert!(
        most_bytes <= 400_000,
        "{most_bytes} bytes of samples on disk"
    );

    // The last minute, by queue: what was pushed since the retention began is counted.
    let a = n.get("/api/v1/status/analytics?interval=minute");
    assert_eq!(a.status, 200, "{}", a.text);
    let queues = a.json["queues"].as_array().expect("queues");
    assert_eq!(queues.len(), 3, "{}", a.text);
    let an_a = queues.iter().find(|q| q["queue"] == "an-a").expect("an-a");
    let seen_pushed = sum(&an_a["series"], "pushed");
    assert!(
        seen_pushed > 0.0 && seen_pushed <= pushed as f64,
        "pushed {seen_pushed} of {pushed}: {}",
        a.text
    );
    assert!(
        sum(&an_a["series"], "consumed") <= consumed as f64,
        "{}",
        a.text
    );
    assert!(
        sum(&a.json["totals"], "pushed") >= seen_pushed,
        "{}",
        a.text
    );
    let one = n.get("/api/v1/status/analytics?queue=an-b");
    assert_eq!(
        one.json["queues"].as_array().map(Vec::len),
        Some(1),
        "{}",
        one.text
    );

    // The node's own figures.
    let sys = n.get("/api/v1/analytics/system-metrics");
    assert_eq!(sys.status, 200, "{}", sys.text);
    let last = sys.json["series"]
        .as_array()
        .and_then(|s| s.last().cloned())
        .expect("a bucket");
    assert!(
        last["rssBytes"].as_f64().unwrap_or(0.0) > 1e6,
        "{}",
        sys.text
    );
    assert_eq!(last["leader"], 1.0, "{}", sys.text);
    assert!(last.get("requests").is_none(), "{}", sys.text);
    let work = n.get("/api/v1/analytics/worker-metrics");
    assert!(sum(&work.json["series"], "requests") > 0.0, "{}", work.text);

    // Bad ranges name their field.
    let bad = n.get("/api/v1/status/analytics?interval=week");
    assert_eq!(bad.status, 400, "{}", bad.text);
    assert!(bad.text.contains("interval"), "{}", bad.text);
    let wide = n.get("/api/v1/status/analytics?from=0&interval=minute");
    assert_eq!(wide.status, 400, "{}", wide.text);
    assert!(wide.text.contains("interval"), "{}", wide.text);

    // After kill -9 (a line may be torn) the node reads the samples it kept.
    let mut n = n;
    n.kill9();
    n.restart();
    assert!(eventually(Duration::from_secs(10), || {
        let a = n.get("/api/v1/status/analytics");
        a.status == 200 && a.json["samples"].as_u64().unwrap_or(0) > 20
    }));
}
