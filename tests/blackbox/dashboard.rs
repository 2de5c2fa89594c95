//! The dashboard on real nodes: the page and its files are served by the binary, without a
//! credential even with broker JWT on, each with its content type, and nothing in them points
//! outside the node; three nodes each serve the same page, and the survivor of two crashes
//! shows the no-quorum banner. Then a real browser (Debian's headless Chromium, driven by
//! Selenium from `tests/browser/run.sh`) walks every view of a follower in a three-node
//! cluster filled with queues, a consumer group, a dead letter, a KV key, a timer, an ephemeral
//! queue and the S3 sink on: the figures against the API's, retry and delete, the sink's
//! figures from the node that writes each queue, each node's raft figures; then it asks for a
//! token on a JWT node, shows the banner of a closed disk gate, and saves the screenshots that
//! `docs/dashboard.md` shows.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use queen_tests::{Node, eventually, three_nodes};
use serde_json::{Value, json};

const SECRET: &str = "dashboard-blackbox-secret-long-enough";

/// The SVG namespace (a name the charts' elements are created in; nothing is loaded from it).
const SVG_NS: &str = "http://www.w3.org/2000/svg";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn token(role: &str) -> String {
    let claims = json!({"sub": "dashboard-test", "role": role, "exp": jsonwebtoken::get_current_timestamp() + 600});
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("a key"),
    )
    .expect("a token")
}

fn jwt_env() -> [(&'static str, &'static str); 2] {
    [("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)]
}

/// The files the page names (`/dashboard/…` in the HTML) and the modules the scripts import
/// (`from "./x.js"`), found by walking from the page.
fn files_of(n: &Node) -> Vec<(String, String, String)> {
    let page = n.get("/");
    let mut todo: Vec<String> = quoted_after(&page.text, "\"/dashboard/")
        .into_iter()
        .map(|f| format!("/dashboard/{f}"))
        .collect();
    let mut seen = Vec::new();
    while let Some(path) = todo.pop() {
        if seen.iter().any(|(p, _, _)| *p == path) {
            continue;
        }
        let a = n.get(&path);
        assert_eq!(a.status, 200, "{path}: {}", a.text);
        for m in quoted_after(&a.text, "from \"./") {
            todo.push(format!("/dashboard/{m}"));
        }
        seen.push((path, a.content_type.unwrap_or_default(), a.text));
    }
    seen
}

/// Every text between `start` and the next `"`.
fn quoted_after(text: &str, start: &str) -> Vec<String> {
    text.split(start)
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

fn points_outside(text: &str) -> bool {
    let text = text.replace(SVG_NS, "");
    text.contains("http://") || text.contains("https://")
}

#[test]
fn the_page_and_its_files_are_served_without_a_credential_and_load_nothing_from_outside() {
    let dir = tempfile::tempdir().expect("temp dir");
    let n = Node::start(bin(), dir.path(), &jwt_env());

    let page = n.get("/");
    assert_eq!(page.status, 200, "{}", page.text);
    assert_eq!(
        page.content_type.as_deref(),
        Some("text/html; charset=utf-8")
    );
    assert!(page.text.starts_with("<!doctype html>"), "{}", page.text);
    assert!(
        page.text
            .contains("<script type=\"module\" src=\"/dashboard/app.js\">")
    );
    assert!(
        !points_outside(&page.text),
        "the page points outside the node"
    );

    let files = files_of(&n);
    let names: Vec<&str> = files.iter().map(|(p, _, _)| p.as_str()).collect();
    for want in [
        "/dashboard/app.css",
        "/dashboard/app.js",
        "/dashboard/api.js",
        "/dashboard/dom.js",
        "/dashboard/chart.js",
        "/dashboard/views.js",
    ] {
        assert!(
            names.contains(&want),
            "{want} is not reached from the page: {names:?}"
        );
    }
    for (path, content_type, text) in &files {
        let want = if path.ends_with(".css") {
            "text/css; charset=utf-8"
        } else {
            "text/javascript; charset=utf-8"
        };
        assert_eq!(content_type, want, "{path}");
        assert!(!points_outside(text), "{path} points outside the node");
        assert!(!text.contains("innerHTML"), "{path} parses text as HTML");
    }

    // The files carry no data; every figure does, and needs the token.
    assert_eq!(n.get("/status").status, 401);
    assert_eq!(n.get("/api/v1/resources/queues").status, 401);
    let missing = n.get("/dashboard/nope.js");
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json["code"], "no_such_route");
    // Only GET (and HEAD) read the page: a POST to it reaches the router, which has no such
    // route.
    assert_eq!(n.request("POST", "/", Some("{}")).status, 404);

    // Requests of the page are counted under their own route label (the metrics need a
    // token under JWT: they name every tenant's queues).
    let auth = format!("Bearer {}", token("read-only"));
    let metrics = n
        .try_request_with(
            "GET",
            "/metrics/prometheus",
            None,
            &[("authorization", &auth)],
        )
        .expect("metrics")
        .text;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("queen_http_requests_total") && l.contains("dashboard")),
        "no request counted as the dashboard:\n{metrics}"
    );
}

