//! Issue 59, H3: ephemeral memory bounded by `QUEEN_EPHEMERAL_MAX_BYTES`. The probe made tens of
//! thousands of one-message queues (the budget counted payloads only) and popped on names
//! nobody pushed to (each pop created a queue); the node's RSS grew far past the budget and
//! the listing answered every queue at once. Here, on a real node: the RSS growth stays within
//! the budget plus a stated constant, pushes past the budget or a cap are refused, a pop
//! creates nothing, and the listing pages.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::{Answer, Node, eventually, memory_kib};
use serde_json::{Value, json};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// The budget of the probe's node.
const BUDGET: u64 = 4 << 20;
/// What the RSS may grow beyond the budget (docs/ephemeral.md states it): buffers, the
/// allocator's pages, the bounded caches of names.
const SLACK: u64 = 16 << 20;

fn push_one(n: &Node, queue: &str, headers: &[(&str, &str)]) -> Answer {
    let body = json!({"queue": queue, "messages": [{"payload": {"n": 1}}]}).to_string();
    n.try_request_with("POST", "/api/v1/ephemeral/push", Some(&body), headers)
        .unwrap_or_else(|e| panic!("push {queue}: {e}"))
}

fn rss(n: &Node) -> u64 {
    memory_kib(n.pid().expect("running"), "VmRSS") * 1024
}

/// Every queue name of the listing, page by page with `limit`; the pages' sizes.
fn list_all(n: &Node, limit: u32) -> (Vec<String>, Vec<usize>) {
    let (mut names, mut pages) = (Vec::new(), Vec::new());
    let mut after: Option<String> = None;
    for _ in 0..10_000 {
        let path = match &after {
            Some(a) => format!("/api/v1/ephemeral/queues?limit={limit}&after={a}"),
            None => format!("/api/v1/ephemeral/queues?limit={limit}"),
        };
        let a = n.get(&path);
        assert_eq!(a.status, 200, "{path}: {}", a.text);
        let rows = a.json["queues"].as_array().cloned().unwrap_or_default();
        pages.push(rows.len());
        names.extend(
            rows.iter()
                .map(|r| r["queue"].as_str().unwrap_or("").to_owned()),
        );
        match a.json["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return (names, pages),
        }
    }
    panic!("the listing did not end");
}

