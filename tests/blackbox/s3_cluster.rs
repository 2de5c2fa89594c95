//! The embedded S3 sink on three real nodes on loopback, writing to a real S3 server (moto):
//! fair placement and what moves when a node leaves and comes back; kill -9 takeovers and
//! SIGTERM hand-overs under a steady writer; a stalled owner (SIGSTOP past the lease TTL) that
//! wakes up fenced; and the bucket down for a while. Each ends with `queen lake verify` and the
//! lake read back by DuckDB and pyarrow: every acknowledged record once.
//!
//! The tests run one at a time (each is three brokers plus moto on a small machine), with short
//! settings: windows of one second, a half-second guard, leases of three seconds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use queen_tests::s3::{self, Mode, S3Server};
use queen_tests::sink::{
    WriterPlan, assert_lake_is_the_log, cluster, instance, metric, owner, owner_k, owners, reports,
    row, rows, sink, spawn_writer, verified_records, verify,
};
use queen_tests::{Node, eventually, holds_for};
use serde_json::{Value, json};

const TTL: Duration = Duration::from_millis(3000);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// One test at a time: three brokers and moto each.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The same sink settings for every node.
fn sink_env(endpoint: &str, queues: &str) -> Vec<(&'static str, String)> {
    s3::sink_env(
        endpoint,
        queues,
        &[
            ("QUEEN_S3_LEASE_TTL_MS", TTL.as_millis().to_string()),
            ("QUEEN_S3_CHECKPOINT_EVERY", "3".into()),
        ],
    )
}

/// One record a request to `queues` in turn, 50 a second at most, for three minutes at most.
fn plan(queues: &[&str], prefix: &str) -> WriterPlan {
    WriterPlan {
        queues: queues.iter().map(|q| (*q).to_owned()).collect(),
        prefix: prefix.to_owned(),
        per_push: 1,
        pause: Duration::from_millis(20),
        limit: Duration::from_secs(180),
    }
}

/// Push `items` through the first live node that takes them (same items, same transactionIds on
/// a retry), within a minute.
fn push_any(nodes: &[Node], live: &[bool], items: &Value) {
    let body = json!({ "items": items }).to_string();
    let mut last = Vec::new();
    let ok = eventually(Duration::from_secs(60), || {
        (0..nodes.len()).filter(|i| live[*i]).any(|i| {
            match queen_tests::post_url(
                &format!("http://127.0.0.1:{}/api/v1/push", nodes[i].port),
                &body,
            ) {
                Ok((200, _)) => true,
                other => {
                    last.push(format!("node {i}: {other:?}"));
                    false
                }
            }
        })
    });
    last.reverse();
    last.truncate(6);
    assert!(ok, "no live node took the push: {last:#?}");
}

