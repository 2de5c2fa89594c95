use queen_domain::sink::commit::ManifestObject;
use queen_domain::sink::jsonl::{SinkRecord, encode_window};
use queen_domain::sink::keys::{Align, WindowKeys};

use super::*;
use crate::encode::{ParquetCodec, compress, parquet};
use crate::store::LakeTarget;

const T0: u64 = 1_791_007_200_000_000; // 2026-10-03T06:00:00Z
const TENANT: &str = "00000000-0000-0000-0000-000000000001";

#[derive(Clone, Copy)]
enum Enc {
    Jsonl(Compression),
    Parquet,
}

fn rec(partition: &str, offset: u64, ts: u64) -> SinkRecord {
    SinkRecord {
        partition: partition.into(),
        offset,
        transaction_id: format!("tx-{partition}-{offset}"),
        ts: Stamp(ts),
        payload: format!("{{\"n\":{offset}}}").into_bytes(),
    }
}

/// Upload window k of `queue` holding `records` and its manifest; `tamper` changes the object's
/// bytes after the manifest was computed.
async fn commit(
    lake: &Lake,
    queue: &str,
    k: u64,
    (t_start, t_end): (u64, u64),
    mut records: Vec<SinkRecord>,
    enc: Enc,
    tamper: impl FnOnce(&mut Vec<u8>),
) -> Manifest {
    let keys = WindowKeys {
        prefix: "queen",
        tenant: TENANT,
        queue,
        k,
        t_start: Stamp(t_start),
        t_end: Stamp(t_end),
        align: Align::Hour,
    };
    let jsonl = encode_window(&mut records); // sorts the records too
    let (mut bytes, format, compression, extension) = match enc {
        Enc::Jsonl(c) => (
            compress(&jsonl, c).unwrap(),
            "jsonl",
            c.as_str(),
            ext(Format::Jsonl, c),
        ),
        Enc::Parquet => (
            parquet(&records, ParquetCodec::Zstd, queue, TENANT).unwrap(),
            "parquet",
            "zstd",
            "parquet",
        ),
    };
    let key = keys.data(extension);
    let object = ManifestObject {
        key: key.clone(),
        bytes: bytes.len() as u64,
        records: records.len() as u64,
        sha256: sha256_hex(&bytes),
    };
    tamper(&mut bytes);
    lake.put_create(&key, Bytes::from(bytes)).await.unwrap();
    let partitions: HashSet<&str> = records.iter().map(|r| r.partition.as_str()).collect();
    let manifest = Manifest {
        sink: "default".into(),
        tenant: TENANT.into(),
        queue: queue.into(),
        k,
        t_start,
        t_end,
        format: format.into(),
        compression: compression.into(),
        layout: "merged".into(),
        records: object.records,
        bytes: object.bytes,
        objects: vec![object],
        partitions: partitions.len() as u64,
        min_ts: records.iter().map(|r| r.ts.0).min().unwrap_or(0),
        max_ts: records.iter().map(|r| r.ts.0).max().unwrap_or(0),
        lost: vec![],
        writer: format!("queen-s3/0.1.0 {format}+{compression}"),
        committed_at: "2026-10-03T06:37:44.741000Z".into(),
    };
    lake.put_create(
        &keys.manifest(),
        Bytes::from(serde_json::to_vec(&manifest).unwrap()),
    )
    .await
    .unwrap();
    manifest
}

fn keep(_: &mut Vec<u8>) {}

/// Three windows of `orders` in three encodings, one of `audit`.
async fn good_lake() -> Lake {
    let lake = Lake::open(&LakeTarget::Memory).unwrap();
    let w1 = vec![
        rec("cust-2", 0, T0 + 5),
        rec("cust-1", 0, T0 + 1),
        rec("cust-1", 1, T0 + 9),
    ];
    commit(
        &lake,
        "orders",
        1,
        (T0, T0 + 10),
        w1,
        Enc::Jsonl(Compression::Zstd),
        keep,
    )
    .await;
    let w2 = vec![rec("cust-1", 2, T0 + 10), rec("cust-3", 0, T0 + 19)];
    commit(
        &lake,
        "orders",
        2,
        (T0 + 10, T0 + 20),
        w2,
        Enc::Jsonl(Compression::Gzip),
        keep,
    )
    .await;
    let w3 = (0..50).map(|i| rec("cust-4", i, T0 + 30 + i)).collect();
    commit(
        &lake,
        "orders",
        3,
        (T0 + 25, T0 + 100),
        w3,
        Enc::Parquet,
        keep,
    )
    .await;
    commit(
        &lake,
        "audit",
        1,
        (T0, T0 + 10),
        vec![rec("a", 0, T0)],
        Enc::Jsonl(Compression::None),
        keep,
    )
    .await;
    lake
}