#[test]
fn many_one_message_queues_and_unknown_pops_stay_within_the_ephemeral_budget() {
    let dir = tempfile::tempdir().expect("temp dir");
    let budget = BUDGET.to_string();
    let n = Node::start(
        bin(),
        dir.path(),
        &[
            ("QUEEN_EPHEMERAL_MAX_BYTES", &budget),
            ("QUEEN_EPHEMERAL_MAX_QUEUES", "1000000"),
            ("QUEEN_EPHEMERAL_MAX_QUEUES_PER_TENANT", "1000000"),
        ],
    );
    // Warm the paths the probe takes, then measure from there.
    for i in 0..50 {
        assert_eq!(push_one(&n, &format!("warm-{i}"), &[]).status, 201);
        let _ = n.get(&format!(
            "/api/v1/ephemeral/pop?queue=warm-{i}&autoAck=true"
        ));
    }
    let _ = n.get("/api/v1/ephemeral/queues");
    let before = rss(&n);

    // 20,000 one-message queues from four clients, and 20,000 pops on names never pushed.
    let started = Instant::now();
    let per_thread = 5_000;
    let answers: Vec<(u64, u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let n = &n;
                s.spawn(move || {
                    let (mut pushed, mut refused, mut empty) = (0, 0, 0);
                    for i in 0..per_thread {
                        let a = push_one(n, &format!("probe-{t}-{i:05}"), &[]);
                        match a.status {
                            201 => pushed += 1,
                            503 => {
                                assert_eq!(a.json["code"], "ephemeral_unavailable", "{}", a.text);
                                assert!(a.text.contains("QUEEN_EPHEMERAL_MAX_BYTES"), "{}", a.text);
                                refused += 1;
                            }
                            s => panic!("push answered {s}: {}", a.text),
                        }
                        let p = n.get(&format!(
                            "/api/v1/ephemeral/pop?queue=unknown-{t}-{i:05}&group=g{i}"
                        ));
                        assert!(p.status == 200 || p.status == 204, "pop: {}", p.text);
                        if p.json["messages"].as_array().is_none_or(Vec::is_empty) {
                            empty += 1;
                        }
                    }
                    (pushed, refused, empty)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    let pushed: u64 = answers.iter().map(|a| a.0).sum();
    let refused: u64 = answers.iter().map(|a| a.1).sum();
    let empty: u64 = answers.iter().map(|a| a.2).sum();
    println!(
        "{pushed} queues kept, {refused} pushes refused, {empty} empty pops in {:?}",
        started.elapsed()
    );
    // Waiting pops on unknown names leave nothing behind either.
    std::thread::scope(|s| {
        for t in 0..8 {
            let n = &n;
            s.spawn(move || {
                let a = n.get(&format!(
                    "/api/v1/ephemeral/pop?queue=waiting-{t}&wait=true&timeout=300"
                ));
                assert!(a.status == 200 || a.status == 204, "{}", a.text);
            });
        }
    });

    // The allocator gives freed pages back within a fraction of a second: wait for the figure
    // to settle under the bound, bounded.
    let bound = BUDGET + SLACK;
    let mut grown = 0;
    let settled = eventually(Duration::from_secs(20), || {
        grown = rss(&n).saturating_sub(before);
        grown <= bound
    });
    println!(
        "RSS {} MiB before, grew {:.1} MiB (budget {} MiB + {} MiB)",
        before >> 20,
        grown as f64 / f64::from(1 << 20),
        BUDGET >> 20,
        SLACK >> 20
    );
    assert!(settled, "RSS grew {grown} bytes, over {bound}");
    assert!(pushed > 100, "the budget holds some queues");
    assert!(refused > 0, "pushes past the budget are refused");
    assert_eq!(
        empty,
        4 * per_thread,
        "a pop on an unknown name finds nothing"
    );

    let status = n.get("/status").json["ephemeral"].clone();
    let counted = status["bytes"].as_u64().expect("bytes");
    assert!(counted <= BUDGET, "counted {counted} over the budget");
    let (names, pages) = list_all(&n, 1000);
    assert!(
        pages.iter().all(|p| *p <= 1000),
        "pages of at most 1000: {pages:?}"
    );
    let kept: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(kept.len(), names.len(), "no queue twice across pages");
    assert!(
        names
            .iter()
            .all(|q| q.starts_with("probe-") || q.starts_with("warm-")),
        "a pop created a queue: {:?}",
        names
            .iter()
            .find(|q| !q.starts_with("probe-") && !q.starts_with("warm-"))
    );
    assert_eq!(
        names.iter().filter(|q| q.starts_with("probe-")).count() as u64,
        pushed
    );
}

#[test]
fn queue_caps_refuse_new_queues_per_tenant_and_per_node_and_the_listing_pages() {
    const A: &str = "a1a1a1a1-0000-4000-8000-00000000000a";
    const B: &str = "b2b2b2b2-0000-4000-8000-00000000000b";
    let dir = tempfile::tempdir().expect("temp dir");
    let n = Node::start(
        bin(),
        dir.path(),
        &[
            ("QUEEN_TENANCY_HEADER", "true"),
            ("QUEEN_KV_TRUSTED_PROXY", "1"),
            ("QUEEN_EPHEMERAL_MAX_QUEUES", "300"),
            ("QUEEN_EPHEMERAL_MAX_QUEUES_PER_TENANT", "250"),
        ],
    );
    // The default tenant fills its share: the next new queue is refused, naming the cap.
    for i in 0..250 {
        let a = push_one(&n, &format!("q{i:03}"), &[]);
        assert_eq!(a.status, 201, "{}", a.text);
    }
    let over = push_one(&n, "q250", &[]);
    assert_eq!(over.status, 429, "{}", over.text);
    assert_eq!(over.json["code"], "too_many_queues", "{}", over.text);
    assert!(
        over.text.contains("QUEEN_EPHEMERAL_MAX_QUEUES_PER_TENANT"),
        "{}",
        over.text
    );
    // A queue it holds still takes pushes.
    assert_eq!(push_one(&n, "q000", &[]).status, 201);

    // Another tenant is not held back by it, until the node's own cap.
    let a = [("x-queen-tenant", A)];
    for i in 0..50 {
        let got = push_one(&n, &format!("a{i:02}"), &a);
        assert_eq!(got.status, 201, "{}", got.text);
    }
    let b = [("x-queen-tenant", B)];
    let full = push_one(&n, "b0", &b);
    assert_eq!(full.status, 429, "{}", full.text);
    assert!(
        full.text.contains("QUEEN_EPHEMERAL_MAX_QUEUES") && !full.text.contains("PER_TENANT"),
        "{}",
        full.text
    );

    // Pops on unknown names create nothing, and the listing pages: 100 by default, a cursor.
    for i in 0..20 {
        let p = n.get(&format!(
            "/api/v1/ephemeral/pop?queue=nobody-{i}&wait=true&timeout=50"
        ));
        assert!(p.status == 200 || p.status == 204, "{}", p.text);
    }
    let first = n.get("/api/v1/ephemeral/queues");
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["count"], 100);
    assert_eq!(first.json["next"], "q099");
    let (names, pages) = list_all(&n, 120);
    assert_eq!(pages, [120, 120, 10]);
    let expected: Vec<String> = (0..250).map(|i| format!("q{i:03}")).collect();
    assert_eq!(
        names, expected,
        "the default tenant's queues, in order, once each"
    );
    let last = n.get("/api/v1/ephemeral/queues?limit=1000&after=q249");
    assert_eq!(last.json["count"], 0, "{}", last.text);
    assert_eq!(last.json["next"], Value::Null);
    for bad in ["limit=0", "limit=1001", "limit=x"] {
        let a = n.get(&format!("/api/v1/ephemeral/queues?{bad}"));
        assert_eq!(a.status, 400, "{bad}: {}", a.text);
        assert!(a.text.contains("limit"), "{}", a.text);
    }
    let theirs = n
        .try_request_with("GET", "/api/v1/ephemeral/queues?limit=1000", None, &a)
        .expect("list");
    assert_eq!(theirs.json["count"], 50, "{}", theirs.text);
}
