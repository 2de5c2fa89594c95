//! `queen lake verify`: read a lake back and check it against its manifests.
//!
//! Read-only. Every committed window's manifest is read, and every object it names is fetched,
//! hashed and decoded, so the cost is one full read of the lake: run it on demand, not in a loop.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::Bytes;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::RowAccessor;
use parquet::schema::parser::parse_message_type;
use queen_domain::sink::commit::Manifest;
use queen_domain::sink::keys::{encode_queue, encode_tenant};
use queen_domain::time::Stamp;
use serde::{Deserialize, Serialize};

use crate::encode::{Compression, Format, PARQUET_SCHEMA, decompress, ext, sha256_hex};
use crate::error::LakeError;
use crate::store::Lake;

/// Problems of one kind reported per object before the rest are only counted.
const PROBLEMS_PER_KIND: usize = 5;

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    /// The prefix verified (`queen`).
    pub prefix: String,
    /// Manifests found under `<prefix>/_queen/`.
    pub manifests: u64,
    /// One entry per (tenant, queue), sorted.
    pub queues: Vec<QueueReport>,
    /// Problems that belong to no queue (a manifest that cannot be read).
    pub problems: Vec<String>,
}

impl VerifyReport {
    /// Whether the lake is sound: no problem anywhere.
    #[must_use]
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.queues.iter().all(|q| q.problems.is_empty())
    }
}

/// One queue of the lake.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueReport {
    /// Tenant id.
    pub tenant: String,
    /// Queue name.
    pub queue: String,
    /// Committed windows (manifests).
    pub windows: u64,
    /// Records, as the manifests count them.
    pub records: u64,
    /// Bytes, as the manifests count them.
    pub bytes: u64,
    /// What is wrong, one line each; empty when the queue is sound.
    pub problems: Vec<String>,
}

/// One record as verify sees it.
#[derive(Debug)]
struct Row {
    partition: String,
    offset: u64,
    ts: u64,
}

/// The fields of a JSONL line verify reads (the payload is only parsed, as part of the line).
#[derive(Deserialize)]
struct Line {
    partition: String,
    offset: u64,
    ts: String,
}

/// A manifest as listed: its key, the k its key names, and what it holds.
struct Listed {
    key: String,
    k: u64,
    manifest: Manifest,
}

/// `tenant=<t>/queue=<q>/windows/<k>.json` under `_queen/`: (tenant, queue, k), encoded.
fn manifest_path(rest: &str) -> Option<(&str, &str, u64)> {
    let mut parts = rest.split('/');
    let tenant = parts.next()?.strip_prefix("tenant=")?;
    let queue = parts.next()?.strip_prefix("queue=")?;
    let windows = parts.next()?;
    let name = parts.next()?.strip_suffix(".json")?;
    if windows != "windows"
        || parts.next().is_some()
        || name.is_empty()
        || !name.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    Some((tenant, queue, name.parse().ok()?))
}