fn problems_of(report: &VerifyReport, queue: &str) -> Vec<String> {
    report
        .queues
        .iter()
        .find(|q| q.queue == queue)
        .map(|q| q.problems.clone())
        .unwrap_or_default()
}

fn assert_problem(report: &VerifyReport, queue: &str, needle: &str) {
    assert!(!report.ok());
    let problems = problems_of(report, queue);
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "'{needle}' not in {problems:#?}"
    );
}

#[tokio::test]
async fn a_good_lake_passes() {
    let lake = good_lake().await;
    // A checkpoint and a stray file under _queen/ are not manifests.
    lake.put_create(
        "queen/_queen/tenant=x/queue=orders/checkpoint/0000000001.json.zst",
        Bytes::from_static(b"x"),
    )
    .await
    .unwrap();
    let report = verify(&lake, "queen").await.unwrap();
    assert!(report.ok(), "{report:#?}");
    assert_eq!(report.manifests, 4);
    let queues: Vec<(&str, u64, u64)> = report
        .queues
        .iter()
        .map(|q| (q.queue.as_str(), q.windows, q.records))
        .collect();
    assert_eq!(queues, vec![("audit", 1, 1), ("orders", 3, 55)]);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["queues"][1]["windows"], 3);
    assert!(
        json.get("manifests").is_some() && json["queues"][0].get("problems").is_some(),
        "{json}"
    );
    // Another prefix holds nothing.
    let empty = verify(&lake, "other/").await.unwrap();
    assert!(empty.ok() && empty.queues.is_empty());
}

#[tokio::test]
async fn a_tampered_object_is_found() {
    let lake = good_lake().await;
    let w = vec![rec("cust-1", 3, T0 + 101)];
    commit(
        &lake,
        "orders",
        4,
        (T0 + 100, T0 + 200),
        w,
        Enc::Jsonl(Compression::Zstd),
        |b| {
            let last = b.len() - 1;
            b[last] ^= 1;
        },
    )
    .await;
    let report = verify(&lake, "queen").await.unwrap();
    assert_problem(&report, "orders", "window 4: object");
    assert_problem(&report, "orders", "has sha256");
    assert!(problems_of(&report, "audit").is_empty());
}

#[tokio::test]
async fn a_missing_window_is_found() {
    let lake = good_lake().await;
    commit(
        &lake,
        "orders",
        5,
        (T0 + 200, T0 + 300),
        vec![rec("cust-1", 3, T0 + 201)],
        Enc::Parquet,
        keep,
    )
    .await;
    let report = verify(&lake, "queen").await.unwrap();
    assert_problem(&report, "orders", "window 4 is missing (next is 5)");
    // A queue whose windows start above 1 misses its first ones.
    let lake = Lake::open(&LakeTarget::Memory).unwrap();
    commit(
        &lake,
        "orders",
        3,
        (T0, T0 + 10),
        vec![rec("p", 0, T0)],
        Enc::Parquet,
        keep,
    )
    .await;
    assert_problem(
        &verify(&lake, "queen").await.unwrap(),
        "orders",
        "windows 1..=2 are missing",
    );
}

#[tokio::test]
async fn overlapping_windows_are_found() {
    let lake = good_lake().await;
    commit(
        &lake,
        "orders",
        4,
        (T0 + 90, T0 + 200),
        vec![rec("cust-1", 3, T0 + 150)],
        Enc::Jsonl(Compression::Zstd),
        keep,
    )
    .await;
    let report = verify(&lake, "queen").await.unwrap();
    assert_problem(&report, "orders", "window 4: starts at");
    assert_problem(&report, "orders", "(overlap)");
}

