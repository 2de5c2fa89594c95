//! Three real nodes on loopback and their membership: changes need the raft token, a node is
//! replaced while health reports a lost quorum, the cluster version rises only when every
//! member reads it, acks settle alike in either log format, and a node refuses a data
//! directory marked newer than it reads.

use std::path::Path;
use std::time::Duration;

use queen_tests::{Node, eventually, free_port};
use serde_json::json;

#[path = "cluster_support.rs"]
mod support;
use support::*;

/// A client without the cluster's raft token can neither add a learner (so the leader never
/// connects to an address a stranger chose, where it would send the token) nor remove a voter.
#[test]
fn membership_changes_need_the_raft_token() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path());
    let leader = leader_index(&nodes, None).expect("a leader");
    // A listener of the stranger's: the address it asks the cluster to replicate to.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let trap_addr = trap.local_addr().unwrap().to_string();
    let learner = json!({"id": 4, "raft": trap_addr, "http": trap_addr});
    let learners = "/api/v1/system/raft/membership/learners";
    for n in &nodes {
        let none = n.post(learners, &learner);
        assert_eq!(none.status, 401, "{}", none.text);
        assert_eq!(none.json["code"], "unauthorized", "{}", none.text);
        assert!(
            none.text.contains("x-queen-raft-token"),
            "the error says what is missing: {}",
            none.text
        );
        let wrong = n
            .try_request_with(
                "POST",
                learners,
                Some(&learner.to_string()),
                &[("x-queen-raft-token", "guess")],
            )
            .unwrap();
        assert_eq!(wrong.status, 401, "{}", wrong.text);
        let wrong_len = n
            .try_request_with(
                "POST",
                learners,
                Some(&learner.to_string()),
                &[("x-queen-raft-token", &format!("{TOKEN}x"))],
            )
            .unwrap();
        assert_eq!(wrong_len.status, 401, "{}", wrong_len.text);
        let remove = n.request("DELETE", "/api/v1/system/raft/membership/members/3", None);
        assert_eq!(remove.status, 401, "{}", remove.text);
        let promote = n.post(
            "/api/v1/system/raft/membership/promote",
            &json!({"ids": [3]}),
        );
        assert_eq!(promote.status, 401, "{}", promote.text);
        // Reading the membership stays open.
        assert_eq!(n.get("/api/v1/system/raft/membership").status, 200);
    }
    // Nothing was added or removed, and nobody ever connected to the stranger's address.
    let three_voters = || {
        let list = nodes[leader].get("/api/v1/system/raft/membership");
        list.json["members"]
            .as_array()
            .is_some_and(|m| m.len() == 3 && m.iter().all(|m| m["voter"] == true))
    };
    assert!(queen_tests::holds_for(Duration::from_secs(2), three_voters));
    let list = nodes[leader].get("/api/v1/system/raft/membership");
    let members = list.json["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{}", list.text);
    assert!(members.iter().all(|m| m["voter"] == true), "{}", list.text);
    assert!(
        trap.accept().is_err(),
        "the leader connected to an address a client without the token chose"
    );
    // The token opens the route (here: a bad body, refused on its own merits).
    let ok = nodes[leader].admin("POST", learners, Some(&json!({"id": 4})));
    assert_eq!(ok.status, 400, "{}", ok.text);
    assert!(
        nodes.iter().all(|n| !n.log_text().contains(TOKEN)),
        "the token never reaches a log line"
    );
}