/// Check every committed window under `prefix` (`queen`, or the sink's `QUEEN_S3_PREFIX`).
///
/// Per queue: windows numbered 1..=n without gaps, each with `tStart < tEnd` and starting at or
/// after the previous window's end; manifest totals equal to the sums of their objects; every
/// object present with the manifest's size and sha256 and the extension of the manifest's
/// format; its records decoded (JSONL by extension, Parquet through the row reader), counted,
/// sorted by (partition, offset), stamped inside `[tStart, tEnd)`; minTs, maxTs and partitions
/// as the manifest says; and each (partition, offset) in one window of the queue only.
///
/// # Errors
/// [`LakeError`] when the lake cannot be read (list or get failing); what the lake holds wrong
/// is in the report, never an error.
pub async fn verify(lake: &Lake, prefix: &str) -> Result<VerifyReport, LakeError> {
    let base = prefix.trim_matches('/');
    let sidecars = format!("{base}/_queen/");
    let mut report = VerifyReport {
        prefix: base.to_owned(),
        ..VerifyReport::default()
    };
    let mut queues: BTreeMap<(String, String), Vec<Listed>> = BTreeMap::new();
    for (key, _) in lake.list(&sidecars).await? {
        let Some((tenant, queue, k)) = key.strip_prefix(&sidecars).and_then(manifest_path) else {
            continue;
        };
        report.manifests += 1;
        let Some(bytes) = lake.get(&key).await? else {
            report
                .problems
                .push(format!("{key}: listed but gone when read"));
            continue;
        };
        let manifest: Manifest = match serde_json::from_slice(&bytes) {
            Ok(m) => m,
            Err(e) => {
                report
                    .problems
                    .push(format!("{key}: unreadable manifest: {e}"));
                continue;
            }
        };
        if encode_tenant(&manifest.tenant) != tenant
            || encode_queue(&manifest.queue) != queue
            || manifest.k != k
        {
            report.problems.push(format!(
                "{key}: holds tenant {} queue {} window {}, not what its key says",
                manifest.tenant, manifest.queue, manifest.k
            ));
        }
        queues
            .entry((manifest.tenant.clone(), manifest.queue.clone()))
            .or_default()
            .push(Listed { key, k, manifest });
    }
    for ((tenant, queue), mut windows) in queues {
        windows.sort_by_key(|w| (w.manifest.k, w.k));
        let mut q = QueueReport {
            tenant,
            queue,
            ..QueueReport::default()
        };
        let mut seen: HashMap<String, HashSet<u64>> = HashMap::new();
        let mut expected_k = 1_u64;
        let mut previous_end: Option<(u64, u64)> = None;
        for Listed {
            key, manifest: m, ..
        } in &windows
        {
            check_sequence(m, expected_k, previous_end, &mut q.problems);
            expected_k = expected_k.max(m.k.saturating_add(1));
            previous_end = Some((m.k, m.t_end));
            q.windows += 1;
            q.records += m.records;
            q.bytes += m.bytes;
            check_window(lake, key, m, &mut seen, &mut q.problems).await?;
        }
        if !q.problems.is_empty() {
            tracing::debug!(target: "queen-s3", tenant = %q.tenant, queue = %q.queue, problems = q.problems.len(), "lake verify found problems");
        }
        report.queues.push(q);
    }
    Ok(report)
}

fn check_sequence(
    m: &Manifest,
    expected_k: u64,
    previous_end: Option<(u64, u64)>,
    problems: &mut Vec<String>,
) {
    if m.k > expected_k {
        if expected_k + 1 == m.k {
            problems.push(format!("window {expected_k} is missing (next is {})", m.k));
        } else {
            problems.push(format!(
                "windows {expected_k}..={} are missing (next is {})",
                m.k - 1,
                m.k
            ));
        }
    } else if m.k < expected_k {
        problems.push(format!("window {} appears twice", m.k));
    }
    if m.t_start >= m.t_end {
        problems.push(format!(
            "window {}: tStart {} is not before tEnd {}",
            m.k, m.t_start, m.t_end
        ));
    }
    if let Some((k, end)) = previous_end
        && m.t_start < end
    {
        problems.push(format!(
            "window {}: starts at {} before window {k} ends at {end} (overlap)",
            m.k, m.t_start
        ));
    }
}

/// Problems of one kind, reported up to [`PROBLEMS_PER_KIND`] and counted after that.
#[derive(Default)]
struct Capped {
    lines: Vec<String>,
    more: u64,
}

impl Capped {
    fn push(&mut self, line: impl FnOnce() -> String) {
        if self.lines.len() < PROBLEMS_PER_KIND {
            self.lines.push(line());
        } else {
            self.more += 1;
        }
    }

    fn drain_into(self, problems: &mut Vec<String>, what: &str) {
        problems.extend(self.lines);
        if self.more > 0 {
            problems.push(format!("... and {} more {what}", self.more));
        }
    }
}

