//! Broker JWT on real nodes: every route family at every role level, the claim checks, HS256,
//! RS256 from a JWK set served by this test on loopback (with the bounded refetch on an unknown
//! `kid`), EdDSA from a PEM key, the raft token on membership routes, and the boot refusal
//! without key material. Keys: `tests/fixtures/jwt` (test-only).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use queen_tests::{Answer, Node};
use serde_json::{Value, json};

const SECRET: &str = "jwt-blackbox-secret-that-is-long-enough";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/jwt")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn hs(claims: &Value) -> String {
    hs_with(claims, SECRET)
}

fn hs_with(claims: &Value, secret: &str) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()).expect("a key"),
    )
    .expect("a token")
}

fn rs(claims: &Value, kid: &str) -> String {
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some(kid.to_owned());
    let key = EncodingKey::from_rsa_pem(fixture("rsa-private.pem").as_bytes()).expect("rsa key");
    jsonwebtoken::encode(&h, claims, &key).expect("a token")
}

fn ed(claims: &Value, kid: Option<&str>) -> String {
    let mut h = Header::new(Algorithm::EdDSA);
    h.kid = kid.map(str::to_owned);
    let key = EncodingKey::from_ed_pem(fixture("ed25519-private.pem").as_bytes()).expect("ed key");
    jsonwebtoken::encode(&h, claims, &key).expect("a token")
}

