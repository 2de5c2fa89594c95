//! The embedded proxy on real nodes: API keys bound to clusters, route classes, statuses, the
//! control plane's token and routes, revocation on every node of three within about a second,
//! and no secret in any answer or log line.

use std::path::Path;
use std::time::{Duration, Instant};

use queen_tests::proxy::{call, key};
use queen_tests::{Answer, Node, eventually, free_port};
use serde_json::{Value, json};

const CP: &str = "cp-token-for-the-proxy-tests-0123456789";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

fn cp(via: &Node, method: &str, path: &str, body: Option<&Value>) -> Answer {
    queen_tests::proxy::control(via, CP, method, path, body)
}

fn push(via: &Node, key: Option<&str>, host: Option<&str>, queue: &str, n: u64) -> Answer {
    call(
        via,
        key,
        host,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": queue, "payload": {"n": n}}]})),
    )
}

fn pop(via: &Node, key: Option<&str>, host: Option<&str>, queue: &str) -> Answer {
    call(
        via,
        key,
        host,
        "GET",
        &format!("/api/v1/pop/queue/{queue}?wait=false&batch=10"),
        None,
    )
}

/// Whether `f` answers `status` within `secs` seconds.
fn becomes(secs: u64, status: u16, mut f: impl FnMut() -> Answer) -> bool {
    eventually(Duration::from_secs(secs), || f().status == status)
}

fn assert_code(a: &Answer, status: u16, code: &str) {
    assert_eq!(a.status, status, "{}", a.text);
    assert_eq!(a.json["code"], code, "{}", a.text);
}

