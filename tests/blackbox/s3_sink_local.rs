//! The S3 sink writing to a local folder (the embedded default): names as long as the broker
//! takes reach the lake, and a queue the sink cannot write turns its health red at once.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use queen_tests::{Node, eventually};
use serde_json::{Value, json};

#[path = "s3_sink_support.rs"]
mod support;
use support::*;

/// Every file under `dir` (the lake folder), as paths relative to it.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    queen_tests::files_under(dir)
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap_or(&p).to_path_buf())
        .collect()
}

/// The sink's report on `/status`.
fn sink_report(n: &Node) -> Value {
    n.get("/status").json["s3"]["sinks"][0].clone()
}

/// The row of `queue` in the sink's report.
fn row_of(sink: &Value, queue: &str) -> Value {
    sink["queues"]
        .as_array()
        .and_then(|qs| qs.iter().find(|q| q["queue"] == queue).cloned())
        .unwrap_or(Value::Null)
}

/// The env of a sink writing every queue to a local folder in one-second windows.
fn local_env(lake: &Path, extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut env: Vec<(&'static str, String)> = vec![
        ("QUEEN_S3_EMBEDDED", "true".into()),
        ("QUEEN_S3_QUEUES", "*".into()),
        ("QUEEN_S3_ENDPOINT", format!("file://{}", lake.display())),
        ("QUEEN_S3_START", "earliest".into()),
        ("QUEEN_S3_MAX_WINDOW_MS", "1000".into()),
        ("QUEEN_S3_SAFE_GUARD_MS", "500".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    env
}

/// The longest names the broker takes (a 255-byte queue, 85 CJK characters that encoding
/// triples to 765 bytes, a 200-byte partition in the per-partition layout) reach a local-folder
/// lake under key components of at most 255 bytes, and the lake verifies.
#[test]
fn local_folder_names_as_long_as_the_broker_takes_reach_the_lake() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let env = local_env(&lake, &[("QUEEN_S3_LAYOUT", "per-partition")]);
    let n = start(&dir.path().join("n1"), &env);
    let long_queue = "q".repeat(255);
    let cjk_queue = "漢".repeat(85);
    let long_partition = "p".repeat(200);
    let want = [
        (long_queue.as_str(), 4_u64),
        (cjk_queue.as_str(), 2),
        ("orders", 2),
    ];
    push(
        &n,
        &json!([
            {"queue": long_queue, "partition": "a", "payload": {"i": 1}},
            {"queue": long_queue, "partition": long_partition, "payload": {"i": 2}},
            {"queue": long_queue, "partition": long_partition, "payload": {"i": 3}},
            {"queue": long_queue, "partition": "漢".repeat(85), "payload": {"i": 4}},
            {"queue": cjk_queue, "partition": "a", "payload": {"i": 5}},
            {"queue": cjk_queue, "partition": long_partition, "payload": {"i": 6}},
            {"queue": "orders", "partition": long_partition, "payload": {"i": 7}},
            {"queue": "orders", "partition": "b", "payload": {"i": 8}},
        ]),
    );
    let mut last = Value::Null;
    let committed = eventually(Duration::from_secs(60), || {
        last = sink_report(&n);
        want.iter()
            .all(|(q, records)| row_of(&last, q)["records"].as_u64() == Some(*records))
    });
    assert!(
        committed,
        "every queue should commit its records: {last:#}\n{}",
        n.log_text()
    );
    assert_eq!(last["ok"], true, "{last:#}");
    assert_eq!(last["health"]["failing"], 0, "{last:#}");
    for (q, _) in want {
        assert_eq!(row_of(&last, q)["lastError"], Value::Null, "{q}: {last:#}");
    }

    let files = files_under(&lake);
    let data: Vec<&std::path::PathBuf> = files
        .iter()
        .filter(|p| p.to_string_lossy().contains("/w-"))
        .collect();
    assert_eq!(
        data.len(),
        7,
        "one object per partition and window: {files:#?}"
    );
    for f in &files {
        let key = f.to_string_lossy();
        assert!(key.len() <= 900, "{} bytes: {key}", key.len());
        for c in f.components() {
            let c = c.as_os_str();
            assert!(c.len() <= 255, "component of {} bytes in {key}", c.len());
        }
    }
    // The shortened names carry the marker; the short ones are encoded as ever.
    assert!(
        files.iter().any(|f| f
            .to_string_lossy()
            .contains(&format!("/queue={}~", "q".repeat(232)))),
        "{files:#?}"
    );
    assert!(
        files
            .iter()
            .any(|f| f.to_string_lossy().contains("/queue=orders/")),
        "{files:#?}"
    );

    let out = Command::new(bin())
        .args([
            "lake",
            "verify",
            "--endpoint",
            &format!("file://{}", lake.display()),
        ])
        .output()
        .expect("verify");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(
        out.status.success(),
        "{report:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The manifests keep the full names: verify reports every queue under its own name.
    for (q, records) in want {
        let r = report["queues"]
            .as_array()
            .and_then(|qs| qs.iter().find(|r| r["queue"] == q).cloned())
            .unwrap_or(Value::Null);
        assert_eq!(r["records"], records, "{q}: {report:#}");
    }
}

/// A queue the sink cannot write (a file stands where its folder should be) turns the sink red
/// within seconds, with the reason, and green again once a later attempt succeeds.
#[test]
fn local_folder_a_queue_the_sink_cannot_write_turns_its_health_red_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let blocker = lake.join(format!("queen/tenant={TENANT}/queue=blocked"));
    std::fs::create_dir_all(blocker.parent().unwrap()).unwrap();
    std::fs::write(&blocker, b"not a folder").unwrap();
    let n = start(&dir.path().join("n1"), &local_env(&lake, &[]));
    push(
        &n,
        &json!([{"queue": "blocked", "partition": "a", "payload": 1}, {"queue": "fine", "partition": "a", "payload": 2}]),
    );
    let pushed = std::time::Instant::now();
    let mut last = Value::Null;
    let red = eventually(Duration::from_secs(20), || {
        last = sink_report(&n);
        last["ok"] == false && row_of(&last, "blocked")["lastError"].is_string()
    });
    assert!(red, "the sink should turn red: {last:#}\n{}", n.log_text());
    let took = pushed.elapsed();
    assert!(took < Duration::from_secs(10), "red only after {took:?}");
    assert_eq!(last["health"]["ok"], false, "{last:#}");
    assert_eq!(last["health"]["failing"], 1, "{last:#}");
    assert_eq!(
        last["health"]["lagging"], 0,
        "not lagging yet, failing: {last:#}"
    );
    let blocked = row_of(&last, "blocked");
    assert_eq!(blocked["failing"], true, "{last:#}");
    assert!(blocked["lastErrorAt"].is_string(), "{last:#}");
    assert!(
        blocked["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("queue=blocked")),
        "the reason names the key: {last:#}"
    );
    // The other queue is not held back by it.
    assert!(
        eventually(Duration::from_secs(30), || row_of(&sink_report(&n), "fine")
            ["records"]
            == 1),
        "{:#}",
        sink_report(&n)
    );
    // `/health` is about raft only: the node stays ready.
    assert_eq!(n.get("/health").status, 200);

    // The folder can be made: the next attempt lands, the sink turns green again and keeps the
    // last error with its time.
    std::fs::remove_file(&blocker).unwrap();
    let green = eventually(Duration::from_secs(30), || {
        last = sink_report(&n);
        last["ok"] == true && row_of(&last, "blocked")["records"] == 1
    });
    assert!(
        green,
        "the sink should turn green again: {last:#}\n{}",
        n.log_text()
    );
    let blocked = row_of(&last, "blocked");
    assert_eq!(blocked["failing"], false, "{last:#}");
    assert_eq!(last["health"]["failing"], 0, "{last:#}");
    assert!(
        blocked["lastError"].is_string() && blocked["lastErrorAt"].is_string(),
        "{last:#}"
    );
}
