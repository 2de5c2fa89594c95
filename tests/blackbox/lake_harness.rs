//! Self-test of the S3 lake fixtures (tests/src/s3.rs, tests/lake/): moto comes up, a hand-made
//! lake (one JSONL.zst object, one Parquet object written by pyarrow, one manifest) uploaded with
//! boto3 reads back the same through DuckDB and pyarrow, from S3 and from a local folder; the
//! fault proxy fails requests in 503 / Refuse mode and passes them again afterwards with the
//! bucket's data intact; a moto restart comes back empty.

use std::net::TcpStream;
use std::time::Duration;

use queen_tests::s3::{self, FaultProxy, Mode, S3Server};
use serde_json::{Value, json};

const TENANT: &str = "0f8e2c1a-1111-4a4a-9b9b-123456789abc";

fn expected_records() -> Value {
    // Sorted like read_lake.py sorts: tenant, queue, partition, offset.
    let r =
        |p: &str, o: i64, tx: &str, payload: Value| json!([TENANT, "orders", p, o, tx, payload]);
    json!([
        r(
            "p0",
            0,
            "tx-0",
            json!(r#"{"amount": 42.00, "note":"caf\u00e9"}"#)
        ),
        r("p0", 1, "tx-1", json!("42.00")),
        r("p0", 2, "tx-3", json!(r#"{"amount":1.10}"#)),
        r("p0", 3, "tx-4", Value::Null),
        r("p1", 0, "tx-2", json!(r#""text""#)),
        r("p1", 1, "tx-5", json!("[1, 2.50]")),
    ])
}

fn check_lake(what: &str, lake: &Value) {
    for reader in ["duckdb", "pyarrow"] {
        let r = &lake[reader];
        assert_eq!(r["rows"], 6, "{what}/{reader}: {lake:#}");
        assert_eq!(
            r["by_format"],
            json!({"jsonl": 3, "parquet": 3}),
            "{what}/{reader}"
        );
        assert_eq!(
            r["records"],
            expected_records(),
            "{what}/{reader}: payload text must be kept as stored"
        );
        assert_eq!(
            r["ts"],
            json!(["2026-10-03T06:00:00.000001Z", "2026-10-03T07:59:59.999999Z"]),
            "{what}/{reader}"
        );
        assert_eq!(r["payload_normalized"], 0, "{what}/{reader}");
        assert_eq!(r["files"], lake["files"], "{what}/{reader}");
    }
    assert_eq!(
        lake["hive"],
        json!({"tenants": [TENANT], "queues": ["orders"], "dts": ["2026-10-03"], "hours": ["06", "07"]}),
        "{what}"
    );
    let files = lake["files"].as_array().expect("files");
    assert_eq!(files.len(), 2, "{what}: {files:?}");
    assert!(
        files[0]
            .as_str()
            .unwrap()
            .ends_with("/hour=06/w-0000000001-1791007200000-1791010799999.jsonl.zst")
    );
    assert!(
        files[1]
            .as_str()
            .unwrap()
            .ends_with("/hour=07/w-0000000002-1791010800000-1791014399999.parquet")
    );
    let manifest = format!("_queen/tenant={TENANT}/queue=orders/windows/0000000001.json");
    assert_eq!(
        lake["manifests"][&manifest],
        json!({"window": 1, "objects": 1, "rows": 3}),
        "{what}: {lake:#}"
    );
    assert_eq!(lake["other"], json!([]), "{what}");
    assert_eq!(
        lake["pyarrow"]["parquet_schema"],
        json!({"partition": "string not null", "offset": "int64 not null", "transaction_id": "string not null",
               "ts": "timestamp[us, tz=UTC] not null", "payload": "string"}),
        "{what}"
    );
}

fn upload_sample(s3: &S3Server, local: &std::path::Path) {
    s3.create_bucket("lake");
    let out = s3::run_lake_script(
        "put_sample.py",
        &[
            "--out",
            local.to_str().unwrap(),
            "--prefix",
            "lake",
            "--s3",
            &s3.endpoint,
            "--bucket",
            "lake",
        ],
    );
    assert!(out.contains("w-0000000001-"), "{out}");
}

#[test]
fn a_hand_made_lake_reads_the_same_with_duckdb_and_pyarrow_from_s3_and_from_disk() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("bucket");
    upload_sample(&s3, &local);

    let mut args = s3.lake_args("lake");
    args.extend(["--prefix", "lake"]);
    let from_s3 = s3::read_lake(&args);
    check_lake("s3", &from_s3);

    let from_disk = s3::read_lake(&["--root", local.to_str().unwrap(), "--prefix", "lake"]);
    check_lake("disk", &from_disk);
    assert_eq!(from_s3, from_disk);

    // Filters.
    let mut a = args.clone();
    a.extend(["--format", "parquet"]);
    let parquet = s3::read_lake(&a);
    assert_eq!(parquet["duckdb"]["rows"], 3);
    assert_eq!(
        parquet["pyarrow"]["by_format"],
        json!({"jsonl": 0, "parquet": 3})
    );
    let mut a = args.clone();
    a.extend(["--queue", "nope"]);
    let none = s3::read_lake(&a);
    assert_eq!(none["duckdb"]["rows"], 0);
    assert_eq!(none["pyarrow"]["rows"], 0);
}

fn refused(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).is_err()
}

#[test]
fn the_fault_proxy_fails_and_recovers_without_losing_data_and_a_moto_restart_is_empty() {
    let mut s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    upload_sample(&s3, &dir.path().join("bucket"));

    let proxy: FaultProxy = s3.proxy();
    let via_proxy = |p: &FaultProxy| {
        vec![
            "--s3".to_owned(),
            p.endpoint.clone(),
            "--bucket".into(),
            "lake".into(),
            "--prefix".into(),
            "lake".into(),
        ]
    };
    let args = via_proxy(&proxy);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    assert_eq!(s3::http(&proxy.endpoint, "GET", "/moto-api/"), Ok(200));
    check_lake("proxy pass", &s3::read_lake(&args));

    proxy.set_mode(Mode::Http503);
    assert_eq!(proxy.mode(), Mode::Http503);
    assert_eq!(s3::http(&proxy.endpoint, "GET", "/moto-api/"), Ok(503));
    assert_eq!(s3::http(&proxy.endpoint, "PUT", "/another"), Ok(503));
    let err = s3::try_read_lake(&args).expect_err("reading through a 503 proxy must fail");
    assert!(
        err.contains("503")
            || err.contains("SlowDown")
            || err.to_lowercase().contains("unavailable"),
        "{err}"
    );

    proxy.set_mode(Mode::Refuse);
    assert!(refused(proxy.port), "Refuse mode must refuse connections");
    assert!(s3::http(&proxy.endpoint, "GET", "/moto-api/").is_err());

    proxy.set_mode(Mode::Stall);
    let stalled = s3::http_within(
        &proxy.endpoint,
        "GET",
        "/moto-api/",
        Duration::from_millis(500),
    );
    assert!(stalled.is_err(), "Stall mode must not answer: {stalled:?}");

    proxy.set_mode(Mode::Pass);
    assert_eq!(s3::http(&proxy.endpoint, "GET", "/moto-api/"), Ok(200));
    check_lake("proxy pass again", &s3::read_lake(&args));
    assert!(proxy.connections() > 0);
    drop(proxy);

    // A stopped server refuses; a restarted one is up on the same port with no bucket.
    let pid = s3.pid().expect("running");
    s3.stop();
    assert!(!s3.is_running());
    assert!(
        refused(s3.port),
        "moto (pid {pid}) still accepts after stop"
    );
    s3.restart();
    assert!(s3.is_running());
    assert_eq!(s3::http(&s3.endpoint, "GET", "/moto-api/"), Ok(200));
    s3.create_bucket("lake");
    let mut a = s3.lake_args("lake");
    a.extend(["--prefix", "lake"]);
    let empty = s3::read_lake(&a);
    assert_eq!(
        empty["duckdb"]["rows"], 0,
        "moto keeps state in memory: {empty:#}"
    );
    assert_eq!(empty["pyarrow"]["rows"], 0);
}