#[test]
fn keys_clusters_routes_and_statuses_through_the_proxy_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy_port = free_port();
    let k1 = key('A');
    let k2 = key('B');
    let pp = proxy_port.to_string();
    let node = Node::start(
        bin(),
        dir.path(),
        &[
            ("QUEEN_PROXY_EMBEDDED", "true"),
            ("QUEEN_PROXY_PORT", &pp),
            ("QUEEN_PROXY_CP_TOKEN", CP),
            ("QUEEN_PROXY_DEFAULT_CLUSTER", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_TENANT", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_API_KEY", &k1),
            ("QUEEN_PROXY_INVAL_POLL_MS", "200"),
        ],
    );
    // The proxy's listener: the same process, another port.
    let px = Node::prepare(bin(), dir.path(), proxy_port, &[]);
    let acme = Some("acme.queen.test");

    // The bootstrap key works once the boot-time bootstrap is applied.
    assert!(
        becomes(20, 200, || push(&px, Some(&k1), acme, "orders", 1)),
        "the bootstrap key never pushed"
    );
    // Credentials.
    assert_code(&push(&px, None, acme, "orders", 2), 401, "unauthorized");
    assert_code(
        &push(&px, Some("not-a-key"), acme, "orders", 2),
        401,
        "unauthorized",
    );
    assert_code(
        &push(&px, Some(&key('Z')), acme, "orders", 2),
        401,
        "unauthorized",
    );
    // A tenant header from the client is not read: the push lands in the cluster's tenant.
    let spoof = px
        .try_request_with(
            "POST",
            "/api/v1/push",
            Some(&json!({"items": [{"queue": "orders", "payload": {"n": 3}}]}).to_string()),
            &[
                ("authorization", &format!("Bearer {k1}")),
                ("x-queen-tenant", "b2b2b2b2-0000-4000-8000-00000000000b"),
                ("x-queen-raft-token", "whatever"),
            ],
        )
        .expect("push");
    assert_eq!(spoof.status, 200, "{}", spoof.text);
    let popped = pop(&px, Some(&k1), acme, "orders");
    assert_eq!(popped.status, 200, "{}", popped.text);
    let ns: Vec<u64> = popped.json["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["data"]["n"].as_u64().expect("n"))
        .collect();
    assert_eq!(ns, [1, 3], "{}", popped.text);
    // The bare client port serves the default tenant, which has none of the cluster's queues.
    let bare = node.get("/api/v1/resources/queues");
    assert_eq!(bare.status, 200, "{}", bare.text);
    assert_eq!(bare.json["queues"], json!([]), "{}", bare.text);

    // Route classes: blocked and operator routes, whatever the key.
    for (method, path) in [
        ("GET", "/api/v1/system/raft/membership"),
        (
            "DELETE",
            "/api/v1/resources/tenant?tenant=b2b2b2b2-0000-4000-8000-00000000000b",
        ),
        ("GET", "/status"),
        ("GET", "/api/v1/status"),
        ("GET", "/api/v1/pop?namespace=x&wait=false"),
        ("POST", "/api/v1/stats/refresh"),
        ("GET", "/internal/x"),
        ("GET", "/api/v1/no-such-route"),
    ] {
        let a = call(&px, Some(&k1), acme, method, path, None);
        assert_code(&a, 404, "route_blocked");
    }
    // Health passes; metrics need the control-plane token.
    assert_eq!(px.get("/health").status, 200);
    assert_code(&px.get("/metrics/prometheus"), 404, "not_found");
    let m = cp(&px, "GET", "/metrics/prometheus", None);
    assert_eq!(m.status, 200, "{}", m.text);

    // The control plane: its token, checked first.
    assert_code(&px.get("/api/cp/clusters"), 401, "unauthorized");
    let wrong = px
        .try_request_with(
            "GET",
            "/api/cp/clusters",
            None,
            &[("x-queen-cp-token", "nope")],
        )
        .expect("cp");
    assert_code(&wrong, 401, "unauthorized");
    // A second cluster, repeated: the same id.
    let made = cp(
        &px,
        "POST",
        "/api/cp/clusters",
        Some(&json!({"tenant_slug": "beta-co", "slug": "beta", "plan": "pro"})),
    );
    assert_eq!(made.status, 201, "{}", made.text);
    let again = cp(
        &px,
        "POST",
        "/api/cp/clusters",
        Some(&json!({"tenant_slug": "beta-co", "slug": "beta", "plan": "pro"})),
    );
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(made.json["id"], again.json["id"]);
    assert_eq!(made.json["tenant_slug"], "beta-co");
    let beta_id = made.json["id"].as_str().expect("id").to_owned();
    // The relays act as the cluster's tenant.
    let conf = cp(
        &px,
        "POST",
        "/api/cp/clusters/beta/configure",
        Some(&json!({"queue": "cfg", "options": {"leaseTime": 30}})),
    );
    assert_eq!(conf.status, 200, "{}", conf.text);
    assert_eq!(conf.json["queue"], "cfg", "{}", conf.text);
    let empty = cp(
        &px,
        "POST",
        "/api/cp/clusters/beta/configure",
        Some(&json!({"queue": " ", "options": {}})),
    );
    assert_code(&empty, 400, "invalid");
    let queues = cp(&px, "GET", "/api/cp/clusters/beta/queues", None);
    assert_eq!(queues.status, 200, "{}", queues.text);
    let names: Vec<&str> = queues.json["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .filter_map(|q| q["name"].as_str().or(q["queue"].as_str()))
        .collect();
    assert_eq!(names, ["cfg"], "{}", queues.text);
    // Another tenant cannot take the slug.
    let taken = cp(
        &px,
        "POST",
        "/api/cp/clusters",
        Some(&json!({"tenant_slug": "acme", "slug": "beta"})),
    );
    assert_code(&taken, 409, "conflict");
    // Validation names the field.
    let bad = cp(
        &px,
        "POST",
        "/api/cp/clusters",
        Some(&json!({"tenant_slug": "Bad_Slug", "slug": "x"})),
    );
    assert_code(&bad, 400, "invalid");
    assert!(
        bad.json["error"]
            .as_str()
            .unwrap_or("")
            .contains("tenant_slug")
    );
    let h2 = queen_tests::sha256_hex(&k2);
    for body in [
        json!({"cluster_id": beta_id, "name": "c", "key_hash": "ABC", "scopes": ["consume"]}),
        json!({"cluster_id": beta_id, "name": "c", "key_hash": h2, "scopes": []}),
        json!({"cluster_id": beta_id, "name": "c", "key_hash": h2, "scopes": ["write"]}),
        json!({"cluster_id": "nope", "name": "c", "key_hash": h2, "scopes": ["consume"]}),
    ] {
        assert_code(
            &cp(&px, "POST", "/api/cp/keys", Some(&body)),
            400,
            "invalid",
        );
    }
    let big = "x".repeat(1_100_000);
    let too_big = px.try_request_with(
        "POST",
        "/api/cp/tenants",
        Some(&json!({"slug": "big", "name": big}).to_string()),
        &[("x-queen-cp-token", CP)],
    );
    // Refused from its declared length: a 413, or the connection closed while the client was
    // still sending what the node will not read.
    match too_big {
        Ok(a) => assert_eq!(a.status, 413, "{}", a.text),
        Err(e) => assert!(
            e.contains("reset")
                || e.contains("closed")
                || e.contains("Broken pipe")
                || e.contains("os error"),
            "{e}"
        ),
    }
    // A consume-only key for beta.
    let body =
        json!({"cluster_id": beta_id, "name": "consumer", "key_hash": h2, "scopes": ["consume"]});
    let k2_made = cp(&px, "POST", "/api/cp/keys", Some(&body));
    assert_eq!(k2_made.status, 201, "{}", k2_made.text);
    let k2_again = cp(&px, "POST", "/api/cp/keys", Some(&body));
    assert_eq!(k2_again.status, 200, "{}", k2_again.text);
    assert_eq!(k2_again.json["existed"], true);
    assert_eq!(k2_again.json["id"], k2_made.json["id"]);
    let k2_id = k2_made.json["id"].as_str().expect("id").to_owned();
    let beta = Some("beta.queen.test:443");
    // Scopes per class, and a key on another cluster's host.
    assert!(eventually(Duration::from_secs(5), || pop(
        &px,
        Some(&k2),
        beta,
        "orders"
    )
    .status
        != 401));
    let beta_pop = pop(&px, Some(&k2), beta, "orders");
    // beta has no messages: acme's queue is not beta's.
    assert!(
        beta_pop.status == 204 || beta_pop.json["messages"] == json!([]),
        "{}",
        beta_pop.text
    );
    assert_code(&push(&px, Some(&k2), beta, "orders", 9), 403, "forbidden");
    assert_code(
        &call(
            &px,
            Some(&k2),
            beta,
            "GET",
            "/api/v1/resources/queues",
            None,
        ),
        403,
        "forbidden",
    );
    let mismatch = pop(&px, Some(&k2), acme, "orders");
    assert_code(&mismatch, 403, "forbidden");
    assert!(
        mismatch.text.contains("not valid for the cluster"),
        "{}",
        mismatch.text
    );
    // An unknown host falls back to the default cluster (acme).
    assert_eq!(
        push(&px, Some(&k1), Some("nowhere.test"), "drain", 4).status,
        200
    );

    // Statuses: push_blocked lets consumers drain; the tenant's suspension refuses everything.
    let acme_row = cp(&px, "GET", "/api/cp/clusters/acme", None);
    assert_eq!(acme_row.status, 200, "{}", acme_row.text);
    let acme_id = acme_row.json["id"].as_str().expect("id").to_owned();
    let blocked = cp(
        &px,
        "PUT",
        &format!("/api/cp/clusters/{acme_id}/status"),
        Some(&json!({"status": "push_blocked"})),
    );
    assert_eq!(blocked.status, 200, "{}", blocked.text);
    assert!(becomes(5, 403, || push(&px, Some(&k1), acme, "orders", 5)));
    assert_code(
        &push(&px, Some(&k1), acme, "orders", 5),
        403,
        "push_blocked",
    );
    // Without a key: 401 first, so the cluster's status is told to its keys only.
    assert_code(&push(&px, None, acme, "orders", 5), 401, "unauthorized");
    let drained = pop(&px, Some(&k1), acme, "drain");
    assert_eq!(drained.status, 200, "{}", drained.text);
    assert_eq!(
        drained.json["messages"][0]["data"]["n"], 4,
        "{}",
        drained.text
    );
    let suspended = cp(
        &px,
        "PUT",
        "/api/cp/tenants/acme/status",
        Some(&json!({"status": "suspended"})),
    );
    assert_eq!(suspended.status, 200, "{}", suspended.text);
    assert_eq!(suspended.json["clusters"][0]["id"], acme_id.as_str());
    assert!(becomes(5, 403, || pop(&px, Some(&k1), acme, "orders")));
    assert_code(
        &pop(&px, Some(&k1), acme, "orders"),
        403,
        "cluster_suspended",
    );
    assert_eq!(px.get("/health").status, 200);
    let bad_status = cp(
        &px,
        "PUT",
        "/api/cp/tenants/acme/status",
        Some(&json!({"status": "gone"})),
    );
    assert_code(&bad_status, 400, "invalid");
    for (path, status) in [
        ("/api/cp/tenants/acme/status", "active"),
        (&*format!("/api/cp/clusters/{acme_id}/status"), "active"),
    ] {
        let a = cp(&px, "PUT", path, Some(&json!({ "status": status })));
        assert_eq!(a.status, 200, "{}", a.text);
    }
    assert!(becomes(5, 200, || push(&px, Some(&k1), acme, "orders", 6)));

    // Revocation: refused within about a second.
    let revoked = cp(&px, "DELETE", &format!("/api/cp/keys/{k2_id}"), None);
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    assert_eq!(revoked.json["already_revoked"], false);
    let t = Instant::now();
    assert!(becomes(5, 401, || pop(&px, Some(&k2), beta, "orders")));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let twice = cp(&px, "DELETE", &format!("/api/cp/keys/{k2_id}"), None);
    assert_eq!(twice.json["already_revoked"], true, "{}", twice.text);
    // A revoked hash is never handed out again.
    assert_code(
        &cp(&px, "POST", "/api/cp/keys", Some(&body)),
        409,
        "conflict",
    );

    // The bootstrap route: a key in the answer once, the same ids on a retry.
    let b = json!({"tenant_slug": "gamma", "admin_email": "ops@gamma.test", "plan": "dev"});
    let first = cp(&px, "POST", "/api/cp/bootstrap", Some(&b));
    assert_eq!(first.status, 200, "{}", first.text);
    let k3 = first.json["key"].as_str().expect("a key").to_owned();
    assert!(k3.starts_with("qk_live_"), "{k3}");
    let second = cp(&px, "POST", "/api/cp/bootstrap", Some(&b));
    assert_eq!(second.json["key"], Value::Null, "{}", second.text);
    assert_eq!(second.json["key_id"], first.json["key_id"]);
    assert_eq!(second.json["cluster_id"], first.json["cluster_id"]);
    assert!(becomes(5, 200, || push(
        &px,
        Some(&k3),
        Some("gamma.queen.test"),
        "jobs",
        1
    )));
    let list = cp(&px, "GET", "/api/cp/clusters?plan=dev", None);
    let slugs: Vec<&str> = list.json["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .filter_map(|c| c["slug"].as_str())
        .collect();
    assert!(slugs.contains(&"acme") && slugs.contains(&"gamma") && !slugs.contains(&"beta"));

    // A tenant's way out: deleting, purge until done, delete; its key then opens nothing.
    assert_code(
        &cp(&px, "POST", "/api/cp/tenants/gamma/purge", None),
        409,
        "not_deleting",
    );
    assert_code(
        &cp(&px, "DELETE", "/api/cp/tenants/gamma", None),
        409,
        "not_deleting",
    );
    let deleting = cp(
        &px,
        "PUT",
        "/api/cp/tenants/gamma/status",
        Some(&json!({"status": "deleting"})),
    );
    assert_eq!(deleting.status, 200, "{}", deleting.text);
    assert!(becomes(5, 403, || push(
        &px,
        Some(&k3),
        Some("gamma.queen.test"),
        "jobs",
        2
    )));
    assert_code(
        &cp(&px, "DELETE", "/api/cp/tenants/gamma", None),
        409,
        "not_purged",
    );
    let mut passes = 0;
    let mut last = Value::Null;
    while passes < 20 {
        passes += 1;
        let p = cp(&px, "POST", "/api/cp/tenants/gamma/purge", None);
        assert_eq!(p.status, 200, "{}", p.text);
        last = p.json;
        if last["done"] == true {
            break;
        }
    }
    assert_eq!(last["done"], true, "{last}");
    assert!(
        passes >= 2,
        "the pass that deletes is followed by one that confirms: {last}"
    );
    let deleted = cp(&px, "DELETE", "/api/cp/tenants/gamma", None);
    assert_eq!(deleted.status, 200, "{}", deleted.text);
    assert_eq!(deleted.json["existed"], true);
    assert_code(
        &cp(&px, "GET", "/api/cp/clusters/gamma", None),
        404,
        "cluster_unknown",
    );
    let again = cp(&px, "DELETE", "/api/cp/tenants/gamma", None);
    assert_eq!(again.json, json!({"existed": false, "clusters": []}));
    // The key went with its cluster (the host now falls back to the default cluster).
    let gone = || push(&px, Some(&k3), Some("gamma.queen.test"), "jobs", 3);
    assert!(becomes(5, 401, gone));

    // No secret in the node's log.
    let log = node.log_text();
    for secret in [k1.as_str(), k2.as_str(), k3.as_str(), CP] {
        assert!(!log.contains(secret), "a secret reached the log");
    }
    drop(px);
}

#[test]
fn three_nodes_share_the_directory_and_a_revocation_reaches_each_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k1 = key('C');
    let mut nodes = queen_tests::three_nodes(bin(), dir.path(), "proxy-cluster-token", |_| {
        vec![
            ("QUEEN_PROXY_EMBEDDED".into(), "1".into()),
            ("QUEEN_PROXY_CP_TOKEN".into(), CP.into()),
            ("QUEEN_PROXY_DEFAULT_CLUSTER".into(), "shop".into()),
            ("QUEEN_PROXY_BOOTSTRAP_TENANT".into(), "shop".into()),
            ("QUEEN_PROXY_BOOTSTRAP_API_KEY".into(), k1.clone()),
        ]
    });
    for n in &nodes {
        assert!(
            becomes(20, 200, || push(n, Some(&k1), None, "q", 1)),
            "node {} never took the bootstrap key",
            n.port
        );
    }
    // The proxy fronts the client port itself here: membership is blocked on it.
    assert_code(
        &call(
            &nodes[0],
            Some(&k1),
            None,
            "GET",
            "/api/v1/system/raft/membership",
            None,
        ),
        404,
        "route_blocked",
    );
    // Three nodes bootstrapped the same names: one tenant, one cluster.
    let list = cp(&nodes[1], "GET", "/api/cp/clusters", None);
    assert_eq!(
        list.json["clusters"].as_array().map(Vec::len),
        Some(1),
        "{}",
        list.text
    );
    let shop_id = list.json["clusters"][0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    // A key made through node 2 works on all three; push on 1, pop on 3.
    let k2 = key('D');
    let made = cp(
        &nodes[1],
        "POST",
        "/api/cp/keys",
        Some(
            &json!({"cluster_id": shop_id, "name": "app", "key_hash": queen_tests::sha256_hex(&k2), "scopes": ["produce", "consume"]}),
        ),
    );
    assert_eq!(made.status, 201, "{}", made.text);
    let k2_id = made.json["id"].as_str().expect("id").to_owned();
    for n in &nodes {
        assert!(becomes(5, 200, || push(n, Some(&k2), None, "jobs", 7)));
    }
    let got = pop(&nodes[2], Some(&k2), None, "jobs");
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(
        got.json["messages"].as_array().map(Vec::len),
        Some(3),
        "{}",
        got.text
    );
    // Revoke through node 3; every node refuses the key within about a second.
    let revoked = cp(&nodes[2], "DELETE", &format!("/api/cp/keys/{k2_id}"), None);
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    let t = Instant::now();
    let mut last = Duration::ZERO;
    for n in &nodes {
        assert!(
            becomes(10, 401, || pop(n, Some(&k2), None, "jobs")),
            "node {} still takes a revoked key",
            n.port
        );
        last = t.elapsed();
    }
    eprintln!("revocation reached every node within {last:?}");
    assert!(last < Duration::from_secs(4), "{last:?}");
    // The bootstrap key still works everywhere.
    for n in &nodes {
        assert_eq!(push(n, Some(&k1), None, "q", 2).status, 200);
    }
    for n in &mut nodes {
        let log = n.log_text();
        assert!(!log.contains(&k1) && !log.contains(&k2) && !log.contains(CP));
    }
}

/// `curl` with the test's CA over TLS; (status, body), or the transport error.
fn curl_tls(
    ca: &Path,
    host: &str,
    port: u16,
    path: &str,
    key: &str,
    body: Option<&str>,
) -> Result<(u16, String), String> {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "--cacert"])
        .arg(ca)
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
        .args(["-H", &format!("authorization: Bearer {key}")])
        .args(["-w", "\n%{http_code}"]);
    if let Some(b) = body {
        cmd.args(["-H", "content-type: application/json", "--data", b]);
    }
    cmd.arg(format!("https://{host}:{port}{path}"));
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').ok_or("no status")?;
    Ok((
        code.trim().parse().map_err(|_| "bad status")?,
        body.to_owned(),
    ))
}

