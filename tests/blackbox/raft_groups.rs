//! Raft groups per process (`QUEEN_RAFT_GROUPS`): three nodes with three groups each, every
//! node leading one; tenants placed by the documented hash push, pop and ack through any node;
//! a kill -9 moves only the dead node's group and leadership comes back with the node; SIGTERM
//! hands the node's group over; a node restarted with another count refuses to start.

use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::{Answer, Node, three_nodes_spaced};
use serde_json::{Value, json};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

const GROUPS: u16 = 3;

/// The placement rule of `docs/cluster.md`: FNV-1a (64 bits) of the tenant id, modulo the
/// group count.
fn group_of(tenant: &str) -> u16 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tenant.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    u16::try_from(h % u64::from(GROUPS)).expect("a group")
}

/// One tenant id for each group.
fn tenants() -> Vec<String> {
    (0..GROUPS)
        .map(|g| {
            (0u32..)
                .map(|i| format!("00000000-0000-4000-8000-{i:012x}"))
                .find(|t| group_of(t) == g)
                .expect("a tenant")
        })
        .collect()
}

fn env(_: usize) -> Vec<(String, String)> {
    [
        ("QUEEN_RAFT_GROUPS", "3"),
        ("QUEEN_TENANCY_HEADER", "true"),
        ("QUEEN_KV_TRUSTED_PROXY", "true"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

fn call(n: &Node, tenant: &str, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let text = body.map(Value::to_string);
    n.try_request_with(method, path, text.as_deref(), &[("x-queen-tenant", tenant)])
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// Each group's leader as node `i` (0-based) sees it, from its `/health`.
fn leaders_seen(n: &Node) -> Option<Vec<Option<u64>>> {
    let h = n.try_request("GET", "/health", None).ok()?;
    let groups = h.json["groups"].as_array()?;
    Some(groups.iter().map(|g| g["leaderId"].as_u64()).collect())
}

/// Groups led by each node id, from the nodes' own `/health` (a node counts as leading a group
/// when it says its role there is leader).
fn led_by(nodes: &[&Node]) -> Vec<(u64, u16)> {
    let mut out = Vec::new();
    for n in nodes {
        let Ok(h) = n.try_request("GET", "/health", None) else {
            continue;
        };
        for g in h.json["groups"].as_array().cloned().unwrap_or_default() {
            if g["role"] == "leader" {
                out.push((
                    g["nodeId"].as_u64().unwrap_or(0),
                    u16::try_from(g["group"].as_u64().unwrap_or(99)).unwrap_or(99),
                ));
            }
        }
    }
    out.sort_unstable();
    out
}

/// Wait (bounded) until each of `nodes` leads exactly one group and every group has one
/// leader; answers how long it took.
fn each_leads_one(nodes: &[&Node], limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let led = led_by(nodes);
        let mut ids: Vec<u64> = led.iter().map(|(n, _)| *n).collect();
        let mut groups: Vec<u16> = led.iter().map(|(_, g)| *g).collect();
        ids.dedup();
        groups.sort_unstable();
        groups.dedup();
        if led.len() == nodes.len() && ids.len() == nodes.len() && groups.len() == nodes.len() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "after {limit:?} the groups are led as {led:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Push `ids` to `queue` of `tenant` through `n`, one request each, every one answered queued.
fn push_all(n: &Node, tenant: &str, queue: &str, ids: &[String]) {
    for id in ids {
        let a = call(
            n,
            tenant,
            "POST",
            "/api/v1/push",
            Some(&json!({"items": [{"queue": queue, "transactionId": id, "payload": {"id": id}}]})),
        );
        assert_eq!(a.status, 200, "push {id} for {tenant}: {}", a.text);
        assert_eq!(a.json[0]["status"], "queued", "{}", a.text);
    }
}

/// Pop and ack everything in `queue` of `tenant` through `pop_via` and `ack_via`: the ids.
fn drain(pop_via: &Node, ack_via: &Node, tenant: &str, queue: &str) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..200 {
        let p = call(
            pop_via,
            tenant,
            "GET",
            &format!("/api/v1/pop/queue/{queue}?batch=50&wait=false"),
            None,
        );
        assert!(p.status == 200 || p.status == 204, "pop: {}", p.text);
        let msgs = p.json["messages"].as_array().cloned().unwrap_or_default();
        if msgs.is_empty() {
            break;
        }
        let acks: Vec<Value> = msgs
            .iter()
            .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed"}))
            .collect();
        let a = call(
            ack_via,
            tenant,
            "POST",
            "/api/v1/ack/batch",
            Some(&json!({"acknowledgments": acks})),
        );
        assert_eq!(a.status, 200, "ack: {}", a.text);
        got.extend(
            msgs.iter()
                .filter_map(|m| m["transactionId"].as_str().map(str::to_owned)),
        );
    }
    got.sort();
    got
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

#[test]
fn three_nodes_lead_one_group_each_serve_every_tenant_and_survive_a_kill() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut nodes = three_nodes_spaced(bin(), dir.path(), "groups-token", GROUPS, env);
    let took = each_leads_one(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    println!("every node leads one group after {took:?}");
    let tenants = tenants();

    // Every tenant through every node: push via one, pop via the next, ack via the third.
    let mut pushed: Vec<Vec<String>> = vec![Vec::new(); tenants.len()];
    for (t, tenant) in tenants.iter().enumerate() {
        for (i, n) in nodes.iter().enumerate() {
            let batch = ids(&format!("t{t}-n{i}"), 5);
            push_all(n, tenant, "jobs", &batch);
            pushed[t].extend(batch);
        }
    }
    // Each tenant's data is in its own group only: each group's `/status` lists the queue of
    // its own tenant and of no other.
    let status = nodes[0].get("/status");
    let groups = status.json["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(groups.len(), usize::from(GROUPS), "{}", status.text);
    for (g, doc) in groups.iter().enumerate() {
        assert_eq!(doc["group"], g, "{}", status.text);
        let names = doc["queues"].to_string();
        for (t, tenant) in tenants.iter().enumerate() {
            assert_eq!(
                names.contains(tenant.as_str()),
                t == g,
                "group {g}: {names}"
            );
        }
    }
    // Each node's metrics carry every group's figures, and say it leads exactly one (refreshed
    // every second).
    for n in &nodes {
        let mut last = String::new();
        assert!(
            queen_tests::eventually(Duration::from_secs(10), || {
                last = n.get("/metrics/prometheus").text;
                let leading: Vec<&str> = last
                    .lines()
                    .filter(|l| l.starts_with("queen_raft_is_leader{"))
                    .collect();
                leading.len() == usize::from(GROUPS)
                    && leading.iter().filter(|l| l.ends_with(" 1")).count() == 1
            }),
            "{last}"
        );
    }
    // A tenant's queue is its own, wherever it is asked.
    let listed = call(
        &nodes[1],
        &tenants[0],
        "GET",
        "/api/v1/resources/queues",
        None,
    );
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert!(listed.text.contains("jobs"), "{}", listed.text);

    // kill -9 of node 3: only the group it led changes leader.
    let before: Vec<Option<u64>> = leaders_seen(&nodes[0]).expect("health of node 1");
    let dead_id = 3u64;
    let dead_group = before
        .iter()
        .position(|l| *l == Some(dead_id))
        .expect("node 3 leads a group");
    nodes[2].kill9();
    let started = Instant::now();
    let after = loop {
        let seen = leaders_seen(&nodes[0]).unwrap_or_default();
        if seen
            .get(dead_group)
            .copied()
            .flatten()
            .is_some_and(|l| l != dead_id)
        {
            break seen;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "group {dead_group} has no new leader: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    println!(
        "group {dead_group} elected node {:?} {:?} after the kill",
        after[dead_group],
        started.elapsed()
    );
    for (g, l) in before.iter().enumerate() {
        if g != dead_group {
            assert_eq!(
                after[g], *l,
                "group {g} changed leader: {before:?} -> {after:?}"
            );
        }
    }
    // Writes of every tenant go on through the survivors.
    for (t, tenant) in tenants.iter().enumerate() {
        let batch = ids(&format!("t{t}-after"), 5);
        push_all(&nodes[t % 2], tenant, "jobs", &batch);
        pushed[t].extend(batch);
    }
    // The node comes back: its group returns to it.
    nodes[2].restart();
    let took = each_leads_one(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    println!("leadership back to one group per node {took:?} after the restart");
    // Nothing acknowledged is lost or doubled.
    for (t, tenant) in tenants.iter().enumerate() {
        let got = drain(&nodes[(t + 1) % 3], &nodes[(t + 2) % 3], tenant, "jobs");
        let mut want = pushed[t].clone();
        want.sort();
        assert_eq!(got, want, "tenant {tenant}");
    }

    // A node restarted with another group count refuses to start, naming the setting.
    nodes[1].kill9();
    nodes[1].set_env("QUEEN_RAFT_GROUPS", "2");
    nodes[1].launch();
    let status = nodes[1]
        .wait_exit(Duration::from_secs(30))
        .expect("a node with another group count exits");
    assert_eq!(status.code(), Some(2), "{}", nodes[1].log_text());
    let log = nodes[1].log_text();
    assert!(
        log.contains("QUEEN_RAFT_GROUPS") && log.contains("holds 3 raft group(s)"),
        "{log}"
    );
    // Wiped, it asks its peers: they run 3, so it refuses too, and records nothing.
    std::fs::remove_dir_all(&nodes[1].dir).expect("wipe node 2");
    nodes[1].set_env("QUEEN_RAFT_JOIN", "true");
    nodes[1].launch();
    let status = nodes[1]
        .wait_exit(Duration::from_secs(30))
        .expect("a fresh node with another group count exits");
    assert_eq!(status.code(), Some(2), "{}", nodes[1].log_text());
    let log = nodes[1].log_text();
    assert!(log.contains("runs 3 raft group(s)"), "{log}");
    assert!(!nodes[1].dir.join("raft-groups").exists());
}

#[test]
fn sigterm_hands_the_groups_a_node_leads_to_another_member() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut nodes = three_nodes_spaced(bin(), dir.path(), "groups-token", GROUPS, env);
    each_leads_one(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    let before = leaders_seen(&nodes[0]).expect("health of node 1");
    let group = before
        .iter()
        .position(|l| *l == Some(2))
        .expect("node 2 leads a group");
    let started = Instant::now();
    let status = nodes[1].sigterm(Duration::from_secs(60));
    assert!(status.success(), "{status}: {}", nodes[1].log_text());
    let seen = leaders_seen(&nodes[0]).unwrap_or_default();
    let new = seen.get(group).copied().flatten();
    assert!(
        new.is_some_and(|l| l != 2),
        "group {group} after SIGTERM: {seen:?}"
    );
    println!(
        "group {group} handed to node {new:?}; the node stopped {:?} after SIGTERM",
        started.elapsed()
    );
    assert!(
        nodes[1]
            .log_text()
            .contains("leadership handed off before draining"),
        "{}",
        nodes[1].log_text()
    );
}

#[test]
fn bad_group_settings_stop_the_boot_with_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (env, says) in [
        (vec![("QUEEN_RAFT_GROUPS", "0")], "QUEEN_RAFT_GROUPS"),
        (vec![("QUEEN_RAFT_GROUPS", "65")], "QUEEN_RAFT_GROUPS"),
        (
            vec![
                ("QUEEN_RAFT_GROUPS", "2"),
                ("QUEEN_RAFT_CLIENT_OFFLOAD", "false"),
            ],
            "QUEEN_RAFT_CLIENT_OFFLOAD",
        ),
        (
            vec![
                ("QUEEN_RAFT_GROUPS", "2"),
                (
                    "QUEEN_TENANT_GROUPS",
                    "00000000-0000-4000-8000-000000000001=2",
                ),
            ],
            "QUEEN_TENANT_GROUPS",
        ),
    ] {
        let mut n = Node::prepare(bin(), &dir.path().join("n"), queen_tests::free_port(), &env);
        n.launch();
        let status = n
            .wait_exit(Duration::from_secs(20))
            .expect("the boot stops");
        assert_eq!(status.code(), Some(2), "{env:?}: {}", n.log_text());
        assert!(n.log_text().contains(says), "{env:?}: {}", n.log_text());
    }
}

#[test]
fn a_membership_change_reaches_every_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut nodes = three_nodes_spaced(bin(), dir.path(), "groups-token", GROUPS, env);
    each_leads_one(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    // Remove node 3 from every group.
    let r = nodes[0].admin("DELETE", "/api/v1/system/raft/membership/members/3", None);
    assert_eq!(r.status, 200, "{}", r.text);
    let groups = r.json["groups"].as_array().cloned().unwrap_or_default();
    assert_eq!(groups.len(), usize::from(GROUPS), "{}", r.text);
    for g in &groups {
        assert_eq!(g["members"].as_array().map(Vec::len), Some(2), "{}", r.text);
    }
    // Two nodes lead the three groups between them.
    let survivors = [&nodes[0], &nodes[1]];
    assert!(
        queen_tests::eventually(Duration::from_secs(30), || {
            let led = led_by(&survivors);
            led.len() == usize::from(GROUPS)
        }),
        "{:?}",
        led_by(&survivors)
    );
    // Wipe it, start it empty to join, add it to every group and promote it.
    nodes[2].kill9();
    std::fs::remove_dir_all(&nodes[2].dir).expect("wipe node 3");
    nodes[2].set_env("QUEEN_RAFT_JOIN", "true");
    nodes[2].launch();
    assert!(
        queen_tests::eventually(Duration::from_secs(30), || nodes[2]
            .try_request("GET", "/health", None)
            .is_ok()),
        "the joining node never answered:\n{}",
        nodes[2].log_text()
    );
    let raft_addr = nodes[2]
        .env_value("QUEEN_RAFT_PEERS")
        .expect("peers")
        .split(',')
        .find_map(|p| p.strip_prefix("3="))
        .and_then(|a| a.split('/').next())
        .expect("node 3's raft address")
        .to_owned();
    let learner =
        json!({"id": 3, "raft": raft_addr, "http": format!("127.0.0.1:{}", nodes[2].port)});
    let add = nodes[1].admin(
        "POST",
        "/api/v1/system/raft/membership/learners",
        Some(&learner),
    );
    assert_eq!(add.status, 200, "{}", add.text);
    assert!(
        queen_tests::eventually(Duration::from_secs(30), || nodes[1]
            .admin(
                "POST",
                "/api/v1/system/raft/membership/promote",
                Some(&json!({"ids": [3]}))
            )
            .status
            == 200),
        "node 3 was never promoted in every group"
    );
    let list = nodes[0].get("/api/v1/system/raft/membership");
    assert_eq!(list.status, 200, "{}", list.text);
    for g in list.json["groups"].as_array().cloned().unwrap_or_default() {
        let members = g["members"].as_array().cloned().unwrap_or_default();
        assert_eq!(members.len(), 3, "{}", list.text);
        assert!(members.iter().all(|m| m["voter"] == true), "{}", list.text);
    }
    // Back to one group each, node 3 leading its preferred group again.
    let took = each_leads_one(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    println!("one group per node {took:?} after node 3 joined every group again");
}

/// Every record line of the JSONL objects under `dir` (uncompressed), recursively.
fn lake_lines(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(lake_lines(&p));
        } else if p.extension().is_some_and(|x| x == "jsonl") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            out.extend(text.lines().map(str::to_owned));
        }
    }
    out
}

#[test]
fn every_group_mirrors_its_own_tenants_into_the_lake() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lake = dir.path().join("lake");
    let url = format!("file://{}", lake.display());
    let sink: Vec<(String, String)> = queen_tests::folder_sink_env(&url)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    std::fs::create_dir_all(dir.path().join("c")).expect("the cluster's folder");
    let mut nodes = three_nodes_spaced(bin(), &dir.path().join("c"), "groups-token", GROUPS, |i| {
        let mut e = env(i);
        e.extend(sink.iter().cloned());
        e
    });
    each_leads_one(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    let tenants = tenants();
    for (t, tenant) in tenants.iter().enumerate() {
        push_all(&nodes[t], tenant, "events", &ids(&format!("lake-t{t}"), 10));
    }
    // Each tenant's ten records land under its own folder, once each, written by the sink of
    // the group that holds it.
    let mut counts = Vec::new();
    assert!(
        queen_tests::eventually(Duration::from_secs(60), || {
            counts = tenants
                .iter()
                .map(|t| lake_lines(&lake.join("queen").join(format!("tenant={t}"))).len())
                .collect();
            counts.iter().all(|c| *c >= 10)
        }),
        "records in the lake by tenant: {counts:?}"
    );
    assert_eq!(counts, vec![10; tenants.len()]);
    let status = nodes[0].get("/status");
    for g in status.json["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        assert!(
            g["s3"].is_object(),
            "group {} runs no sink: {}",
            g["group"],
            status.text
        );
    }
    for n in &mut nodes {
        n.kill9();
    }
}

#[test]
fn a_rolling_restart_under_a_round_robin_writer_keeps_every_acknowledged_write_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().expect("temp dir");
    let mut nodes = three_nodes_spaced(bin(), dir.path(), "groups-token", GROUPS, env);
    each_leads_one(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    let tenants = tenants();
    // Clients of the three ports (processes never started from these handles).
    let clients: Vec<Node> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| Node::prepare(bin(), &dir.path().join(format!("client{i}")), n.port, &[]))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<Vec<String>>>> = Arc::new(Mutex::new(vec![Vec::new(); tenants.len()]));
    // The writer: one message at a time, tenants and nodes in turn; a request that fails is
    // sent again with the same transactionId to the next node (dedup keeps it once).
    let writer = {
        let (stop, acked, tenants) = (stop.clone(), acked.clone(), tenants.clone());
        std::thread::spawn(move || {
            let mut node = 0usize;
            let started = Instant::now();
            for i in 0..100_000u32 {
                if stop.load(Ordering::SeqCst) || started.elapsed() > Duration::from_secs(240) {
                    break;
                }
                let t = usize::try_from(i).unwrap_or(0) % tenants.len();
                let id = format!("rr-{i:06}");
                let body = json!({"items": [{"queue": "rolling", "transactionId": id, "payload": {"i": i}}]}).to_string();
                for _attempt in 0..50 {
                    node = (node + 1) % clients.len();
                    let sent = clients[node].try_request_with(
                        "POST",
                        "/api/v1/push",
                        Some(&body),
                        &[("x-queen-tenant", &tenants[t])],
                    );
                    if let Ok(a) = sent
                        && a.status == 200
                        && (a.json[0]["status"] == "queued" || a.json[0]["status"] == "duplicate")
                    {
                        acked.lock().expect("acked")[t].push(id.clone());
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    // Each node in turn: SIGTERM, start again, wait until every node leads one group again.
    for i in 0..nodes.len() {
        let status = nodes[i].sigterm(Duration::from_secs(60));
        assert!(status.success(), "node {}: {status}", i + 1);
        nodes[i].restart();
        each_leads_one(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("the writer");
    let acked = acked.lock().expect("acked").clone();
    println!(
        "acknowledged writes by tenant: {:?}",
        acked.iter().map(Vec::len).collect::<Vec<_>>()
    );
    // Every acknowledged write is stored exactly once, as every node reads it.
    for (t, tenant) in tenants.iter().enumerate() {
        assert!(acked[t].len() > 10, "too few writes for {tenant}");
        let mut want = acked[t].clone();
        want.sort();
        for n in &nodes {
            // The node has applied everything committed before it answers (read barrier).
            let mut got = Vec::new();
            assert!(
                queen_tests::eventually(Duration::from_secs(20), || {
                    got = n.stored_ids_with("rolling", "Default", &[("x-queen-tenant", tenant)]);
                    got.len() >= want.len()
                }),
                "node {}: {} stored of {} acknowledged",
                n.port,
                got.len(),
                want.len()
            );
            let mut sorted = got.clone();
            sorted.sort();
            let before = sorted.len();
            sorted.dedup();
            assert_eq!(before, sorted.len(), "a write stored twice for {tenant}");
            for id in &want {
                assert!(sorted.binary_search(id).is_ok(), "{id} of {tenant} lost");
            }
        }
    }
}

const CP: &str = "cp-token-for-the-groups-tests-0123456789";

/// A request through the embedded proxy with `key` on the shared host.
fn keyed(n: &Node, key: &str, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let text = body.map(Value::to_string);
    let auth = format!("Bearer {key}");
    n.try_request_with(
        method,
        path,
        text.as_deref(),
        &[("authorization", &auth), ("host", "api.groups.test")],
    )
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn cp(n: &Node, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let text = body.map(Value::to_string);
    n.try_request_with(method, path, text.as_deref(), &[("x-queen-cp-token", CP)])
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

#[test]
fn the_embedded_proxy_serves_clusters_whose_tenants_live_in_different_groups() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The proxy on ports of its own; the client ports serve the bare router (its `/status`
    // shows where each tenant's data is).
    let proxy_ports: Vec<u16> = (0..3).map(|_| queen_tests::free_port()).collect();
    let bare = three_nodes_spaced(bin(), dir.path(), "groups-token", GROUPS, |i| {
        [
            ("QUEEN_RAFT_GROUPS", "3".to_owned()),
            ("QUEEN_PROXY_EMBEDDED", "1".to_owned()),
            ("QUEEN_PROXY_PORT", proxy_ports[i].to_string()),
            ("QUEEN_PROXY_CP_TOKEN", CP.to_owned()),
            ("QUEEN_PROXY_SHARED_HOSTS", "api.groups.test".to_owned()),
            ("QUEEN_PROXY_INVAL_POLL_MS", "200".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    });
    each_leads_one(&bare.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    let nodes: Vec<Node> = proxy_ports
        .iter()
        .enumerate()
        .map(|(i, p)| Node::prepare(bin(), &dir.path().join(format!("proxy{i}")), *p, &[]))
        .collect();
    // Clusters until their broker tenants cover every group (each a random UUID).
    let mut clusters: Vec<(String, u16, String)> = Vec::new();
    for i in 0..40 {
        let made = cp(
            &nodes[i % 3],
            "POST",
            "/api/cp/clusters",
            Some(&json!({"tenant_slug": format!("t{i}"), "slug": format!("c{i}"), "plan": "pro"})),
        );
        assert_eq!(made.status, 201, "{}", made.text);
        let id = made.json["id"].as_str().expect("id").to_owned();
        let uuid = made.json["broker_tenant_uuid"].as_str().expect("uuid");
        clusters.push((id, group_of(uuid), uuid.to_owned()));
        let mut seen: Vec<u16> = clusters.iter().map(|(_, g, _)| *g).collect();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() == usize::from(GROUPS) {
            break;
        }
    }
    println!("clusters by group: {clusters:?}");
    // A key per cluster; each pushes through one node and pops through another.
    for (i, (id, _, _)) in clusters.iter().enumerate() {
        let key = format!("qk_test_{}{:042}", "k", i);
        let made = cp(
            &nodes[(i + 1) % 3],
            "POST",
            "/api/cp/keys",
            Some(
                &json!({"cluster_id": id, "name": "app", "key_hash": queen_tests::sha256_hex(&key), "scopes": ["produce", "consume"]}),
            ),
        );
        assert_eq!(made.status, 201, "{}", made.text);
        let pushed = (0..50).find_map(|_| {
            let a = keyed(
                &nodes[i % 3],
                &key,
                "POST",
                "/api/v1/push",
                Some(&json!({"items": [{"queue": "orders", "payload": {"cluster": i}}]})),
            );
            if a.status == 200 {
                Some(a)
            } else {
                std::thread::sleep(Duration::from_millis(100));
                None
            }
        });
        assert!(pushed.is_some(), "cluster {i}: its key never worked");
        // Another node knows the new key within about a second.
        let mut got = None;
        for _ in 0..50 {
            let a = keyed(
                &nodes[(i + 2) % 3],
                &key,
                "GET",
                "/api/v1/pop/queue/orders?batch=5&wait=false",
                None,
            );
            if a.status != 401 {
                got = Some(a);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let got = got.expect("the key reaches every node");
        assert_eq!(got.status, 200, "cluster {i} ({id}): {}", got.text);
        assert_eq!(
            got.json["messages"][0]["data"]["cluster"], i,
            "{}",
            got.text
        );
        // The control plane's relay reads the same group: the queue is listed there.
        let slug = format!("c{i}");
        let queues = cp(
            &nodes[i % 3],
            "GET",
            &format!("/api/cp/clusters/{slug}/queues"),
            None,
        );
        assert!(queues.text.contains("orders"), "{}", queues.text);
    }
    // Each cluster's queue is in the group of its broker tenant, and in no other.
    let status = bare[0].get("/status");
    let groups = status.json["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(groups.len(), usize::from(GROUPS), "{}", status.text);
    for (_, g, uuid) in &clusters {
        for (h, doc) in groups.iter().enumerate() {
            let names = doc["queues"].to_string();
            assert_eq!(
                names.contains(uuid.as_str()),
                usize::from(*g) == h,
                "tenant {uuid} (group {g}) in group {h}: {names}"
            );
        }
    }
}

#[test]
fn a_tenant_with_data_cannot_be_pinned_to_another_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tenants = tenants();
    // One node of three groups; tenant 0 has a KV row only, tenant 1 a queue.
    let mut n = Node::start(
        bin(),
        &dir.path().join("n"),
        &[
            ("QUEEN_RAFT_GROUPS", "3"),
            ("QUEEN_TENANCY_HEADER", "true"),
            ("QUEEN_KV_TRUSTED_PROXY", "true"),
        ],
    );
    let put = call(
        &n,
        &tenants[0],
        "POST",
        "/api/v1/kv",
        Some(
            &json!({"operations": [{"op": "put", "ns": "app", "key": "k", "value": 1, "forever": true}]}),
        ),
    );
    assert_eq!(put.status, 200, "{}", put.text);
    push_all(&n, &tenants[1], "jobs", &ids("pin", 1));
    // Pinning either to another group stops the boot, naming the tenant and what it holds.
    for (t, holds) in [(0usize, "KV rows"), (1, "queue")] {
        n.kill9();
        let other = (group_of(&tenants[t]) + 1) % GROUPS;
        n.set_env("QUEEN_TENANT_GROUPS", &format!("{}={other}", tenants[t]));
        n.launch();
        let status = n
            .wait_exit(Duration::from_secs(30))
            .expect("the boot stops");
        assert_eq!(status.code(), Some(2), "{}", n.log_text());
        let log = n.log_text();
        assert!(log.contains(&tenants[t]) && log.contains(holds), "{log}");
    }
    // Pinned where the hash put it, it starts.
    n.set_env(
        "QUEEN_TENANT_GROUPS",
        &format!("{}={}", tenants[0], group_of(&tenants[0])),
    );
    n.restart();
    let got = call(&n, &tenants[0], "GET", "/api/v1/kv/app/k", None);
    assert!(got.text.contains('1'), "{}", got.text);
}

#[test]
fn the_analytics_sample_every_groups_queues() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tenants = tenants();
    let n = Node::start(
        bin(),
        &dir.path().join("n"),
        &[
            ("QUEEN_RAFT_GROUPS", "3"),
            ("QUEEN_TENANCY_HEADER", "true"),
            ("QUEEN_KV_TRUSTED_PROXY", "true"),
            ("QUEEN_ANALYTICS_INTERVAL_MS", "200"),
        ],
    );
    for (t, tenant) in tenants.iter().enumerate() {
        push_all(&n, tenant, &format!("q{t}"), &ids(&format!("an{t}"), 3));
    }
    // Each tenant sees its own queue in the node's samples, whichever group holds it.
    for (t, tenant) in tenants.iter().enumerate() {
        let mut last = String::new();
        assert!(
            queen_tests::eventually(Duration::from_secs(20), || {
                let a = call(
                    &n,
                    tenant,
                    "GET",
                    "/api/v1/status/analytics?interval=minute",
                    None,
                );
                last = a.text.clone();
                a.json["queues"]
                    .as_array()
                    .is_some_and(|q| q.iter().any(|x| x["queue"] == format!("q{t}")))
            }),
            "tenant {t}: {last}"
        );
    }
}
