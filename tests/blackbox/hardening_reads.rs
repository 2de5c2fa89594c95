//! Issue 59, M1: a queue with very many partitions must not make the status routes answer tens
//! of megabytes, nor let their readers starve pushes to other queues. One real node, one queue
//! of `PARTITIONS` partitions made by batched pushes; every heavy route's answer must be bounded
//! in bytes, and following its cursor must visit every partition exactly once.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use queen_tests::Node;
use serde_json::{Value, json};

/// Partitions of the wide queue: well above the per-call walk budget (10,000), cheap enough to
/// create on a debug build.
const PARTITIONS: usize = 20_000;
/// Items per push while creating them.
const BATCH: usize = 1000;
/// Largest answer any heavy route may give (bytes); a full page of 1,000 partition rows is
/// about a third of it.
const MAX_ANSWER: usize = 1 << 20;

fn node(dir: &Path) -> Node {
    Node::start(Path::new(env!("CARGO_BIN_EXE_queen")), &dir.join("n1"), &[])
}

/// The wide queue: one message in each of `PARTITIONS` partitions, and group `g1` holding a
/// lease on one of them.
fn wide_queue(n: &Node) {
    for chunk in 0..PARTITIONS / BATCH {
        let items: Vec<Value> = (0..BATCH)
            .map(|i| {
                let k = chunk * BATCH + i;
                json!({"queue": "wide", "partition": format!("p{k:05}"), "transactionId": format!("t{k}"), "payload": k})
            })
            .collect();
        let a = n.post("/api/v1/push", &json!({ "items": items }));
        assert_eq!(a.status, 200, "{}", &a.text[..a.text.len().min(300)]);
    }
    let p = n.get("/api/v1/pop/queue/wide?batch=1&wait=false&consumerGroup=g1");
    assert_eq!(p.status, 200, "{}", p.text);
}

