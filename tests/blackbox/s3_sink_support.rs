//! What the S3 sink black-box tests share: the sink's settings, starting a node, pushing, and
//! reading the committed lake back through the official readers.

#![allow(dead_code)] // each test binary uses its own part of it

use std::path::Path;
use std::time::Duration;

use queen_tests::s3::{self, S3Server};
use queen_tests::{Node, eventually};
use serde_json::{Value, json};

pub(crate) const TENANT: &str = "00000000-0000-0000-0000-000000000001";

pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// The sink's settings for a bucket at `endpoint`, mirroring `orders`, with three-second
/// leases and a checkpoint after every window.
pub(crate) fn sink_env(
    endpoint: &str,
    extra: &[(&'static str, &'static str)],
) -> Vec<(&'static str, String)> {
    let mut all: Vec<(&'static str, String)> = vec![
        ("QUEEN_S3_LEASE_TTL_MS", "3000".into()),
        ("QUEEN_S3_CHECKPOINT_EVERY", "1".into()),
    ];
    all.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    s3::sink_env(endpoint, "orders", &all)
}

pub(crate) fn start(dir: &Path, env: &[(&'static str, String)]) -> Node {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Node::start(bin(), dir, &pairs)
}

pub(crate) fn push(n: &Node, items: &Value) {
    let a = n.post("/api/v1/push", &json!({ "items": items }));
    assert_eq!(a.status, 200, "{}", a.text);
}

/// The `orders` row of the sink's status.
pub(crate) fn queue_status(n: &Node) -> Value {
    let s = n.get("/status").json;
    s["s3"]["sinks"][0]["queues"]
        .as_array()
        .and_then(|qs| qs.iter().find(|q| q["queue"] == "orders").cloned())
        .unwrap_or(Value::Null)
}

/// Wait until the sink reports at least `k` committed windows with every pushed record in them.
pub(crate) fn wait_committed(n: &Node, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let ok = eventually(Duration::from_secs(60), || {
        last = queue_status(n);
        cond(&last)
    });
    assert!(ok, "{what}: sink status {last:#}\n{}", n.log_text());
    last
}

/// `queen lake verify` on the bucket: the report; panics unless it is clean.
pub(crate) fn verify(server: &S3Server) -> Value {
    let (clean, report) = queen_tests::sink::verify(bin(), server);
    assert!(clean, "lake verify failed:\n{report:#}");
    report
}

/// Every record the readers see, as (partition, offset, transactionId, payload text).
pub(crate) fn lake_records(server: &S3Server, reader: &str) -> Vec<(String, u64, String, Value)> {
    let mut args = server.lake_args("lake");
    args.extend(["--prefix", "queen"]);
    let lake = s3::read_lake(&args);
    lake[reader]["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            assert_eq!(r[0], TENANT);
            assert_eq!(r[1], "orders");
            (
                r[2].as_str().unwrap().to_owned(),
                r[3].as_u64().unwrap(),
                r[4].as_str().unwrap().to_owned(),
                r[5].clone(),
            )
        })
        .collect()
}
