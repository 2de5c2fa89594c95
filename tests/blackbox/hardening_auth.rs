//! Issue 59's access rules of the client port on real nodes: the metrics need a credential
//! under JWT (a JWT that names no tenant, or `QUEEN_METRICS_TOKEN`) and a request acting for a
//! tenant is refused on every node-wide route (M2, M3); a configured `iss`/`aud` is required and
//! a payload with a repeated key is refused (M4); a body a web page could send without a
//! preflight, a foreign `Origin` and a `Host` outside `QUEEN_ALLOWED_HOSTS` are refused (M5);
//! and the low ones: a foreign lease answered as an unknown one, writes to the reserved KV
//! namespaces refused, control characters refused in client names.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use queen_tests::{Answer, Node};
use serde_json::{Value, json};

const SECRET: &str = "hardening-auth-secret-that-is-long-enough";
const METRICS_TOKEN: &str = "scrape-token-for-the-hardening-test";
const RAFT_TOKEN: &str = "raft-token-for-the-hardening-test";
const A: &str = "a1a1a1a1-0000-4000-8000-00000000000a";
const B: &str = "b2b2b2b2-0000-4000-8000-00000000000b";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

fn token(claims: &Value) -> String {
    token_raw(&claims.to_string())
}

/// A token of `role`, for `tenant` when given, with the issuer and audience the JWT nodes of
/// this file expect.
fn jwt(role: &str, tenant: Option<&str>) -> String {
    let mut c = json!({"sub": "svc", "role": role, "iss": "https://idp.test", "aud": "queen",
        "exp": jsonwebtoken::get_current_timestamp() + 600});
    if let Some(t) = tenant {
        c["tenant"] = json!(t);
    }
    token(&c)
}

/// A token whose payload is `payload` exactly as written, repeated keys included (no `json!`
/// value can hold a repeat).
fn token_raw(payload: &str) -> String {
    let raw = serde_json::value::RawValue::from_string(payload.to_owned()).expect("JSON");
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &raw,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("a key"),
    )
    .expect("a token")
}

fn get(n: &Node, path: &str, headers: &[(&str, &str)]) -> Answer {
    n.try_request_with("GET", path, None, headers)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

/// One request written as bytes on its own connection (`connection: close`): the status and
/// the answer's JSON. The head is the caller's, so `Host`, `Origin` and `Content-Type` are
/// exactly what a browser would send.
fn raw(port: u16, head: &str, body: &str) -> (u16, Value) {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let req = format!(
        "{head}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).expect("send");
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

#[test]
fn metrics_need_a_credential_and_a_tenant_gets_403_on_every_node_wide_route() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        bin(),
        &dir.path().join("n"),
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_SECRET", SECRET),
            ("JWT_ISSUER", "https://idp.test"),
            ("JWT_AUDIENCE", "queen"),
            ("QUEEN_RAFT_TOKEN", RAFT_TOKEN),
            ("QUEEN_METRICS_TOKEN", METRICS_TOKEN),
            // `/metrics` skipped by the operator (not `/metrics/prometheus`): a tenant's
            // token is still refused there.
            ("JWT_SKIP_PATHS", "/health,/,/metrics"),
        ],
    );
    // A tenant's queue, so the sink's and the queues' series would carry its names.
    let tenant_admin = bearer(&jwt("admin", Some(A)));
    let push = n
        .try_request_with(
            "POST",
            "/api/v1/push",
            Some(&json!({"items": [{"queue": "tenant-secret-queue", "payload": 1}]}).to_string()),
            &[("authorization", &tenant_admin)],
        )
        .unwrap();
    assert_eq!(push.status, 200, "{}", push.text);

    // No credential: 401 (was 200 under the old default skip list).
    let open = get(&n, "/metrics/prometheus", &[]);
    assert_eq!(
        (open.status, open.json["reason"].as_str()),
        (401, Some("missing_token")),
        "{}",
        open.text
    );
    // The scrape token, and an operator's JWT (no tenant), read it.
    let scraped = get(
        &n,
        "/metrics/prometheus",
        &[("authorization", &bearer(METRICS_TOKEN))],
    );
    assert_eq!(scraped.status, 200, "{}", scraped.text);
    let operator = bearer(&jwt("read-only", None));
    assert_eq!(
        get(&n, "/metrics/prometheus", &[("authorization", &operator)]).status,
        200
    );
    // The scrape token is no JWT: it opens nothing else.
    let other = get(
        &n,
        "/api/v1/resources/queues",
        &[("authorization", &bearer(METRICS_TOKEN))],
    );
    assert_eq!(other.status, 401, "{}", other.text);

    // A tenant's admin token: 403 on every node-wide route (the raft routes answered 200).
    for path in [
        "/metrics/prometheus",
        "/metrics",
        "/status",
        "/api/v1/system/raft/nodes",
        "/api/v1/system/raft/membership",
    ] {
        let r = get(&n, path, &[("authorization", &tenant_admin)]);
        assert_eq!(r.status, 403, "{path}: {}", r.text);
        assert!(
            !r.text.contains("tenant-secret-queue"),
            "{path}: {}",
            r.text
        );
    }
    // The skipped `/metrics` still opens without a token, and the raft token does not let a
    // tenant's token through either.
    assert_eq!(get(&n, "/metrics", &[]).status, 200);
    let both = get(
        &n,
        "/api/v1/system/raft/membership",
        &[
            ("authorization", &tenant_admin),
            ("x-queen-raft-token", RAFT_TOKEN),
        ],
    );
    assert_eq!(both.status, 403, "{}", both.text);
    // The operator's admin token and the raft token alone keep their access.
    let op_admin = bearer(&jwt("admin", None));
    let nodes = get(
        &n,
        "/api/v1/system/raft/nodes",
        &[("authorization", &op_admin)],
    );
    assert_eq!(nodes.status, 200, "{}", nodes.text);
    let m = get(
        &n,
        "/api/v1/system/raft/membership",
        &[("x-queen-raft-token", RAFT_TOKEN)],
    );
    assert_eq!(m.status, 200, "{}", m.text);
    assert!(!n.log_text().contains(METRICS_TOKEN));
}