/// Sends `request` (its head, and no more) on a new connection to the node's port and answers
/// the response's head.
fn raw_head(port: u16, request: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    c.write_all(request.as_bytes()).expect("send");
    let mut got = Vec::new();
    let mut buf = [0_u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn call(n: &Node, method: &str, path: &str, body: Option<&Value>, token: Option<&str>) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    let text = body.map(Value::to_string);
    n.try_request_with(method, path, text.as_deref(), &headers)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// A route of each family and the level it needs.
fn routes() -> Vec<(&'static str, &'static str, Option<Value>, &'static str)> {
    vec![
        (
            "POST",
            "/api/v1/push",
            Some(json!({"items": [{"queue": "jq", "partition": "p", "payload": {"n": 1}}]})),
            "write",
        ),
        (
            "POST",
            "/api/v1/timers",
            Some(
                json!({"operations": [{"op": "schedule", "queue": "jt", "timerKey": "k", "payload": "e30=", "delayMs": 600_000}]}),
            ),
            "write",
        ),
        (
            "GET",
            "/api/v1/pop/queue/jq?batch=1&wait=false",
            None,
            "consume",
        ),
        (
            "POST",
            "/api/v1/ack",
            Some(json!({"transactionId": "t", "partitionId": "1", "status": "completed"})),
            "consume",
        ),
        (
            "POST",
            "/api/v1/ack/batch",
            Some(json!({"acknowledgments": []})),
            "consume",
        ),
        (
            "POST",
            "/api/v1/transaction",
            Some(
                json!({"operations": [{"type": "push", "items": [{"queue": "jq", "partition": "p", "payload": {"t": 1}}]}]}),
            ),
            "consume",
        ),
        (
            "POST",
            "/api/v1/kv",
            Some(
                json!({"operations": [{"op": "put", "namespace": "ns", "key": "k", "value": "v"}]}),
            ),
            "consume",
        ),
        (
            "POST",
            "/api/v1/configure",
            Some(json!({"queue": "jc"})),
            "consume",
        ),
        ("GET", "/api/v1/kv/ns/k", None, "read"),
        (
            "POST",
            "/api/v1/fetch",
            Some(json!({"entries": [{"queue": "jq", "partition": "p", "offset": 0}]})),
            "read",
        ),
        ("GET", "/api/v1/resources/queues", None, "read"),
        ("GET", "/api/v1/dlq?queue=jq", None, "read"),
        ("GET", "/api/v1/timers/jt", None, "read"),
        ("GET", "/status", None, "read"),
        ("DELETE", "/api/v1/resources/queues/jgone", None, "admin"),
        ("GET", "/api/v1/system/raft/membership", None, "admin"),
        ("GET", "/health", None, "public"),
        // The metrics name every tenant's queues: no longer skipped by default.
        ("GET", "/metrics/prometheus", None, "read"),
    ]
}

fn passes(role: &str, need: &str) -> bool {
    match need {
        "public" => true,
        "read" => matches!(role, "read-only" | "read-write" | "admin"),
        "write" => matches!(role, "write-only" | "read-write" | "admin"),
        "consume" => matches!(role, "read-write" | "admin"),
        _ => role == "admin",
    }
}

#[test]
fn every_route_family_answers_each_role_at_its_level() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        bin(),
        &dir.path().join("n"),
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_SECRET", SECRET),
            ("JWT_ISSUER", "https://idp.test"),
            ("JWT_AUDIENCE", "queen"),
            ("QUEEN_RAFT_TOKEN", "raft-token-for-the-jwt-test"),
        ],
    );
    let claims = |role: &str| json!({"sub": format!("{role}-user"), "role": role, "iss": "https://idp.test", "aud": "queen", "exp": now() + 600});
    for role in [
        "(none)",
        "(no role)",
        "read-only",
        "write-only",
        "read-write",
        "admin",
    ] {
        let token = match role {
            "(none)" => None,
            "(no role)" => Some(hs(
                &json!({"sub": "x", "iss": "https://idp.test", "aud": "queen"}),
            )),
            r => Some(hs(&claims(r))),
        };
        for (method, path, body, need) in routes() {
            let a = call(&n, method, path, body.as_ref(), token.as_deref());
            if passes(role, need) {
                assert!(
                    a.status != 401 && a.status != 403 && a.status < 500,
                    "{role} on {method} {path} ({need}) should pass: {} {}",
                    a.status,
                    a.text
                );
            } else {
                let want = if token.is_none() { 401 } else { 403 };
                assert_eq!(
                    a.status, want,
                    "{role} on {method} {path} ({need}): {}",
                    a.text
                );
                let code = if want == 401 {
                    "unauthorized"
                } else {
                    "forbidden"
                };
                assert_eq!(a.json["code"], code, "{}", a.text);
                let reason = if want == 401 {
                    "missing_token"
                } else {
                    "role_too_low"
                };
                assert_eq!(a.json["reason"], reason, "{}", a.text);
            }
        }
    }
    // A refusal sent before the body is read says the connection closes (hyper closes it, its
    // body still unread); a refused request without a body keeps the connection.
    let pending = "POST /api/v1/push HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n";
    let head = raw_head(n.port, pending);
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    let bodiless = raw_head(
        n.port,
        "GET /api/v1/resources/queues HTTP/1.1\r\nhost: q\r\n\r\n",
    );
    assert!(bodiless.starts_with("HTTP/1.1 401"), "{bodiless}");
    assert!(
        !bodiless.to_ascii_lowercase().contains("connection: close"),
        "{bodiless}"
    );

    // What the write-only producer pushed is really stored: a consumer pops it.
    let rw = hs(&claims("read-write"));
    let wo = hs(&claims("write-only"));
    let pushed = call(
        &n,
        "POST",
        "/api/v1/push",
        Some(
            &json!({"items": [{"queue": "jstored", "partition": "p", "payload": {"from": "producer"}}]}),
        ),
        Some(&wo),
    );
    assert_eq!(pushed.status, 200, "{}", pushed.text);
    let popped = call(
        &n,
        "GET",
        "/api/v1/pop/queue/jstored?batch=5&wait=false",
        None,
        Some(&rw),
    );
    assert_eq!(popped.status, 200, "{}", popped.text);
    assert_eq!(
        popped.json["messages"][0]["data"]["from"], "producer",
        "{}",
        popped.text
    );

    // The claims: each failure is a 401 that says why, and says nothing of the secret.
    let push = routes().remove(0);
    let refused = |token: &str, reason: &str| {
        let a = call(&n, push.0, push.1, push.2.as_ref(), Some(token));
        assert_eq!(
            (a.status, a.json["code"].as_str()),
            (401, Some("unauthorized")),
            "{reason}: {}",
            a.text
        );
        assert_eq!(a.json["reason"], reason, "{}", a.text);
        assert!(!a.text.contains(SECRET));
    };
    let mut c = claims("admin");
    c["exp"] = (now() - 3600).into();
    refused(&hs(&c), "expired");
    let mut c = claims("admin");
    c["nbf"] = (now() + 3600).into();
    refused(&hs(&c), "not_yet_valid");
    let mut c = claims("admin");
    c["iss"] = "https://someone-else.test".into();
    refused(&hs(&c), "wrong_issuer");
    let mut c = claims("admin");
    c["aud"] = "another-service".into();
    refused(&hs(&c), "wrong_audience");
    refused(
        &hs_with(&claims("admin"), "a-different-secret-entirely-32-bytes"),
        "bad_signature",
    );
    refused(&rs(&claims("admin"), "rsa-1"), "algorithm_not_allowed");
    refused("abc.def", "malformed");
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none"}"#),
        b64(claims("admin").to_string().as_bytes())
    );
    let a = call(&n, push.0, push.1, push.2.as_ref(), Some(&unsigned));
    assert_eq!(a.status, 401, "an unsigned token: {}", a.text);
    // A token spelled with another scheme is no token.
    let basic = n
        .try_request_with(
            "GET",
            "/status",
            None,
            &[("authorization", "Basic dXNlcjpwYXNz")],
        )
        .expect("answer");
    assert_eq!(
        (basic.status, basic.json["reason"].as_str()),
        (401, Some("missing_token"))
    );

    // The raft token is the membership routes' own credential, JWT or not.
    let m = n.admin("GET", "/api/v1/system/raft/membership", None);
    assert_eq!(m.status, 200, "{}", m.text);
    // A percent-encoded spelling of a skipped path is the same path (skipped), and no
    // spelling of a protected one is skipped.
    assert_eq!(call(&n, "GET", "/heal%74h", None, None).status, 200);
    assert_eq!(call(&n, "GET", "/health/../status", None, None).status, 401);
    assert_eq!(call(&n, "GET", "//status", None, None).status, 401);
    // The token never reaches the log.
    assert!(!n.log_text().contains(&rw) && !n.log_text().contains(SECRET));
}