#[test]
fn membership_replace_a_node_and_health_reports_a_lost_quorum() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let leader = leader_index(&nodes, None).expect("a leader");
    let gone = (0..3).find(|i| *i != leader).unwrap();
    let gone_id = (gone + 1) as u64;
    push(&nodes[leader], "m", "before");
    // Every membership call below goes through a follower, which hands it to the leader.
    let other = (0..3).find(|i| *i != leader && *i != gone).unwrap();
    let list = nodes[other].get("/api/v1/system/raft/membership");
    assert_eq!(list.status, 200, "{}", list.text);
    let members = list.json["members"].as_array().unwrap().clone();
    assert_eq!(members.len(), 3, "{}", list.text);
    assert!(
        members.iter().all(|m| m["live"] == true),
        "the leader's view of liveness: {}",
        list.text
    );
    // Remove the member, wipe its disk, start it empty with QUEEN_RAFT_JOIN, add and promote it.
    let r = nodes[other].admin(
        "DELETE",
        &format!("/api/v1/system/raft/membership/members/{gone_id}"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["members"].as_array().unwrap().len(), 2, "{}", r.text);
    let again = nodes[other].admin(
        "DELETE",
        &format!("/api/v1/system/raft/membership/members/{gone_id}"),
        None,
    );
    assert_eq!(again.status, 200, "idempotent: {}", again.text);
    assert_eq!(
        again.json["members"].as_array().unwrap().len(),
        2,
        "{}",
        again.text
    );
    nodes[gone].kill9();
    std::fs::remove_dir_all(&nodes[gone].dir).unwrap();
    // Same peer list and token as the cluster, plus QUEEN_RAFT_JOIN.
    nodes[gone].set_env("QUEEN_RAFT_JOIN", "true");
    nodes[gone].launch();
    let mut first = None;
    assert!(
        queen_tests::eventually(Duration::from_secs(30), || {
            first = nodes[gone].try_request("GET", "/health", None).ok();
            first.is_some()
        }),
        "the joining node never answered:\n{}",
        nodes[gone].log_text()
    );
    assert_eq!(
        first.map(|a| a.status),
        Some(503),
        "an empty joining node serves 503 until added"
    );
    let raft_addr = nodes[gone]
        .env_value("QUEEN_RAFT_PEERS")
        .unwrap()
        .split(',')
        .find(|p| p.starts_with(&format!("{gone_id}=")))
        .and_then(|p| {
            p.split_once('=')
                .map(|(_, a)| a.split('/').next().unwrap_or_default().to_owned())
        })
        .unwrap();
    let learner = json!({"id": gone_id, "raft": raft_addr, "http": format!("127.0.0.1:{}", nodes[gone].port)});
    let add = nodes[other].admin(
        "POST",
        "/api/v1/system/raft/membership/learners",
        Some(&learner),
    );
    assert_eq!(add.status, 200, "{}", add.text);
    let add_again = nodes[other].admin(
        "POST",
        "/api/v1/system/raft/membership/learners",
        Some(&learner),
    );
    assert_eq!(add_again.status, 200, "idempotent: {}", add_again.text);
    let promote = nodes[other].admin(
        "POST",
        "/api/v1/system/raft/membership/promote",
        Some(&json!({"ids": [gone_id]})),
    );
    assert!(
        promote.status == 200 || promote.json["code"] == "learner_behind",
        "{}",
        promote.text
    );
    assert!(
        eventually(Duration::from_secs(30), || nodes[other]
            .admin(
                "POST",
                "/api/v1/system/raft/membership/promote",
                Some(&json!({"ids": [gone_id]}))
            )
            .status
            == 200),
        "the learner was never promoted"
    );
    let after = nodes[leader].get("/api/v1/system/raft/membership");
    assert!(
        after.json["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["voter"] == true),
        "{}",
        after.text
    );
    nodes[gone].wait_healthy(Duration::from_secs(30));
    let f = nodes[gone].post(
        "/api/v1/fetch",
        &json!({"entries": [{"queue": "m", "partition": "Default", "offset": 0}]}),
    );
    assert_eq!(
        f.json["entries"][0]["records"][0]["transactionId"], "before",
        "{}",
        f.text
    );
    // Bad requests name the field.
    let bad = nodes[leader].admin(
        "POST",
        "/api/v1/system/raft/membership/learners",
        Some(&json!({"id": 9, "raft": "nowhere"})),
    );
    assert_eq!(bad.status, 400);
    assert!(bad.text.contains("raft"), "{}", bad.text);

    // Kill the two others: the survivor reports no_quorum instead of healthy.
    let survivor = leader;
    for i in (0..3).filter(|i| *i != survivor) {
        nodes[i].kill9();
    }
    assert!(
        eventually(Duration::from_secs(20), || nodes[survivor]
            .get("/health")
            .status
            == 503),
        "a node without its quorum still answers 200"
    );
    assert_eq!(nodes[survivor].get("/health").json["status"], "no_quorum");
}

fn raft_field(n: &Node, field: &str) -> u64 {
    health(n)["raft"][field].as_u64().unwrap_or(u64::MAX)
}

#[test]
fn the_cluster_version_rises_only_when_every_member_reads_it_and_guards_the_data() {
    // Nodes 1 and 2 pretend a newer build that reads format 7 (test-only switch); node 3 reads
    // this build's 6.
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster_with(dir.path(), |i| {
        let mut env = vec![("QUEEN_TEST_FAULTS", "1")];
        if i < 2 {
            env.push(("QUEEN_TEST_LOG_KINDS", "7"));
        }
        env
    });
    let kinds: Vec<u64> = nodes.iter().map(|n| raft_field(n, "kinds")).collect();
    assert_eq!(kinds, [7, 7, 6], "each node reports the format it reads");
    assert!(
        eventually(Duration::from_secs(30), || nodes
            .iter()
            .all(|n| raft_field(n, "clusterVersion") == 6)),
        "the leader raised the cluster version to what every member reads"
    );
    // For several gate rounds it does not go past what node 3 reads.
    assert!(
        queen_tests::holds_for(Duration::from_secs(3), || nodes
            .iter()
            .all(|n| raft_field(n, "clusterVersion") == 6)),
        "{:?}",
        nodes.iter().map(health).collect::<Vec<_>>()
    );
    // Upgrade node 3: now every member reads 7, and the version follows.
    assert!(nodes[2].sigterm(Duration::from_secs(40)).success());
    nodes[2].set_env("QUEEN_TEST_LOG_KINDS", "7");
    nodes[2].restart();
    assert!(
        eventually(Duration::from_secs(30), || nodes
            .iter()
            .all(|n| raft_field(n, "clusterVersion") == 7)),
        "the version rises once the last member reads it: {:?}",
        nodes.iter().map(health).collect::<Vec<_>>()
    );
    let marker = nodes[2].dir.join("cluster-version");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(&marker)
            .is_ok_and(|t| t.trim() == "7")),
        "each node records the version in its data directory"
    );
    // A downgrade past the format change stops at the first node: it refuses to start.
    assert!(nodes[2].sigterm(Duration::from_secs(40)).success());
    nodes[2].set_env("QUEEN_TEST_LOG_KINDS", "6");
    nodes[2].launch();
    let status = nodes[2]
        .wait_exit(Duration::from_secs(30))
        .expect("the old build must refuse to start");
    assert_eq!(status.code(), Some(2), "{}", nodes[2].log_text());
    assert!(
        nodes[2]
            .log_text()
            .contains("holds cluster format version 7, newer than this build reads (6)"),
        "{}",
        nodes[2].log_text()
    );
    // The other two go on writing.
    push(&nodes[0], "after-downgrade", "still-writing");
}