/// GET with the answer's headers: (status, lowercase header lines, body). The harness's answer
/// keeps no arbitrary header, and the array routes carry their cursor in one.
fn get_with_headers(n: &Node, path: &str) -> (u16, Vec<(String, String)>, String) {
    let mut s = TcpStream::connect(("127.0.0.1", n.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

/// A GET that must answer 200 within `MAX_ANSWER` bytes.
fn bounded(n: &Node, path: &str) -> Value {
    let a = n.get(path);
    assert_eq!(
        a.status,
        200,
        "{path}: {}",
        &a.text[..a.text.len().min(300)]
    );
    assert!(
        a.text.len() < MAX_ANSWER,
        "{path} answered {} bytes",
        a.text.len()
    );
    a.json
}

/// Follows an object answer's `nextCursor` (at `cursor_at`) from `first` and collects
/// `name_of(row)` over the rows at `rows_at`; every name must come once.
fn follow_object(
    n: &Node,
    first: &str,
    rows_at: &[&str],
    cursor_at: &[&str],
    name_of: &dyn Fn(&Value) -> String,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut path = first.to_owned();
    for _ in 0..PARTITIONS {
        let v = bounded(n, &path);
        let rows = rows_at.iter().fold(&v, |v, k| &v[*k]);
        for r in rows.as_array().unwrap() {
            assert!(seen.insert(name_of(r)), "{} twice ({path})", name_of(r));
        }
        match cursor_at.iter().fold(&v, |v, k| &v[*k]).as_str() {
            Some(c) => path = format!("{first}&after={c}"),
            None => return seen,
        }
    }
    panic!("{first}: the cursor never ended");
}

/// Follows an array answer's `x-queen-next-cursor` header from `first`; `rows` picks the rows
/// of one answer.
fn follow_header(
    n: &Node,
    first: &str,
    rows: &dyn Fn(&Value) -> Vec<Value>,
    name_of: &dyn Fn(&Value) -> String,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut path = first.to_owned();
    for _ in 0..PARTITIONS {
        let (status, headers, body) = get_with_headers(n, &path);
        assert_eq!(status, 200, "{path}: {}", &body[..body.len().min(300)]);
        assert!(
            body.len() < MAX_ANSWER,
            "{path} answered {} bytes",
            body.len()
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        for r in rows(&v) {
            assert!(seen.insert(name_of(&r)), "{} twice ({path})", name_of(&r));
        }
        match headers.iter().find(|(k, _)| k == "x-queen-next-cursor") {
            Some((_, c)) => path = format!("{first}&after={c}"),
            None => return seen,
        }
    }
    panic!("{first}: the cursor never ended");
}

fn all_partitions() -> BTreeSet<String> {
    (0..PARTITIONS).map(|k| format!("p{k:05}")).collect()
}

fn str_of(key: &'static str) -> impl Fn(&Value) -> String {
    move |r: &Value| r[key].as_str().unwrap_or_default().to_owned()
}

#[test]
fn status_routes_of_a_queue_with_many_partitions_answer_bounded_pages_that_visit_every_partition_once()
 {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path());
    wide_queue(&n);
    for g in ["g2", "g3"] {
        let p = n.get(&format!(
            "/api/v1/pop/queue/wide?batch=1&wait=false&consumerGroup={g}"
        ));
        assert_eq!(p.status, 200, "{}", p.text);
    }

    // Totals come from counters; pending is summed over a bounded walk and says so.
    let detail = bounded(&n, "/api/v1/resources/queues/wide");
    let overview = bounded(&n, "/api/v1/resources/overview");
    assert_eq!(overview["partitions"], PARTITIONS, "{overview}");
    assert_eq!(overview["messages"]["total"], PARTITIONS, "{overview}");
    assert_eq!(overview["approximate"], true, "{overview}");
    assert_eq!(bounded(&n, "/api/v1/status")["partitions"], PARTITIONS);
    assert_eq!(
        detail["partitionCount"], PARTITIONS,
        "{}",
        detail["partitionCount"]
    );
    assert_eq!(detail["messages"]["total"], PARTITIONS);
    assert_eq!(detail["partitions"].as_array().unwrap().len(), 100);
    assert_eq!(detail["truncated"], true);
    let list = bounded(&n, "/api/v1/resources/queues");
    assert_eq!(list["queues"][0]["partitionCount"], PARTITIONS, "{list}");
    let depth = bounded(&n, "/api/v1/resources/queues/wide/depth?group=g1");
    assert_eq!(depth["partitions"].as_array().unwrap().len(), 1000);
    assert_eq!(depth["approximate"], true);
    let all = bounded(&n, "/api/v1/resources/partitions");
    assert_eq!(all["partitions"].as_array().unwrap().len(), 1000);
    let browse = bounded(&n, "/api/v1/messages?queue=wide&status=pending");
    assert_eq!(browse["messages"].as_array().unwrap().len(), 100);
    let a = n.get("/api/v1/resources/queues/wide?limit=5000");
    assert_eq!(
        a.json["limit"], 1000,
        "a limit above the maximum is the maximum"
    );
    assert_eq!(
        n.get("/api/v1/resources/queues/wide?after=x").status,
        400,
        "a cursor the broker did not issue"
    );

    // Following each cursor visits every partition exactly once; the message listing pages
    // the queue-mode group's pending messages, one in each partition.
    let every = all_partitions();
    for (first, rows_at, cursor_at, key) in [
        (
            "/api/v1/resources/queues/wide?limit=1000",
            &["partitions"][..],
            &["nextCursor"][..],
            "name",
        ),
        (
            "/api/v1/resources/queues/wide/depth?limit=1000",
            &["partitions"][..],
            &["nextCursor"][..],
            "partition",
        ),
        (
            "/api/v1/resources/partitions?queue=wide",
            &["partitions"][..],
            &["nextCursor"][..],
            "name",
        ),
        (
            "/api/v1/messages?queue=wide&status=pending&limit=1000",
            &["messages"][..],
            &["pagination", "nextCursor"][..],
            "partition",
        ),
    ] {
        let seen = follow_object(&n, first, rows_at, cursor_at, &str_of(key));
        assert_eq!(seen, every, "{first}");
    }
    let lagging = follow_header(
        &n,
        "/api/v1/consumer-groups/lagging?minLagSeconds=0",
        &|v| v.as_array().unwrap().clone(),
        &|r| {
            format!(
                "{}/{}",
                r["consumer_group"].as_str().unwrap(),
                r["partition_name"].as_str().unwrap()
            )
        },
    );
    // Each of the three groups lags on every partition but the one it leased and acked none of:
    // all of them, since a leased message is still unconsumed.
    assert_eq!(lagging.len(), 3 * PARTITIONS);
    let g1 = follow_header(
        &n,
        "/api/v1/consumer-groups/g1?limit=1000",
        &|v| {
            v["wide"]["partitions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        },
        &str_of("partition"),
    );
    assert_eq!(g1, every);
    // The group list, one row a page: each group once, its lag summed over a bounded walk.
    let groups = follow_header(
        &n,
        "/api/v1/consumer-groups?limit=1",
        &|v| v.as_array().unwrap().clone(),
        &str_of("name"),
    );
    assert_eq!(groups, ["g1", "g2", "g3"].map(str::to_owned).into());
}

/// Latency of one push of one item to the quiet queue.
fn push_once(n: &Node, i: usize) -> Duration {
    let t = Instant::now();
    let a = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "quiet", "transactionId": format!("q{i}"), "payload": i}]}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    t.elapsed()
}

#[test]
fn a_push_to_another_queue_stays_quick_while_readers_hammer_the_heavy_routes() {
    let dir = tempfile::tempdir().unwrap();
    let n = Arc::new(node(dir.path()));
    wide_queue(&n);
    let stop = Arc::new(AtomicBool::new(false));
    let routes = [
        "/api/v1/consumer-groups/lagging?minLagSeconds=0",
        "/api/v1/resources/queues/wide",
        "/api/v1/resources/overview",
        "/api/v1/consumer-groups",
        "/api/v1/messages?queue=wide&status=pending",
    ];
    let readers: Vec<_> = routes
        .iter()
        .map(|route| {
            let (n, stop, route) = (n.clone(), stop.clone(), (*route).to_owned());
            std::thread::spawn(move || {
                let mut reads = 0u32;
                // Bounded: the test stops the readers, and each is capped in count anyway.
                while !stop.load(Ordering::Relaxed) && reads < 10_000 {
                    let a = n.get(&route);
                    assert_eq!(a.status, 200, "{route}");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let started = Instant::now();
    let mut took = Vec::new();
    while started.elapsed() < Duration::from_secs(10) && took.len() < 500 {
        took.push(push_once(&n, took.len()));
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u32 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    took.sort();
    let median = took[took.len() / 2];
    let worst = *took.last().unwrap();
    eprintln!(
        "pushes {} median {median:?} p99 {:?} worst {worst:?}; reads {reads}",
        took.len(),
        took[took.len() * 99 / 100]
    );
    assert!(reads > 0);
    // Generous bounds for a loaded two-core machine; before the fix the median alone was
    // seconds.
    assert!(median < Duration::from_millis(500), "median {median:?}");
    assert!(worst < Duration::from_secs(3), "worst {worst:?}");
}