async fn check_window(
    lake: &Lake,
    manifest_key: &str,
    m: &Manifest,
    seen: &mut HashMap<String, HashSet<u64>>,
    problems: &mut Vec<String>,
) -> Result<(), LakeError> {
    let k = m.k;
    let expected_ext = match (m.format.as_str(), m.compression.as_str()) {
        ("parquet", _) => Some(ext(Format::Parquet, Compression::None)),
        ("jsonl", "zstd") => Some(ext(Format::Jsonl, Compression::Zstd)),
        ("jsonl", "gzip") => Some(ext(Format::Jsonl, Compression::Gzip)),
        ("jsonl", "none") => Some(ext(Format::Jsonl, Compression::None)),
        (format, compression) => {
            problems.push(format!(
                "window {k}: unknown format {format}+{compression} in {manifest_key}"
            ));
            None
        }
    };
    let object_records: u64 = m.objects.iter().map(|o| o.records).sum();
    let object_bytes: u64 = m.objects.iter().map(|o| o.bytes).sum();
    if object_records != m.records || object_bytes != m.bytes {
        problems.push(format!(
            "window {k}: manifest says {} records and {} bytes, its objects add up to {object_records} and {object_bytes}",
            m.records, m.bytes
        ));
    }
    let mut all_decoded = true;
    let mut min_ts = u64::MAX;
    let mut max_ts = 0_u64;
    let mut partitions: HashSet<String> = HashSet::new();
    let mut outside = Capped::default();
    let mut duplicates = Capped::default();
    for o in &m.objects {
        let key = o.key.as_str();
        if let Some(e) = expected_ext
            && !key.ends_with(&format!(".{e}"))
        {
            problems.push(format!("window {k}: object {key} does not end in .{e}"));
        }
        let Some(bytes) = lake.get(key).await? else {
            problems.push(format!("window {k}: object {key} is missing"));
            all_decoded = false;
            continue;
        };
        if bytes.len() as u64 != o.bytes {
            problems.push(format!(
                "window {k}: object {key} holds {} bytes, manifest says {}",
                bytes.len(),
                o.bytes
            ));
        }
        let sha = sha256_hex(&bytes);
        if sha != o.sha256 {
            problems.push(format!(
                "window {k}: object {key} has sha256 {sha}, manifest says {}",
                o.sha256
            ));
            all_decoded = false;
            continue;
        }
        let rows = match decode(key, bytes, m) {
            Ok((rows, issues)) => {
                problems.extend(
                    issues
                        .into_iter()
                        .map(|i| format!("window {k}: object {key}: {i}")),
                );
                rows
            }
            Err(reason) => {
                problems.push(format!(
                    "window {k}: object {key} cannot be decoded: {reason}"
                ));
                all_decoded = false;
                continue;
            }
        };
        if rows.len() as u64 != o.records {
            problems.push(format!(
                "window {k}: object {key} holds {} records, manifest says {}",
                rows.len(),
                o.records
            ));
        }
        if let Some(at) = rows
            .windows(2)
            .position(|w| (&w[0].partition, w[0].offset) >= (&w[1].partition, w[1].offset))
        {
            problems.push(format!(
                "window {k}: object {key} is not sorted by partition and offset at record {}",
                at + 1
            ));
        }
        for r in rows {
            if r.ts < m.t_start || r.ts >= m.t_end {
                outside.push(|| {
                    format!(
                        "window {k}: {} offset {} has ts {} outside [{}, {})",
                        r.partition, r.offset, r.ts, m.t_start, m.t_end
                    )
                });
            }
            min_ts = min_ts.min(r.ts);
            max_ts = max_ts.max(r.ts);
            let offsets = seen.entry(r.partition.clone()).or_default();
            if !offsets.insert(r.offset) {
                duplicates.push(|| {
                    format!(
                        "window {k}: {} offset {} is already in the lake",
                        r.partition, r.offset
                    )
                });
            }
            partitions.insert(r.partition);
        }
    }
    outside.drain_into(problems, "records outside the window");
    duplicates.drain_into(problems, "duplicated records");
    if all_decoded && m.records > 0 {
        if min_ts != m.min_ts || max_ts != m.max_ts {
            problems.push(format!(
                "window {k}: records span ts {min_ts}..={max_ts}, manifest says minTs {} maxTs {}",
                m.min_ts, m.max_ts
            ));
        }
        if partitions.len() as u64 != m.partitions {
            problems.push(format!(
                "window {k}: records have {} partitions, manifest says {}",
                partitions.len(),
                m.partitions
            ));
        }
    }
    Ok(())
}