/// Each committed manifest's objects, as (key, sha256), by manifest key.
fn manifest_objects(server: &S3Server) -> BTreeMap<String, Vec<(String, String)>> {
    let mut args = server.lake_args("lake");
    args.extend(["--prefix", "queen"]);
    let lake = s3::read_lake(&args);
    lake["manifests"]
        .as_object()
        .expect("manifests")
        .iter()
        .map(|(k, m)| {
            let objects = m["objects"]
                .as_array()
                .map(|os| {
                    os.iter()
                        .map(|o| {
                            (
                                o["key"].as_str().unwrap_or_default().to_owned(),
                                o["sha256"].as_str().unwrap_or_default().to_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            (k.clone(), objects)
        })
        .collect()
}

/// Wait for a placement where the live nodes run every queue once, each runs `share`, and every
/// live node counts `live` sink nodes and names the same holder for every queue.
fn settle(
    nodes: &[Node],
    live: &[bool],
    queues: &[&str],
    share: u64,
    limit: Duration,
) -> BTreeMap<String, usize> {
    let n_live = live.iter().filter(|l| **l).count() as u64;
    let mut last = String::new();
    let mut found = None;
    let ok = eventually(limit, || {
        let Some(o) = owners(nodes, live, queues) else {
            last = "a queue without exactly one runner".into();
            return false;
        };
        for i in (0..nodes.len()).filter(|i| live[*i]) {
            let s = sink(&nodes[i]);
            let p = &s["placement"];
            if p["nodes"] != n_live || p["held"] != share || p["share"] != share {
                last = format!("node {i} placement {p}");
                return false;
            }
            let r = rows(&s);
            for (q, holder) in &o {
                if r.get(q)
                    .is_none_or(|row| row["heldBy"] != instance(*holder))
                {
                    last = format!(
                        "node {i} names another holder for {q}: {}",
                        r.get(q).cloned().unwrap_or_default()
                    );
                    return false;
                }
            }
        }
        found = Some(o);
        true
    });
    assert!(
        ok,
        "no settled placement within {limit:?} ({last}):\n{:#?}",
        reports(nodes, live)
    );
    found.unwrap_or_default()
}

fn held_by(o: &BTreeMap<String, usize>, i: usize) -> BTreeSet<String> {
    o.iter()
        .filter(|(_, h)| **h == i)
        .map(|(q, _)| q.clone())
        .collect()
}

const SIX: [&str; 6] = ["p1", "p2", "p3", "p4", "p5", "p6"];

#[test]
fn six_queues_settle_two_per_node_and_only_a_leaving_nodes_queues_move() {
    let _one = serial();
    let started = Instant::now();
    let server = S3Server::start();
    server.create_bucket("lake");
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(
        bin(),
        dir.path(),
        &sink_env(&server.endpoint, &SIX.join(",")),
    );
    let mut live = vec![true; 3];
    for (i, q) in SIX.iter().enumerate() {
        push_any(
            &nodes,
            &live,
            &json!([{"queue": q, "transactionId": format!("{q}-0"), "payload": i}]),
        );
    }
    let first = settle(&nodes, &live, &SIX, 2, Duration::from_secs(90));
    eprintln!("placement: 2/2/2 after {:?}: {first:?}", started.elapsed());
    // A steady state: nothing moves for longer than a lease TTL.
    let given: Vec<f64> = nodes
        .iter()
        .map(|n| metric(n, "queen_s3_queues_given_back_total"))
        .collect();
    assert!(
        holds_for(TTL + Duration::from_secs(2), || owners(&nodes, &live, &SIX)
            .as_ref()
            == Some(&first)),
        "a queue moved in a steady state: {:?} after {first:?}",
        owners(&nodes, &live, &SIX)
    );
    assert_eq!(
        nodes
            .iter()
            .map(|n| metric(n, "queen_s3_queues_given_back_total"))
            .collect::<Vec<_>>(),
        given
    );

    // SIGTERM one node: its two queues go to the others, and only those move.
    let gone = 0;
    let t = Instant::now();
    assert!(
        nodes[gone].sigterm(Duration::from_secs(60)).success(),
        "{}",
        nodes[gone].log_text()
    );
    live[gone] = false;
    assert!(
        nodes[gone].log_text().contains("queen-s3"),
        "the sink ran on the stopped node"
    );
    let second = settle(&nodes, &live, &SIX, 3, Duration::from_secs(60));
    eprintln!(
        "placement: node 1 stopped, 3/3 after {:?}: {second:?}",
        t.elapsed()
    );
    for (q, h) in &first {
        if *h != gone {
            assert_eq!(
                second[q], *h,
                "{q} moved from node {h} though only node {gone} left: {first:?} -> {second:?}"
            );
        }
    }
    for i in [1, 2] {
        assert_eq!(
            metric(&nodes[i], "queen_s3_queues_given_back_total"),
            given[i],
            "node {i} gave a queue back after the leave"
        );
    }

    // Back again: the two others are over the new share (2) for a TTL, give one back each, and
    // the returning node takes both; nothing else moves.
    let t = Instant::now();
    nodes[gone].restart();
    live[gone] = true;
    let third = settle(&nodes, &live, &SIX, 2, Duration::from_secs(90));
    eprintln!(
        "placement: node 1 back, 2/2/2 after {:?}: {third:?}",
        t.elapsed()
    );
    let moved: BTreeSet<String> = SIX
        .iter()
        .filter(|q| second[**q] != third[**q])
        .map(|q| (*q).to_owned())
        .collect();
    assert_eq!(
        moved,
        held_by(&third, gone),
        "only what the returning node took moved: {second:?} -> {third:?}"
    );
    for i in [1, 2] {
        assert!(
            held_by(&third, i).is_subset(&held_by(&second, i)),
            "node {i} took a queue: {second:?} -> {third:?}"
        );
        assert_eq!(
            metric(&nodes[i], "queen_s3_queues_given_back_total"),
            given[i] + 1.0,
            "node {i} should have given back exactly one queue"
        );
    }
    eprintln!("placement test took {:?}", started.elapsed());
}

const WQ: &[&str] = &["w1", "w2", "w3"];

#[test]
fn kill_9_takeovers_and_sigterm_hand_overs_under_a_writer_keep_every_record_once() {
    let _one = serial();
    let started = Instant::now();
    let server = S3Server::start();
    server.create_bucket("lake");
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(
        bin(),
        dir.path(),
        &sink_env(&server.endpoint, &WQ.join(",")),
    );
    let mut live = vec![true; 3];
    let live_flags = Arc::new((0..3).map(|_| AtomicBool::new(true)).collect::<Vec<_>>());
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(
        nodes.iter().map(|n| n.port).collect(),
        live_flags.clone(),
        plan(WQ, "w"),
        acked.clone(),
        stop.clone(),
    );
    let progress =
        |n: usize| eventually(Duration::from_secs(60), || acked.lock().unwrap().len() >= n);

    let committed = |nodes: &[Node], live: &[bool], q: &str, above: u64| {
        let mut last = (None, 0);
        let ok = eventually(Duration::from_secs(60), || {
            last = owner_k(nodes, live, q);
            last.1 > above
        });
        assert!(
            ok,
            "{q}: no window committed past {above} (owner, k = {last:?}):\n{:#?}",
            reports(nodes, live)
        );
        last
    };
    for q in WQ {
        committed(&nodes, &live, q, 0);
    }
    eprintln!(
        "writer: every queue committed after {:?}",
        started.elapsed()
    );

    for (round, queue) in ["w1", "w2", "w1", "w3"].into_iter().enumerate() {
        let kill = round % 2 == 0;
        // A queue may be on its way back to the node restarted last round: wait for its owner.
        let mut found = (None, 0);
        assert!(
            eventually(Duration::from_secs(30), || {
                found = owner_k(&nodes, &live, queue);
                found.0.is_some()
            }),
            "{queue} has no single owner"
        );
        let victim = found.0.unwrap();
        let k = (0..3)
            .filter(|i| live[*i])
            .filter_map(|i| row(&nodes, i, queue)["k"].as_u64())
            .max()
            .unwrap_or(0);
        let n = acked.lock().unwrap().len();
        assert!(
            progress(n + 20),
            "the writer made no progress before round {round}"
        );
        let t = Instant::now();
        live_flags[victim].store(false, Ordering::Relaxed);
        if kill {
            nodes[victim].kill9();
        } else {
            assert!(
                nodes[victim].sigterm(Duration::from_secs(60)).success(),
                "{}",
                nodes[victim].log_text()
            );
        }
        live[victim] = false;
        let (taker, k2) = committed(&nodes, &live, queue, k);
        eprintln!(
            "{} of node {victim} (owner of {queue} at k={k}): node {taker:?} committed k={k2} after {:?}",
            if kill { "kill -9" } else { "SIGTERM" },
            t.elapsed()
        );
        let n = acked.lock().unwrap().len();
        assert!(
            progress(n + 20),
            "the writer made no progress with node {victim} down"
        );
        nodes[victim].restart();
        live[victim] = true;
        live_flags[victim].store(true, Ordering::Relaxed);
    }
    let n = acked.lock().unwrap().len();
    assert!(
        progress(n + 30),
        "the writer made no progress after the last restart"
    );
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    let report = assert_lake_is_the_log(
        bin(),
        &server,
        &nodes,
        0,
        WQ,
        &acked,
        Duration::from_secs(90),
    );
    let windows: u64 = report["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["windows"].as_u64().unwrap_or(0))
        .sum();
    eprintln!(
        "takeovers: {} acknowledged records in {windows} windows, each once; {:?}",
        acked.len(),
        started.elapsed()
    );
}

fn signal(n: &Node, sig: &str) {
    let pid = n.pid().expect("a running node").to_string();
    assert!(
        Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill")
            .success(),
        "kill {sig} {pid}"
    );
}

#[test]
fn a_stalled_owner_wakes_fenced_and_changes_no_committed_byte() {
    let _one = serial();
    let started = Instant::now();
    let server = S3Server::start();
    server.create_bucket("lake");
    let dir = tempfile::tempdir().unwrap();
    // A follower's write forwarded to a stopped leader waits out the request timeout before it
    // fails over to the new leader (the sink's own KV calls included): keep that short.
    let mut env = sink_env(&server.endpoint, "stall");
    env.push(("QUEEN_REQUEST_TIMEOUT_MS", "5000".into()));
    let nodes = cluster(bin(), dir.path(), &env);
    let mut live = vec![true; 3];
    let mut acked = Vec::new();
    let mut next = 0u64;
    let mut push_batch = |nodes: &[Node], live: &[bool]| {
        let items: Vec<Value> = (next..next + 10).map(|i| json!({"queue": "stall", "partition": format!("p{}", i % 3), "transactionId": format!("s-{i}"), "payload": {"i": i}})).collect();
        push_any(nodes, live, &json!(items));
        acked.extend((next..next + 10).map(|i| format!("s-{i}")));
        next += 10;
    };
    // The owner commits a few windows while records keep coming.
    let mut stalled = None;
    let ok = eventually(Duration::from_secs(60), || {
        push_batch(&nodes, &live);
        std::thread::sleep(Duration::from_millis(200));
        let (o, k) = owner_k(&nodes, &live, "stall");
        stalled = o;
        k >= 2
    });
    assert!(
        ok,
        "the owner committed no windows: {:#?}",
        nodes.iter().map(sink).collect::<Vec<_>>()
    );
    let a = stalled.unwrap();
    let lost_before = metric(&nodes[a], "queen_s3_commit_precondition_lost_total");
    assert_eq!(lost_before, 0.0);

    // SIGSTOP the owner past the TTL while records keep coming; another node takes the lease
    // and commits.
    push_batch(&nodes, &live);
    live[a] = false;
    signal(&nodes[a], "-STOP");
    let t = Instant::now();
    let mut taker = (None, 0);
    let ok = eventually(Duration::from_secs(60), || {
        push_batch(&nodes, &live);
        std::thread::sleep(Duration::from_millis(200));
        taker = owner_k(&nodes, &live, "stall");
        taker
            .0
            .is_some_and(|b| row(&nodes, b, "stall")["windowsCommitted"].as_u64() >= Some(1))
            && t.elapsed() > TTL
    });
    if !ok {
        signal(&nodes[a], "-CONT");
    }
    assert!(
        ok,
        "no other node took the stalled owner's queue and committed: {taker:?}\n{:#?}",
        reports(&nodes, &live)
    );
    let b = taker.0.unwrap();
    eprintln!(
        "stall: node {b} took over from node {a} and committed k={} after {:?}",
        taker.1,
        t.elapsed()
    );
    let before = manifest_objects(&server);

    // Wake it: it finds its lease gone, counts the lost precondition, and stops the queue.
    signal(&nodes[a], "-CONT");
    live[a] = true;
    let t = Instant::now();
    let mut last = Value::Null;
    let fenced = eventually(Duration::from_secs(60), || {
        last = row(&nodes, a, "stall");
        last["state"] == "fenced"
    });
    assert!(
        fenced,
        "the stalled node should end fenced: {last:#}\n{}",
        nodes[a].log_text()
    );
    eprintln!("stall: node {a} fenced {:?} after SIGCONT", t.elapsed());
    let lost = metric(&nodes[a], "queen_s3_commit_precondition_lost_total");
    assert!(
        lost >= 1.0,
        "queen_s3_commit_precondition_lost_total on the stalled node: {lost}"
    );
    assert!(
        nodes[a].log_text().contains("lease lost to another node"),
        "{}",
        nodes[a].log_text()
    );
    // It stays fenced while the other node holds the queue, and writes nothing.
    for _ in 0..5 {
        push_batch(&nodes, &live);
        std::thread::sleep(Duration::from_millis(600));
    }
    let mut r = Value::Null;
    let names = eventually(Duration::from_secs(15), || {
        r = row(&nodes, a, "stall");
        r["heldBy"] == instance(b)
    });
    assert!(
        names,
        "the fenced node's row should name the new holder: {r:#}"
    );
    assert_eq!(r["state"], "fenced", "{r:#}");
    assert_eq!(
        owner(&nodes, &live, "stall"),
        Some(b),
        "the queue stays with the node that took it over"
    );
    assert_eq!(sink(&nodes[a])["placement"]["held"], 0);

    assert_lake_is_the_log(
        bin(),
        &server,
        &nodes,
        b,
        &["stall"],
        &acked,
        Duration::from_secs(90),
    );
    let after = manifest_objects(&server);
    for (key, objects) in &before {
        assert_eq!(
            after.get(key),
            Some(objects),
            "{key}: a committed window changed after the stalled node woke"
        );
    }
    assert!(
        after.len() > before.len(),
        "windows committed after the wake-up"
    );
    eprintln!("stall test took {:?}", started.elapsed());
}

const DQ: &[&str] = &["d1", "d2", "d3"];

#[test]
fn the_bucket_down_on_a_cluster_then_back_loses_and_doubles_nothing() {
    let _one = serial();
    let started = Instant::now();
    let server = S3Server::start();
    server.create_bucket("lake");
    let proxy = server.proxy();
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(bin(), dir.path(), &sink_env(&proxy.endpoint, &DQ.join(",")));
    let mut live = vec![true; 3];
    let live_flags = Arc::new((0..3).map(|_| AtomicBool::new(true)).collect::<Vec<_>>());
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(
        nodes.iter().map(|n| n.port).collect(),
        live_flags.clone(),
        plan(DQ, "d"),
        acked.clone(),
        stop.clone(),
    );
    for q in DQ {
        assert!(
            eventually(Duration::from_secs(60), || owner_k(&nodes, &live, q).1 >= 1),
            "{q}: no first window"
        );
    }
    let before = verified_records(&verify(bin(), &server).1);
    let errors_before: BTreeMap<&str, Value> = DQ
        .iter()
        .map(|q| {
            (
                *q,
                owner(&nodes, &live, q)
                    .map_or(Value::Null, |i| row(&nodes, i, q)["lastError"].clone()),
            )
        })
        .collect();

    // 503 for every request: uploads fail, the owners say so, nothing commits.
    proxy.set_mode(Mode::Http503);
    let t = Instant::now();
    let failing = eventually(Duration::from_secs(60), || {
        DQ.iter().all(|q| {
            owner(&nodes, &live, q).is_some_and(|i| {
                let e = &row(&nodes, i, q)["lastError"];
                e.is_string() && *e != errors_before[q]
            })
        })
    });
    assert!(
        failing,
        "every owner should show the failing bucket as lastError: {:#?}",
        nodes.iter().map(sink).collect::<Vec<_>>()
    );
    eprintln!(
        "bucket down: every owner reported it after {:?}",
        t.elapsed()
    );
    let during = verified_records(&verify(bin(), &server).1);
    for q in DQ {
        let (b, d) = (
            before.get(*q).copied().unwrap_or(0),
            during.get(*q).copied().unwrap_or(0),
        );
        assert!(d >= b, "{q}: the lake lost records");
    }
    assert!(
        holds_for(Duration::from_secs(2), || verified_records(
            &verify(bin(), &server).1
        ) == during),
        "a window committed while every upload failed"
    );

    // Then the connections are refused, and an owner dies meanwhile: its queue moves while the
    // bucket is still down.
    proxy.set_mode(Mode::Refuse);
    let (victim, _) = owner_k(&nodes, &live, "d1");
    let victim = victim.expect("d1 has an owner");
    live_flags[victim].store(false, Ordering::Relaxed);
    nodes[victim].kill9();
    live[victim] = false;
    let moved = eventually(Duration::from_secs(30), || {
        owner(&nodes, &live, "d1").is_some()
    });
    assert!(moved, "d1 did not move while the bucket was down");
    std::thread::sleep(Duration::from_secs(2));
    nodes[victim].restart();
    live[victim] = true;
    live_flags[victim].store(true, Ordering::Relaxed);

    // Back: everything written meanwhile lands, once.
    proxy.set_mode(Mode::Pass);
    let t = Instant::now();
    let n = acked.lock().unwrap().len();
    assert!(
        eventually(Duration::from_secs(60), || acked.lock().unwrap().len()
            >= n + 30),
        "the writer made no progress"
    );
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    assert_lake_is_the_log(
        bin(),
        &server,
        &nodes,
        0,
        DQ,
        &acked,
        Duration::from_secs(90),
    );
    eprintln!(
        "bucket back: the lake caught up after {:?}; {} records once; test took {:?}",
        t.elapsed(),
        acked.len(),
        started.elapsed()
    );
}