#[test]
fn tls_on_the_proxy_listener() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = dir.path().join("cert.pem");
    let key_file = dir.path().join("key.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
        ])
        .args([
            "-subj",
            "/CN=acme.queen.test",
            "-addext",
            "subjectAltName=DNS:acme.queen.test",
        ])
        .arg("-keyout")
        .arg(&key_file)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (cert_s, key_s) = (
        cert.to_string_lossy().into_owned(),
        key_file.to_string_lossy().into_owned(),
    );

    // Boot refusals: one line naming what is wrong.
    for (env, names) in [
        (
            vec![
                ("QUEEN_PROXY_EMBEDDED", "1"),
                ("QUEEN_TLS_CERT", cert_s.as_str()),
            ],
            "QUEEN_TLS_KEY",
        ),
        (
            vec![
                ("QUEEN_TLS_CERT", cert_s.as_str()),
                ("QUEEN_TLS_KEY", key_s.as_str()),
            ],
            "QUEEN_PROXY_EMBEDDED",
        ),
        (
            vec![
                ("QUEEN_PROXY_EMBEDDED", "1"),
                ("QUEEN_TLS_CERT", key_s.as_str()),
                ("QUEEN_TLS_KEY", key_s.as_str()),
            ],
            "QUEEN_TLS_CERT",
        ),
    ] {
        let out = std::process::Command::new(bin())
            .env("QUEEN_RAFT_DIR", dir.path().join("refused"))
            .env("PORT", free_port().to_string())
            .envs(env)
            .output()
            .expect("queen");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(names) && err.lines().count() == 1, "{err}");
    }

    let proxy_port = free_port();
    let k1 = key('T');
    let pp = proxy_port.to_string();
    let node = Node::start(
        bin(),
        &dir.path().join("node"),
        &[
            ("QUEEN_PROXY_EMBEDDED", "1"),
            ("QUEEN_PROXY_PORT", &pp),
            ("QUEEN_TLS_CERT", &cert_s),
            ("QUEEN_TLS_KEY", &key_s),
            ("QUEEN_PROXY_BOOTSTRAP_TENANT", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_API_KEY", &k1),
        ],
    );
    let body = json!({"items": [{"queue": "tls", "payload": {"n": 1}}]}).to_string();
    let mut last = Err(String::new());
    let ok = eventually(Duration::from_secs(20), || {
        last = curl_tls(
            &cert,
            "acme.queen.test",
            proxy_port,
            "/api/v1/push",
            &k1,
            Some(&body),
        );
        matches!(&last, Ok((200, _)))
    });
    assert!(ok, "{last:?}");
    let (status, text) = curl_tls(
        &cert,
        "acme.queen.test",
        proxy_port,
        "/api/v1/pop/queue/tls?wait=false",
        &k1,
        None,
    )
    .expect("pop");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"n\":1"), "{text}");
    // Plain HTTP on the TLS listener gets no answer; the client port stays plain HTTP.
    let px = Node::prepare(bin(), dir.path(), proxy_port, &[]);
    assert!(
        px.try_request("GET", "/health", None)
            .map_or(true, |a| a.status != 200)
    );
    assert_eq!(node.get("/health").status, 200);
    drop(px);
}