/// The records of one object, plus problems that do not stop the decoding.
fn decode(key: &str, bytes: Bytes, m: &Manifest) -> Result<(Vec<Row>, Vec<String>), String> {
    if key.ends_with(".parquet") {
        return decode_parquet(bytes, m);
    }
    let compression = if key.ends_with(".jsonl.zst") {
        Compression::Zstd
    } else if key.ends_with(".jsonl.gz") {
        Compression::Gzip
    } else if key.ends_with(".jsonl") {
        Compression::None
    } else {
        return Err("unknown extension".into());
    };
    let text = decompress(&bytes, compression).map_err(|e| e.to_string())?;
    decode_jsonl(&text).map(|rows| (rows, Vec::new()))
}

fn decode_jsonl(text: &[u8]) -> Result<Vec<Row>, String> {
    let Some(body) = text.strip_suffix(b"\n") else {
        return if text.is_empty() {
            Ok(Vec::new())
        } else {
            Err("the last line has no line break".into())
        };
    };
    let mut rows = Vec::new();
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        let n = i + 1;
        let parsed: Line = serde_json::from_slice(line).map_err(|e| format!("line {n}: {e}"))?;
        let ts = Stamp::parse_iso(&parsed.ts).map_err(|e| format!("line {n}: {e}"))?;
        if ts.iso_micros() != parsed.ts {
            return Err(format!(
                "line {n}: ts '{}' is not RFC 3339 UTC with microseconds",
                parsed.ts
            ));
        }
        rows.push(Row {
            partition: parsed.partition,
            offset: parsed.offset,
            ts: ts.0,
        });
    }
    Ok(rows)
}

fn decode_parquet(bytes: Bytes, m: &Manifest) -> Result<(Vec<Row>, Vec<String>), String> {
    let reader = SerializedFileReader::new(bytes).map_err(|e| e.to_string())?;
    let mut issues = Vec::new();
    let expected = parse_message_type(PARQUET_SCHEMA).map_err(|e| e.to_string())?;
    let metadata = reader.metadata().file_metadata();
    if metadata.schema() != &expected {
        issues.push("schema is not queen_record's".to_owned());
    }
    let footer = |name: &str| {
        metadata
            .key_value_metadata()
            .and_then(|kv| kv.iter().find(|e| e.key == name))
            .and_then(|e| e.value.clone())
    };
    for (name, want) in [("queen.queue", &m.queue), ("queen.tenant", &m.tenant)] {
        let found = footer(name);
        if found.as_ref() != Some(want) {
            issues.push(format!(
                "footer {name} is {found:?}, manifest says {want:?}"
            ));
        }
    }
    let projection = parse_message_type(
        "message queen_record { required binary partition (STRING); required int64 offset; required int64 ts (TIMESTAMP(MICROS,true)); }",
    )
    .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for (i, row) in reader
        .get_row_iter(Some(projection))
        .map_err(|e| e.to_string())?
        .enumerate()
    {
        let row = row.map_err(|e| format!("row {i}: {e}"))?;
        let partition = row
            .get_string(0)
            .map_err(|e| format!("row {i}: {e}"))?
            .clone();
        let offset = row.get_long(1).map_err(|e| format!("row {i}: {e}"))?;
        let ts = row
            .get_timestamp_micros(2)
            .map_err(|e| format!("row {i}: {e}"))?;
        let (Ok(offset), Ok(ts)) = (u64::try_from(offset), u64::try_from(ts)) else {
            return Err(format!("row {i}: negative offset or ts"));
        };
        rows.push(Row {
            partition,
            offset,
            ts,
        });
    }
    Ok((rows, issues))
}

#[cfg(test)]
mod tests;