#[test]
fn three_nodes_serve_the_same_page_and_a_survivor_without_quorum_says_so() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut nodes = three_nodes(bin(), dir.path(), "dash-token", |_| Vec::new());
    let first = files_of(&nodes[0]);
    for n in &nodes[1..] {
        assert_eq!(n.get("/").text, nodes[0].get("/").text);
        let files = files_of(n);
        assert_eq!(files.len(), first.len());
        for ((p, _, a), (q, _, b)) in first.iter().zip(&files) {
            assert_eq!((p, a), (q, b));
        }
    }
    // The members the overview lists, each with the client address its link opens.
    let m = nodes[2].get("/api/v1/system/raft/membership");
    let addrs: Vec<&str> = m.json["members"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["http"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(addrs.len(), 3, "{}", m.text);
    // Each node's own figures, gathered by the node asked over the raft port: once the last
    // member has caught up (it joins as a learner that has applied nothing yet), every node
    // answers with an applied index.
    let settled = |a: &queen_tests::Answer| {
        a.json["nodes"].as_array().is_some_and(|l| {
            l.len() == 3
                && l.iter()
                    .all(|n| n["reachable"] == true && n["applied"].as_u64().unwrap_or(0) > 0)
        })
    };
    assert!(
        eventually(Duration::from_secs(20), || settled(
            &nodes[2].get("/api/v1/system/raft/nodes")
        )),
        "{}",
        nodes[2].get("/api/v1/system/raft/nodes").text
    );
    let all = nodes[2].get("/api/v1/system/raft/nodes");
    let listed = all.json["nodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        listed.iter().filter(|n| n["role"] == "leader").count(),
        1,
        "{}",
        all.text
    );
    println!(
        "three nodes served the dashboard in {:?}",
        started.elapsed()
    );

    let shots = shots_dir();

    // Two of three gone: the survivor has no quorum, and its page says so.
    nodes[1].kill9();
    nodes[2].kill9();
    assert!(
        eventually(
            Duration::from_secs(20),
            || nodes[0].get("/health").json["status"] == "no_quorum"
        ),
        "{}",
        nodes[0].get("/health").text
    );
    // The survivor still lists every member, the two gone as unreachable.
    let alone = nodes[0].get("/api/v1/system/raft/nodes");
    let listed = alone.json["nodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 3, "{}", alone.text);
    assert_eq!(
        listed.iter().filter(|n| n["reachable"] == false).count(),
        2,
        "{}",
        alone.text
    );
    if let Some(stdout) = browser(&[
        "banner",
        &nodes[0].url(""),
        "No quorum",
        &shots,
        "no-quorum",
    ]) {
        assert!(stdout.contains("dashboard banner ok"), "{stdout}");
    }
    println!("with the no-quorum banner: {:?}", started.elapsed());
}

/// Whether Debian's chromium and chromium-driver are installed.
#[allow(
    clippy::disallowed_methods,
    reason = "a test: where the browser is installed"
)]
fn chromium() -> Option<(String, String)> {
    let find = |names: &[&str]| {
        names.iter().find_map(|n| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(n))
                    .find(|p| p.is_file())
                    .map(|p| p.display().to_string())
            })
        })
    };
    Some((
        find(&["chromium", "chromium-browser"])?,
        find(&["chromedriver"])?,
    ))
}

/// Where the browser saves its screenshots: `docs/dashboard/` with
/// `QUEEN_DASHBOARD_SCREENSHOTS=1` (to refresh the ones the docs show), else a folder under the
/// system's temporary directory, so a test run leaves the work tree as it was.
#[allow(
    clippy::disallowed_methods,
    reason = "a test: where the screenshots go"
)]
fn shots_dir() -> String {
    let dir = if std::env::var("QUEEN_DASHBOARD_SCREENSHOTS").is_ok_and(|v| v == "1") {
        repo().join("docs/dashboard")
    } else {
        std::env::temp_dir().join(format!("queen-dashboard-shots-{}", std::process::id()))
    };
    std::fs::create_dir_all(&dir).expect("the screenshots' folder");
    dir.display().to_string()
}

