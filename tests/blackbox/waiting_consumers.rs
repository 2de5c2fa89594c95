//! Waiting consumers at scale (issue 60, item 4): many long-polling pops parked on one queue
//! cost the node next to no CPU while nothing arrives, and a push wakes its share of them
//! promptly, on the leader and on a follower. Each waiter holds its own keep-alive connection
//! (raw HTTP/1.1 on loopback, one tokio task each), so the test needs about two file
//! descriptors per waiter between itself and the node. The bounds are generous (a loaded
//! 2-core machine); the real figures are printed (`--nocapture`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_tests::{Node, eventually, three_nodes, waiting_pops};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The binary under test. `QUEEN_WAITERS_BIN` (read by this test only) points it at another
/// build, for a before/after figure.
#[allow(clippy::disallowed_methods, reason = "a test: the build to measure")]
fn bin() -> PathBuf {
    std::env::var_os("QUEEN_WAITERS_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_queen")), PathBuf::from)
}

/// Long-poll limit of each pop (ms): longer than the test's idle window, so the window sees
/// parked pops only.
const POLL_MS: u64 = 20_000;

/// Answers the waiters got: transactionId -> when.
type Seen = Arc<Mutex<HashMap<String, Instant>>>;

/// One answer on a keep-alive connection: status and body.
async fn read_answer(r: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<u8>)> {
    let mut line = String::new();
    r.read_line(&mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut len = 0usize;
    let mut chunked = false;
    loop {
        line.clear();
        r.read_line(&mut line).await?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let lower = l.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line).await?;
            let n = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        body.resize(len, 0);
        r.read_exact(&mut body).await?;
    }
    Ok((status, body))
}