fn b64(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |a, (i, &x)| a | u32::from(x) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A JWK set served over plain HTTP on loopback, counting its fetches. Stops when dropped, and
/// in any case after two minutes.
struct JwksServer {
    url: String,
    body: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl JwksServer {
    fn start(body: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}/jwks.json", listener.local_addr().expect("addr"));
        let body = Arc::new(Mutex::new(body));
        let fetches = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, f, s) = (body.clone(), fetches.clone(), stop.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(120);
            while !s.load(Ordering::Relaxed) && Instant::now() < until {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => req.extend_from_slice(&buf[..k]),
                    }
                }
                f.fetch_add(1, Ordering::SeqCst);
                let text = b.lock().expect("lock").clone();
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
            }
        });
        Self {
            url,
            body,
            fetches,
            stop,
        }
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn jwks_with(kids: &[&str]) -> String {
    let all: Value = serde_json::from_str(&fixture("jwks.json")).expect("jwks fixture");
    let keys: Vec<Value> = all["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .filter(|k| kids.contains(&k["kid"].as_str().unwrap_or("")))
        .cloned()
        .collect();
    json!({"keys": keys}).to_string()
}

#[test]
fn rs256_from_a_jwk_set_with_a_bounded_refetch_and_eddsa_from_pem() {
    let server = JwksServer::start(jwks_with(&["rsa-1"]));
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        bin(),
        &dir.path().join("auto"),
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_ALGORITHM", "auto"),
            ("JWT_SECRET", SECRET),
            ("JWT_JWKS_URL", &server.url),
        ],
    );
    let admin = json!({"sub": "ops", "roles": ["admin"]});
    assert!(server.fetches() >= 1, "the set is fetched at start");
    assert_eq!(
        call(&n, "GET", "/status", None, Some(&rs(&admin, "rsa-1"))).status,
        200
    );
    assert_eq!(
        call(&n, "GET", "/status", None, Some(&hs(&admin))).status,
        200
    );
    // An Ed25519 key the set does not have yet.
    let a = call(&n, "GET", "/status", None, Some(&ed(&admin, Some("ed-1"))));
    assert_eq!(
        (a.status, a.json["reason"].as_str()),
        (401, Some("unknown_key")),
        "{}",
        a.text
    );
    // A burst of tokens naming unknown kids costs the identity provider at most one fetch
    // per five seconds.
    let before = server.fetches();
    let started = Instant::now();
    for i in 0..40 {
        let a = call(
            &n,
            "GET",
            "/status",
            None,
            Some(&rs(&admin, &format!("forged-{i}"))),
        );
        assert_eq!(a.status, 401, "{}", a.text);
    }
    let spent = started.elapsed().as_secs();
    assert!(
        server.fetches() - before <= 1 + usize::try_from(spent / 5).unwrap_or(0),
        "{} fetches in {spent} s",
        server.fetches() - before
    );
    // The provider adds the key: after the refetch gap the next token naming it passes.
    *server.body.lock().unwrap() = jwks_with(&["rsa-1", "ed-1"]);
    std::thread::sleep(Duration::from_millis(5_500));
    let a = call(&n, "GET", "/status", None, Some(&ed(&admin, Some("ed-1"))));
    assert_eq!(a.status, 200, "{}", a.text);

    // EdDSA with a PEM key: Ed25519 tokens pass, tokens of other families do not.
    let e = Node::start(
        bin(),
        &dir.path().join("ed"),
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_ALGORITHM", "EdDSA"),
            ("JWT_PUBLIC_KEY", &fixture("ed25519-public.pem")),
        ],
    );
    assert_eq!(
        call(&e, "GET", "/status", None, Some(&ed(&admin, None))).status,
        200
    );
    for token in [rs(&admin, "rsa-1"), hs(&admin)] {
        let a = call(&e, "GET", "/status", None, Some(&token));
        assert_eq!(
            (a.status, a.json["reason"].as_str()),
            (401, Some("algorithm_not_allowed")),
            "{}",
            a.text
        );
    }
    // RS256 with a PEM key.
    let r = Node::start(
        bin(),
        &dir.path().join("rs"),
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_ALGORITHM", "RS256"),
            ("JWT_PUBLIC_KEY", &fixture("rsa-public.pem")),
        ],
    );
    assert_eq!(
        call(&r, "GET", "/status", None, Some(&rs(&admin, "any"))).status,
        200
    );
    let a = call(&r, "GET", "/status", None, Some(&ed(&admin, None)));
    assert_eq!(a.status, 401, "{}", a.text);
}