#[test]
fn plans_limits_quotas_and_usage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k1 = key('L');
    let node = Node::start(
        bin(),
        &dir.path().join("enforced"),
        &[
            ("QUEEN_PROXY_EMBEDDED", "1"),
            ("QUEEN_PROXY_ENFORCE", "true"),
            ("QUEEN_PROXY_METER_FLUSH_MS", "200"),
            ("QUEEN_PROXY_RECONCILE_MS", "200"),
            ("QUEEN_PROXY_CP_TOKEN", CP),
            ("QUEEN_PROXY_BOOTSTRAP_TENANT", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_PLAN", "free"),
            ("QUEEN_PROXY_DEFAULT_CLUSTER", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_API_KEY", &k1),
            ("QUEEN_PROXY_INVAL_POLL_MS", "100"),
        ],
    );
    let list = |k: &str| {
        call(
            &node,
            Some(k),
            None,
            "GET",
            "/api/v1/resources/queues",
            None,
        )
    };
    // Retrying a limited call spends the tokens it waits for: wait on the control plane.
    assert!(becomes(20, 200, || cp(
        &node,
        "GET",
        "/api/cp/clusters/acme",
        None
    )));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(list(&k1).status, 200);
    // The free plan: 5 requests a second, a burst of 25.
    let answers: Vec<Answer> = (0..40).map(|_| list(&k1)).collect();
    let limited: Vec<&Answer> = answers.iter().filter(|a| a.status == 429).collect();
    assert!(
        !limited.is_empty(),
        "40 requests at once within a burst of 25"
    );
    assert_eq!(
        limited[0].json["code"], "rate_limited",
        "{}",
        limited[0].text
    );
    let wait: u32 = limited[0]
        .retry_after
        .as_deref()
        .and_then(|r| r.parse().ok())
        .expect("retry-after");
    assert!((1..=60).contains(&wait), "{wait}");

    // Overrides: unlimited rates, small caps, a monthly quota, no KV.
    let id = cp(&node, "GET", "/api/cp/clusters/acme", None).json["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let bad = cp(
        &node,
        "PUT",
        &format!("/api/cp/clusters/{id}/overrides"),
        Some(&json!({"max_colour": 3})),
    );
    assert_code(&bad, 400, "invalid");
    let set = cp(
        &node,
        "PUT",
        &format!("/api/cp/clusters/{id}/overrides"),
        Some(&json!({
            "max_req_per_sec": null, "max_msgs_per_sec": null, "max_batch_items": 3,
            "max_payload_bytes": 100, "max_queues": 2, "max_retention_seconds": 3600,
            "monthly_msgs_quota": 7, "features": {"kv": false}, "max_partitions_per_queue": 2
        })),
    );
    assert_eq!(set.status, 200, "{}", set.text);
    let items = |n: usize, queue: &str, size: usize| json!({"items": (0..n).map(|_| json!({"queue": queue, "payload": "x".repeat(size)})).collect::<Vec<_>>()});
    let push_items =
        |body: &Value| call(&node, Some(&k1), None, "POST", "/api/v1/push", Some(body));
    assert!(becomes(5, 413, || push_items(&items(4, "q1", 1))));
    let a = push_items(&items(4, "q1", 1));
    assert_code(&a, 413, "payload_too_large");
    assert!(a.text.contains("items"), "{}", a.text);
    let a = push_items(&items(1, "q1", 200));
    assert_code(&a, 413, "payload_too_large");
    assert!(a.text.contains("items[0].payload"), "{}", a.text);
    // QPB1 bodies meet the same caps, counted on the messages they carry.
    let binary = |groups: &[queen_tests::TxnGroup<'_>]| {
        let auth = format!("Bearer {k1}");
        node.post_bytes_with(
            "/api/v1/push",
            "application/x-queen-push",
            &queen_tests::qpb1_txn(groups),
            &[("authorization", &auth)],
        )
    };
    let four = [("t1", "1"), ("t2", "2"), ("t3", "3"), ("t4", "4")];
    let a = binary(&[("q1", "Default", &four[..2]), ("q1", "p", &four[2..])]);
    assert_code(&a, 413, "payload_too_large");
    assert!(a.text.contains("items holds 4"), "{}", a.text);
    let big = format!("\"{}\"", "x".repeat(200));
    let a = binary(&[("q1", "Default", &[("t5", big.as_str())])]);
    assert_code(&a, 413, "payload_too_large");
    assert!(a.text.contains("items[0].payload"), "{}", a.text);
    // Two queues, not a third.
    assert_eq!(push_items(&items(1, "q1", 1)).status, 200);
    assert_eq!(push_items(&items(1, "q2", 1)).status, 200);
    assert_code(&push_items(&items(1, "q3", 1)), 403, "quota_exceeded");
    assert_code(
        &binary(&[("q3", "Default", &four[..1])]),
        403,
        "quota_exceeded",
    );
    // Two partitions of a queue, not a third (q2 has its default one).
    let part = |p: &str| json!({"items": [{"queue": "q2", "partition": p, "payload": 1}]});
    assert_eq!(push_items(&part("p2")).status, 200);
    assert_code(&push_items(&part("p3")), 403, "quota_exceeded");
    // The retention ceiling and the feature gate.
    let conf = call(
        &node,
        Some(&k1),
        None,
        "POST",
        "/api/v1/configure",
        Some(&json!({"queue": "q1", "options": {"retentionSeconds": 7200}})),
    );
    assert_code(&conf, 403, "quota_exceeded");
    let kv = call(
        &node,
        Some(&k1),
        None,
        "PUT",
        "/api/v1/kv/ns/k",
        Some(&json!({"value": 1})),
    );
    assert_code(&kv, 403, "feature_gated");
    // The monthly quota: 7 messages, 3 pushed; 4 more, then refused.
    let mut pushed = 3;
    for _ in 0..4 {
        assert_eq!(push_items(&items(1, "q1", 1)).status, 200);
        pushed += 1;
    }
    assert_eq!(pushed, 7);
    assert!(becomes(5, 403, || push_items(&items(1, "q1", 1))));
    assert_code(&push_items(&items(1, "q1", 1)), 403, "quota_exceeded");
    // Consumers are not held by the quota.
    let popped = call(
        &node,
        Some(&k1),
        None,
        "GET",
        "/api/v1/pop/queue/q1?wait=false&batch=10",
        None,
    );
    assert_eq!(popped.status, 200, "{}", popped.text);

    // Usage: the last hour by minute and op class.
    let mut usage = Value::Null;
    let ok = eventually(Duration::from_secs(10), || {
        usage = cp(&node, "GET", &format!("/api/cp/clusters/{id}/usage"), None).json;
        let sum = |op: &str, f: &str| -> u64 {
            usage["minutes"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .filter(|r| r["op"] == op)
                        .map(|r| r[f].as_u64().unwrap_or(0))
                        .sum()
                })
                .unwrap_or(0)
        };
        sum("push", "msgs") == 7 && sum("read", "reqs") >= 25 && sum("delivery", "reqs") >= 1
    });
    assert!(ok, "{usage:#}");

    // Activity: from the nodes' rows; unknown figures are null.
    let act = cp(
        &node,
        "POST",
        "/api/cp/activity",
        Some(&json!({"clusters": ["acme", "nope"]})),
    );
    assert_eq!(act.status, 200, "{}", act.text);
    let acme = &act.json["clusters"][0];
    assert!(
        acme["found"] == true
            && acme["last_activity_at"].is_string()
            && acme["first_push_at"].is_string(),
        "{}",
        act.text
    );
    assert!(
        acme["retained_bytes"].as_u64().is_some_and(|b| b > 0),
        "{}",
        act.text
    );
    assert_eq!(act.json["clusters"][1]["found"], false, "{}", act.text);
    assert!(act.json["clusters"][1]["last_activity_at"].is_null());

    // Provision: everything at once, the same ids on a retry, its overrides in force.
    let k5 = key('P');
    let user = "5d0c9a8e-1f7b-4c2e-9a55-2b7a0f3c1d42";
    let body = json!({
        "tenant_slug": "delta", "cluster_slug": "delta-main", "plan": "pro",
        "user_id": user, "email": "Ops@Delta.test", "role": "producer",
        "key_name": "app", "key_hash": queen_tests::sha256_hex(&k5), "scopes": ["produce"],
        "overrides": {"max_batch_items": 2}
    });
    let first = cp(&node, "POST", "/api/cp/provision", Some(&body));
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(
        first.json["created"],
        json!({"tenant": true, "cluster": true, "user": true, "key": true})
    );
    let again = cp(&node, "POST", "/api/cp/provision", Some(&body));
    assert_eq!(
        again.json["created"],
        json!({"tenant": false, "cluster": false, "user": false, "key": false}),
        "{}",
        again.text
    );
    for f in [
        "tenant_id",
        "cluster_id",
        "broker_tenant_uuid",
        "user_id",
        "key_id",
    ] {
        assert_eq!(first.json[f], again.json[f], "{f}");
    }
    let mut other = body.clone();
    other["user_id"] = json!("6d0c9a8e-1f7b-4c2e-9a55-2b7a0f3c1d42");
    assert_code(
        &cp(&node, "POST", "/api/cp/provision", Some(&other)),
        409,
        "conflict",
    );
    let mut bad_role = body.clone();
    bad_role["role"] = json!("owner");
    assert_code(
        &cp(&node, "POST", "/api/cp/provision", Some(&bad_role)),
        400,
        "invalid",
    );
    let three = json!({"items": [{"queue": "d", "payload": 1}, {"queue": "d", "payload": 2}, {"queue": "d", "payload": 3}]});
    let host = Some("delta-main.queen.test");
    assert!(becomes(5, 413, || call(
        &node,
        Some(&k5),
        host,
        "POST",
        "/api/v1/push",
        Some(&three)
    )));

    // The storage quota: counted from what the cluster stores, blocked above the cap, released
    // at 90% of it once the queue is deleted.
    let k6 = key('S');
    let store = json!({
        "tenant_slug": "store-co", "cluster_slug": "store", "plan": "pro",
        "user_id": "7d0c9a8e-1f7b-4c2e-9a55-2b7a0f3c1d42", "email": "ops@store.test",
        "role": "admin", "key_name": "app", "key_hash": queen_tests::sha256_hex(&k6),
        "scopes": ["produce", "consume", "admin"], "overrides": {"max_retained_bytes": 3000}
    });
    assert_eq!(
        cp(&node, "POST", "/api/cp/provision", Some(&store)).status,
        200
    );
    let host = Some("store.queen.test");
    let big = json!({"items": [{"queue": "big", "payload": "y".repeat(500)}]});
    let push_big = || call(&node, Some(&k6), host, "POST", "/api/v1/push", Some(&big));
    assert!(becomes(5, 200, push_big));
    let mut accepted = 1;
    while accepted < 20 && push_big().status == 200 {
        accepted += 1;
    }
    let refused = push_big();
    assert_code(&refused, 403, "storage_quota_exceeded");
    assert!(
        (5..=8).contains(&accepted),
        "{accepted} pushes of 500 bytes under a 3000-byte cap"
    );
    // The count, not only the estimate, keeps it blocked.
    std::thread::sleep(Duration::from_millis(600));
    assert_code(&push_big(), 403, "storage_quota_exceeded");
    // Consuming is never blocked; deleting the queue releases it.
    assert_eq!(
        call(
            &node,
            Some(&k6),
            host,
            "GET",
            "/api/v1/pop/queue/big?wait=false",
            None
        )
        .status,
        200
    );
    let del = call(
        &node,
        Some(&k6),
        host,
        "DELETE",
        "/api/v1/resources/queues/big",
        None,
    );
    assert_eq!(del.status, 200, "{}", del.text);
    assert!(becomes(10, 200, push_big), "released after the delete");

    // Shadow mode (the default): the same burst is only logged.
    let k2 = key('M');
    let shadow = Node::start(
        bin(),
        &dir.path().join("shadow"),
        &[
            ("QUEEN_PROXY_EMBEDDED", "1"),
            ("QUEEN_PROXY_BOOTSTRAP_TENANT", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_PLAN", "free"),
            ("QUEEN_PROXY_DEFAULT_CLUSTER", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_API_KEY", &k2),
        ],
    );
    let list = |k: &str| {
        call(
            &shadow,
            Some(k),
            None,
            "GET",
            "/api/v1/resources/queues",
            None,
        )
    };
    assert!(becomes(20, 200, || list(&k2)));
    assert!((0..40).all(|_| list(&k2).status == 200));
    assert!(
        shadow.log_text().contains("would_block"),
        "{}",
        shadow.log_text()
    );
}

#[test]
fn tenant_header_off_puts_every_cluster_in_the_default_tenant() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k1 = key('H');
    let node = Node::start(
        bin(),
        dir.path(),
        &[
            ("QUEEN_PROXY_EMBEDDED", "1"),
            ("QUEEN_PROXY_PORT", &free_port().to_string()),
            ("QUEEN_PROXY_TENANT_HEADER", "false"),
            ("QUEEN_PROXY_CP_TOKEN", CP),
            ("QUEEN_PROXY_DEFAULT_CLUSTER", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_TENANT", "acme"),
            ("QUEEN_PROXY_BOOTSTRAP_API_KEY", &k1),
        ],
    );
    let port: u16 = node
        .env_value("QUEEN_PROXY_PORT")
        .and_then(|p| p.parse().ok())
        .expect("port");
    let px = Node::prepare(bin(), dir.path(), port, &[]);
    assert!(becomes(20, 200, || push(&px, Some(&k1), None, "shared", 1)));
    // The bare port (the default tenant) sees the cluster's queue.
    let bare = node.get("/api/v1/resources/queues");
    assert!(bare.text.contains("\"shared\""), "{}", bare.text);
    // What would act on one cluster's broker data would act on all of them.
    for (method, path) in [
        ("GET", "/api/cp/clusters/acme/queues"),
        ("POST", "/api/cp/clusters/acme/configure"),
    ] {
        let body = json!({"queue": "shared", "options": {}});
        let a = cp(&px, method, path, (method == "POST").then_some(&body));
        assert_code(&a, 409, "system_tenant");
    }
    drop(px);
}
