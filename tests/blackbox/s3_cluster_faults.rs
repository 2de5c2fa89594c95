//! The embedded S3 sink on three real nodes and a real S3 server (moto), when things go wrong:
//! a stalled owner (SIGSTOP past the lease TTL) wakes up fenced and changes no committed byte,
//! and the bucket down for a while on a cluster loses and doubles nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_tests::s3::{Mode, S3Server};
use queen_tests::sink::{
    assert_lake_is_the_log, cluster, instance, metric, owner, owner_k, reports, row, sink,
    spawn_writer, verified_records, verify,
};
use queen_tests::{Node, eventually, holds_for};
use serde_json::{Value, json};

#[path = "s3_cluster_support.rs"]
mod support;
use support::*;

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
    nodes[a].signal("-STOP");
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
        nodes[a].signal("-CONT");
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
    nodes[a].signal("-CONT");
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
