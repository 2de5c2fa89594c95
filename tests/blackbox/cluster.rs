//! Three real nodes on loopback: any node serves any client, SIGTERM hands leadership over,
//! kill -9 of a follower costs nothing, and stopped nodes catch up.

use std::time::{Duration, Instant};

use queen_tests::{Node, eventually, post_url_within};
use serde_json::json;

#[path = "cluster_support.rs"]
mod support;
use support::*;
#[test]
fn any_node_serves_any_client_and_a_sigterm_hands_leadership_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let leader = leader_index(&nodes, None).expect("a leader");
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();

    // The walkthrough: push through a follower, pop through the other, ack through the leader.
    let p = push(&nodes[followers[0]], "orders", "order-1001-created");
    assert_eq!(p["status"], "queued");
    let got = nodes[followers[1]].get("/api/v1/pop/queue/orders?batch=1&wait=true&timeout=5000");
    assert_eq!(got.status, 200, "{}", got.text);
    let m = got.json["messages"][0].clone();
    assert_eq!(m["transactionId"], "order-1001-created");
    let a = nodes[leader].post("/api/v1/ack", &json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": got.json["leaseId"], "status": "completed"}));
    assert_eq!(a.json[0]["success"], true, "{}", a.text);
    // Every node stays healthy past an election timeout (heartbeats keep the quorum fresh).
    assert!(
        queen_tests::holds_for(Duration::from_millis(2500), || nodes
            .iter()
            .all(|n| n.get("/health").status == 200)),
        "a node left health within an election timeout: {:?}",
        nodes
            .iter()
            .map(|n| n.get("/health").text)
            .collect::<Vec<_>>()
    );
    // Reads through any node see the write (read index).
    for n in &nodes {
        let f = n.post(
            "/api/v1/fetch",
            &json!({"entries": [{"queue": "orders", "partition": "Default", "offset": 0}]}),
        );
        assert_eq!(f.json["entries"][0]["highWatermark"], 1, "{}", f.text);
    }

    // SIGTERM the leader: a new leader quickly, writes go on with two of three.
    let started = Instant::now();
    let status = nodes[leader].sigterm(Duration::from_secs(40));
    assert!(status.success(), "{}", nodes[leader].log_text());
    assert!(
        eventually(Duration::from_secs(10), || leader_index(
            &nodes,
            Some(leader)
        )
        .is_some()),
        "no new leader after SIGTERM"
    );
    eprintln!(
        "new leader {:?} after {:?}",
        leader_index(&nodes, Some(leader)),
        started.elapsed()
    );
    assert!(
        nodes[leader].log_text().contains("leadership handed off"),
        "{}",
        nodes[leader].log_text()
    );
    for i in 0..20 {
        push(&nodes[followers[i % 2]], "orders", &format!("after-{i}"));
    }
    nodes[leader].restart();
    let target = applied(&nodes[followers[0]]);
    assert!(
        eventually(Duration::from_secs(30), || applied(&nodes[leader])
            >= target),
        "the restarted node did not catch up"
    );
}

#[test]
fn a_follower_killed_with_9_catches_up_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let leader = leader_index(&nodes, None).expect("a leader");
    let victim = (0..3).find(|i| *i != leader).unwrap();
    let other = (0..3).find(|i| *i != leader && *i != victim).unwrap();
    for i in 0..10 {
        push(&nodes[i % 3], "k9", &format!("before-{i}"));
    }
    nodes[victim].kill9();
    for i in 0..30 {
        push(
            &nodes[if i % 2 == 0 { leader } else { other }],
            "k9",
            &format!("during-{i}"),
        );
    }
    nodes[victim].restart();
    let ids = caught_up_ids(&nodes, victim, leader, "k9");
    assert_eq!(ids.len(), 40, "every acknowledged write, once: {ids:?}");
}

