//! The disk gate on a small file system: 1 MiB pushes stop with 507 before the disk passes
//! `QUEEN_RAFT_DISK_HIGH_PCT` (by at most `MARGIN_PCT`), consumers then drain every message
//! (`/health` 200 and no 5xx throughout), and once the queue is deleted pushes are accepted
//! again.
//!
//! Needs root (it mounts a 300 MiB tmpfs as the node's data directory); elsewhere it prints
//! `skipped: <why>` and passes. A third test needs no mount: the S3 sink (to a local folder)
//! keeps committing on a node whose gate is closed.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use queen_tests::{Node, Tmpfs, eventually};
use serde_json::json;

/// Size of the test file system.
const DISK_MIB: u64 = 300;
/// The gate under test.
const HIGH_PCT: u64 = 85;
/// How far past the gate the disk may go: the state store's background flushes and compactions
/// rewrite tables after the last admitted push (documented in docs/getting-started.md).
const MARGIN_PCT: u64 = 3;
/// One message's payload.
const PAYLOAD_BYTES: usize = 1 << 20;

/// (size, used) of the file system holding `dir`, in bytes, from `statvfs` (via `stat -f`), used
/// counted as the node counts it: size minus what an unprivileged writer may still use.
fn disk_use(dir: &Path) -> (u64, u64) {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%b %a %S"])
        .arg(dir)
        .output()
        .expect("stat -f");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    assert_eq!(v.len(), 3, "stat -f answered {text:?}");
    (v[0] * v[2], (v[0] - v[1]) * v[2])
}

/// A payload that does not compress: pseudo-random letters from a seeded generator.
fn payload(seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..PAYLOAD_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + u8::try_from(x % 26).unwrap_or(0))
        })
        .collect()
}

