//! Tenants on real nodes: two tenants named by `x-queen-tenant` (behind a trusted proxy) and the
//! default tenant use the same queue, KV, lock and timer names on one node and on three, and
//! never see each other's data through any route; the lake writes each under its own
//! `tenant=`; path and header tricks are refused; a tenant token's claim names its tenant;
//! the purge removes one tenant in bounded passes and leaves the others whole.

use std::path::Path;
use std::time::Duration;

use queen_tests::{Answer, Node, eventually};
use serde_json::{Value, json};

const A: &str = "a1a1a1a1-0000-4000-8000-00000000000a";
const B: &str = "b2b2b2b2-0000-4000-8000-00000000000b";
const DEFAULT: &str = "00000000-0000-0000-0000-000000000001";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// A request as tenant `t` (`None`: no header, the default tenant).
fn call(n: &Node, t: Option<&str>, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let headers: Vec<(&str, &str)> = t.map(|t| vec![("x-queen-tenant", t)]).unwrap_or_default();
    let text = body.map(Value::to_string);
    n.try_request_with(method, path, text.as_deref(), &headers)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn header_env(lake: &str) -> Vec<(&str, &str)> {
    let mut e = vec![
        ("QUEEN_TENANCY_HEADER", "true"),
        ("QUEEN_KV_TRUSTED_PROXY", "1"),
    ];
    e.extend(queen_tests::folder_sink_env(lake));
    e
}

/// Each tenant's marker: what its payloads carry.
fn marker(t: Option<&str>) -> &'static str {
    match t {
        Some(A) => "from-a",
        Some(B) => "from-b",
        _ => "from-default",
    }
}

/// Configure, push the same transactionIds, and fill KV, locks and timers under one name.
fn fill(n: &Node, t: Option<&str>) {
    let m = marker(t);
    let c = call(
        n,
        t,
        "POST",
        "/api/v1/configure",
        Some(
            &json!({"queue": "orders", "namespace": "shop", "options": {"retryLimit": 0, "leaseTime": 60}}),
        ),
    );
    assert_eq!(c.status, 200, "{}", c.text);
    assert_eq!(c.json["queue"], "orders");
    assert_eq!(c.json["namespace"], "shop");
    let p = call(
        n,
        t,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [
            {"queue": "orders", "partition": "p", "transactionId": "t1", "payload": {"who": m, "n": 1}},
            {"queue": "orders", "partition": "p", "transactionId": "t2", "payload": {"who": m, "n": 2}}
        ]})),
    );
    assert_eq!(p.status, 200, "{}", p.text);
    for r in p.json.as_array().unwrap() {
        // The same transactionIds in another tenant are not duplicates.
        assert_eq!(r["status"], "queued", "{}", p.text);
        assert_eq!(r["queueName"], "orders", "{}", p.text);
    }
    let kv = call(
        n,
        t,
        "PUT",
        "/api/v1/kv/cfg/color",
        Some(&json!({"value": m, "forever": true})),
    );
    assert_eq!(kv.status, 200, "{}", kv.text);
    let l = call(
        n,
        t,
        "POST",
        "/api/v1/locks",
        Some(
            &json!({"operations": [{"op": "acquire", "name": "job", "ttlSeconds": 60, "owner": m}]}),
        ),
    );
    assert_eq!(l.json["results"][0]["acquired"], true, "{}", l.text);
    // base64 of {"t":1}
    let s = call(
        n,
        t,
        "POST",
        "/api/v1/timers",
        Some(
            &json!({"operations": [{"op": "schedule", "queue": "orders", "timerKey": "later", "payload": "eyJ0IjoxfQ==", "delayMs": 600_000}]}),
        ),
    );
    assert_eq!(s.status, 200, "{}", s.text);
    assert_eq!(s.json["results"][0]["queue"], "orders", "{}", s.text);
}

