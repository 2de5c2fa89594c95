//! The embedded S3 sink end to end: a real `queen` process writing to a real S3 server (moto),
//! the lake read back by DuckDB and pyarrow and checked by `queen lake verify`; a kill -9 at
//! each point of the commit sequence; a bucket that is down or answers errors; retention
//! overrunning the sink; the local-folder default.

use std::process::Command;
use std::time::Duration;

use queen_tests::eventually;
use queen_tests::s3::{self, Mode, S3Server};
use serde_json::{Value, json};

#[path = "s3_sink_support.rs"]
mod support;
use support::*;

#[test]
fn the_walkthrough_three_records_land_in_window_one_exactly_as_pushed() {
    let server = S3Server::start();
    server.create_bucket("lake");
    let dir = tempfile::tempdir().unwrap();
    let n = start(&dir.path().join("n1"), &sink_env(&server.endpoint, &[]));
    let before = queue_status(&n);
    assert!(
        eventually(Duration::from_secs(10), || queue_status(&n)["state"]
            == "missing"),
        "{before:#}"
    );
    let t0 = std::time::Instant::now();
    // Raw text: serde_json would print 42.00 as 42.0, and the point is that the lake keeps the
    // producer's own text.
    let a = n.post_raw(
        "/api/v1/push",
        r#"{"items":[
  {"queue":"orders","partition":"cust-1","payload":{"order":1,"status":"new","total":42.00}},
  {"queue":"orders","partition":"cust-2","payload":{"order":2,"status":"new","total":17.50}},
  {"queue":"orders","partition":"cust-1","payload":{"order":1,"status":"paid","total":42.00}}
]}"#,
    );
    assert_eq!(a.status, 200, "{}", a.text);
    // Before the first window commits, the lag counts from the queue's oldest record (seconds),
    // not from the epoch.
    let early = wait_committed(&n, "a lag before the first commit", |q| {
        q["lagSeconds"].as_f64().is_some()
    });
    assert!(
        early["lagSeconds"].as_f64().is_some_and(|l| l < 120.0),
        "{early:#}"
    );
    let s = wait_committed(&n, "window 1", |q| {
        q["windowsCommitted"].as_u64() >= Some(1) && q["records"] == 3
    });
    assert_eq!(s["k"], 1);
    assert!(t0.elapsed() < Duration::from_secs(40));
    assert!(s["lagSeconds"].as_f64().is_some());
    let sink = &n.get("/status").json["s3"]["sinks"][0];
    assert_eq!(sink["ok"], true, "{sink:#}");
    assert_eq!(sink["bucket"]["reachable"], true);
    assert_eq!(sink["placement"]["held"], 1);

    let report = verify(&server);
    assert_eq!(report["queues"][0]["records"], 3, "{report:#}");
    let manifest_key = format!("queen/_queen/tenant={TENANT}/queue=orders/windows/0000000001.json");
    let lake = s3::read_lake(&[server.lake_args("lake"), vec!["--prefix", "queen"]].concat());
    let files: Vec<String> = lake["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(files.len(), 1, "{lake:#}");
    assert_eq!(
        lake["duckdb"]["read_json_rows"], 3,
        "DuckDB's read_json reads the JSONL too: {lake:#}"
    );
    let re_ok = files[0].starts_with(&format!("tenant={TENANT}/queue=orders/dt="))
        && files[0].contains("/hour=")
        && files[0].contains("/w-0000000001-")
        && files[0].ends_with(".jsonl.zst");
    assert!(re_ok, "data key {files:?}");
    assert!(
        lake["manifests"]
            .get(manifest_key.trim_start_matches("queen/"))
            .is_some(),
        "{lake:#}"
    );
    for reader in ["duckdb", "pyarrow"] {
        let recs = lake_records(&server, reader);
        let want = vec![
            (
                "cust-1".to_owned(),
                0,
                r#"{"order":1,"status":"new","total":42.00}"#,
            ),
            (
                "cust-1".to_owned(),
                1,
                r#"{"order":1,"status":"paid","total":42.00}"#,
            ),
            (
                "cust-2".to_owned(),
                0,
                r#"{"order":2,"status":"new","total":17.50}"#,
            ),
        ];
        assert_eq!(recs.len(), 3, "{reader}: {recs:?}");
        for ((p, o, _, payload), (wp, wo, wpay)) in recs.iter().zip(want) {
            assert_eq!((p, *o), (&wp, wo), "{reader}");
            let text = payload.as_str().unwrap_or_default().replace(' ', "");
            assert_eq!(text, wpay, "{reader}: 42.00 must stay 42.00");
        }
    }
    let metrics = n.get("/metrics/prometheus").text;
    for name in [
        "queen_s3_windows_committed_total",
        "queen_s3_records_written_total",
        "queen_s3_lag_seconds",
        "queen_s3_s3_requests_total",
    ] {
        assert!(
            metrics.contains(name),
            "{name} missing from /metrics/prometheus"
        );
    }
    assert!(
        !n.log_text().contains(s3::SECRET_KEY),
        "the secret key reached the log"
    );
    assert!(
        !n.get("/status").text.contains(s3::SECRET_KEY),
        "the secret key reached /status"
    );
}

#[test]
fn parquet_reads_back_with_hive_partitioning() {
    let server = S3Server::start();
    server.create_bucket("lake");
    let dir = tempfile::tempdir().unwrap();
    let n = start(
        &dir.path().join("n1"),
        &sink_env(
            &server.endpoint,
            &[
                ("QUEEN_S3_FORMAT", "parquet"),
                ("QUEEN_S3_LAYOUT", "per-partition"),
            ],
        ),
    );
    let items: Vec<String> = (0..40)
        .map(|i| {
            format!(
                r#"{{"queue":"orders","partition":"p{}","payload":{{"i":{i},"x":1.50}}}}"#,
                i % 4
            )
        })
        .collect();
    let a = n.post_raw(
        "/api/v1/push",
        &format!(r#"{{"items":[{}]}}"#, items.join(",")),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    wait_committed(&n, "parquet windows", |q| q["records"] == 40);
    verify(&server);
    for reader in ["duckdb", "pyarrow"] {
        let recs = lake_records(&server, reader);
        assert_eq!(recs.len(), 40, "{reader}");
        let mut keys: Vec<(String, u64)> = recs.iter().map(|r| (r.0.clone(), r.1)).collect();
        keys.dedup();
        assert_eq!(keys.len(), 40, "{reader}: each (partition, offset) once");
        assert!(
            recs.iter()
                .all(|r| r.3.as_str().is_some_and(|t| t.contains("1.50"))),
            "{reader}: payload text kept"
        );
    }
}

/// kill -9 (an abort at a chosen point of the commit sequence), restart, and every record is in
/// the lake exactly once.
#[test]
fn a_crash_at_each_commit_point_leaves_every_record_once() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    for (i, point) in ["intent", "objects", "manifest", "pointer", "checkpoint"]
        .into_iter()
        .enumerate()
    {
        let bucket = format!("crash{i}");
        server.create_bucket(&bucket);
        let mut env = sink_env(&server.endpoint, &[("QUEEN_S3_BUCKET", "x")]);
        env.retain(|(k, _)| *k != "QUEEN_S3_BUCKET");
        env.push(("QUEEN_S3_BUCKET", bucket.clone()));
        env.push(("QUEEN_TEST_S3_CRASH_AT", point.to_owned()));
        let mut n = start(&dir.path().join(point), &env);
        let items: Vec<Value> = (0..30).map(|j| json!({"queue": "orders", "partition": format!("p{}", j % 3), "transactionId": format!("t{j}"), "payload": {"j": j}})).collect();
        push(&n, &json!(items));
        let status = n.wait_exit(Duration::from_secs(60));
        assert!(
            status.is_some_and(|s| !s.success()),
            "{point}: the node should have aborted at the crash point\n{}",
            n.log_text()
        );
        n.set_env("QUEEN_TEST_S3_CRASH_AT", "");
        n.restart();
        let more: Vec<Value> = (30..40).map(|j| json!({"queue": "orders", "partition": format!("p{}", j % 3), "transactionId": format!("t{j}"), "payload": {"j": j}})).collect();
        push(&n, &json!(more));
        let report_ok = eventually(Duration::from_secs(60), || {
            let out = Command::new(bin())
                .args([
                    "lake",
                    "verify",
                    "--bucket",
                    &bucket,
                    "--endpoint",
                    &server.endpoint,
                    "--path-style",
                    "true",
                ])
                .env("QUEEN_S3_ACCESS_KEY", s3::ACCESS_KEY)
                .env("QUEEN_S3_SECRET_KEY", s3::SECRET_KEY)
                .output()
                .expect("verify");
            let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            out.status.success() && report["queues"][0]["records"] == 40
        });
        assert!(
            report_ok,
            "{point}: the lake should hold all 40 records once\n{}",
            n.log_text()
        );
        let mut args = server.lake_args(&bucket);
        args.extend(["--prefix", "queen"]);
        let lake = s3::read_lake(&args);
        let recs = lake["duckdb"]["records"].as_array().unwrap();
        let mut txns: Vec<&str> = recs.iter().map(|r| r[4].as_str().unwrap()).collect();
        txns.sort_unstable();
        txns.dedup();
        assert_eq!((recs.len(), txns.len()), (40, 40), "{point}: exactly once");
    }
}

#[test]
fn a_bucket_that_fails_then_recovers_loses_and_doubles_nothing() {
    let server = S3Server::start();
    server.create_bucket("lake");
    let proxy = server.proxy();
    let dir = tempfile::tempdir().unwrap();
    let n = start(&dir.path().join("n1"), &sink_env(&proxy.endpoint, &[]));
    push(
        &n,
        &json!([{"queue": "orders", "partition": "a", "payload": 1}]),
    );
    wait_committed(&n, "first window", |q| q["records"] == 1);
    proxy.set_mode(Mode::Http503);
    push(
        &n,
        &json!([{"queue": "orders", "partition": "a", "payload": 2}, {"queue": "orders", "partition": "b", "payload": 3}]),
    );
    assert!(
        eventually(Duration::from_secs(60), || queue_status(&n)["lastError"]
            .is_string()),
        "the failing upload should show as lastError: {:#}",
        queue_status(&n)
    );
    assert_eq!(
        queue_status(&n)["records"],
        1,
        "nothing commits while the bucket fails"
    );
    proxy.set_mode(Mode::Refuse);
    std::thread::sleep(Duration::from_secs(2));
    proxy.set_mode(Mode::Pass);
    wait_committed(&n, "after recovery", |q| q["records"] == 3);
    let report = verify(&server);
    assert_eq!(report["queues"][0]["records"], 3, "{report:#}");
}

#[test]
fn retention_that_overruns_the_sink_is_recorded_as_lost() {
    let server = S3Server::start();
    server.create_bucket("lake");
    let proxy = server.proxy();
    proxy.set_mode(Mode::Refuse);
    let dir = tempfile::tempdir().unwrap();
    let n = start(&dir.path().join("n1"), &sink_env(&proxy.endpoint, &[]));
    let a = n.post(
        "/api/v1/configure",
        &json!({"queue": "orders", "options": {"retentionEnabled": true, "retentionSeconds": 1}}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    push(
        &n,
        &json!([{"queue": "orders", "partition": "a", "payload": 1}, {"queue": "orders", "partition": "a", "payload": 2}]),
    );
    let gone = eventually(Duration::from_secs(30), || {
        let f = n.post(
            "/api/v1/fetch",
            &json!({"entries": [{"queue": "orders", "partition": "a", "offset": 0}]}),
        );
        f.json["entries"][0]["records"]
            .as_array()
            .is_some_and(Vec::is_empty)
    });
    assert!(gone, "retention should have deleted both records");
    let _ = n.post(
        "/api/v1/configure",
        &json!({"queue": "orders", "options": {"retentionEnabled": false}}),
    );
    push(
        &n,
        &json!([{"queue": "orders", "partition": "a", "payload": 3}]),
    );
    proxy.set_mode(Mode::Pass);
    let row = wait_committed(&n, "window after the overrun", |q| q["records"] == 1);
    // The status row (and so the dashboard) names what was lost, with the window that said so.
    assert_eq!(row["recordsLost"], 2, "{row:#}");
    let ranges = row["lostRanges"].as_array().cloned().unwrap_or_default();
    assert_eq!(ranges.len(), 1, "{row:#}");
    assert_eq!(
        (
            &ranges[0]["partition"],
            &ranges[0]["from"],
            &ranges[0]["to"]
        ),
        (&json!("a"), &json!(0), &json!(1)),
        "{row:#}"
    );
    assert!(ranges[0]["k"].as_u64().is_some(), "{row:#}");
    let mut args = server.lake_args("lake");
    args.extend(["--prefix", "queen"]);
    let lake = s3::read_lake(&args);
    let lost: Vec<Value> = lake["manifests"]
        .as_object()
        .expect("manifests")
        .values()
        .flat_map(|m| m["lost"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        lost,
        vec![json!({"partition": "a", "from": 0, "to": 1})],
        "{lake:#}"
    );
    assert!(
        n.get("/metrics/prometheus")
            .text
            .contains("queen_s3_records_lost_total{queue=\"orders\"} 2")
    );
}

#[test]
fn the_local_folder_default_needs_no_account_and_sigterm_drains() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let env: Vec<(&'static str, String)> = vec![
        ("QUEEN_S3_EMBEDDED", "true".into()),
        ("QUEEN_S3_QUEUES", "*".into()),
        ("QUEEN_S3_ENDPOINT", format!("file://{}", lake.display())),
        ("QUEEN_S3_START", "earliest".into()),
        ("QUEEN_S3_SAFE_GUARD_MS", "500".into()),
    ];
    let mut n = start(&dir.path().join("n1"), &env);
    let items: Vec<Value> = (0..5)
        .map(|i| json!({"queue": "local", "partition": "p", "payload": {"i": i}}))
        .collect();
    push(&n, &json!(items));
    // The default window is five minutes: only the drain at SIGTERM commits it (it is open for
    // ten seconds on the broker's clock by then, or holds a megabyte).
    std::thread::sleep(Duration::from_secs(11));
    assert!(n.sigterm(Duration::from_secs(60)).success());
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
    assert_eq!(
        report["queues"][0]["records"],
        5,
        "{report:#}\n{}",
        n.log_text()
    );
    let lake_json = s3::read_lake(&["--root", lake.to_str().unwrap(), "--prefix", "queen"]);
    assert_eq!(lake_json["duckdb"]["rows"], 5, "{lake_json:#}");
}

#[test]
fn bad_sink_settings_stop_the_boot_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .env_clear()
        .env("QUEEN_RAFT_DIR", dir.path())
        .env("PORT", queen_tests::free_port().to_string())
        .env("QUEEN_S3_EMBEDDED", "true")
        .env("QUEEN_S3_QUEUES", "orders")
        .env("QUEEN_S3_BUCKET", "lake")
        .env("QUEEN_S3_ACCESS_KEY", "k")
        .env("QUEEN_S3_SECRET_KEY", "very-secret-value")
        .env("QUEEN_S3_MAX_WINDOW_MS", "50")
        .output()
        .expect("run queen");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ERROR boot: FATAL: QUEEN_S3_EMBEDDED=true: QUEEN_S3_MAX_WINDOW_MS=50 is outside 100..=86400000. It is how long a window may stay open"),
        "{err}"
    );
    assert!(!err.contains("very-secret-value"));
}

/// Windows closed by size over several partitions: the sink reads the partitions in stamp order,
/// so a full buffer can always close a window (reading one partition to the budget first left
/// the others unread and no window could ever close).
#[test]
fn size_closed_windows_over_many_partitions_keep_flowing() {
    let server = S3Server::start();
    server.create_bucket("lake");
    let dir = tempfile::tempdir().unwrap();
    let n = start(
        &dir.path().join("n1"),
        &sink_env(
            &server.endpoint,
            &[
                ("QUEEN_S3_TARGET_MB", "1"),
                ("QUEEN_S3_MAX_WINDOW_MS", "600000"),
            ],
        ),
    );
    let body = "x".repeat(1000);
    for r in 0..30 {
        let items: Vec<Value> = (0..100).map(|j| json!({"queue": "orders", "partition": format!("p{}", j % 4), "transactionId": format!("t{r}-{j}"), "payload": {"b": body}})).collect();
        push(&n, &json!(items));
    }
    let s = wait_committed(&n, "size-closed windows", |q| {
        q["records"].as_u64() >= Some(2000)
    });
    assert!(
        s["windowsCommitted"].as_u64() >= Some(2),
        "several 1 MB windows: {s:#}"
    );
    let report = verify(&server);
    assert!(
        report["queues"][0]["records"].as_u64() >= Some(2000),
        "{report:#}"
    );
}