/// Samples the disk every 10 ms on a thread and keeps the highest use seen.
struct PeakWatch {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeakWatch {
    fn start(dir: &Path) -> PeakWatch {
        let (peak, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (p, s, d) = (peak.clone(), stop.clone(), dir.to_path_buf());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(disk_use(&d).1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        PeakWatch {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for PeakWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn on_a_small_disk_pushes_stop_at_the_gate_and_consumers_drain_everything() {
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("n1");
    let mount = match Tmpfs::mount(&data, DISK_MIB) {
        Ok(m) => m,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    // The node's log file is written next to the directory (n1.log), outside the tmpfs.
    let high = HIGH_PCT.to_string();
    let mut n = Node::start(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &data,
        &[("QUEEN_RAFT_DISK_HIGH_PCT", &high)],
    );
    let watch = PeakWatch::start(&mount.dir);
    let (total, at_start) = disk_use(&mount.dir);
    println!("tmpfs: {total} bytes, {at_start} in use at start");

    // Four producers push 1 MiB messages at once (a burst between two samples is what overshot
    // before), each until the gate refuses it ten times in a row a tenth of a second apart (a
    // push may pass again after a refusal when a sample shows the disk below the projection: it
    // is then counted like any other).
    let accepted_ids: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::default();
    let refusals: std::sync::Mutex<Vec<queen_tests::Answer>> = std::sync::Mutex::default();
    std::thread::scope(|scope| {
        for producer in 0..4u64 {
            let (n, accepted_ids, refusals) = (&n, &accepted_ids, &refusals);
            scope.spawn(move || {
                let mut refused_in_a_row = 0;
                for i in 0..100u64 {
                    if refused_in_a_row >= 10 {
                        return;
                    }
                    let id = format!("p{producer}-{i:03}");
                    let a = n.post("/api/v1/push", &json!({"items": [{"queue": "q", "transactionId": id, "payload": payload(producer * 1000 + i)}]}));
                    match a.status {
                        200 => {
                            assert_eq!(a.json[0]["status"], "queued", "{}", a.text);
                            accepted_ids.lock().unwrap().insert(id);
                            refused_in_a_row = 0;
                        }
                        507 => {
                            refused_in_a_row += 1;
                            refusals.lock().unwrap().push(a);
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        other => panic!("push {id} answered {other}: {}", a.text),
                    }
                }
                panic!("producer {producer}: the gate never closed on a {DISK_MIB} MiB disk");
            });
        }
    });
    let accepted = accepted_ids.into_inner().unwrap();
    let first_refusal = refusals.into_inner().unwrap().into_iter().next();
    if let Some(r) = &first_refusal {
        println!("first refusal: {}", r.text);
    }
    let refusal = first_refusal.expect("a refusal");
    assert_eq!(refusal.json["code"], "disk_full", "{}", refusal.text);
    let message = refusal.json["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("QUEEN_RAFT_DISK_HIGH_PCT is 85%"),
        "names the setting and the limit: {message}"
    );
    let (_, at_gate) = disk_use(&mount.dir);
    println!(
        "gate held after {} pushes; {at_gate} bytes in use",
        accepted.len()
    );
    assert_eq!(
        n.get("/health").status,
        200,
        "a closed gate is not a failure"
    );
    let peak = watch.peak();
    let peak_pct = peak * 100 / total;
    println!("peak disk use while pushing: {peak} bytes ({peak_pct}%)");
    assert!(
        peak * 100 <= total * (HIGH_PCT + MARGIN_PCT),
        "the disk reached {peak_pct}%, past {HIGH_PCT}% + {MARGIN_PCT}%"
    );
    assert!(
        accepted.len() >= 20,
        "the gate closed early: {} pushes",
        accepted.len()
    );

    // Drain: every message comes back, pops and acks never fail, health stays ready.
    let mut drained: BTreeSet<String> = BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(30);
    while drained.len() < accepted.len() {
        assert!(
            Instant::now() < until,
            "drained {} of {}",
            drained.len(),
            accepted.len()
        );
        let got = n.get("/api/v1/pop/queue/q?batch=5&wait=false");
        assert_eq!(
            got.status,
            200,
            "pop at a closed gate: {}",
            &got.text[..got.text.len().min(300)]
        );
        let messages = got.json["messages"].as_array().cloned().unwrap_or_default();
        let lease = got.json["leaseId"].clone();
        for m in &messages {
            let a = n.post("/api/v1/ack", &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": lease, "status": "completed"}));
            assert_eq!(a.status, 200, "ack at a closed gate: {}", a.text);
            assert_eq!(a.json[0]["success"], true, "{}", a.text);
            drained.insert(m["transactionId"].as_str().unwrap_or_default().to_owned());
        }
        let h = n.get("/health");
        assert_eq!(h.status, 200, "health at a closed gate: {}", h.text);
    }
    assert_eq!(
        drained, accepted,
        "every accepted message came back, none other"
    );

    // Deleting the drained queue frees its data: 1 MiB pushes are accepted again.
    let big = json!({"items": [{"queue": "q2", "transactionId": "again", "payload": payload(7)}]});
    assert_eq!(
        n.post("/api/v1/push", &big).status,
        507,
        "still closed before the delete"
    );
    let d = n.request("DELETE", "/api/v1/resources/queues/q", None);
    assert_eq!(d.status, 200, "queue delete at a closed gate: {}", d.text);
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let a = n.post("/api/v1/push", &big);
        if a.status == 200 {
            break;
        }
        assert_eq!(a.status, 507, "{}", a.text);
        let reclaim: Vec<String> = n
            .log_text()
            .lines()
            .filter(|l| l.contains("reclaim"))
            .map(str::to_owned)
            .collect();
        assert!(
            Instant::now() < until,
            "pushes still refused after the queue was deleted: {} (disk {:?}; {reclaim:?})",
            a.text,
            disk_use(&mount.dir)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // And the node gives the deleted queue's space back to the file system (the reclaim after a
    // deletion near the gate): less in use than when the gate closed, by at least 10%.
    let mut now = 0;
    let freed = eventually(Duration::from_secs(20), || {
        now = disk_use(&mount.dir).1;
        now * 10 < at_gate * 9
    });
    assert!(
        freed,
        "{now} bytes still in use after the queue was deleted ({at_gate} at the gate)"
    );
    println!("accepted again; {now} bytes in use");
    assert_eq!(n.get("/health").status, 200);
    let peak = watch.peak();
    assert!(
        peak * 100 <= total * (HIGH_PCT + MARGIN_PCT),
        "the disk reached {}% during the drain",
        peak * 100 / total
    );
    println!(
        "done in {:?}; disk now {:?}",
        started.elapsed(),
        disk_use(&mount.dir)
    );
    drop(watch);
    n.kill9();
    drop(mount);
}

#[test]
fn with_the_gate_at_100_percent_the_reserve_stops_writes_before_the_store_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("n1");
    let mount = match Tmpfs::mount(&data, 100) {
        Ok(m) => m,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    // The default reserve (32 MiB). Without it (QUEEN_RAFT_DISK_RESERVE_BYTES=0) this disk fills
    // and the state store fails a write: the node stops (exit status 1) until it is restarted
    // with room (tests/blackbox/faults_disk.rs).
    let mut n = Node::start(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &data,
        &[("QUEEN_RAFT_DISK_HIGH_PCT", "100")],
    );
    let watch = PeakWatch::start(&mount.dir);
    let (total, _) = disk_use(&mount.dir);
    let (mut accepted, mut refused_in_a_row, mut message) = (0u64, 0, String::new());
    while refused_in_a_row < 10 {
        assert!(
            accepted < 200,
            "the reserve never stopped pushes on a 100 MiB disk"
        );
        let a = n.post("/api/v1/push", &json!({"items": [{"queue": "q", "transactionId": format!("m{accepted}"), "payload": payload(accepted)}]}));
        match a.status {
            200 => {
                accepted += 1;
                refused_in_a_row = 0;
            }
            507 => {
                refused_in_a_row += 1;
                message = a.json["error"].as_str().unwrap_or_default().to_owned();
                std::thread::sleep(Duration::from_millis(100));
            }
            other => panic!("push answered {other}: {}", a.text),
        }
    }
    assert!(
        message.contains("QUEEN_RAFT_DISK_RESERVE_BYTES"),
        "names the reserve: {message}"
    );
    let free_at_peak = total - watch.peak();
    println!("accepted {accepted}; least free {free_at_peak} bytes; {message}");
    assert!(free_at_peak > 0, "the disk filled");
    assert_eq!(n.get("/health").status, 200, "the store did not fail");
    // Consumers still drain in the room above the reserve.
    let got = n.get("/api/v1/pop/queue/q?batch=1&wait=false");
    assert_eq!(got.status, 200, "{}", &got.text[..got.text.len().min(300)]);
    let m = &got.json["messages"][0];
    let a = n.post("/api/v1/ack", &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": got.json["leaseId"], "status": "completed"}));
    assert_eq!(a.json[0]["success"], true, "{}", a.text);
    drop(watch);
    n.kill9();
    drop(mount);
}

#[test]
fn above_the_gate_the_sink_keeps_committing_its_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("n1");
    let lake = dir.path().join("lake");
    let bin = Path::new(env!("CARGO_BIN_EXE_queen"));
    let mut n = Node::start(bin, &data, &[]);
    // Retention held for the sink: nothing is deleted before the sink committed it.
    let c = n.post(
        "/api/v1/configure",
        &json!({"queue": "local", "options": {"retentionEnabled": true, "retentionSeconds": 1, "retentionSinkHold": "default"}}),
    );
    assert_eq!(c.status, 200, "{}", c.text);
    let items: Vec<serde_json::Value> = (0..5)
        .map(|i| json!({"queue": "local", "partition": "p", "payload": {"i": i}}))
        .collect();
    let a = n.post("/api/v1/push", &json!({ "items": items }));
    assert_eq!(a.status, 200, "{}", a.text);
    // The hold lets retention delete only what lies a minute (of broker time) below the sink's
    // commit pointer, and the pointer moves only with windows of records: one more record a
    // minute later puts the first five below that line once the sink commits both.
    std::thread::sleep(Duration::from_secs(62));
    let b = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "local", "partition": "p", "payload": {"i": "late"}}]}),
    );
    assert_eq!(b.status, 200, "{}", b.text);
    assert!(n.sigterm(Duration::from_secs(30)).success());
    // 1% is past on any disk holding this checkout: the gate is closed from the start.
    let endpoint = format!("file://{}", lake.display());
    let sink = [
        ("QUEEN_RAFT_DISK_HIGH_PCT", "1"),
        ("QUEEN_S3_EMBEDDED", "true"),
        ("QUEEN_S3_QUEUES", "*"),
        ("QUEEN_S3_ENDPOINT", endpoint.as_str()),
        ("QUEEN_S3_START", "earliest"),
        ("QUEEN_S3_MAX_WINDOW_MS", "1000"),
        ("QUEEN_S3_SAFE_GUARD_MS", "500"),
    ];
    let mut n = Node::start(bin, &data, &sink);
    let refused = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "local", "partition": "p", "payload": {"i": 5}}]}),
    );
    assert_eq!(refused.status, 507, "the gate is closed: {}", refused.text);
    let mut last = serde_json::Value::Null;
    let committed = eventually(Duration::from_secs(60), || {
        let s = n.get("/status").json;
        last = s["s3"]["sinks"][0]["queues"]
            .as_array()
            .and_then(|qs| qs.iter().find(|q| q["queue"] == "local").cloned())
            .unwrap_or_default();
        last["windowsCommitted"].as_u64() >= Some(1) && last["records"] == 6
    });
    assert!(
        committed,
        "the sink committed its backlog at a closed gate: {last:#}\n{}",
        n.log_text()
    );
    // Then retention deletes what the sink committed a minute below its commit pointer (the
    // hold's margin): the first five records, not the late one. A node above the gate drains
    // because the sink's lease refreshes and commit pointer went through the closed gate.
    let mut seen = serde_json::Value::Null;
    let drained = eventually(Duration::from_secs(60), || {
        seen = n.get("/status").json["queues"]["items"].clone();
        seen.as_array().is_some_and(|qs| {
            qs.iter()
                .any(|q| q["name"] == "local" && q["messages"] == 1)
        })
    });
    assert!(
        drained,
        "retention with the sink's hold drained the queue: {seen:#}"
    );
    let refused = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "local", "partition": "p", "payload": {"i": 6}}]}),
    );
    assert_eq!(
        refused.status, 507,
        "the gate is still closed: {}",
        refused.text
    );
    assert!(n.sigterm(Duration::from_secs(60)).success());
    let out = std::process::Command::new(bin)
        .args(["lake", "verify", "--endpoint", &endpoint])
        .output()
        .expect("verify");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(
        out.status.success(),
        "{report:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report["queues"][0]["records"], 6, "{report:#}");
}