/// What tenant `t` sees through each read route.
fn check_isolated(n: &Node, t: Option<&str>) {
    let m = marker(t);
    let list = call(n, t, "GET", "/api/v1/resources/queues", None);
    let names: Vec<&str> = list.json["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["orders"], "{}", list.text);
    assert_eq!(list.json["queues"][0]["namespace"], "shop");
    assert_eq!(list.json["queues"][0]["messages"]["total"], 2);
    let f = call(
        n,
        t,
        "POST",
        "/api/v1/fetch",
        Some(&json!({"entries": [{"queue": "orders", "partition": "p", "offset": 0}]})),
    );
    let recs = f.json["entries"][0]["records"].as_array().unwrap();
    assert_eq!(recs.len(), 2, "{}", f.text);
    assert!(recs.iter().all(|r| r["payload"]["who"] == m), "{}", f.text);
    let kv = call(n, t, "GET", "/api/v1/kv/cfg/color", None);
    assert_eq!(kv.json["value"], m, "{}", kv.text);
    let held = call(
        n,
        t,
        "POST",
        "/api/v1/locks",
        Some(&json!({"operations": [{"op": "get", "name": "job"}]})),
    );
    assert_eq!(
        held.json["results"][0]["holders"][0]["owner"], m,
        "{}",
        held.text
    );
    let timers = call(n, t, "GET", "/api/v1/timers/orders", None);
    assert_eq!(
        timers.json["rows"].as_array().unwrap().len(),
        1,
        "{}",
        timers.text
    );
    let changed = call(
        n,
        t,
        "POST",
        "/api/v1/partitions/changed",
        Some(&json!({"entries": [{"queue": "orders"}]})),
    );
    assert_eq!(
        changed.json["entries"][0]["partitions"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "Default and p: {t:?} {}",
        changed.text
    );
}

fn pop(n: &Node, t: Option<&str>, path: &str) -> Answer {
    call(n, t, "GET", path, None)
}

fn lake_payloads(lake: &Path, tenant: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for p in queen_tests::files_under(lake) {
        let path = p.to_string_lossy().to_string();
        if !path.ends_with(".jsonl") || !path.contains(&format!("tenant={tenant}/queue=orders/")) {
            continue;
        }
        for line in std::fs::read_to_string(&p).unwrap_or_default().lines() {
            if let Ok(v) = serde_json::from_str::<Value>(line) {
                out.push(v["payload"].clone());
            }
        }
    }
    out
}

#[test]
fn the_header_needs_a_trusted_proxy_to_boot() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin())
        .env("QUEEN_RAFT_DIR", dir.path())
        .env("PORT", queen_tests::free_port().to_string())
        .env("QUEEN_TENANCY_HEADER", "true")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("QUEEN_TENANCY_HEADER") && err.contains("QUEEN_KV_TRUSTED_PROXY=1"),
        "{err}"
    );
}