#[test]
fn jwt_without_key_material_stops_the_boot_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for (env, names) in [
        (vec![("JWT_ENABLED", "true")], "JWT_SECRET"),
        (
            vec![("JWT_ENABLED", "true"), ("JWT_ALGORITHM", "RS256")],
            "JWT_PUBLIC_KEY or JWT_JWKS_URL",
        ),
        (
            vec![
                ("JWT_ENABLED", "true"),
                ("JWT_ALGORITHM", "HS1024"),
                ("JWT_SECRET", SECRET),
            ],
            "JWT_ALGORITHM",
        ),
    ] {
        let mut n = Node::prepare(
            bin(),
            &dir.path().join("refused"),
            queen_tests::free_port(),
            &env,
        );
        n.launch();
        let status = n
            .wait_exit(Duration::from_secs(30))
            .expect("the node must refuse to start");
        assert_eq!(status.code(), Some(2), "{}", n.log_text());
        assert!(n.log_text().contains(names), "{}", n.log_text());
        assert!(!n.log_text().contains(SECRET), "{}", n.log_text());
    }
}

#[test]
fn a_tokens_tenant_claim_names_its_tenant_and_cannot_purge() {
    const A: &str = "a1a1a1a1-0000-4000-8000-00000000000a";
    const B: &str = "b2b2b2b2-0000-4000-8000-00000000000b";
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        bin(),
        &dir.path().join("n"),
        &[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)],
    );
    let token = |tenant: Option<&str>, role: &str| {
        let mut c = json!({"sub": "svc", "role": role, "exp": now() + 600});
        if let Some(t) = tenant {
            c["tenant"] = json!(t);
        }
        hs(&c)
    };
    let (a, b, plain) = (
        token(Some(A), "read-write"),
        token(Some(B), "read-write"),
        token(None, "read-write"),
    );
    for (t, who) in [(&a, "a"), (&b, "b"), (&plain, "default")] {
        let p = call(
            &n,
            "POST",
            "/api/v1/push",
            Some(
                &json!({"items": [{"queue": "orders", "transactionId": "same", "payload": {"who": who}}]}),
            ),
            Some(t),
        );
        assert_eq!(p.json[0]["status"], "queued", "{}", p.text);
    }
    for (t, who) in [(&a, "a"), (&b, "b"), (&plain, "default")] {
        let got = call(
            &n,
            "GET",
            "/api/v1/pop/queue/orders?batch=10&wait=false",
            None,
            Some(t),
        );
        let msgs = got.json["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 1, "{}", got.text);
        assert_eq!(msgs[0]["data"]["who"], who);
    }
    // A tenant claim that is not a UUID is a bad token; this node does not read the header.
    let bad = call(
        &n,
        "GET",
        "/api/v1/resources/queues",
        None,
        Some(&token(Some("acme"), "read-write")),
    );
    assert_eq!(bad.status, 401, "{}", bad.text);
    let headed = n
        .try_request_with(
            "GET",
            "/api/v1/resources/queues",
            None,
            &[
                ("authorization", &format!("Bearer {plain}")),
                ("x-queen-tenant", B),
            ],
        )
        .unwrap();
    assert_eq!(headed.status, 400, "{}", headed.text);
    // A tenant's own admin token cannot purge; an operator's token (no tenant) can.
    let purge_a = |t: &str| {
        let path = format!("/api/v1/resources/tenant?tenant={A}");
        call(&n, "DELETE", &path, None, Some(t))
    };
    let own = purge_a(&token(Some(A), "admin"));
    assert_eq!(own.status, 403, "{}", own.text);
    let op = purge_a(&token(None, "admin"));
    assert_eq!(op.status, 200, "{}", op.text);
    assert_eq!(op.json["done"], true);
    let gone = call(&n, "GET", "/api/v1/resources/queues", None, Some(&a));
    assert_eq!(
        gone.json["queues"].as_array().unwrap().len(),
        0,
        "{}",
        gone.text
    );
    let kept = call(&n, "GET", "/api/v1/resources/queues", None, Some(&b));
    assert_eq!(
        kept.json["queues"].as_array().unwrap().len(),
        1,
        "{}",
        kept.text
    );
}