/// Wait (30 s at most) until node `i` has applied what node `from` has, then answer the
/// transactionIds of `queue`'s Default partition as node `i` reads them (a fetch from offset 0;
/// each once, or the count shows the double).
fn caught_up_ids(nodes: &[Node], i: usize, from: usize, queue: &str) -> Vec<String> {
    let target = applied(&nodes[from]);
    assert!(
        eventually(Duration::from_secs(30), || applied(&nodes[i]) >= target),
        "node {i} did not catch up"
    );
    let f = nodes[i].post(
        "/api/v1/fetch",
        &json!({"entries": [{"queue": queue, "partition": "Default", "offset": 0}]}),
    );
    f.json["entries"][0]["records"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", f.text))
        .iter()
        .map(|r| r["transactionId"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_leader_killed_with_9_is_replaced_and_writes_resume_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let leader = leader_index(&nodes, None).expect("a leader");
    for i in 0..10 {
        push(&nodes[leader], "k9l", &format!("before-{i}"));
    }
    let survivors: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let started = Instant::now();
    nodes[leader].kill9();
    // Alternate between the survivors, as a client holding every node's URL does, until one
    // acknowledges the write (the same transactionId on every try).
    let body = json!({"items": [{"queue": "k9l", "transactionId": "after-kill", "payload": 1}]})
        .to_string();
    let mut tries = 0usize;
    let mut last = String::new();
    let acknowledged = loop {
        if started.elapsed() > Duration::from_secs(30) {
            break None;
        }
        let n = &nodes[survivors[tries % 2]];
        tries += 1;
        match n.try_request("POST", "/api/v1/push", Some(&body)) {
            Ok(a) if a.status == 200 || a.status == 201 => break Some(started.elapsed()),
            Ok(a) => last = format!("{}: {}", a.status, a.text),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = acknowledged.unwrap_or_else(|| panic!("no write acknowledged within 30 s: {last}"));
    eprintln!("kill -9 of the leader: first acknowledged write after {took:?} ({tries} tries)");
    // Issue 23's goal is 1.5 s (`queen-bench cluster --failover` measures 1.1-1.4 s on a quiet
    // machine); the bound is generous for a loaded 2-core machine and still catches a regression
    // to the old election timeouts' several seconds.
    assert!(
        took <= Duration::from_secs(6),
        "the first write after the kill took {took:?}"
    );
    nodes[leader].restart();
    let ids = caught_up_ids(&nodes, leader, survivors[0], "k9l");
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert!(
        ids.len() == 11 && unique.len() == 11 && unique.contains(&"after-kill".to_owned()),
        "every acknowledged write, once: {ids:?}"
    );
}

/// A writer that pushes `<prefix>-<i>` round-robin over the nodes until told to stop (or 120 s),
/// retrying a failed push on the next node with the same transactionId, as a client holding
/// every node's URL does. Returns what was acknowledged.
fn spawn_writer(
    ports: Vec<u16>,
    queue: &'static str,
    prefix: &'static str,
    acked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let started = Instant::now();
        for i in 0..100_000u64 {
            if stop.load(std::sync::atomic::Ordering::Relaxed)
                || started.elapsed() > Duration::from_secs(120)
            {
                break;
            }
            let txn = format!("{prefix}-{i}");
            let body = json!({"items": [{"queue": queue, "transactionId": txn, "payload": i}]})
                .to_string();
            for attempt in 0..60u64 {
                let port = ports[((i + attempt) % 3) as usize];
                match queen_tests::post_url(&format!("http://127.0.0.1:{port}/api/v1/push"), &body)
                {
                    Ok((200, text)) if text.contains("queued") || text.contains("duplicate") => {
                        acked.lock().unwrap().push(txn.clone());
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(100)),
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

#[test]
fn recovery_rehearsal_loses_and_doubles_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(ports, "rehearsal", "r", acked.clone(), stop.clone());
    let progress =
        |n: usize| eventually(Duration::from_secs(30), || acked.lock().unwrap().len() >= n);

    assert!(progress(50), "no writes before the first fault");
    // 1. kill -9 the leader.
    let l = leader_index(&nodes, None).expect("a leader");
    nodes[l].kill9();
    let (_, took) =
        healthy_leader(&nodes, Duration::from_secs(10)).expect("a new leader after kill -9");
    eprintln!("kill -9 of the leader: new leader after {took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    let n = acked.lock().unwrap().len();
    assert!(
        progress(n + 50),
        "writes did not continue with two of three"
    );
    nodes[l].restart();
    // 2. kill -9 a follower.
    let l = leader_index(&nodes, None).expect("a leader");
    let f = (0..3).find(|i| *i != l).unwrap();
    nodes[f].kill9();
    let n = acked.lock().unwrap().len();
    assert!(progress(n + 50));
    nodes[f].restart();
    // 3. SIGTERM the leader.
    let l = leader_index(&nodes, None).expect("a leader");
    assert!(nodes[l].sigterm(Duration::from_secs(40)).success());
    let n = acked.lock().unwrap().len();
    assert!(progress(n + 50));
    nodes[l].restart();
    let n = acked.lock().unwrap().len();
    assert!(progress(n + 20));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    let acked = acked.lock().unwrap().clone();
    assert_all_once(&nodes, "rehearsal", &acked);
    eprintln!(
        "rehearsal: {} acknowledged writes, all on every node once",
        acked.len()
    );
}

#[test]
fn a_rolling_restart_under_a_writer_loses_and_doubles_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(ports, "rolling", "roll", acked.clone(), stop.clone());
    for (i, node) in nodes.iter_mut().enumerate() {
        let n = acked.lock().unwrap().len();
        assert!(
            eventually(Duration::from_secs(30), || acked.lock().unwrap().len()
                >= n + 30),
            "no progress before restarting node {i}"
        );
        assert!(node.sigterm(Duration::from_secs(40)).success());
        node.restart();
    }
    let n = acked.lock().unwrap().len();
    assert!(eventually(Duration::from_secs(30), || acked
        .lock()
        .unwrap()
        .len()
        >= n + 30));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    assert_all_once(&nodes, "rolling", &acked);
    eprintln!(
        "rolling restart: {} acknowledged writes, all on every node once",
        acked.len()
    );
}

/// Cut node `isolated` off from the two others (test fault layer): each side drops its calls
/// to the other. An empty list heals.
fn partition(nodes: &[Node], isolated: Option<usize>) {
    for (i, n) in nodes.iter().enumerate() {
        let blocked: Vec<String> = match isolated {
            None => Vec::new(),
            Some(x) if x == i => (0..nodes.len())
                .filter(|j| *j != x)
                .map(|j| (j + 1).to_string())
                .collect(),
            Some(x) => vec![(x + 1).to_string()],
        };
        std::fs::write(n.dir.join("test-faults"), blocked.join(",")).unwrap();
    }
}

#[test]
fn a_partitioned_leader_loses_its_quorum_and_rejoins_without_losing_anything() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster_with(dir.path(), |_| {
        vec![
            ("QUEEN_TEST_FAULTS", "1"),
            ("QUEEN_REQUEST_TIMEOUT_MS", "5000"),
        ]
    });
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(ports, "partition", "w", acked.clone(), stop.clone());
    let progress =
        |n: usize| eventually(Duration::from_secs(30), || acked.lock().unwrap().len() >= n);
    assert!(progress(30), "no writes before the partition");

    let old = leader_index(&nodes, None).expect("a leader");
    let started = Instant::now();
    partition(&nodes, Some(old));
    // The majority side elects a leader of its own and goes on acknowledging writes.
    assert!(
        eventually(Duration::from_secs(30), || leader_index(&nodes, Some(old))
            .is_some()),
        "the majority side elected no leader"
    );
    eprintln!(
        "partition: the majority side had a new leader after {:?}",
        started.elapsed()
    );
    let majority: Vec<usize> = (0..3).filter(|i| *i != old).collect();
    for (k, i) in majority.iter().cycle().take(10).enumerate() {
        let txn = format!("majority-{k}");
        assert_eq!(push(&nodes[*i], "partition", &txn)["status"], "queued");
        acked.lock().unwrap().push(txn);
    }
    // The writer (a third of whose first attempts meet the cut-off node and wait out its
    // deadline) goes on too.
    let n = acked.lock().unwrap().len();
    assert!(
        progress(n + 10),
        "writes did not continue on the majority side"
    );
    // The old leader knows it lost its quorum, and a write to it fails within its deadline.
    assert!(
        eventually(Duration::from_secs(20), || {
            let h = nodes[old].try_request("GET", "/health", None);
            h.is_ok_and(|h| h.status == 503 && h.json["status"] == "no_quorum")
        }),
        "the cut-off leader does not report no_quorum: {}",
        health(&nodes[old])
    );
    let t = Instant::now();
    let stranded = nodes[old].post(
        "/api/v1/push",
        &json!({"items": [{"queue": "partition", "transactionId": "stranded", "payload": 1}]}),
    );
    assert_eq!(stranded.status, 503, "{}", stranded.text);
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "the write was not answered within its deadline: {:?}",
        t.elapsed()
    );
    // More writes at once than the node keeps entries in flight (8): the ones that wait for a
    // slot are answered within their own deadline (5 s here) too, not after the others'.
    let port = nodes[old].port;
    let waves: Vec<_> = (0..12)
        .map(|i| {
            std::thread::spawn(move || {
                let t = Instant::now();
                let body = json!({"items": [{"queue": "partition", "transactionId": format!("stranded-{i}"), "payload": i}]}).to_string();
                let status = queen_tests::post_url(&format!("http://127.0.0.1:{port}/api/v1/push"), &body).map(|(s, _)| s);
                (status, t.elapsed())
            })
        })
        .collect();
    for w in waves {
        let (status, took) = w.join().unwrap();
        assert_eq!(status, Ok(503), "a concurrent stranded write");
        assert!(
            took < Duration::from_secs(9),
            "a concurrent stranded write was answered after {took:?}, past its 5 s deadline"
        );
    }

    // Heal: the old leader rejoins as a follower and catches up.
    partition(&nodes, None);
    assert!(
        eventually(Duration::from_secs(30), || role(&nodes[old]) == "follower"),
        "the old leader did not rejoin: {}",
        health(&nodes[old])
    );
    let n = acked.lock().unwrap().len();
    assert!(progress(n + 20), "no writes after healing");
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    // The stranded write, sent again, lands once.
    let again = push(&nodes[old], "partition", "stranded");
    assert!(
        again["status"] == "queued" || again["status"] == "duplicate",
        "{again}"
    );
    let mut acked = acked.lock().unwrap().clone();
    acked.push("stranded".to_owned());
    assert_all_once(&nodes, "partition", &acked);
    let applied: Vec<u64> = nodes.iter().map(applied).collect();
    eprintln!(
        "partition: {} acknowledged writes on every node once; applied {applied:?}",
        acked.len()
    );
}

/// A leader left alone (both followers killed) stops promptly on SIGTERM: its hand-off attempt
/// is bounded, and nothing waits out a request deadline for a quorum that is gone (its tick
/// proposal used to hold the stop for 30 s).
#[test]
fn a_leader_without_a_quorum_stops_promptly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let leader = leader_index(&nodes, None).expect("a leader");
    for i in (0..3).filter(|i| *i != leader) {
        nodes[i].kill9();
    }
    // Past a tick, so that one is in flight without a quorum.
    std::thread::sleep(Duration::from_millis(1500));
    let started = Instant::now();
    let status = nodes[leader].sigterm(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

/// A leader that stops answering (SIGSTOP) while a follower forwards writes to it: once a new
/// leader takes over, those forwards are given up at once (their outcome is unknown; a retry
/// with the same transactionId is safe), so they do not hold the follower's push lane, which
/// has a few entries in flight at most, for the forward's whole timeout. Found by the fault
/// campaign: every push on such a node waited about 20 s, even once the node led itself.
#[test]
fn forwards_to_a_paused_leader_do_not_hold_pushes_once_another_leads() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path());
    let paused = leader_index(&nodes, None).expect("a leader");
    let f = (paused + 1) % 3;
    push(&nodes[f], "paused", "warm");
    nodes[paused].signal("-STOP");
    // More pushes than the lane has entries in flight, one after another so that each goes
    // alone, all before the election timeout (400 ms at least): each is forwarded to the
    // paused leader and waits for it.
    let url = nodes[f].url("/api/v1/push");
    let stuck: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            let body = json!({"items": [{"queue": "paused", "transactionId": format!("stuck-{i}"), "payload": i}]})
                .to_string();
            let t = std::thread::spawn(move || post_url_within(&url, &body, Duration::from_secs(3)));
            std::thread::sleep(Duration::from_millis(25));
            t
        })
        .collect();
    let mut new = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            new = leader_index(&nodes, Some(paused));
            new.is_some()
        }),
        "no new leader while the old one is paused"
    );
    // Through the follower that holds the stuck forwards (it may be the new leader itself).
    let since = Instant::now();
    let body =
        json!({"items": [{"queue": "paused", "transactionId": "after", "payload": 0}]}).to_string();
    let mut last = String::new();
    let acked = eventually(Duration::from_secs(15), || {
        match post_url_within(&url, &body, Duration::from_secs(2)) {
            Ok((200, _)) => true,
            Ok((s, t)) => {
                last = format!("{s}: {t}");
                false
            }
            Err(e) => {
                last = e;
                false
            }
        }
    });
    let took = since.elapsed();
    nodes[paused].signal("-CONT");
    let answered = stuck
        .into_iter()
        .filter_map(|t| t.join().ok())
        .filter(|r| matches!(r, Ok((200, _))))
        .count();
    eprintln!(
        "new leader {}: a push through node {} acknowledged {took:?} after it was known ({answered} of 8 stuck pushes answered 200)",
        new.map_or(0, |n| n + 1),
        f + 1
    );
    assert!(acked, "no push through node {} in 15 s: {last}", f + 1);
    // The lane was free at once; 5 s is generous for a loaded 2-core machine (the forwards'
    // timeout, which held it before, is 30 s).
    assert!(took < Duration::from_secs(5), "the push waited {took:?}");
    let acked: Vec<String> = vec!["warm".into(), "after".into()];
    for n in &nodes {
        assert!(eventually(Duration::from_secs(30), || n
            .try_request("GET", "/health", None)
            .is_ok_and(|a| a.status == 200)));
    }
    assert_all_once(&nodes, "paused", &acked);
}
