//! Clock skew between nodes, made with libfaketime (Debian's `faketime`): one node's wall clock
//! runs ahead of the others'. Leases are timed by the stamps of the leader that proposed each
//! pop, so when leadership moves to a node whose clock is ahead, the leases the old leader
//! granted would end early in real time; a new leader therefore holds them past their expiry
//! by `QUEEN_RAFT_MAX_CLOCK_SKEW_MS` (500 ms by default). The test grants leases on a leader
//! with a true clock, hands leadership (SIGTERM) to the node whose clock is ahead, and has a
//! second consumer of the same group pop until it gets the messages again: none may come back
//! while the first consumer's lease is surely still valid when the skew is inside the bound.
//! Past the bound, the same run shows leases ending early by about the excess, which is what
//! the bound documents.
//!
//! Without libfaketime it prints a SKIPPED line to stderr and passes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use queen_tests::{eventually, or_skip, three_nodes};
use serde_json::{Value, json};

const QUEUE: &str = "skewed";
const GROUP: &str = "g";
const LEASE: Duration = Duration::from_secs(3);
const MESSAGES: usize = 20;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// libfaketime's library for threaded programs, where Debian installs it.
fn faketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime",
        "/usr/lib/aarch64-linux-gnu/faketime",
        "/usr/lib/faketime",
    ]
    .iter()
    .map(|d| Path::new(d).join("libfaketimeMT.so.1"))
    .find(|p| p.exists())
}

/// What one run measured.
struct Run {
    /// Messages handed to the second consumer while the first one's lease was surely valid.
    early: usize,
    /// The earliest second delivery, measured from the first pop's send (the lease is `LEASE`).
    first_again: Duration,
    /// When the skewed node led, from the first pop's send.
    led_after: Duration,
}

/// Three nodes, node 3's clock `ahead` of the others'; leases granted by a true-clock leader,
/// leadership handed to node 3, then a second consumer pops until it has every message again.
fn run(lib: &Path, ahead: &str, dir: &Path) -> Run {
    std::fs::create_dir_all(dir).expect("run directory");
    let lib = lib.to_string_lossy().into_owned();
    let mut nodes = three_nodes(bin(), dir, "clock-skew", |i| {
        if i == 2 {
            vec![
                ("LD_PRELOAD".into(), lib.clone()),
                ("FAKETIME".into(), ahead.into()),
                ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
            ]
        } else {
            Vec::new()
        }
    });
    let mut leader = 0;
    assert!(
        eventually(Duration::from_secs(30), || {
            leader = nodes[0].leader_id().unwrap_or(0);
            (1..=3).contains(&leader)
        }),
        "no leader"
    );
    if leader == 3 {
        // Start from a leader with a true clock: node 3 hands over and comes back.
        nodes[2].sigterm(Duration::from_secs(30));
        nodes[2].launch();
        nodes[2].wait_healthy(Duration::from_secs(60));
        assert!(eventually(Duration::from_secs(30), || {
            leader = nodes[0].leader_id().unwrap_or(0);
            leader == 1 || leader == 2
        }));
    }
    let l = usize::try_from(leader - 1).unwrap_or(0);
    let other = if l == 0 { 1 } else { 0 };
    let configured = nodes[l].post(
        "/api/v1/configure",
        &json!({"queue": QUEUE, "options": {"leaseTime": LEASE.as_secs(), "retryLimit": 100}}),
    );
    assert_eq!(configured.status, 200, "{}", configured.text);
    let items: Vec<Value> = (0..MESSAGES)
        .map(|k| json!({"queue": QUEUE, "partition": "p", "transactionId": format!("s{k}"), "payload": {"k": k}}))
        .collect();
    let pushed = nodes[l].post("/api/v1/push", &json!({"items": items}));
    assert_eq!(pushed.status, 200, "{}", pushed.text);
    // Let both followers catch up, so that the hand-over goes to node 3 (the most caught-up
    // follower; on a tie, the higher id).
    std::thread::sleep(Duration::from_millis(500));
    let path =
        format!("/api/v1/pop/queue/{QUEUE}?consumerGroup={GROUP}&batch={MESSAGES}&wait=false");
    let sent = Instant::now();
    let first = nodes[l].get(&path);
    assert_eq!(first.status, 200, "{}", first.text);
    let got = first.json["messages"].as_array().map_or(0, Vec::len);
    assert_eq!(got, MESSAGES, "{}", first.text);
    // Hand leadership to node 3 (SIGTERM makes the leader transfer it first).
    nodes[l].sigterm(Duration::from_secs(30));
    let mut led_after = Duration::MAX;
    let mut again: Vec<Duration> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while again.len() < MESSAGES && Instant::now() < deadline {
        if led_after == Duration::MAX && nodes[other].leader_id() == Some(3) {
            led_after = sent.elapsed();
        }
        let second = nodes[other].get(&path);
        if second.status == 200 {
            let at = sent.elapsed();
            let n = second.json["messages"].as_array().map_or(0, Vec::len);
            again.extend(std::iter::repeat_n(at, n));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        again.len(),
        MESSAGES,
        "the messages came back to the group within 20 s"
    );
    let early = again.iter().filter(|t| **t < LEASE).count();
    let first_again = again.iter().min().copied().unwrap_or_default();
    for n in &mut nodes {
        n.kill9();
    }
    Run {
        early,
        first_again,
        led_after,
    }
}

#[test]
fn leases_survive_a_leader_whose_clock_runs_ahead_within_the_bound() {
    let Some(lib) = or_skip(
        faketime().ok_or("libfaketime is not installed"),
        "clock-skew test",
        "Debian package faketime",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    // Inside the bound (500 ms): no lease ends early.
    let inside = run(&lib, "+0.4", &dir.path().join("inside"));
    println!(
        "node 3 400 ms ahead: led {:?} after the pop; first message again after {:?} (lease {LEASE:?}); {} early",
        inside.led_after, inside.first_again, inside.early
    );
    assert!(
        inside.led_after < LEASE,
        "the skewed node must lead while the leases run ({:?})",
        inside.led_after
    );
    assert_eq!(
        inside.early, 0,
        "messages handed out again inside a valid lease"
    );
    // Past the bound: leases end early by about the excess (1.5 s ahead, 0.5 s held).
    let past = run(&lib, "+1.5", &dir.path().join("past"));
    println!(
        "node 3 1500 ms ahead: led {:?} after the pop; first message again after {:?} (lease {LEASE:?}); {} early",
        past.led_after, past.first_again, past.early
    );
    if past.led_after < Duration::from_millis(900) {
        assert!(
            past.early > 0,
            "a clock 1 s past the bound should end leases early, or the test sees nothing"
        );
    }
}