#[test]
fn two_tenants_and_the_default_share_names_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let lake_url = format!("file://{}", lake.display());
    let n = Node::start(bin(), &dir.path().join("data"), &header_env(&lake_url));
    let all = [Some(A), Some(B), None];
    for t in all {
        fill(&n, t);
    }
    for t in all {
        check_isolated(&n, t);
    }
    // The node-wide pages are the operator's: a request acting for a tenant cannot read them.
    for path in ["/status", "/metrics", "/metrics/prometheus"] {
        let r = call(&n, Some(A), "GET", path, None);
        assert_eq!(r.status, 403, "{path}: {}", r.text);
    }
    // The operator's status page names a tenant's queue as <tenant>/<queue>.
    let status = n.get("/status");
    let shown: Vec<&str> = status.json["queues"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert!(
        shown.contains(&format!("{A}/orders").as_str()) && shown.contains(&"orders"),
        "{shown:?}"
    );

    // Pops, acks and dead letters stay in their tenant.
    let got = pop(&n, Some(A), "/api/v1/pop/queue/orders?batch=10&wait=false");
    let msgs = got.json["messages"].as_array().unwrap().clone();
    assert_eq!(msgs.len(), 2, "{}", got.text);
    assert!(msgs.iter().all(|m| m["data"]["who"] == "from-a"));
    let lease = got.json["leaseId"].clone();
    // Tenant B names A's partition, message and lease: answered as an unknown partition.
    let forged = json!({"transactionId": msgs[0]["transactionId"], "partitionId": msgs[0]["partitionId"], "leaseId": lease, "status": "completed"});
    let b_ack = call(&n, Some(B), "POST", "/api/v1/ack", Some(&forged));
    assert_eq!(b_ack.json[0]["success"], false, "{}", b_ack.text);
    let b_extend = call(
        &n,
        Some(B),
        "POST",
        &format!("/api/v1/lease/{}/extend", lease.as_str().unwrap()),
        None,
    );
    assert_eq!(b_extend.json["success"], false, "{}", b_extend.text);
    let browse = format!(
        "/api/v1/messages/{}/{}",
        msgs[0]["partitionId"].as_str().unwrap(),
        msgs[0]["transactionId"].as_str().unwrap()
    );
    assert_eq!(call(&n, Some(B), "GET", &browse, None).status, 404);
    assert_eq!(call(&n, Some(A), "GET", &browse, None).status, 200);
    let listed = call(&n, Some(B), "GET", "/api/v1/messages?queue=orders", None);
    assert!(
        listed.json["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["data"]["who"] == "from-b" && m["queue"] == "orders"),
        "{}",
        listed.text
    );
    let b_txn = call(
        &n,
        Some(B),
        "POST",
        "/api/v1/transaction",
        Some(&json!({"operations": [], "requiredLeases": [lease]})),
    );
    assert_eq!(b_txn.status, 400, "{}", b_txn.text);
    // A acks one and fails the other into its dead letters.
    let done = call(&n, Some(A), "POST", "/api/v1/ack", Some(&forged));
    assert_eq!(done.json[0]["success"], true, "{}", done.text);
    let failed = call(
        &n,
        Some(A),
        "POST",
        "/api/v1/ack",
        Some(
            &json!({"transactionId": msgs[1]["transactionId"], "partitionId": msgs[1]["partitionId"], "leaseId": lease, "status": "failed", "error": "no"}),
        ),
    );
    assert_eq!(failed.json[0]["dlq"], true, "{}", failed.text);
    let dlq = |t| call(&n, t, "GET", "/api/v1/dlq?queue=orders", None).json["total"].clone();
    assert_eq!(dlq(Some(A)), 1);
    assert_eq!(dlq(Some(B)), 0);
    assert_eq!(dlq(None), 0);
    // B and the default tenant still have both of their own messages.
    for t in [Some(B), None] {
        let got = pop(&n, t, "/api/v1/pop/queue/orders?batch=10&wait=false");
        let msgs = got.json["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 2, "{}", got.text);
        assert!(msgs.iter().all(|m| m["data"]["who"] == marker(t)));
    }
    // Pop by namespace tag reaches only the tenant's own queues.
    call(
        &n,
        Some(B),
        "POST",
        "/api/v1/push",
        Some(
            &json!({"items": [{"queue": "orders", "partition": "q", "payload": {"who": "from-b"}}]}),
        ),
    );
    let tagged = pop(
        &n,
        Some(A),
        "/api/v1/pop?namespace=shop&batch=10&wait=false",
    );
    assert_eq!(tagged.status, 204, "{}", tagged.text);
    let tagged = pop(
        &n,
        Some(B),
        "/api/v1/pop?namespace=shop&batch=10&wait=false",
    );
    assert_eq!(
        tagged.json["messages"][0]["data"]["who"], "from-b",
        "{}",
        tagged.text
    );
    // Consumer groups list only the tenant's queues.
    pop(
        &n,
        Some(A),
        "/api/v1/pop/queue/orders?consumerGroup=g&batch=1&wait=false",
    );
    let named = |t| {
        let groups = call(&n, t, "GET", "/api/v1/consumer-groups", None);
        groups
            .json
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["name"] == "g")
            .map(|g| g["queueName"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(named(Some(A)), vec!["orders"]);
    assert!(named(Some(B)).is_empty() && named(None).is_empty());

    // Tricks: a header that is not a UUID, the proxy's tenant, a name spelled with the scope.
    let bad = call(&n, Some("acme"), "GET", "/api/v1/resources/queues", None);
    assert_eq!(bad.status, 400, "{}", bad.text);
    assert!(bad.text.contains("x-queen-tenant"), "{}", bad.text);
    let reserved = call(
        &n,
        Some("00000000-0000-0000-0000-00000000fffe"),
        "GET",
        "/api/v1/resources/queues",
        None,
    );
    assert_eq!(reserved.status, 400, "{}", reserved.text);
    let spelled = format!("\u{1}{A}\u{1}orders");
    for (method, path, body) in [
        (
            "POST",
            "/api/v1/push".to_owned(),
            Some(json!({"items": [{"queue": spelled, "payload": 1}]})),
        ),
        (
            "POST",
            "/api/v1/fetch".to_owned(),
            Some(json!({"entries": [{"queue": spelled, "partition": "p", "offset": 0}]})),
        ),
        (
            "GET",
            format!("/api/v1/pop/queue/%01{A}%01orders?wait=false"),
            None,
        ),
        ("GET", format!("/api/v1/timers/%01{A}%01orders"), None),
        ("GET", format!("/api/v1/dlq?queue=%01{A}%01orders"), None),
        ("GET", format!("/api/v1/kv/%01{A}%01cfg/color"), None),
    ] {
        let r = call(&n, None, method, &path, body.as_ref());
        assert_eq!(r.status, 400, "{method} {path}: {}", r.text);
    }

    // The lake writes each tenant's records under its own tenant=.
    assert!(
        eventually(Duration::from_secs(60), || {
            lake_payloads(&lake, A).len() == 2
                && lake_payloads(&lake, B).len() == 3
                && lake_payloads(&lake, DEFAULT).len() == 2
        }),
        "a={:?} b={:?} default={:?}",
        lake_payloads(&lake, A),
        lake_payloads(&lake, B),
        lake_payloads(&lake, DEFAULT)
    );
    assert!(lake_payloads(&lake, A).iter().all(|p| p["who"] == "from-a"));
    assert!(
        lake_payloads(&lake, DEFAULT)
            .iter()
            .all(|p| p["who"] == "from-default")
    );

    // Ephemeral queues of A and B (in memory on their owner).
    for t in [A, B] {
        let pushed = call(
            &n,
            Some(t),
            "POST",
            "/api/v1/ephemeral/push",
            Some(&json!({"queue": "rooms", "partition": "lobby", "messages": [{"payload": t}]})),
        );
        assert_eq!(pushed.status, 201, "{}", pushed.text);
    }
    let ephemeral = |t| {
        let r = call(&n, Some(t), "GET", "/api/v1/ephemeral/queues", None);
        r.json["queues"]
            .as_array()
            .unwrap_or(&Vec::new())
            .iter()
            .map(|q| {
                (
                    q["queue"].as_str().unwrap_or("").to_owned(),
                    q["depth"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(ephemeral(A), vec![("rooms".to_owned(), json!(1))]);

    // Purge A: a trusted proxy may name only the tenant it purges; the default tenant is never
    // purged; a pass deletes, the next confirms.
    let purge = |t: Option<&str>, which: &str| {
        call(
            &n,
            t,
            "DELETE",
            &format!("/api/v1/resources/tenant?tenant={which}"),
            None,
        )
    };
    assert_eq!(purge(Some(B), A).status, 403);
    assert_eq!(purge(None, DEFAULT).status, 409);
    assert_eq!(purge(None, "acme").status, 400);
    let first = purge(Some(A), A);
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["tenant"], A);
    assert_eq!(
        first.json["partitionsDeleted"], 2,
        "Default and p: {}",
        first.text
    );
    assert_eq!(first.json["done"], true);
    let second = purge(None, A);
    assert_eq!(
        (
            second.json["partitionsDeleted"].clone(),
            second.json["done"].clone()
        ),
        (json!(0), json!(true)),
        "{}",
        second.text
    );
    // A's ephemeral queue is gone from memory; B's keeps its message.
    assert!(ephemeral(A).is_empty(), "{:?}", ephemeral(A));
    assert_eq!(ephemeral(B), vec![("rooms".to_owned(), json!(1))]);
    let gone = call(&n, Some(A), "GET", "/api/v1/resources/queues", None);
    assert_eq!(
        gone.json["queues"].as_array().unwrap().len(),
        0,
        "{}",
        gone.text
    );
    assert_eq!(
        call(&n, Some(A), "GET", "/api/v1/kv/cfg/color", None).status,
        404
    );
    assert_eq!(
        call(&n, Some(A), "GET", "/api/v1/timers/orders", None).json["rows"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    let free = call(
        &n,
        Some(A),
        "POST",
        "/api/v1/locks",
        Some(&json!({"operations": [{"op": "get", "name": "job"}]})),
    );
    assert_eq!(free.json["results"][0]["held"], false, "{}", free.text);
    // B and the default tenant are whole; the lake still holds A's records.
    for t in [Some(B), None] {
        assert_eq!(
            call(&n, t, "GET", "/api/v1/kv/cfg/color", None).json["value"],
            marker(t)
        );
        let list = call(&n, t, "GET", "/api/v1/resources/queues", None);
        assert_eq!(
            list.json["queues"].as_array().unwrap().len(),
            1,
            "{}",
            list.text
        );
    }
    assert_eq!(lake_payloads(&lake, A).len(), 2);
}

#[test]
fn a_node_without_tenancy_refuses_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(bin(), &dir.path().join("data"), &[]);
    let r = call(&n, Some(A), "GET", "/api/v1/resources/queues", None);
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.text.contains("QUEEN_TENANCY_HEADER"), "{}", r.text);
}

#[test]
fn three_nodes_keep_tenants_apart_through_any_node() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let lake_url = format!("file://{}", lake.display());
    let nodes = queen_tests::three_nodes(bin(), dir.path(), "tenants-token", |_| {
        header_env(&lake_url)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    });
    let all = [Some(A), Some(B), None];
    // Each tenant writes through one node and is read through another.
    for (i, t) in all.into_iter().enumerate() {
        fill(&nodes[i], t);
    }
    for (i, t) in all.into_iter().enumerate() {
        check_isolated(&nodes[(i + 1) % 3], t);
    }
    for (i, t) in all.into_iter().enumerate() {
        let n = &nodes[(i + 2) % 3];
        let got = pop(
            n,
            t,
            "/api/v1/pop/queue/orders?batch=10&wait=true&timeout=5000",
        );
        let msgs = got.json["messages"].as_array().unwrap().clone();
        assert_eq!(msgs.len(), 2, "{}", got.text);
        assert!(
            msgs.iter().all(|m| m["data"]["who"] == marker(t)),
            "{}",
            got.text
        );
        // Each fails its second message into its own dead letters.
        let lease = &got.json["leaseId"];
        let failed = call(
            n,
            t,
            "POST",
            "/api/v1/ack",
            Some(
                &json!({"transactionId": msgs[1]["transactionId"], "partitionId": msgs[1]["partitionId"], "leaseId": lease, "status": "failed", "error": "no"}),
            ),
        );
        assert_eq!(failed.json[0]["dlq"], true, "{}", failed.text);
    }
    for (i, t) in all.into_iter().enumerate() {
        let dlq = call(&nodes[i], t, "GET", "/api/v1/dlq?queue=orders", None);
        assert_eq!(dlq.json["total"], 1, "{}", dlq.text);
        assert_eq!(
            dlq.json["messages"][0]["data"]["who"],
            marker(t),
            "{}",
            dlq.text
        );
    }
    assert!(
        eventually(Duration::from_secs(60), || {
            [A, B, DEFAULT]
                .iter()
                .all(|t| lake_payloads(&lake, t).len() == 2)
        }),
        "a={:?} b={:?} default={:?}",
        lake_payloads(&lake, A),
        lake_payloads(&lake, B),
        lake_payloads(&lake, DEFAULT)
    );
    for (t, who) in [(A, "from-a"), (B, "from-b"), (DEFAULT, "from-default")] {
        assert!(lake_payloads(&lake, t).iter().all(|p| p["who"] == who));
    }
}

/// The size of every file under `dir`, in bytes.
fn disk_bytes(dir: &Path) -> u64 {
    queen_tests::files_under(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// Push one message into each of three queues for tenants `from..to`, over four connections.
fn fill_tenants(n: &Node, from: u32, to: u32) {
    std::thread::scope(|s| {
        for lane in 0..4 {
            s.spawn(move || {
                for i in (from..to).filter(|i| i % 4 == lane) {
                    let t = format!("{i:08x}-0000-4000-8000-000000000000");
                    let body = json!({"items": (0..3).map(|q| json!({"queue": format!("q{q}"), "transactionId": "m", "payload": {"i": i}})).collect::<Vec<_>>()});
                    let r = call(n, Some(&t), "POST", "/api/v1/push", Some(&body));
                    assert_eq!(r.status, 200, "{t}: {}", r.text);
                }
            });
        }
    });
}

#[test]
fn ten_thousand_tenants_keep_memory_and_disk_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let n = Node::start(
        bin(),
        &data,
        &[
            ("QUEEN_TENANCY_HEADER", "true"),
            ("QUEEN_KV_TRUSTED_PROXY", "1"),
        ],
    );
    let pid = n.pid().unwrap();
    fill_tenants(&n, 0, 1_000);
    let rss_1k = queen_tests::memory_kib(pid, "VmRSS");
    let disk_1k = disk_bytes(&data);
    fill_tenants(&n, 1_000, 10_000);
    let rss_10k = queen_tests::memory_kib(pid, "VmRSS");
    let peak = queen_tests::memory_kib(pid, "VmHWM");
    let disk_10k = disk_bytes(&data);
    eprintln!(
        "tenants: RSS {rss_1k} KiB at 1,000 tenants, {rss_10k} KiB at 10,000 (peak {peak} KiB); disk {disk_1k} B at 1,000, {disk_10k} B at 10,000 (30,000 queues)"
    );
    // One tenant's listing reads its own range of the table, not 30,000 queues.
    let one = call(
        &n,
        Some("00000007-0000-4000-8000-000000000000"),
        "GET",
        "/api/v1/resources/queues",
        None,
    );
    assert_eq!(
        one.json["queues"].as_array().unwrap().len(),
        3,
        "{}",
        one.text
    );
    let none = call(&n, None, "GET", "/api/v1/resources/queues", None);
    assert_eq!(
        none.json["queues"].as_array().unwrap().len(),
        0,
        "{}",
        none.text
    );
    // Nothing is kept in memory per tenant: nine times the tenants add well under 1 KiB each.
    assert!(
        rss_10k.saturating_sub(rss_1k) < 48 * 1024,
        "RSS grew from {rss_1k} KiB to {rss_10k} KiB"
    );
    assert!(peak < 256 * 1024, "peak RSS {peak} KiB");
    // On disk a queue of one message costs a few rows, not a file or a segment of its own.
    let per_queue = disk_10k / 30_000;
    assert!(per_queue < 4096, "{per_queue} bytes per queue on disk");
}
