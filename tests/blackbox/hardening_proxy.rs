//! Issue 59, the embedded proxy on a real node: one tenant flooding new partition names into a
//! queue of thousands does not hold another tenant's pushes and costs the same per item as
//! into a small queue; the proxy answers 401 before it says anything about a cluster, and one
//! answer to a key of another cluster whether the named cluster exists or not; a push-blocked
//! cluster refuses every write that grows its data (a new queue, a lock acquire, KV, timers,
//! transactions, ephemeral pushes) and still lets consumers drain.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_tests::proxy::{call, key};
use queen_tests::{Answer, Node, eventually, free_port};
use serde_json::{Value, json};

const CP: &str = "cp-token-for-the-hardening-proxy-tests-0123";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

fn cp(via: &Node, method: &str, path: &str, body: Option<&Value>) -> Answer {
    queen_tests::proxy::control(via, CP, method, path, body)
}

/// A cluster `slug` of tenant `slug` with a key of every scope; its id and broker tenant.
fn cluster_with_key(via: &Node, slug: &str, plan: &str, key: &str) -> (String, String) {
    let made = cp(
        via,
        "POST",
        "/api/cp/clusters",
        Some(&json!({"tenant_slug": slug, "slug": slug, "plan": plan})),
    );
    assert!(made.status == 201 || made.status == 200, "{}", made.text);
    let id = made.json["id"].as_str().expect("id").to_owned();
    let body = json!({"cluster_id": id, "name": "all", "key_hash": queen_tests::sha256_hex(key),
        "scopes": ["produce", "consume", "admin", "read"]});
    let k = cp(via, "POST", "/api/cp/keys", Some(&body));
    assert!(k.status == 201 || k.status == 200, "{}", k.text);
    let row = cp(via, "GET", &format!("/api/cp/clusters/{slug}"), None);
    let tenant = row.json["broker_tenant_uuid"]
        .as_str()
        .expect("broker tenant")
        .to_owned();
    (id, tenant)
}

/// Items of one push, each in its own partition `{prefix}{i}` of `queue`.
fn spread(queue: &str, prefix: &str, from: usize, n: usize) -> Value {
    let items: Vec<Value> = (from..from + n)
        .map(|i| json!({"queue": queue, "partition": format!("{prefix}{i}"), "payload": i}))
        .collect();
    json!({ "items": items })
}

fn assert_code(a: &Answer, status: u16, code: &str) {
    assert_eq!(a.status, status, "{}", a.text);
    assert_eq!(a.json["code"], code, "{}", a.text);
}

/// A node whose proxy listens on its own port: the node (data port), the proxy listener and
/// its port.
fn proxy_node(dir: &Path, extra: &[(&str, &str)]) -> (Node, Node, u16) {
    let proxy_port = free_port();
    let pp = proxy_port.to_string();
    let mut env = vec![
        ("QUEEN_PROXY_EMBEDDED", "true"),
        ("QUEEN_PROXY_PORT", pp.as_str()),
        ("QUEEN_PROXY_CP_TOKEN", CP),
        ("QUEEN_PROXY_INVAL_POLL_MS", "200"),
    ];
    env.extend_from_slice(extra);
    let node = Node::start(bin(), dir, &env);
    let px = Node::prepare(bin(), dir, proxy_port, &[]);
    assert!(
        eventually(Duration::from_secs(30), || cp(
            &px,
            "GET",
            "/api/cp/clusters",
            None
        )
        .status
            == 200),
        "the control plane never answered"
    );
    (node, px, proxy_port)
}