/// Pop `n` messages of `queue` from `from` and acknowledge them all in one batch through `to`;
/// answers the verdicts.
fn pop_and_ack(from: &Node, to: &Node, queue: &str, n: usize) -> Vec<serde_json::Value> {
    let got = from.get(&format!("/api/v1/pop/queue/{queue}?batch={n}&wait=false"));
    assert_eq!(got.status, 200, "{}", got.text);
    let msgs = got.json["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(msgs.len(), n, "{}", got.text);
    let acks: Vec<_> = msgs
        .iter()
        .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": got.json["leaseId"], "status": "completed"}))
        .collect();
    let a = to.post("/api/v1/ack/batch", &json!({"acknowledgments": acks}));
    assert_eq!(a.status, 200, "{}", a.text);
    a.json.as_array().cloned().unwrap_or_default()
}

#[test]
fn acks_apply_alike_before_and_after_every_member_reads_acks_with_offsets() {
    // Node 3 reads format 3 (acks without offsets) until it is upgraded; acks taken by a
    // follower or the leader, the node that answered the pop or another, settle every
    // message either way.
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster_with(dir.path(), |i| {
        let mut env = vec![("QUEEN_TEST_FAULTS", "1")];
        if i == 2 {
            env.push(("QUEEN_TEST_LOG_KINDS", "3"));
        }
        env
    });
    // Format 5 pops read the ready index instead of every partition, format 6 fills it in
    // bounded steps: pops and acks settle alike on both sides of those changes too.
    for version in [3, 4, 5, 6] {
        assert!(
            eventually(Duration::from_secs(30), || nodes
                .iter()
                .all(|n| raft_field(n, "clusterVersion") == version)),
            "{:?}",
            nodes.iter().map(health).collect::<Vec<_>>()
        );
        let leader = leader_index(&nodes, None).expect("a leader");
        let follower = (leader + 1) % 3;
        let queue = format!("acks-v{version}");
        for i in 0..20 {
            push(&nodes[leader], &queue, &format!("m{i}"));
        }
        // Acked where the pop was answered (that node knows where it delivered them) and
        // elsewhere (that node reads them).
        for (from, to) in [
            (leader, follower),
            (follower, leader),
            (leader, leader),
            (follower, follower),
        ] {
            // Each ack settles its own message (none is a repeat) and the last one ends the
            // lease.
            let verdicts = pop_and_ack(&nodes[from], &nodes[to], &queue, 5);
            let settled: Vec<_> = verdicts
                .iter()
                .map(|v| (&v["success"], &v["noop"], &v["error"], &v["leaseReleased"]))
                .collect();
            let mut expected = vec![(&json!(true), &json!(false), &json!(null), &json!(false)); 5];
            expected[4].3 = &json!(true);
            assert_eq!(settled, expected, "format {version}: {verdicts:?}");
        }
        let rest = nodes[leader].get(&format!("/api/v1/pop/queue/{queue}?batch=10&wait=false"));
        assert_eq!(
            rest.status, 204,
            "format {version}: every message was settled: {}",
            rest.text
        );
        if version < 6 {
            assert!(nodes[2].sigterm(Duration::from_secs(40)).success());
            let next = (version + 1).to_string();
            nodes[2].set_env("QUEEN_TEST_LOG_KINDS", &next);
            nodes[2].restart();
        }
    }
}

#[test]
fn a_node_refuses_a_data_directory_marked_newer_than_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("n1");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("cluster-version"), "7\n").unwrap();
    let mut node = Node::prepare(
        Path::new(env!("CARGO_BIN_EXE_queen")),
        &data,
        free_port(),
        &[],
    );
    node.launch();
    let status = node
        .wait_exit(Duration::from_secs(30))
        .expect("it must refuse to start");
    assert_eq!(status.code(), Some(2), "{}", node.log_text());
    let log = node.log_text();
    assert!(
        log.contains("holds cluster format version 7, newer than this build reads (6)"),
        "{log}"
    );
    assert!(
        !data.join("state").exists(),
        "nothing was opened or written: {log}"
    );
}
