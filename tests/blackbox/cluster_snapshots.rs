//! Three real nodes on loopback and snapshots: a follower that fell behind a purge catches up
//! by a streamed snapshot (spooled to its disk, installed chunk by chunk), through kill -9 at
//! each step of the transfer and install, and a leader killed while sending one.

use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::{Node, eventually};
use serde_json::{Value, json};

#[path = "cluster_support.rs"]
mod support;
use support::*;

/// Snapshots every 200 entries, so a purge strands a stopped follower after about 1,500 entries
/// (purges go in steps of 1,024); the log store reports its purges. The raft log's files roll
/// at 1 MiB, so purges delete files and move those that still hold messages to the archive.
const SNAPSHOT_ENV: [(&str, &str); 4] = [
    ("QUEEN_TEST_FAULTS", "1"),
    ("QUEEN_TEST_SNAPSHOT_EVERY", "200"),
    ("QUEEN_TEST_LOG_SEGMENT_BYTES", "1048576"),
    ("RUST_LOG", "info,queen_raft::log_store=debug"),
];

/// Bytes of one message's payload: the snapshots of these tests hold tens of MiB.
const BULK_PAYLOAD_BYTES: usize = 4096;

/// Push `requests` requests of `per_request` messages (`<prefix>-<n>`) one after another, each
/// one log entry, round-robin over the nodes `via`, a failed request retried on the next node
/// with the same transactionIds. Returns the acknowledged ids.
fn load(
    nodes: &[Node],
    via: &[usize],
    queue: &str,
    prefix: &str,
    requests: usize,
    per_request: usize,
) -> Vec<String> {
    let started = Instant::now();
    let mut acked = Vec::with_capacity(requests * per_request);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64
        ^ prefix
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    for r in 0..requests {
        let ids: Vec<String> = (0..per_request)
            .map(|k| format!("{prefix}-{}", r * per_request + k))
            .collect();
        let items: Vec<Value> = ids
            .iter()
            .map(|id| {
                // Incompressible-looking text, so the state's size is what it says.
                let mut text = String::with_capacity(BULK_PAYLOAD_BYTES);
                while text.len() < BULK_PAYLOAD_BYTES {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    text.push_str(&format!("{:016x}", seed));
                }
                json!({"queue": queue, "transactionId": id, "payload": {"t": id, "fill": text}})
            })
            .collect();
        let body = json!({ "items": items }).to_string();
        let mut done = false;
        for attempt in 0..100usize {
            let port = nodes[via[(r + attempt) % via.len()]].port;
            match queen_tests::post_url(&format!("http://127.0.0.1:{port}/api/v1/push"), &body) {
                Ok((200, text)) if !text.contains("\"failed\"") => {
                    done = true;
                    break;
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        assert!(done, "request {r} of {prefix} was never acknowledged");
        acked.extend(ids);
    }
    eprintln!(
        "{prefix}: {requests} pushes of {per_request} messages in {:?}",
        started.elapsed()
    );
    acked
}

/// The highest index node `n`'s raft log was purged up to, from its log lines (0: none yet).
fn purged_upto(n: &Node) -> u64 {
    n.log_text()
        .lines()
        .filter(|l| l.contains("raft log purge"))
        .filter_map(|l| l.split("upto=").nth(1))
        .filter_map(|v| {
            v.split_whitespace()
                .next()?
                .rsplit(['.', '-'])
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or(0)
}

/// Whether `pattern` occurs in node `n`'s log past byte `from`.
fn logged_since(n: &Node, from: usize, pattern: &str) -> bool {
    n.log_text()
        .get(from..)
        .is_some_and(|t| t.contains(pattern))
}

/// Files in node `n`'s snapshot spool (a transfer or install under way).
fn spool_files(n: &Node) -> usize {
    std::fs::read_dir(n.dir.join("snapshot-spool"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Peak resident memory of a process so far (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    Some(queen_tests::memory_kib(pid, "VmHWM")).filter(|k| *k > 0)
}

/// Wait until node `n` has been purged past `index` (its snapshots run in the background).
fn wait_purged_past(n: &Node, index: u64) {
    assert!(
        eventually(Duration::from_secs(60), || purged_upto(n) > index),
        "node did not purge its log past {index} (purged up to {})",
        purged_upto(n)
    );
}

/// Pop every message of `queue` through `n` (auto-acknowledged): their transactionIds.
fn pop_all(n: &Node, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..10_000 {
        let got = n.get(&format!(
            "/api/v1/pop/queue/{queue}?batch=500&wait=false&autoAck=true"
        ));
        if got.status == 204 {
            break;
        }
        assert_eq!(got.status, 200, "{}", got.text);
        let messages = got.json["messages"].as_array().cloned().unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        out.extend(
            messages
                .iter()
                .map(|m| m["transactionId"].as_str().unwrap_or_default().to_owned()),
        );
    }
    out
}

/// Wait until node `i` has applied what the most advanced node had applied when asked.
fn wait_caught_up(nodes: &[Node], i: usize, limit: Duration) {
    let target = nodes.iter().map(applied).max().unwrap_or(0);
    assert!(
        eventually(limit, || applied(&nodes[i]) >= target),
        "node {i} did not catch up to {target} (applied {}):\n{}",
        applied(&nodes[i]),
        nodes[i]
            .log_text()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Three nodes with `SNAPSHOT_ENV`, their leader and a follower.
fn snapshot_cluster(dir: &Path) -> (Vec<Node>, usize, usize) {
    let nodes = cluster_with(dir, |_| SNAPSHOT_ENV.to_vec());
    let leader = leader_index(&nodes, None).expect("a leader");
    let follower = (0..3).find(|i| *i != leader).unwrap();
    (nodes, leader, follower)
}

#[test]
fn a_follower_behind_a_purge_catches_up_by_snapshot_and_serves_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, _, follower) = snapshot_cluster(dir.path());
    let live: Vec<usize> = (0..3).filter(|i| *i != follower).collect();
    let mut acked = load(&nodes, &[0, 1, 2], "snap", "before", 20, 4);
    wait_caught_up(&nodes, follower, Duration::from_secs(30));
    let stopped_at = applied(&nodes[follower]);
    assert!(nodes[follower].sigterm(Duration::from_secs(40)).success());

    // About 1,800 entries and 56 MiB of messages while it is away: the others snapshot and purge
    // the log it would need.
    acked.extend(load(&nodes, &live, "snap", "away", 1800, 8));
    let now_leader = leader_index(&nodes, Some(follower)).expect("a leader");
    wait_purged_past(&nodes[now_leader], stopped_at);
    // Its messages were written once, into the raft log: the purge kept the files that hold
    // them (in the archive), and the pops below read them from there.
    let archived = std::fs::read_dir(nodes[now_leader].dir.join("log").join("archive"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(archived > 0, "the leader's purges archived no log file");

    let from = nodes[follower].log_text().len();
    nodes[follower].launch();
    wait_caught_up(&nodes, follower, Duration::from_secs(120));
    assert!(
        logged_since(&nodes[follower], from, "snapshot installed"),
        "the follower caught up without a snapshot:\n{}",
        nodes[follower].log_text().get(from..).unwrap_or_default()
    );
    nodes[follower].wait_healthy(Duration::from_secs(30));
    assert_eq!(
        spool_files(&nodes[follower]),
        0,
        "the spool file is gone after the install"
    );
    // Peak memory of the receiving node (measured now, before the pops below add their own)
    // stays close to the follower that applied the same data from the log: the snapshot's chunks
    // went to disk, not to memory.
    let received = nodes[follower]
        .log_text()
        .get(from..)
        .unwrap_or_default()
        .lines()
        .find(|l| l.contains("snapshot received"))
        .unwrap_or_default()
        .to_owned();
    let bytes: u64 = received
        .split("bytes=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert!(
        bytes > 40 << 20,
        "the snapshot was smaller than expected: {received}"
    );
    let peak = |i: usize| nodes[i].pid().and_then(peak_rss_kib).unwrap_or(0);
    let others: Vec<u64> = live.iter().map(|i| peak(*i)).collect();
    let reference = others.iter().copied().min().unwrap_or(0);
    let receiving = peak(follower);
    eprintln!(
        "peak RSS (KiB): receiving follower {receiving}, the others {others:?}; snapshot of {bytes} bytes"
    );
    assert!(
        receiving < reference + bytes / 1024 / 2,
        "the receiving follower peaked at {receiving} KiB, more than the other follower ({reference} KiB) plus half the {bytes}-byte snapshot"
    );

    // Every message, once, popped through the node that caught up by snapshot.
    let popped = pop_all(&nodes[follower], "snap");
    let unique: std::collections::BTreeSet<&String> = popped.iter().collect();
    assert_eq!(unique.len(), popped.len(), "a message was popped twice");
    let missing: Vec<&String> = acked
        .iter()
        .filter(|t| !unique.contains(t))
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged messages not served, e.g. {missing:?} (of {})",
        acked.len()
    );
    assert_eq!(popped.len(), acked.len());
}

/// Stop node `i` with kill -9 as soon as `moment` holds (polled), within `limit`: whether it
/// held before the kill (false: the node was killed at the deadline instead).
fn kill9_when(
    nodes: &mut [Node],
    i: usize,
    limit: Duration,
    mut moment: impl FnMut(&[Node]) -> bool,
) -> bool {
    let hit = eventually(limit, || moment(nodes));
    nodes[i].kill9();
    hit
}

#[test]
fn a_follower_killed_during_snapshot_transfer_and_install_converges_with_every_write() {
    follower_killed_during_snapshot(false);
}

/// As above, but the follower first snapshots and purges its own log, so an install cut short
/// cannot be repaired by re-applying its log: the store must keep its old state (and meta) until
/// the new one is complete (a store that discarded it at open left the node unable to start:
/// "Cannot re-apply logs: need logs from index 0, but purged up to ...").
#[test]
fn a_follower_with_a_purged_log_killed_during_snapshot_install_converges_with_every_write() {
    follower_killed_during_snapshot(true);
}

fn follower_killed_during_snapshot(own_purge_first: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, _, follower) = snapshot_cluster(dir.path());
    let live: Vec<usize> = (0..3).filter(|i| *i != follower).collect();
    let mut acked = load(
        &nodes,
        &[0, 1, 2],
        "k9snap",
        "before",
        if own_purge_first { 1600 } else { 20 },
        2,
    );
    wait_caught_up(&nodes, follower, Duration::from_secs(60));
    if own_purge_first {
        wait_purged_past(&nodes[follower], 0);
    }
    let stopped_at = applied(&nodes[follower]);
    nodes[follower].kill9();

    acked.extend(load(&nodes, &live, "k9snap", "away", 1600, 8));
    let now_leader = leader_index(&nodes, Some(follower)).expect("a leader");
    wait_purged_past(&nodes[now_leader], stopped_at);

    // 1. kill -9 while the snapshot streams in (its spool file is being written).
    let from = nodes[follower].log_text().len();
    nodes[follower].launch();
    let in_transfer = kill9_when(&mut nodes, follower, Duration::from_secs(60), |n| {
        spool_files(&n[follower]) > 0 && !logged_since(&n[follower], from, "snapshot received")
    });
    // 2. kill -9 once it is all received, while it installs.
    let from = nodes[follower].log_text().len();
    nodes[follower].launch();
    let in_install = kill9_when(&mut nodes, follower, Duration::from_secs(60), |n| {
        logged_since(&n[follower], from, "snapshot received")
    });
    let installed_anyway = logged_since(&nodes[follower], from, "snapshot installed");
    eprintln!(
        "kill -9 during the transfer: {in_transfer}; during the install: {in_install} (finished before the kill: {installed_anyway})"
    );
    assert!(in_transfer && in_install, "the kills missed their steps");

    // 3. Restart: leftovers go, the snapshot comes again, and every write is there once.
    let from = nodes[follower].log_text().len();
    nodes[follower].launch();
    nodes[follower].wait_healthy(Duration::from_secs(120));
    assert!(
        logged_since(
            &nodes[follower],
            from,
            "deleted snapshot spool files left by an earlier process"
        ),
        "{}",
        nodes[follower].log_text().get(from..).unwrap_or_default()
    );
    acked.extend(load(&nodes, &[0, 1, 2], "k9snap", "after", 20, 2));
    wait_caught_up(&nodes, follower, Duration::from_secs(120));
    assert_all_once(&nodes, "k9snap", &acked);
    assert_eq!(spool_files(&nodes[follower]), 0);
}

#[test]
fn the_leader_killed_while_sending_a_snapshot_the_cluster_converges_with_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, leader, follower) = snapshot_cluster(dir.path());
    let other = (0..3).find(|i| *i != leader && *i != follower).unwrap();
    let mut acked = load(&nodes, &[0, 1, 2], "lsnap", "before", 20, 2);
    wait_caught_up(&nodes, follower, Duration::from_secs(30));
    let stopped_at = applied(&nodes[follower]);
    assert!(nodes[follower].sigterm(Duration::from_secs(40)).success());
    // Through the leader only, so it stays the leader.
    acked.extend(load(&nodes, &[leader], "lsnap", "away", 1600, 8));
    assert_eq!(
        leader_index(&nodes, Some(follower)),
        Some(leader),
        "the leader changed while loading"
    );
    wait_purged_past(&nodes[leader], stopped_at);
    wait_purged_past(&nodes[other], stopped_at);

    // kill -9 the leader while the follower's spool file is being written.
    nodes[follower].launch();
    let in_transfer = kill9_when(&mut nodes, leader, Duration::from_secs(60), |n| {
        spool_files(&n[follower]) > 0
    });
    eprintln!("kill -9 of the leader during the transfer: {in_transfer}");
    assert!(in_transfer, "the kill missed the transfer");
    // The other node leads (the follower is too far behind to), sends its own snapshot, and
    // takes writes, building snapshots as it goes.
    let (new_leader, took) = healthy_leader(&nodes, Duration::from_secs(30)).expect("a new leader");
    eprintln!("new leader {new_leader} after {took:?}");
    acked.extend(load(&nodes, &[other, follower], "lsnap", "after", 300, 2));
    wait_caught_up(&nodes, follower, Duration::from_secs(120));
    nodes[follower].wait_healthy(Duration::from_secs(60));
    assert_eq!(spool_files(&nodes[follower]), 0);

    // The old leader comes back and everything converges.
    nodes[leader].restart();
    acked.extend(load(&nodes, &[0, 1, 2], "lsnap", "end", 20, 2));
    assert_all_once(&nodes, "lsnap", &acked);
}

/// An encrypted queue on three nodes with one key: what a follower receives in a snapshot is
/// ciphertext too, no node's data directory holds the payloads' bytes, and every node's pops
/// give them back in clear.
#[test]
fn an_encrypted_queue_stays_ciphertext_on_every_node_and_through_a_snapshot() {
    const KEY: (&str, &str) = (
        "QUEEN_ENCRYPTION_KEY",
        "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00",
    );
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster_with(dir.path(), |_| {
        let mut env = SNAPSHOT_ENV.to_vec();
        env.push(KEY);
        env
    });
    let leader = leader_index(&nodes, None).expect("a leader");
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let live: Vec<usize> = (0..3).filter(|i| *i != follower).collect();
    let c = nodes[leader].post(
        "/api/v1/configure",
        &json!({"queue": "vault", "options": {"encryptionEnabled": true}}),
    );
    assert_eq!(c.status, 200, "{}", c.text);
    wait_caught_up(&nodes, follower, Duration::from_secs(30));
    let stopped_at = applied(&nodes[follower]);
    assert!(nodes[follower].sigterm(Duration::from_secs(40)).success());
    // While it is away: marked payloads through the other nodes, then enough entries that the
    // log it would need is purged, so the marks reach it in a snapshot.
    for (i, via) in live.iter().enumerate() {
        for (queue, mark) in [("vault", "VAULT-PLAINTEXT"), ("open", "OPEN-PLAINTEXT")] {
            let a = nodes[*via].post(
                "/api/v1/push",
                &json!({"items": [{"queue": queue, "transactionId": format!("{mark}-{i}"), "payload": {"m": format!("{mark}-{i}!")}}]}),
            );
            assert_eq!(a.status, 200, "{}", a.text);
        }
    }
    load(&nodes, &live, "vault", "away", 1600, 1);
    let now_leader = leader_index(&nodes, Some(follower)).expect("a leader");
    wait_purged_past(&nodes[now_leader], stopped_at);
    let from = nodes[follower].log_text().len();
    nodes[follower].launch();
    wait_caught_up(&nodes, follower, Duration::from_secs(120));
    assert!(
        logged_since(&nodes[follower], from, "snapshot installed"),
        "the follower caught up without a snapshot"
    );
    nodes[follower].wait_healthy(Duration::from_secs(30));
    // Every node gives the payloads back in clear.
    for (i, n) in nodes.iter().enumerate() {
        let got = n.get(&format!(
            "/api/v1/pop/queue/vault?batch=2&wait=false&consumerGroup=reader-{i}"
        ));
        assert!(
            got.text.contains(r#"{"m":"VAULT-PLAINTEXT-0!"}"#),
            "{}",
            got.text
        );
    }
    // No node's files hold them; the unflagged queue's are there (the scan can see).
    let holds =
        |n: &Node, needle: &str| !queen_tests::files_holding(&n.dir, needle.as_bytes()).is_empty();
    // Stopped by kill -9: what they wrote is in their files either way, and a graceful stop of
    // the last node, alone without a quorum, is not what this test is about.
    for n in &mut nodes {
        n.kill9();
    }
    for (i, n) in nodes.iter().enumerate() {
        assert!(
            !holds(n, "VAULT-PLAINTEXT-0!"),
            "node {i} stores the payload in clear"
        );
        assert!(
            !holds(n, "VAULT-PLAINTEXT-1!"),
            "node {i} stores the payload in clear"
        );
        assert!(
            holds(n, "OPEN-PLAINTEXT-0!"),
            "node {i}: the scan finds unflagged payloads"
        );
    }
}
