//! The monitoring files in `infra/monitoring` work: the alert rules pass `promtool check rules`
//! and their unit tests (`promtool test rules`), and every metric the rules and the Grafana
//! dashboard name is one a real node exports on `/metrics/prometheus` (a node with the S3 sink
//! on, after a push, a pop, an ack and a committed window).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use queen_tests::{Node, eventually};
use serde_json::{Value, json};

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../infra/monitoring")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(monitoring())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "promtool is needed to check the alert rules ({e}); install it with \
                 `apt-get install prometheus` (Debian) or put Prometheus's promtool on PATH"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let checked = promtool(&["check", "rules", "queen-alerts.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "queen-alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Every `queen_*` name in a text.
fn names_in(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("queen_") {
        let start = i + at;
        let before_ok =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        let mut end = start;
        while end < b.len()
            && (b[end].is_ascii_lowercase() || b[end].is_ascii_digit() || b[end] == b'_')
        {
            end += 1;
        }
        if before_ok && !out.iter().any(|n| n == &text[start..end]) {
            out.push(text[start..end].to_owned());
        }
        i = end.max(start + 1);
    }
    out
}

#[test]
fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    let rules = std::fs::read_to_string(monitoring().join("queen-alerts.yml")).expect("rules");
    let dash_text =
        std::fs::read_to_string(monitoring().join("grafana/queen.json")).expect("dashboard");
    let dash: Value = serde_json::from_str(&dash_text).expect("the dashboard is JSON");
    assert!(
        dash["panels"].as_array().is_some_and(|p| p.len() > 10),
        "panels"
    );
    let mut exprs = rules.clone();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push('\n');
            exprs.push_str(t["expr"].as_str().expect("every target has an expr"));
        }
    }
    let wanted = names_in(&exprs);
    assert!(wanted.len() > 20, "{wanted:?}");

    let dir = tempfile::tempdir().unwrap();
    let lake = format!("file://{}", dir.path().join("lake").display());
    let n = Node::start(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &dir.path().join("n"),
        &[
            ("QUEEN_S3_EMBEDDED", "true"),
            ("QUEEN_S3_QUEUES", "*"),
            ("QUEEN_S3_ENDPOINT", &lake),
            ("QUEEN_S3_MAX_WINDOW_MS", "1000"),
            ("QUEEN_S3_SAFE_GUARD_MS", "500"),
        ],
    );
    n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "m", "transactionId": "t1", "payload": 1}]}),
    );
    let p = n.get("/api/v1/pop/queue/m?batch=1&wait=false");
    let msg = &p.json["messages"][0];
    let a = n.post(
        "/api/v1/ack",
        &json!({"transactionId": "t1", "partitionId": msg["partitionId"], "leaseId": p.json["leaseId"], "status": "completed"}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    let exported = |text: &str, name: &str| {
        text.lines().filter(|l| !l.starts_with('#')).any(|l| {
            l.strip_prefix(name).is_some_and(|rest| {
                rest.starts_with(['{', ' '])
                    || rest.starts_with("_bucket")
                    || rest.starts_with("_count")
            })
        })
    };
    let mut text = String::new();
    let all_there = eventually(Duration::from_secs(30), || {
        text = n.get("/metrics/prometheus").text;
        wanted.iter().all(|w| exported(&text, w))
    });
    let missing: Vec<&String> = wanted.iter().filter(|w| !exported(&text, w)).collect();
    assert!(
        all_there,
        "named by the monitoring files but not exported: {missing:?}\n{text}"
    );
}