#[test]
fn one_tenant_flooding_new_partitions_neither_holds_another_tenants_pushes_nor_costs_more_per_item()
{
    /// Partitions made in the wide queue before the flood (on the data port, in batches).
    const SEEDED: usize = 8000;
    /// Items (each a new partition) of one flood push.
    const FLOOD_BATCH: usize = 200;
    let dir = tempfile::tempdir().expect("tempdir");
    // The default shadow mode: the caps only log, and used to cost the most.
    // The data port takes `x-queen-tenant`, to seed the flooding tenant's queue directly.
    let (node, px, proxy_port) = proxy_node(
        dir.path(),
        &[
            ("QUEEN_TENANCY_HEADER", "true"),
            ("QUEEN_KV_TRUSTED_PROXY", "1"),
        ],
    );
    let (ka, kb) = (key('F'), key('C'));
    let (_, tenant_a) = cluster_with_key(&px, "flood", "dev", &ka);
    cluster_with_key(&px, "calm", "dev", &kb);
    let (host_a, host_b) = (Some("flood.queen.test"), Some("calm.queen.test"));
    let push_a = |body: &Value| call(&px, Some(&ka), host_a, "POST", "/api/v1/push", Some(body));
    assert!(
        eventually(Duration::from_secs(10), || push_a(&spread(
            "narrow", "warm-", 0, 1
        ))
        .status
            == 200),
        "the flooding tenant's key never pushed"
    );
    let push_b = |n: u64| {
        call(
            &px,
            Some(&kb),
            host_b,
            "POST",
            "/api/v1/push",
            Some(&json!({"items": [{"queue": "calm", "payload": n}]})),
        )
    };
    assert!(
        eventually(Duration::from_secs(10), || push_b(0).status == 200),
        "the other tenant's key never pushed"
    );
    // The wide queue, seeded on the data port under the flooding tenant.
    for from in (0..SEEDED).step_by(1000) {
        let body = spread("wide", "seed-", from, 1000).to_string();
        let a = node
            .try_request_with(
                "POST",
                "/api/v1/push",
                Some(&body),
                &[("x-queen-tenant", &tenant_a)],
            )
            .expect("seed push");
        assert_eq!(a.status, 200, "{}", a.text);
    }
    // The cost per new partition into a queue of one partition, then of thousands.
    let timed = |queue: &str, prefix: &str| {
        let t = Instant::now();
        let a = push_a(&spread(queue, prefix, 0, FLOOD_BATCH));
        assert_eq!(a.status, 200, "{}", a.text);
        t.elapsed()
    };
    let small = timed("narrow", "n-");
    let wide = timed("wide", "w-");
    println!("{FLOOD_BATCH} new partitions: into a queue of 2 {small:?}, of {SEEDED} {wide:?}");

    // The flood, bounded in time, while the other tenant pushes one item at a time.
    let stop = Arc::new(AtomicBool::new(false));
    let flood_pushes = Arc::new(Mutex::new(Vec::new()));
    let flood = {
        let (stop, done) = (stop.clone(), flood_pushes.clone());
        let px = Node::prepare(bin(), dir.path(), proxy_port, &[]);
        let ka = ka.clone();
        std::thread::spawn(move || {
            let mut from = 0;
            while !stop.load(Ordering::Relaxed) && from < 500 * FLOOD_BATCH {
                let t = Instant::now();
                let a = call(
                    &px,
                    Some(&ka),
                    Some("flood.queen.test"),
                    "POST",
                    "/api/v1/push",
                    Some(&spread("wide", "flood-", from, FLOOD_BATCH)),
                );
                assert_eq!(a.status, 200, "{}", a.text);
                done.lock().expect("flood").push(t.elapsed());
                from += FLOOD_BATCH;
            }
        })
    };
    let started = Instant::now();
    let mut calm = Vec::new();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(6) && n < 5000 {
        n += 1;
        let t = Instant::now();
        let a = push_b(n);
        assert_eq!(a.status, 200, "{}", a.text);
        calm.push(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().expect("the flood thread");
    let flooded = flood_pushes.lock().expect("flood").clone();
    calm.sort();
    let worst = *calm.last().expect("pushes");
    let p99 = calm[(calm.len() * 99 / 100).min(calm.len() - 1)];
    let first = flooded.first().copied().unwrap_or_default();
    let slowest = flooded.iter().max().copied().unwrap_or_default();
    println!(
        "calm tenant: {} pushes, p99 {p99:?}, worst {worst:?}; flood: {} pushes of {FLOOD_BATCH} \
         new partitions, the first {first:?}, the slowest {slowest:?}",
        calm.len(),
        flooded.len(),
    );
    assert!(
        worst < Duration::from_secs(1),
        "another tenant's push waited {worst:?} while one tenant flooded new partitions"
    );
    assert!(
        wide < small * 5 + Duration::from_millis(500),
        "a new partition costs more in a queue of {SEEDED} partitions ({wide:?}) than in a \
         queue of two ({small:?})"
    );
    assert!(
        !flooded.is_empty(),
        "the flood made no push within the period"
    );
    // The flood's pushes, into a queue growing past thousands, cost what the first did.
    assert!(
        slowest < first * 5 + Duration::from_secs(1),
        "flood pushes grew from {first:?} to {slowest:?}"
    );
    drop(px);
    drop(node);
}

#[test]
fn the_proxy_answers_401_before_naming_a_cluster_and_one_answer_for_a_key_of_another_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ka, kb, kg) = (key('A'), key('B'), key('G'));
    let (node, px, _) = proxy_node(
        dir.path(),
        &[
            ("QUEEN_PROXY_DEFAULT_CLUSTER", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_TENANT", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_API_KEY", &ka),
        ],
    );
    cluster_with_key(&px, "beta", "dev", &kb);
    let (gamma_id, _) = cluster_with_key(&px, "gamma", "dev", &kg);
    let suspended = cp(
        &px,
        "PUT",
        &format!("/api/cp/clusters/{gamma_id}/status"),
        Some(&json!({"status": "suspended"})),
    );
    assert_eq!(suspended.status, 200, "{}", suspended.text);
    let pop = |key: Option<&str>, host: &str| {
        call(
            &px,
            key,
            Some(host),
            "GET",
            "/api/v1/pop/queue/q?wait=false",
            None,
        )
    };
    // Every key works on its own cluster (gamma's says it is suspended).
    assert!(eventually(Duration::from_secs(10), || {
        pop(Some(&ka), "acme.queen.test").status != 401
            && pop(Some(&kb), "beta.queen.test").status != 401
            && pop(Some(&kg), "gamma.queen.test").status == 403
    }));
    assert_code(
        &pop(Some(&kg), "gamma.queen.test"),
        403,
        "cluster_suspended",
    );
    // Without a valid key: the same 401 whatever the host names (an active cluster, a
    // suspended one, none).
    let hosts = [
        "acme.queen.test",
        "beta.queen.test",
        "gamma.queen.test",
        "nosuch.queen.test",
        "127.0.0.1",
    ];
    let unknown = key('Z');
    for credential in [None, Some("not-a-key"), Some(unknown.as_str())] {
        let answers: Vec<Answer> = hosts.iter().map(|h| pop(credential, h)).collect();
        for (h, a) in hosts.iter().zip(&answers) {
            assert_code(a, 401, "unauthorized");
            assert_eq!(a.json, answers[0].json, "{h}: {}", a.text);
        }
        // A push to a blocked or suspended cluster without a key: 401 as well.
        let a = call(
            &px,
            credential,
            Some("gamma.queen.test"),
            "POST",
            "/api/v1/push",
            Some(&json!({"items": [{"queue": "q", "payload": 1}]})),
        );
        assert_code(&a, 401, "unauthorized");
    }
    // A key of another cluster: one answer for an active, a suspended and an unknown cluster.
    let foreign: Vec<Answer> = ["acme", "gamma", "nosuch", "nothing-here"]
        .iter()
        .map(|c| pop(Some(&kb), &format!("{c}.queen.test")))
        .collect();
    for a in &foreign {
        assert_eq!(a.status, 403, "{}", a.text);
        assert_eq!(a.json, foreign[0].json, "{}", a.text);
        assert!(
            !a.text.contains("acme") && !a.text.contains("gamma"),
            "{}",
            a.text
        );
    }
    // The default cluster's key acts on the default cluster whatever the host: the same
    // answer for a host naming another cluster as for one naming none.
    let via_beta = pop(Some(&ka), "beta.queen.test");
    let via_none = pop(Some(&ka), "nosuch.queen.test");
    assert_eq!(via_beta.status, via_none.status, "{}", via_beta.text);
    assert!(via_beta.status < 300, "{}", via_beta.text);
    drop(px);
    drop(node);
}