#[test]
fn producer_sub_is_stamped_from_the_token_and_never_from_the_body() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(
        bin(),
        &dir.path().join("n"),
        &[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)],
    );
    let token = |sub: Option<&str>| {
        let mut c = json!({"role": "read-write", "exp": now() + 600});
        if let Some(s) = sub {
            c["sub"] = json!(s);
        }
        hs(&c)
    };
    let (alice, nobody) = (token(Some("alice")), token(None));
    // A body that names a producer is not believed: the token's sub is stamped.
    let p = call(
        &n,
        "POST",
        "/api/v1/push",
        Some(
            &json!({"items": [{"queue": "ps", "transactionId": "a1", "payload": 1, "producerSub": "mallory"}]}),
        ),
        Some(&alice),
    );
    assert_eq!(p.status, 200, "{}", p.text);
    call(
        &n,
        "POST",
        "/api/v1/push",
        Some(&json!({"items": [{"queue": "ps", "transactionId": "n1", "payload": 2}]})),
        Some(&nobody),
    );
    let t = call(
        &n,
        "POST",
        "/api/v1/transaction",
        Some(
            &json!({"operations": [{"type": "push", "items": [{"queue": "ps", "transactionId": "t1", "payload": 3}]}], "requiredLeases": []}),
        ),
        Some(&alice),
    );
    assert_eq!(t.json["success"], true, "{}", t.text);
    // A timer alice schedules delivers a message stamped with her sub (base64 of 4).
    let timer = call(
        &n,
        "POST",
        "/api/v1/timers",
        Some(
            &json!({"operations": [{"op": "schedule", "queue": "ps", "timerKey": "k", "payload": "NA==", "delayMs": 0, "txn": "z1"}]}),
        ),
        Some(&alice),
    );
    assert_eq!(timer.status, 200, "{}", timer.text);
    assert!(
        queen_tests::eventually(Duration::from_secs(20), || {
            call(&n, "GET", "/api/v1/timers/ps", None, Some(&alice)).json["rows"]
                .as_array()
                .is_some_and(Vec::is_empty)
        }),
        "the timer was not delivered"
    );
    let got = call(
        &n,
        "GET",
        "/api/v1/pop/queue/ps?batch=10&wait=false",
        None,
        Some(&alice),
    );
    let subs: Vec<(Value, Value)> = got.json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["transactionId"].clone(), m["producerSub"].clone()))
        .collect();
    assert_eq!(
        subs,
        vec![
            (json!("a1"), json!("alice")),
            (json!("n1"), Value::Null),
            (json!("t1"), json!("alice")),
            (json!("z1"), json!("alice")),
        ],
        "{}",
        got.text
    );
}
