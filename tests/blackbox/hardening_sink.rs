//! Issue 59, H2: a tenant's sink endpoint cannot make a node reach its own loopback, the
//! private network or a metadata service (SSRF), and no answer of a peer comes back to anyone.
//! A tiny HTTP listener on a loopback port records every request and answers 403 with a
//! recognisable body; the control plane refuses literal private addresses, user names and
//! passwords, queries, fragments, paths and bad bucket names with 400 naming the field; a name
//! that resolves to loopback is accepted but never connected to; and with private endpoints
//! allowed by the operator, the listener's body shows nowhere (status, dashboard sources, the
//! control plane's answer, the log), only a status and a class.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_tests::{Answer, Node, eventually, free_port};
use serde_json::{Value, json};

const CP: &str = "cp-token-of-the-hardening-sink-test-0000";
const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const SECRET: &str = "sink-secret-that-must-never-show-0001";
/// What the listener answers: must never come back through the node.
const CANARY: &str = "CANARY-ROLE-CREDENTIALS-h59-9f3a";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// A loopback HTTP listener that records each request's first line and answers 403 with the
/// canary in its body; stopped (its thread joined) on drop.
struct Listener {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    fn start() -> Listener {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let port = l.local_addr().expect("addr").port();
        // The same port on [::1] too when the machine has IPv6, so `localhost` is covered both
        // ways; a machine without it has nothing there to reach either.
        let l6 = TcpListener::bind(("::1", port)).ok();
        if let Some(l6) = &l6 {
            l6.set_nonblocking(true).expect("nonblocking");
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let body = format!(
                "<Error><Code>AccessDenied</Code><Message>{CANARY}</Message><RequestId>{CANARY}</RequestId></Error>"
            );
            while !st.load(Ordering::SeqCst) {
                let got = l.accept().ok().or_else(|| l6.as_ref()?.accept().ok());
                let Some((mut conn, _)) = got else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = vec![0u8; 8192];
                let n = conn.read(&mut buf).unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]);
                s.lock()
                    .expect("lock")
                    .push(head.lines().next().unwrap_or("").to_owned());
                let _ = conn.write_all(
                    format!(
                        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        Listener {
            port,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("lock").clone()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One node with the proxy, its control plane and the embedded sink (the node's own sink in a
/// local folder, the operator's trusted choice), plus `extra`; and the proxy port's handle.
fn start(dir: &Path, extra: &[(&str, &str)]) -> (Node, Node) {
    let lake = format!("file://{}", dir.join("lake").display());
    let proxy_port = free_port().to_string();
    let mut env: Vec<(&str, &str)> = queen_tests::folder_sink_env(&lake);
    env.extend([
        ("QUEEN_PROXY_EMBEDDED", "1"),
        ("QUEEN_PROXY_PORT", proxy_port.as_str()),
        ("QUEEN_PROXY_CP_TOKEN", CP),
        ("QUEEN_ENCRYPTION_KEY", KEY),
    ]);
    env.extend_from_slice(extra);
    let node = Node::start(bin(), &dir.join("data"), &env);
    let px = Node::prepare(
        bin(),
        &dir.join("px"),
        proxy_port.parse().expect("port"),
        &[],
    );
    (node, px)
}

fn cp(px: &Node, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let text = body.map(Value::to_string);
    px.try_request_with(method, path, text.as_deref(), &[("x-queen-cp-token", CP)])
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn bootstrap(px: &Node, slug: &str) {
    let b = cp(
        px,
        "POST",
        "/api/cp/bootstrap",
        Some(
            &json!({"tenant_slug": slug, "admin_email": format!("ops@{slug}.test"), "plan": "pro"}),
        ),
    );
    assert_eq!(b.status, 200, "{}", b.text);
}

fn sink(endpoint: &str, bucket: &str) -> Value {
    json!({
        "endpoint": endpoint,
        "region": "us-east-1",
        "pathStyle": true,
        "bucket": bucket,
        "accessKey": "AKIDEXAMPLE",
        "secretKey": SECRET,
        "queues": "*",
    })
}

/// The control plane's sink row of `cluster` on the node's status page.
fn cp_row(n: &Node, cluster: &str) -> Value {
    n.get("/status").json["s3"]["sinks"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["cluster"] == cluster).cloned())
        .unwrap_or(Value::Null)
}

/// Everything the node shows about its sinks: the status page and the dashboard's other source
/// (both polled by the dashboard's sink view), the control plane's answer and the log.
fn everything_shown(n: &Node, px: &Node, cluster: &str) -> String {
    [
        n.get("/status").text,
        n.get("/api/v1/system/raft/nodes").text,
        cp(px, "GET", &format!("/api/cp/clusters/{cluster}/s3"), None).text,
        n.log_text(),
    ]
    .join("\n")
}

#[test]
fn tenant_sink_endpoints_on_private_addresses_and_bad_buckets_are_refused_with_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let listener = Listener::start();
    let (node, px) = start(dir.path(), &[]);
    bootstrap(&px, "acme");
    let p = listener.port;
    let own = node.port;
    let endpoints = [
        format!("http://127.0.0.1:{p}"),
        format!("http://[::1]:{p}"),
        format!("http://127.1:{p}"),
        format!("http://0x7f.0.0.1:{p}"),
        format!("http://2130706433:{p}"),
        format!("http://[::ffff:127.0.0.1]:{p}"),
        format!("http://127.0.0.1:{own}"),
        "http://169.254.169.254".to_owned(),
        "http://[::ffff:169.254.169.254]".to_owned(),
        "http://[fd00:ec2::254]".to_owned(),
        "http://10.0.0.1:9000".to_owned(),
        "http://192.168.1.1".to_owned(),
        "http://0.0.0.0:6632".to_owned(),
        "http://admin:pass-canary-7781@s3.example.com".to_owned(),
        "https://s3.example.com/?X-Amz-Security-Token=1".to_owned(),
        "https://s3.example.com/#fragment".to_owned(),
        "https://s3.example.com/latest/meta-data/iam/security-credentials/role".to_owned(),
        "ftp://s3.example.com".to_owned(),
        "https://s3.exam ple.com".to_owned(),
    ];
    for e in &endpoints {
        let a = cp(
            &px,
            "PUT",
            "/api/cp/clusters/acme/s3",
            Some(&sink(e, "acme-lake")),
        );
        assert_eq!(a.status, 400, "{e}: {}", a.text);
        assert_eq!(a.json["code"], "invalid", "{e}: {}", a.text);
        let message = a.json["error"].as_str().unwrap_or("");
        assert!(message.starts_with("endpoint "), "{e}: {}", a.text);
        assert!(!a.text.contains("pass-canary"), "{e}: {}", a.text);
        assert!(!a.text.contains(SECRET), "{e}: {}", a.text);
    }
    for b in [
        "acme/lake",
        "acme?lake",
        "acme#lake",
        "acme..lake",
        "../acme",
        "AcmeLake",
        "ab",
        "10.0.0.1",
        "-acme",
        &"a".repeat(64),
    ] {
        let a = cp(
            &px,
            "PUT",
            "/api/cp/clusters/acme/s3",
            Some(&sink("https://s3.example.com", b)),
        );
        assert_eq!(a.status, 400, "{b}: {}", a.text);
        let message = a.json["error"].as_str().unwrap_or("");
        assert!(message.starts_with("bucket "), "{b}: {}", a.text);
    }
    assert_eq!(
        cp(&px, "GET", "/api/cp/clusters/acme/s3", None).json["code"],
        "s3_unset"
    );

    // A name is judged where it is resolved, at each connection: `localhost` is stored, the
    // sink starts, and its probe is refused before any connection.
    let ok = cp(
        &px,
        "PUT",
        "/api/cp/clusters/acme/s3",
        Some(&sink(&format!("http://localhost:{p}"), "acme-lake")),
    );
    assert_eq!(ok.status, 200, "{}", ok.text);
    let mut row = Value::Null;
    let refused = eventually(Duration::from_secs(60), || {
        row = cp_row(&node, "acme");
        row["bucket"]["failure"]["reason"] == "refused_address"
    });
    assert!(refused, "no refused_address in {row}");
    assert_eq!(row["bucket"]["failure"]["status"], 0, "{row}");
    assert_eq!(row["bucket"]["reachable"], false, "{row}");
    // A few more probes' worth of time: still nothing reached the listener.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until && listener.seen().is_empty() {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(listener.seen(), Vec::<String>::new(), "the node connected");
    let shown = everything_shown(&node, &px, "acme");
    assert!(!shown.contains(SECRET), "the secret shows");
    assert!(!shown.contains("pass-canary"), "a password shows");
    drop(node);
}

#[test]
fn a_peers_answer_is_never_reflected_only_its_status_and_class() {
    let dir = tempfile::tempdir().expect("tempdir");
    let listener = Listener::start();
    // The operator allows private endpoints: the tenant's loopback endpoint is reached.
    let (node, px) = start(dir.path(), &[("QUEEN_S3_ALLOW_PRIVATE_ENDPOINTS", "true")]);
    bootstrap(&px, "acme");
    let a = cp(
        &px,
        "PUT",
        "/api/cp/clusters/acme/s3",
        Some(&sink(
            &format!("http://127.0.0.1:{}", listener.port),
            "acme-lake",
        )),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    // The probe reached the listener and its failure is on the status page.
    let mut row = Value::Null;
    let reached = eventually(Duration::from_secs(60), || {
        row = cp_row(&node, "acme");
        !listener.seen().is_empty() && row["bucket"]["error"].is_string()
    });
    assert!(reached, "no failed probe: {row}");
    let seen = listener.seen();
    assert!(
        seen.iter().any(|l| l.starts_with("GET /acme-lake")),
        "the listener saw {seen:?}"
    );
    let shown = everything_shown(&node, &px, "acme");
    assert!(
        !shown.contains(CANARY),
        "the peer's body shows: {}",
        row["bucket"]
    );
    assert!(!shown.contains(SECRET), "the secret shows");
    assert_eq!(row["bucket"]["failure"]["status"], 403, "{row}");
    assert_eq!(row["bucket"]["failure"]["reason"], "access_denied", "{row}");
    drop(node);
}