#[test]
fn a_push_blocked_cluster_refuses_every_growing_write_and_lets_consumers_drain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = key('P');
    let (node, px, _) = proxy_node(
        dir.path(),
        &[
            ("QUEEN_PROXY_DEFAULT_CLUSTER", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_TENANT", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_PLAN", "pro"),
            ("QUEEN_PROXY_BOOTSTRAP_API_KEY", &k),
        ],
    );
    let req = |method: &str, path: &str, body: Option<&Value>| {
        call(&px, Some(&k), None, method, path, body)
    };
    assert!(
        eventually(Duration::from_secs(20), || req(
            "POST",
            "/api/v1/push",
            Some(&json!({"items": [{"queue": "kept", "payload": 1}]}))
        )
        .status
            == 200),
        "the bootstrap key never pushed"
    );
    let held = req(
        "POST",
        "/api/v1/locks",
        Some(&json!({"operations": [{"op": "acquire", "name": "held", "ttlSeconds": 60}]})),
    );
    assert_eq!(held.json["results"][0]["acquired"], true, "{}", held.text);
    let token = held.json["results"][0]["token"].clone();
    let id = cp(&px, "GET", "/api/cp/clusters/acme", None).json["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let blocked = cp(
        &px,
        "PUT",
        &format!("/api/cp/clusters/{id}/status"),
        Some(&json!({"status": "push_blocked"})),
    );
    assert_eq!(blocked.status, 200, "{}", blocked.text);
    let push = json!({"items": [{"queue": "kept", "payload": 2}]});
    assert!(eventually(Duration::from_secs(5), || req(
        "POST",
        "/api/v1/push",
        Some(&push)
    )
    .status
        == 403));
    // Every write that adds stored data.
    let growing = [
        (
            "POST",
            "/api/v1/push",
            json!({"items": [{"queue": "kept", "payload": 3}]}),
        ),
        (
            "POST",
            "/api/v1/transaction",
            json!({"operations": [{"type": "push", "items": [{"queue": "kept", "payload": 4}]}], "requiredLeases": []}),
        ),
        (
            "POST",
            "/api/v1/configure",
            json!({"queue": "brand-new", "options": {}}),
        ),
        (
            "POST",
            "/api/v1/locks",
            json!({"operations": [{"op": "acquire", "name": "another", "ttlSeconds": 60}]}),
        ),
        ("PUT", "/api/v1/kv/ns/k", json!({"value": 1})),
        (
            "POST",
            "/api/v1/kv",
            json!({"operations": [{"op": "put", "ns": "ns", "key": "k", "value": 1}]}),
        ),
        (
            "POST",
            "/api/v1/timers",
            json!({"operations": [{"op": "schedule", "queue": "kept", "timerKey": "t", "payload": "eyJhIjoxfQ==", "delayMs": 60000}]}),
        ),
        (
            "POST",
            "/api/v1/ephemeral/push",
            json!({"items": [{"queue": "e", "payload": 1}]}),
        ),
        ("POST", "/api/v1/traces", json!({"traces": []})),
    ];
    for (method, path, body) in &growing {
        let a = req(method, path, Some(body));
        assert!(
            a.status == 403 && a.json["code"] == "push_blocked",
            "{method} {path}: {}",
            a.text
        );
    }
    // What does not grow still passes: a stored queue's configuration, a lock's release,
    // a KV delete, and the consumers that drain the cluster.
    let conf = req(
        "POST",
        "/api/v1/configure",
        Some(&json!({"queue": "kept", "options": {"leaseTime": 30}})),
    );
    assert_eq!(conf.status, 200, "{}", conf.text);
    let released = req(
        "POST",
        "/api/v1/locks",
        Some(&json!({"operations": [{"op": "release", "name": "held", "token": token}]})),
    );
    assert_eq!(released.status, 200, "{}", released.text);
    assert_eq!(
        released.json["results"][0]["released"], true,
        "{}",
        released.text
    );
    assert_ne!(req("DELETE", "/api/v1/kv/ns/k", None).status, 403);
    let popped = req("GET", "/api/v1/pop/queue/kept?wait=false", None);
    assert_eq!(popped.status, 200, "{}", popped.text);
    assert_eq!(popped.json["messages"][0]["data"], 1, "{}", popped.text);
    // The new queue was not made.
    let row = req("GET", "/api/v1/resources/queues/brand-new", None);
    assert_eq!(row.status, 404, "{}", row.text);
    drop(px);
    drop(node);
}