#[test]
fn a_configured_issuer_and_audience_are_required_and_a_repeated_claim_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        bin(),
        &dir.path().join("n"),
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_SECRET", SECRET),
            ("JWT_ISSUER", "https://idp.test"),
            ("JWT_AUDIENCE", "queen"),
        ],
    );
    let exp = jsonwebtoken::get_current_timestamp() + 600;
    let reason = |t: &str| {
        let r = get(
            &n,
            "/api/v1/resources/queues",
            &[("authorization", &bearer(t))],
        );
        (r.status, r.json["reason"].as_str().unwrap_or("").to_owned())
    };
    let cases = [
        (
            json!({"role": "admin", "aud": "queen", "exp": exp}),
            "wrong_issuer",
        ),
        (
            json!({"role": "admin", "iss": "https://idp.test", "exp": exp}),
            "wrong_audience",
        ),
        (
            json!({"role": "admin", "iss": "https://idp.test", "aud": null, "exp": exp}),
            "wrong_audience",
        ),
        (
            json!({"role": "admin", "iss": null, "aud": "queen", "exp": exp}),
            "wrong_issuer",
        ),
    ];
    for (claims, want) in cases {
        assert_eq!(reason(&token(&claims)), (401, want.to_owned()), "{claims}");
    }
    assert_eq!(reason(&jwt("read-only", None)).0, 200);

    // `{"role":"read-only","role":"admin"}`: signed as written, refused (was read as admin).
    let claims =
        |rest: &str| format!(r#"{{"iss":"https://idp.test","aud":"queen","exp":{exp},{rest}}}"#);
    let membership = |t: &str| {
        get(
            &n,
            "/api/v1/system/raft/membership",
            &[("authorization", &bearer(t))],
        )
    };
    let r = membership(&token_raw(&claims(r#""role":"read-only","role":"admin""#)));
    assert_eq!(
        (r.status, r.json["reason"].as_str()),
        (401, Some("bad_claims")),
        "{}",
        r.text
    );
    let nested = token_raw(&claims(r#""role":"admin","x":{"a":1,"a":2}"#));
    assert_eq!(reason(&nested), (401, "bad_claims".to_owned()));
    let once = token_raw(&claims(r#""role":"admin","x":{"a":1}"#));
    assert_eq!(membership(&once).status, 200);
}

#[test]
fn browser_bodies_origins_and_hosts_are_refused_on_the_client_port() {
    let dir = tempfile::tempdir().unwrap();
    let port = queen_tests::free_port();
    let hosts = format!("127.0.0.1:{port},queen.test:{port}");
    let mut n = Node::prepare(
        bin(),
        &dir.path().join("n"),
        port,
        &[
            ("QUEEN_ALLOWED_HOSTS", &hosts),
            ("QUEEN_ALLOWED_ORIGINS", "https://ops.example.com"),
            ("QUEEN_METRICS_TOKEN", METRICS_TOKEN),
        ],
    );
    n.restart();
    let host = format!("host: 127.0.0.1:{port}");
    let push = |q: &str| json!({"items": [{"queue": q, "payload": 1}]}).to_string();

    // A JSON body sent as a page's form or text: 415, and nothing stored.
    for t in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    ] {
        let head = format!("POST /api/v1/push HTTP/1.1\r\n{host}\r\ncontent-type: {t}");
        let (status, body) = raw(port, &head, &push("cross-site"));
        assert_eq!(status, 415, "{t}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap_or("")
                .contains("content-type"),
            "{body}"
        );
    }
    let head = format!("POST /api/v1/push HTTP/1.1\r\n{host}");
    assert_eq!(
        raw(port, &head, &push("cross-site")).0,
        415,
        "no content type"
    );
    let head = format!("PUT /api/v1/kv/app/k HTTP/1.1\r\n{host}\r\ncontent-type: text/plain");
    assert_eq!(raw(port, &head, r#"{"value":1,"forever":true}"#).0, 415);
    let queues = n.get("/api/v1/resources/queues");
    assert!(
        !queues.text.contains("cross-site"),
        "nothing was stored: {}",
        queues.text
    );
    // JSON (with a charset) and the binary type pass the rule; bodiless requests need none.
    let head = format!(
        "POST /api/v1/push HTTP/1.1\r\n{host}\r\ncontent-type: application/json; charset=utf-8"
    );
    assert_eq!(raw(port, &head, &push("fine")).0, 200);
    let head =
        format!("POST /api/v1/push HTTP/1.1\r\n{host}\r\ncontent-type: application/x-queen-push");
    let (status, _) = raw(port, &head, "not a frame");
    assert_eq!(status, 400, "read as a binary body, not refused as a type");
    let head = format!("DELETE /api/v1/kv/app/k HTTP/1.1\r\n{host}");
    assert_eq!(raw(port, &head, "").0, 200);
    let head = format!("POST /api/v1/stats/refresh HTTP/1.1\r\n{host}");
    assert_eq!(raw(port, &head, "").0, 200);

    // Origin: another site's page is refused; the node's own page and a listed origin pass.
    let with_origin = |origin: &str, host_line: &str| {
        let head = format!(
            "POST /api/v1/push HTTP/1.1\r\n{host_line}\r\norigin: {origin}\r\ncontent-type: application/json"
        );
        raw(port, &head, &push("origin"))
    };
    let (status, body) = with_origin("http://evil.example", &host);
    assert_eq!(
        (status, body["reason"].as_str()),
        (403, Some("origin_not_allowed")),
        "{body}"
    );
    assert_eq!(with_origin("null", &host).0, 403);
    assert_eq!(
        with_origin(&format!("http://127.0.0.1:{port}"), &host).0,
        200
    );
    assert_eq!(
        with_origin(
            &format!("http://queen.test:{port}"),
            &format!("host: queen.test:{port}")
        )
        .0,
        200
    );
    assert_eq!(with_origin("https://ops.example.com", &host).0, 200);
    let head =
        format!("GET /api/v1/resources/queues HTTP/1.1\r\n{host}\r\norigin: http://evil.example");
    assert_eq!(raw(port, &head, "").0, 403, "a cross-site read too");

    // Host: a rebound name is refused with a JSON error, reads and writes alike.
    let head = format!("GET /api/v1/resources/queues HTTP/1.1\r\nhost: rebound.example:{port}");
    let (status, body) = raw(port, &head, "");
    assert_eq!(
        (status, body["code"].as_str()),
        (421, Some("misdirected_request")),
        "{body}"
    );
    let head = format!(
        "POST /api/v1/push HTTP/1.1\r\nhost: rebound.example:{port}\r\norigin: http://rebound.example:{port}\r\ncontent-type: application/json"
    );
    assert_eq!(raw(port, &head, &push("rebound")).0, 421);

    // Without JWT, the scrape token closes the metrics.
    assert_eq!(n.get("/metrics/prometheus").status, 401);
    let m = get(
        &n,
        "/metrics/prometheus",
        &[("authorization", &bearer(METRICS_TOKEN))],
    );
    assert_eq!(m.status, 200, "{}", m.text);
    assert_eq!(n.get("/health").status, 200);
}

#[test]
fn foreign_leases_reserved_namespaces_and_control_bytes_in_names() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        bin(),
        &dir.path().join("n"),
        &[
            ("QUEEN_TENANCY_HEADER", "true"),
            ("QUEEN_KV_TRUSTED_PROXY", "1"),
        ],
    );
    let as_tenant = |t: &str, method: &str, path: &str, body: Option<&Value>| {
        let text = body.map(Value::to_string);
        n.try_request_with(method, path, text.as_deref(), &[("x-queen-tenant", t)])
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    };
    // B holds a live lease.
    let p = as_tenant(
        B,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "jobs", "payload": 1}]})),
    );
    assert_eq!(p.status, 200, "{}", p.text);
    let popped = as_tenant(B, "GET", "/api/v1/pop/queue/jobs?batch=1&wait=false", None);
    let lease = popped.json["messages"][0]["leaseId"]
        .as_str()
        .unwrap_or_else(|| panic!("a lease: {}", popped.text))
        .to_owned();
    let txn = |l: &str| json!({"operations": [{"type": "push", "items": [{"queue": "out", "payload": 1}]}], "requiredLeases": [l]});
    let unknown_id = "00000000-0000-4000-8000-000000000000";
    let foreign = as_tenant(A, "POST", "/api/v1/transaction", Some(&txn(&lease)));
    let unknown = as_tenant(A, "POST", "/api/v1/transaction", Some(&txn(unknown_id)));
    assert_eq!(
        foreign.status, unknown.status,
        "{} / {}",
        foreign.text, unknown.text
    );
    assert_eq!(foreign.json["success"], false, "{}", foreign.text);
    assert_eq!(
        foreign.json["error"]
            .as_str()
            .map(|e| e.replace(&lease, "L")),
        unknown.json["error"]
            .as_str()
            .map(|e| e.replace(unknown_id, "L")),
        "{} / {}",
        foreign.text,
        unknown.text
    );
    // The lease still works for its own tenant.
    let own = as_tenant(B, "POST", "/api/v1/transaction", Some(&txn(&lease)));
    assert_eq!(own.json["success"], true, "{}", own.text);

    // Reserved namespaces: writes refused on both KV forms, naming the namespace.
    for ns in ["queen-locks", "queen-streams", "queen-traces"] {
        let r = as_tenant(
            A,
            "PUT",
            &format!("/api/v1/kv/{ns}/x"),
            Some(&json!({"value": 1, "forever": true})),
        );
        assert_eq!(r.status, 400, "{ns}: {}", r.text);
        assert!(
            r.json["error"].as_str().unwrap_or("").contains(ns),
            "{}",
            r.text
        );
        let ops = json!({"operations": [{"op": "put", "ns": ns, "key": "permit/0", "value": 1, "forever": true}]});
        let r = as_tenant(A, "POST", "/api/v1/kv", Some(&ops));
        assert_eq!(r.status, 400, "{ns}: {}", r.text);
        assert!(
            r.json["error"]
                .as_str()
                .unwrap_or("")
                .starts_with("operations[0].ns"),
            "{}",
            r.text
        );
    }
    // A lock's guard (a check on queen-locks) still rides a transaction.
    let lock = as_tenant(
        A,
        "POST",
        "/api/v1/locks",
        Some(&json!({"operations": [{"op": "acquire", "name": "nightly", "ttlSeconds": 30}]})),
    );
    let guard = lock.json["results"][0]["guard"].clone();
    assert!(guard.is_object(), "{}", lock.text);
    let guarded = as_tenant(
        A,
        "POST",
        "/api/v1/transaction",
        Some(
            &json!({"operations": [{"type": "push", "items": [{"queue": "out", "payload": 2}]}], "requiredLeases": [], "kv": [guard]}),
        ),
    );
    assert_eq!(guarded.json["success"], true, "{}", guarded.text);

    // Control characters in client names: 400 naming the field.
    let cases = [
        (
            "/streams/v1/queries",
            json!({"name": "q\u{1}x", "source_queue": "src", "config_hash": "h1"}),
            "name",
        ),
        (
            "/api/v1/timers",
            json!({"operations": [{"op": "schedule", "queue": "tq", "timerKey": "k\u{7}", "payload": "e30=", "delayMs": 1000}]}),
            "operations[0].timerKey",
        ),
        (
            "/api/v1/kv",
            json!({"operations": [{"op": "put", "ns": "app", "key": "k\u{1b}[31m", "value": 1, "forever": true}]}),
            "operations[0].key",
        ),
        (
            "/api/v1/traces",
            json!({"transactionId": "t", "partitionId": "p", "traceNames": ["n\u{0}"], "data": {}}),
            "traceNames",
        ),
        (
            "/api/v1/locks",
            json!({"operations": [{"op": "acquire", "name": "l\u{8}", "ttlSeconds": 5}]}),
            "operations[0].name",
        ),
        (
            "/api/v1/configure",
            json!({"queue": "cq", "namespace": "n\u{1}"}),
            "namespace",
        ),
        (
            "/api/v1/push",
            json!({"items": [{"queue": "q\u{1}", "payload": 1}]}),
            "queue",
        ),
    ];
    for (path, body, field) in cases {
        let r = as_tenant(A, "POST", path, Some(&body));
        assert_eq!(r.status, 400, "{path}: {}", r.text);
        let e = r.json["error"].as_str().unwrap_or("");
        assert!(e.contains(field), "{path}: {field} not named in {}", r.text);
    }
}
