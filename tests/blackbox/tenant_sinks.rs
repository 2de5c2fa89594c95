//! A bucket per tenant, end to end on three nodes (two tenants in buckets of their own, two
//! sharing one): the control plane stores each cluster's sink
//! with its secret sealed, every node runs one sink per tenant from those rows, the objects land
//! in each cluster's own bucket under its broker tenant, the node's own sink keeps the default
//! tenant, a node with another encryption key shows that tenant's sink in phase `error` while
//! the others ship, and no secret reaches an answer, a log line or a data file.

use std::path::Path;
use std::time::Duration;

use queen_tests::s3::{self, S3Server};
use queen_tests::{Answer, Node, eventually, files_holding, free_port};
use serde_json::{Value, json};

const CP: &str = "cp-token-of-the-tenant-sink-test-000000";
const KEY_A: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const KEY_B: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
const ACME_SECRET: &str = "acme-secret-that-must-never-show-0001";
const ACME_SECRET_2: &str = "acme-secret-rotated-never-shown-0002";
const BETA_SECRET: &str = "beta-secret-that-must-never-show-0003";
const GAMMA_SECRET: &str = "gamma-secret-that-must-never-show-004";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

fn cp(via: &Node, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let text = body.map(Value::to_string);
    via.try_request_with(method, path, text.as_deref(), &[("x-queen-cp-token", CP)])
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// Push `n` through `via`; a cluster or key made a moment ago through another node is known
/// to every node within about a second, so 421 and 401 are retried for a few seconds.
fn push(via: &Node, key: &str, host: &str, n: u64) {
    let auth = format!("Bearer {key}");
    let body =
        json!({"items": [{"queue": "orders", "partition": "p", "payload": {"n": n}}]}).to_string();
    let mut last = None;
    let ok = eventually(Duration::from_secs(5), || {
        let a = via
            .try_request_with(
                "POST",
                "/api/v1/push",
                Some(&body),
                &[("authorization", &auth), ("host", host)],
            )
            .expect("push");
        let status = a.status;
        last = Some(a);
        status != 421 && status != 401
    });
    let a = last.expect("an answer");
    assert!(ok && a.status == 200, "{}", a.text);
}

/// The records of `bucket` under the `queen` prefix, as DuckDB reads them: (tenant, n).
fn records(server: &S3Server, bucket: &str) -> Vec<(String, u64)> {
    let args = [server.lake_args(bucket), vec!["--prefix", "queen"]].concat();
    let Ok(lake) = s3::try_read_lake(&args) else {
        return Vec::new();
    };
    lake["duckdb"]["records"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| {
                    let payload: Value =
                        serde_json::from_str(r[5].as_str().unwrap_or("null")).unwrap_or_default();
                    (
                        r[0].as_str().unwrap_or("").to_owned(),
                        payload["n"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn sink_body(server: &S3Server, bucket: &str, secret: Option<&str>, format: &str) -> Value {
    let mut b = json!({
        "endpoint": server.endpoint,
        "region": s3::REGION,
        "pathStyle": true,
        "bucket": bucket,
        "accessKey": s3::ACCESS_KEY,
        "queues": "*",
        "format": format,
        "start": "earliest",
        "maxWindowMs": 1000,
        "safeGuardMs": 500,
        "checkpointEvery": 1,
    });
    if let Some(s) = secret {
        b["secretKey"] = json!(s);
    }
    b
}

/// The control plane's sink rows on a node's status page.
fn cp_sinks(n: &Node) -> Vec<Value> {
    n.get("/status").json["s3"]["sinks"]
        .as_array()
        .map(|a| a.iter().filter(|s| s["source"] == "cp").cloned().collect())
        .unwrap_or_default()
}

#[test]
fn a_bucket_per_tenant_through_the_control_plane() {
    let server = S3Server::start();
    for b in ["lake", "acme-lake", "beta-lake"] {
        server.create_bucket(b);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let env = s3::sink_env(
        &server.endpoint,
        "orders",
        &[
            ("QUEEN_S3_LEASE_TTL_MS", "3000".into()),
            ("QUEEN_S3_CHECKPOINT_EVERY", "1".into()),
            // The test's S3 server is on loopback: tenant endpoints there are allowed.
            ("QUEEN_S3_ALLOW_PRIVATE_ENDPOINTS", "true".into()),
        ],
    );
    let nodes = queen_tests::three_nodes(bin(), dir.path(), "tenant-sink-token", |i| {
        let mut e: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        e.extend([
            ("QUEEN_PROXY_EMBEDDED".into(), "1".into()),
            ("QUEEN_PROXY_PORT".into(), proxy_ports[i].to_string()),
            ("QUEEN_PROXY_CP_TOKEN".into(), CP.into()),
            // Node 3 holds another key: it cannot open the secrets the others sealed.
            (
                "QUEEN_ENCRYPTION_KEY".into(),
                if i == 2 { KEY_B } else { KEY_A }.into(),
            ),
        ]);
        e
    });
    let px: Vec<Node> = proxy_ports
        .iter()
        .map(|p| Node::prepare(bin(), dir.path(), *p, &[]))
        .collect();

    // Three clusters with a key each; gamma shares acme's bucket.
    let mut keys = Vec::new();
    let mut tenants = Vec::new();
    for slug in ["acme", "beta", "gamma"] {
        let b = cp(
            &px[0],
            "POST",
            "/api/cp/bootstrap",
            Some(
                &json!({"tenant_slug": slug, "admin_email": format!("ops@{slug}.test"), "plan": "pro"}),
            ),
        );
        assert_eq!(b.status, 200, "{}", b.text);
        keys.push(b.json["key"].as_str().expect("key").to_owned());
        tenants.push(
            b.json["broker_tenant_uuid"]
                .as_str()
                .expect("uuid")
                .to_owned(),
        );
    }

    // The sink's own rules, before anything is stored; the secret is needed the first time.
    let mut answers = Vec::new();
    for (body, field) in [
        (sink_body(&server, "beta-lake", None, "jsonl"), "secretKey"),
        (
            {
                let mut b = sink_body(&server, "beta-lake", Some(BETA_SECRET), "jsonl");
                b["memoryMb"] = json!(64);
                b
            },
            "memoryMb",
        ),
        (
            {
                let mut b = sink_body(&server, "beta-lake", Some(BETA_SECRET), "jsonl");
                b["apiToken"] = json!("x");
                b
            },
            "apiToken",
        ),
        (
            {
                let mut b = sink_body(&server, "beta-lake", Some(BETA_SECRET), "jsonl");
                b["colour"] = json!("red");
                b
            },
            "colour",
        ),
        (
            {
                let mut b = sink_body(&server, "beta-lake", Some(BETA_SECRET), "jsonl");
                b["maxWindowMs"] = json!(50);
                b
            },
            "maxWindowMs",
        ),
        (
            {
                let mut b = sink_body(&server, "beta-lake", Some(BETA_SECRET), "jsonl");
                b["endpoint"] = json!("file:///tmp");
                b
            },
            "endpoint",
        ),
    ] {
        let a = cp(&px[1], "PUT", "/api/cp/clusters/beta/s3", Some(&body));
        assert_eq!(a.status, 400, "{field}: {}", a.text);
        assert_eq!(a.json["code"], "invalid", "{}", a.text);
        assert!(a.text.contains(field), "{field}: {}", a.text);
        answers.push(a.text);
    }
    assert_eq!(
        cp(&px[1], "GET", "/api/cp/clusters/beta/s3", None).json["code"],
        "s3_unset"
    );
    assert_eq!(
        cp(&px[1], "GET", "/api/cp/clusters/nobody/s3", None).json["code"],
        "cluster_unknown"
    );
    let acme = cp(
        &px[0],
        "PUT",
        "/api/cp/clusters/acme/s3",
        Some(&sink_body(&server, "acme-lake", Some(ACME_SECRET), "jsonl")),
    );
    assert_eq!(acme.status, 200, "{}", acme.text);
    assert_eq!(acme.json["secretKeySet"], true);
    assert_eq!(acme.json["enabled"], true);
    assert_eq!(acme.json["tenant"], tenants[0].as_str());
    assert!(acme.json["config"].get("secretKey").is_none());
    let beta = cp(
        &px[1],
        "PUT",
        "/api/cp/clusters/beta/s3",
        Some(&sink_body(
            &server,
            "beta-lake",
            Some(BETA_SECRET),
            "parquet",
        )),
    );
    assert_eq!(beta.status, 200, "{}", beta.text);
    // Sealed by node 1 (node 3 seals with its own key, which the others could not open).
    let gamma = cp(
        &px[0],
        "PUT",
        "/api/cp/clusters/gamma/s3",
        Some(&sink_body(
            &server,
            "acme-lake",
            Some(GAMMA_SECRET),
            "jsonl",
        )),
    );
    assert_eq!(gamma.status, 200, "{}", gamma.text);
    answers.push(gamma.text.clone());
    let got = cp(&px[2], "GET", "/api/cp/clusters/acme/s3", None);
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(got.json["config"]["bucket"], "acme-lake");
    answers.extend([acme.text.clone(), beta.text.clone(), got.text.clone()]);

    // Pushes: acme's and beta's through the proxy, the default tenant's on a bare port.
    for n in 1..=3 {
        push(&px[(n % 3) as usize], &keys[0], "acme.queen.test", n);
    }
    for n in 1..=2 {
        push(&px[0], &keys[1], "beta.queen.test", 10 + n);
    }
    for n in 1..=2 {
        push(&px[1], &keys[2], "gamma.queen.test", 20 + n);
    }
    let d = nodes[1].post(
        "/api/v1/push",
        &json!({"items": [{"queue": "orders", "partition": "p", "payload": {"n": 100}}]}),
    );
    assert_eq!(d.status, 200, "{}", d.text);

    let mut seen = (Vec::new(), Vec::new(), Vec::new());
    let ok = eventually(Duration::from_secs(90), || {
        seen = (
            records(&server, "acme-lake"),
            records(&server, "beta-lake"),
            records(&server, "lake"),
        );
        seen.0.len() == 5 && seen.1.len() == 2 && seen.2.len() == 1
    });
    let status: Vec<Value> = nodes
        .iter()
        .map(|n| n.get("/status").json["s3"].clone())
        .collect();
    assert!(ok, "lakes: {seen:?}\nstatus: {status:#?}");
    // Each cluster's records in its own bucket under its broker tenant; the default tenant's in
    // the node's own lake.
    // acme and gamma share a bucket, each under its own tenant.
    let of = |t: &str| -> Vec<u64> { seen.0.iter().filter(|r| r.0 == t).map(|r| r.1).collect() };
    assert_eq!(of(&tenants[0]), [1, 2, 3], "{seen:?}");
    assert_eq!(of(&tenants[2]), [21, 22], "{seen:?}");
    assert!(seen.1.iter().all(|(t, _)| *t == tenants[1]), "{seen:?}");
    assert_eq!(
        seen.2,
        [("00000000-0000-0000-0000-000000000001".to_owned(), 100)]
    );

    // The sink's metrics carry tenant="<id>" for every tenant but the default one.
    let ok = eventually(Duration::from_secs(10), || {
        nodes.iter().any(|n| {
            let text = n.get("/metrics/prometheus").text;
            text.lines().any(|l| {
                l.starts_with("queen_s3_windows_committed_total")
                    && l.contains(&format!("tenant=\"{}\"", tenants[0]))
            })
        })
    });
    assert!(ok, "no tenant label on a tenant sink's series");
    assert!(
        nodes.iter().any(|n| n
            .get("/metrics/prometheus")
            .text
            .lines()
            .any(|l| l.starts_with("queen_s3_windows_committed_total")
                && l.contains("queue=\"orders\"")
                && !l.contains("tenant="))),
        "the default tenant's series has no tenant label"
    );

    // Node 3 cannot open the secrets: phase error there, running on the others.
    let ok = eventually(Duration::from_secs(20), || {
        let third = cp_sinks(&nodes[2]);
        third.len() == 3 && third.iter().all(|s| s["phase"] == "error")
    });
    assert!(ok, "{:#?}", cp_sinks(&nodes[2]));
    let third = cp_sinks(&nodes[2]);
    assert!(
        third[0]["error"]
            .as_str()
            .unwrap_or("")
            .contains("QUEEN_ENCRYPTION_KEY"),
        "{third:#?}"
    );
    for n in &nodes[..2] {
        let rows = cp_sinks(n);
        assert_eq!(rows.len(), 3, "{rows:#?}");
        assert!(rows.iter().all(|s| s["phase"] == "running"), "{rows:#?}");
    }

    // A suspended cluster ships nothing: its sink stops on every node, and runs again once
    // the cluster is active.
    let acme_id = cp(&px[0], "GET", "/api/cp/clusters/acme", None).json["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let phase_on_both = |phase: &str| {
        eventually(Duration::from_secs(20), || {
            nodes[..2].iter().all(|n| {
                cp_sinks(n)
                    .iter()
                    .any(|s| s["cluster"] == "acme" && s["phase"] == phase)
            })
        })
    };
    for (status, phase) in [("suspended", "stopped"), ("active", "running")] {
        let a = cp(
            &px[0],
            "PUT",
            &format!("/api/cp/clusters/{acme_id}/status"),
            Some(&json!({ "status": status })),
        );
        assert_eq!(a.status, 200, "{}", a.text);
        assert!(phase_on_both(phase), "{status}: {:#?}", cp_sinks(&nodes[0]));
    }

    // A rotated secret: the row moves and the sink keeps writing.
    let rotated = cp(
        &px[0],
        "PUT",
        "/api/cp/clusters/acme/s3",
        Some(&sink_body(
            &server,
            "acme-lake",
            Some(ACME_SECRET_2),
            "jsonl",
        )),
    );
    assert_eq!(rotated.status, 200, "{}", rotated.text);
    assert_ne!(rotated.json["updatedAt"], acme.json["updatedAt"]);
    answers.push(rotated.text.clone());
    push(&px[1], &keys[0], "acme.queen.test", 4);
    assert!(
        eventually(Duration::from_secs(60), || records(&server, "acme-lake")
            .iter()
            .filter(|r| r.0 == tenants[0])
            .count()
            == 4),
        "{:?}",
        records(&server, "acme-lake")
    );

    // DELETE removes the row (and the sink); a second DELETE removes nothing.
    let del = cp(&px[2], "DELETE", "/api/cp/clusters/beta/s3", None);
    assert_eq!(
        del.json,
        json!({"cluster": "beta", "removed": true}),
        "{}",
        del.text
    );
    let del = cp(&px[2], "DELETE", "/api/cp/clusters/beta/s3", None);
    assert_eq!(del.json["removed"], false, "{}", del.text);
    assert!(eventually(Duration::from_secs(15), || nodes
        .iter()
        .all(|n| cp_sinks(n).len() == 2)));

    // No secret anywhere: answers, logs, data directories (the raft log holds it sealed).
    for secret in [
        ACME_SECRET,
        ACME_SECRET_2,
        BETA_SECRET,
        GAMMA_SECRET,
        KEY_A,
        KEY_B,
        CP,
    ] {
        for a in &answers {
            assert!(!a.contains(secret), "an answer holds a secret");
        }
        for n in &nodes {
            assert!(!n.log_text().contains(secret), "a log holds a secret");
        }
        if ![CP, KEY_A, KEY_B].contains(&secret) {
            let found = files_holding(dir.path(), secret.as_bytes());
            assert!(found.is_empty(), "in clear in {found:?}");
        }
    }
    drop(px);
}