/// One consumer: pops `queue` (waiting) over and over on its own connection until `stop`,
/// noting every message it got in `seen` and acking it.
async fn consumer(port: u16, queue: String, seen: Seen, stop: tokio::sync::watch::Receiver<bool>) {
    let Ok(stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    let mut r = BufReader::new(stream);
    let request = format!(
        "GET /api/v1/pop/queue/{queue}?batch=1&wait=true&timeout={POLL_MS} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    );
    while !*stop.borrow() {
        if r.get_mut().write_all(request.as_bytes()).await.is_err() {
            return;
        }
        let Ok((status, body)) = read_answer(&mut r).await else {
            return;
        };
        let at = Instant::now();
        if status != 200 {
            continue;
        }
        let Ok(v) = serde_json::from_slice::<Value>(&body) else {
            return;
        };
        for m in v["messages"].as_array().into_iter().flatten() {
            if let Some(t) = m["transactionId"].as_str() {
                seen.lock().unwrap().insert(t.to_owned(), at);
            }
            let ack = json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": v["leaseId"], "status": "completed"}).to_string();
            let req = format!(
                "POST /api/v1/ack HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{ack}",
                ack.len()
            );
            if r.get_mut().write_all(req.as_bytes()).await.is_err()
                || read_answer(&mut r).await.is_err()
            {
                return;
            }
        }
    }
}

/// User and system CPU time the process has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the node's stat");
    // Fields after the command name (which may hold spaces), which ends at the last ')'.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// The share of one core `pid` used over `period`.
fn cpu_share(pid: u32, period: Duration) -> f64 {
    let before = cpu_time(pid);
    std::thread::sleep(period);
    (cpu_time(pid) - before).as_secs_f64() / period.as_secs_f64()
}

/// The `p`th percentile of sorted `v`.
fn pct(v: &[Duration], p: f64) -> Duration {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// What one run measured.
struct Figures {
    /// The node's CPU (share of a core) while the waiters were parked and nothing arrived.
    idle_cpu: f64,
    /// Its CPU while single pushes came one at a time.
    push_cpu: f64,
    latencies: Vec<Duration>,
}

/// Park `waiters` consumers on `queue` of `on`, push `pushes` single messages (each into its
/// own partition) through `via`, one at a time, timing each from its push's answer to the pop
/// answer that carried it, then, everything acked and the waiters parked again, measure `on`'s
/// CPU while nothing arrives.
fn measure(on: &Node, via: &Node, queue: &str, waiters: usize, pushes: usize) -> Figures {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let seen: Seen = Arc::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let tasks: Vec<_> = (0..waiters)
        .map(|_| {
            rt.spawn(consumer(
                on.port,
                queue.to_owned(),
                seen.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(60), || waiting_pops(on)
            >= waiters as u64),
        "only {} of {waiters} pops parked",
        waiting_pops(on)
    );
    let pid = on.pid().expect("the node runs");
    let started = (Instant::now(), cpu_time(pid));
    let mut acked: Vec<(String, Instant)> = Vec::with_capacity(pushes);
    for i in 0..pushes {
        let txn = format!("{queue}-t{i}");
        let a = via.post(
            "/api/v1/push",
            &json!({"items": [{"queue": queue, "partition": format!("p{i}"), "transactionId": txn, "payload": {"i": i}}]}),
        );
        let at = Instant::now();
        assert_eq!(a.status, 200, "{}", a.text);
        acked.push((txn, at));
        // One at a time: each push meets parked waiters, not a queue of answers.
        std::thread::sleep(Duration::from_millis(15));
    }
    let push_cpu = (cpu_time(pid) - started.1).as_secs_f64() / started.0.elapsed().as_secs_f64();
    let all_seen = eventually(Duration::from_secs(30), || {
        let s = seen.lock().unwrap();
        acked.iter().all(|(t, _)| s.contains_key(t))
    });
    // Idle: every waiter parked again on a queue of `pushes` drained partitions.
    let parked = eventually(Duration::from_secs(30), || {
        waiting_pops(on) >= waiters as u64
    });
    std::thread::sleep(Duration::from_millis(500));
    let idle_cpu = cpu_share(pid, Duration::from_secs(4));
    stop_tx.send(true).unwrap();
    rt.shutdown_timeout(Duration::from_secs(1));
    drop(tasks);
    assert!(all_seen, "every pushed message reached a waiter");
    assert!(parked, "the waiters parked again");
    let s = seen.lock().unwrap();
    let mut latencies: Vec<Duration> = acked
        .iter()
        .map(|(t, at)| s[t].saturating_duration_since(*at))
        .collect();
    latencies.sort();
    Figures {
        idle_cpu,
        push_cpu,
        latencies,
    }
}

fn report(what: &str, waiters: usize, f: &Figures) {
    println!(
        "{what}: {waiters} waiters, idle CPU {:.2}% of a core, {:.1}% while single pushes came; wake-up after the push's answer p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} pushes)",
        f.idle_cpu * 100.0,
        f.push_cpu * 100.0,
        pct(&f.latencies, 0.5).as_secs_f64() * 1000.0,
        pct(&f.latencies, 0.99).as_secs_f64() * 1000.0,
        f.latencies.last().unwrap().as_secs_f64() * 1000.0,
        f.latencies.len(),
    );
}

fn check(f: &Figures) {
    assert!(
        f.idle_cpu < 0.10,
        "idle CPU {:.1}% of a core with parked pops",
        f.idle_cpu * 100.0
    );
    let p99 = pct(&f.latencies, 0.99);
    assert!(p99 < Duration::from_millis(200), "wake-up p99 {p99:?}");
}

#[test]
fn a_thousand_waiting_consumers_cost_no_cpu_while_idle_and_wake_within_milliseconds() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(&bin(), &dir.path().join("n1"), &[]);
    let f = measure(&n, &n, "waited", 1000, 200);
    report("one node", 1000, &f);
    check(&f);
}

#[test]
fn waiters_on_a_follower_and_on_the_leader_wake_within_milliseconds_of_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = three_nodes(&bin(), dir.path(), "waiters-token", |_| Vec::new());
    let role = |n: &Node| {
        n.get("/health").json["raft"]["role"]
            .as_str()
            .map(str::to_owned)
    };
    let mut leader = None;
    assert!(eventually(Duration::from_secs(30), || {
        leader = nodes
            .iter()
            .position(|n| role(n).as_deref() == Some("leader"));
        leader.is_some()
    }));
    let leader = &nodes[leader.unwrap()];
    let follower = nodes
        .iter()
        .find(|n| n.port != leader.port)
        .expect("a follower");
    let on_leader = measure(leader, leader, "on-leader", 300, 100);
    report("three nodes, waiters on the leader", 300, &on_leader);
    let on_follower = measure(follower, leader, "on-follower", 300, 100);
    report("three nodes, waiters on a follower", 300, &on_follower);
    check(&on_leader);
    check(&on_follower);
}

#[test]
fn a_waiting_pop_gets_a_delayed_message_when_it_comes_due_not_a_recheck_later() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(&bin(), &dir.path().join("n1"), &[]);
    let c = n.post(
        "/api/v1/configure",
        &json!({"queue": "later", "namespace": null, "task": null, "options": {"delayedProcessing": 1}}),
    );
    assert_eq!(c.status, 200, "{}", c.text);
    let url = n.url("/api/v1/pop/queue/later?batch=1&wait=true&timeout=10000");
    let waiting = std::thread::spawn(move || {
        let answer = queen_tests::get_url(&url);
        (answer, Instant::now())
    });
    assert!(queen_tests::a_pop_waits(&n, Duration::from_secs(30)));
    let a = n.post(
        "/api/v1/push",
        &json!({"items": [{"queue": "later", "partition": "p", "transactionId": "d1", "payload": {"d": 1}}]}),
    );
    let pushed = Instant::now();
    assert_eq!(a.status, 200, "{}", a.text);
    let ((status, body), at) = waiting.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let after = at.saturating_duration_since(pushed);
    println!("a message delayed by 1 s reached its waiting pop {after:?} after the push");
    assert!(
        after >= Duration::from_millis(900),
        "not before it is due: {after:?}"
    );
    assert!(
        after < Duration::from_secs(3),
        "soon after it is due: {after:?}"
    );
}