/// A node with a queue of two partitions, a consumer group that consumed one message, a dead
/// letter in a second queue, a KV key, a timer and an ephemeral queue holding two messages.
fn fill(n: &Node) -> Value {
    let ok = |a: queen_tests::Answer| {
        assert!(a.status < 300, "{}", a.text);
        a.json
    };
    ok(n.post(
        "/api/v1/push",
        &json!({"items": [
            {"queue": "orders", "partition": "eu", "payload": {"order": 1, "note": "<b>not bold</b>"}},
            {"queue": "orders", "partition": "eu", "payload": {"order": 2}},
            {"queue": "orders", "partition": "us", "payload": {"order": 3}},
        ]}),
    ));
    let popped = ok(n.get("/api/v1/pop/queue/orders/partition/eu?consumerGroup=billing&batch=1"));
    let m = &popped["messages"][0];
    ok(n.post(
        "/api/v1/ack",
        &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "consumerGroup": "billing", "status": "completed"}),
    ));
    ok(n.post(
        "/api/v1/configure",
        &json!({"queue": "jobs", "options": {"retryLimit": 0}}),
    ));
    ok(n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "jobs", "partition": "p", "payload": {"job": "resize"}}]}),
    ));
    let job = ok(n.get("/api/v1/pop/queue/jobs?batch=1"));
    let j = &job["messages"][0];
    ok(n.post(
        "/api/v1/ack",
        &json!({"transactionId": j["transactionId"], "partitionId": j["partitionId"], "leaseId": j["leaseId"], "status": "failed", "error": "no such image"}),
    ));
    ok(n.post(
        "/api/v1/kv",
        &json!({"operations": [{"op": "put", "ns": "app", "key": "cfg/colour", "value": "purple", "forever": true}]}),
    ));
    ok(n.post(
        "/api/v1/timers",
        &json!({"operations": [{"op": "schedule", "queue": "jobs", "timerKey": "user/42", "payload": "eyJyZW1pbmQiOnRydWV9", "delayMs": 3_600_000}]}),
    ));
    ok(n.post(
        "/api/v1/ephemeral/configure",
        &json!({"queue": "rooms", "options": {"leaseSeconds": 30}}),
    ));
    ok(n.post(
        "/api/v1/ephemeral/push",
        &json!({"queue": "rooms", "partition": "lobby", "messages": [{"payload": "hi"}, {"payload": "there"}]}),
    ));
    let groups = ok(n.get("/api/v1/consumer-groups"));
    let lag = groups
        .as_array()
        .and_then(|a| a.iter().find(|g| g["name"] == "billing"))
        .map(|g| g["totalLag"].clone())
        .unwrap_or(Value::Null);
    // What the browser must show: the overview's counts and the group's lag.
    json!({
        "overview": n.get("/api/v1/resources/overview").json,
        "billingLag": lag,
        "message": m,
        "deadLetter": j,
    })
}

/// Runs `tests/browser/dashboard.py` with `args` and answers what it printed; `None`, with a
/// printed SKIPPED line, when Chromium is not installed.
fn browser(args: &[&str]) -> Option<String> {
    let (chrome, driver) = queen_tests::or_skip(
        chromium().ok_or("chromium or chromedriver is not installed"),
        "dashboard browser test",
        "apt-get install chromium chromium-driver",
    )?;
    let started = Instant::now();
    let out = std::process::Command::new("bash")
        .arg(repo().join("tests/browser/run.sh"))
        .arg("--script")
        .arg("dashboard.py")
        .args(args)
        .env("CHROMIUM", &chrome)
        .env("CHROMEDRIVER", &driver)
        .output()
        .expect("bash runs tests/browser/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the browser test: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{stdout}");
    println!("the browser took {:?} (bound: 120 s)", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(120));
    Some(stdout)
}

#[test]
fn a_browser_walks_every_view_of_a_three_node_cluster_and_asks_for_a_token_under_jwt() {
    if chromium().is_none() {
        browser(&[]);
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // Three nodes whose S3 sinks share one local folder (each queue written by one of them),
    // sampling their analytics every 500 ms for the history charts.
    let lake = format!("file://{}", dir.path().join("lake").display());
    let cluster = dir.path().join("cluster");
    std::fs::create_dir_all(&cluster).expect("the cluster's folder");
    let nodes = three_nodes(bin(), &cluster, "dash-token", |_| {
        [
            ("QUEEN_S3_EMBEDDED", "true"),
            ("QUEEN_S3_QUEUES", "*"),
            ("QUEEN_S3_ENDPOINT", lake.as_str()),
            ("QUEEN_S3_START", "earliest"),
            ("QUEEN_S3_MAX_WINDOW_MS", "1000"),
            ("QUEEN_S3_SAFE_GUARD_MS", "500"),
            ("QUEEN_ANALYTICS_INTERVAL_MS", "500"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    });
    // The page of a follower: every figure it shows is read through a node that leads nothing,
    // and every write the page makes (retry, delete) is forwarded to the leader.
    let mut follower = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            follower = nodes
                .iter()
                .find(|n| n.get("/health").json["raft"]["role"] == "follower");
            follower.is_some()
        }),
        "no follower"
    );
    let open = follower.expect("a follower");
    let mut expect = fill(open);
    expect["role"] = open.get("/health").json["raft"]["role"].clone();
    let guarded = Node::start(bin(), &dir.path().join("jwt"), &jwt_env());
    // A disk gate at 1%: closed on any disk that holds a file system.
    let full = Node::start(
        bin(),
        &dir.path().join("full"),
        &[("QUEEN_RAFT_DISK_HIGH_PCT", "1")],
    );
    let expect_file = dir.path().join("expect.json");
    std::fs::write(&expect_file, expect.to_string()).expect("expect file");
    let stdout = browser(&[
        &open.url(""),
        &guarded.url(""),
        &token("read-write"),
        &expect_file.display().to_string(),
        &shots_dir(),
        &full.url(""),
    ])
    .unwrap_or_default();
    assert!(stdout.contains("dashboard browser ok"), "{stdout}");
}