#[tokio::test]
async fn a_record_in_two_windows_is_found() {
    let lake = good_lake().await;
    let w = vec![rec("cust-1", 1, T0 + 100), rec("cust-1", 3, T0 + 101)];
    commit(
        &lake,
        "orders",
        4,
        (T0 + 100, T0 + 200),
        w,
        Enc::Parquet,
        keep,
    )
    .await;
    let report = verify(&lake, "queen").await.unwrap();
    assert_problem(
        &report,
        "orders",
        "window 4: cust-1 offset 1 is already in the lake",
    );
    assert_eq!(problems_of(&report, "orders").len(), 1, "{report:#?}");
}

#[tokio::test]
async fn records_outside_their_window_and_wrong_bounds_are_found() {
    let lake = good_lake().await;
    let m = commit(
        &lake,
        "orders",
        4,
        (T0 + 100, T0 + 200),
        vec![rec("cust-1", 3, T0 + 250)],
        Enc::Jsonl(Compression::Gzip),
        keep,
    )
    .await;
    assert_eq!(m.max_ts, T0 + 250);
    let report = verify(&lake, "queen").await.unwrap();
    assert_problem(&report, "orders", "outside [");
}

#[tokio::test]
async fn a_missing_object_and_an_unreadable_manifest_are_found() {
    let lake = good_lake().await;
    let mut m = commit(
        &lake,
        "orders",
        4,
        (T0 + 100, T0 + 200),
        vec![rec("cust-1", 3, T0 + 101)],
        Enc::Parquet,
        keep,
    )
    .await;
    m.k = 5;
    m.t_start = T0 + 200;
    m.t_end = T0 + 300;
    m.objects[0].key = m.objects[0].key.replace("w-0000000004", "w-0000000005");
    let keys = WindowKeys {
        prefix: "queen",
        tenant: TENANT,
        queue: "orders",
        k: 5,
        t_start: Stamp(0),
        t_end: Stamp(0),
        align: Align::Hour,
    };
    lake.put_create(
        &keys.manifest(),
        Bytes::from(serde_json::to_vec(&m).unwrap()),
    )
    .await
    .unwrap();
    lake.put_create(
        "queen/_queen/tenant=x/queue=y/windows/0000000001.json",
        Bytes::from_static(b"{}"),
    )
    .await
    .unwrap();
    let report = verify(&lake, "queen").await.unwrap();
    assert_problem(&report, "orders", "is missing");
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("unreadable manifest")),
        "{report:#?}"
    );
}

#[test]
fn jsonl_lines_must_be_canonical() {
    assert!(decode_jsonl(b"{\"partition\":\"p\",\"offset\":0,\"transactionId\":\"t\",\"ts\":\"2026-10-03T06:37:37.501942Z\",\"payload\":null}\n").is_ok());
    assert!(
        decode_jsonl(b"{\"partition\":\"p\",\"offset\":0,\"ts\":\"2026-10-03T06:37:37Z\"}\n")
            .is_err()
    );
    assert!(
        decode_jsonl(b"{\"partition\":\"p\",\"offset\":0,\"ts\":\"2026-10-03T06:37:37.501942Z\"}")
            .is_err()
    );
    assert!(decode_jsonl(b"").is_ok_and(|rows| rows.is_empty()));
}

/// Queues whose names are too long for a key component (255 bytes, 85 CJK characters) are
/// stored under shortened keys on a real file system, and verify maps them back through the
/// manifest's full name.
#[tokio::test]
async fn queues_with_names_too_long_for_a_component_verify_on_a_local_folder() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(&LakeTarget::Local(dir.path().to_path_buf())).unwrap();
    let long = "q".repeat(255);
    let cjk = "漢".repeat(85);
    for queue in [long.as_str(), cjk.as_str()] {
        commit(
            &lake,
            queue,
            1,
            (T0, T0 + 10),
            vec![rec("p", 0, T0 + 1)],
            Enc::Jsonl(Compression::Zstd),
            keep,
        )
        .await;
        commit(
            &lake,
            queue,
            2,
            (T0 + 10, T0 + 20),
            vec![rec("p", 1, T0 + 11)],
            Enc::Parquet,
            keep,
        )
        .await;
    }
    let report = verify(&lake, "queen").await.unwrap();
    assert!(report.ok(), "{report:#?}");
    let mut queues: Vec<(&str, u64)> = report
        .queues
        .iter()
        .map(|q| (q.queue.as_str(), q.windows))
        .collect();
    queues.sort_unstable();
    let mut want = vec![(long.as_str(), 2), (cjk.as_str(), 2)];
    want.sort_unstable();
    assert_eq!(queues, want);
}
