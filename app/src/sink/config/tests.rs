use super::*;
use std::collections::HashMap;

fn read(vars: &[(&str, &str)]) -> Result<SinkBoot, SinkConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    from_env(&move |k| map.get(k).cloned(), 1)
}

const S3: [(&str, &str); 6] = [
    ("QUEEN_S3_EMBEDDED", "true"),
    ("QUEEN_S3_QUEUES", "orders"),
    ("QUEEN_S3_ENDPOINT", "http://127.0.0.1:9000"),
    ("QUEEN_S3_BUCKET", "lake"),
    ("QUEEN_S3_ACCESS_KEY", "queen"),
    ("QUEEN_S3_SECRET_KEY", "queen-secret-key"),
];

#[test]
fn off_unless_embedded() {
    assert!(read(&[]).unwrap().settings.is_none());
    assert!(
        read(&[("QUEEN_S3_EMBEDDED", " ")])
            .unwrap()
            .settings
            .is_none()
    );
}

#[test]
fn the_documents_boot_line() {
    let mut v = S3.to_vec();
    v.push(("QUEEN_S3_MAX_WINDOW_MS", "50"));
    assert_eq!(
        read(&v).unwrap_err().to_string(),
        "QUEEN_S3_EMBEDDED=true: QUEEN_S3_MAX_WINDOW_MS=50 is outside 100..=86400000. It is how long a window may stay open; the lag SLO is about this plus the safe lag"
    );
}

#[test]
fn defaults_enums_and_refusals() {
    let s = read(&S3).unwrap().settings.unwrap();
    assert_eq!(
        (s.max_window_ms, s.target_mb, s.memory_mb, s.lease_ttl_ms),
        (300_000, 128, 512, 30_000)
    );
    assert_eq!(
        (s.format, s.compression, s.start, s.align),
        (Format::Jsonl, Compression::Zstd, Start::Latest, Align::Hour)
    );
    let mut v = S3.to_vec();
    v.push(("QUEEN_S3_FORMAT", "PARQUET"));
    v.push(("QUEEN_S3_LAYOUT", "Per-Partition"));
    let s = read(&v).unwrap().settings.unwrap();
    assert_eq!(
        (s.format, s.layout),
        (Format::Parquet, Layout::PerPartition)
    );
    let mut v = S3.to_vec();
    v.push(("QUEEN_S3_PARTITIONS", "a,b"));
    assert!(
        read(&v)
            .unwrap_err()
            .to_string()
            .contains("QUEEN_S3_PARTITIONS")
    );
    let mut v = S3.to_vec();
    v.push(("QUEEN_S3_LISTEN", ":8080"));
    assert_eq!(read(&v).unwrap().warnings.len(), 1);
    assert!(
        read(&[("QUEEN_S3_EMBEDDED", "true")])
            .unwrap_err()
            .to_string()
            .contains("QUEEN_S3_QUEUES is required")
    );
}

#[test]
fn the_secret_is_never_shown() {
    let s = read(&S3).unwrap().settings.unwrap();
    assert!(!format!("{s:?}").contains("queen-secret-key"));
    assert!(!s.describe().contains("queen-secret-key"));
    let mut v: Vec<(&str, &str)> = S3
        .iter()
        .copied()
        .filter(|(k, _)| *k != "QUEEN_S3_QUEUES")
        .collect();
    v.push(("QUEEN_S3_QUEUES", "bad/name"));
    assert!(
        !read(&v)
            .unwrap_err()
            .to_string()
            .contains("queen-secret-key")
    );
}

#[test]
fn a_local_folder_needs_no_account() {
    let s = read(&[
        ("QUEEN_S3_EMBEDDED", "true"),
        ("QUEEN_S3_QUEUES", "*"),
        ("QUEEN_S3_ENDPOINT", "file://./queen-lake"),
    ])
    .unwrap()
    .settings
    .unwrap();
    assert_eq!(s.target, Target::Local("./queen-lake".into()));
    assert_eq!(s.queues, Queues::All);
}
