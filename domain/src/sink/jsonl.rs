//! The JSONL line of one record: `partition, offset, transactionId, ts, payload`, in that order,
//! the payload written as the stored bytes (so `42.00` stays `42.00`), `null` when empty, with
//! raw line breaks turned into spaces so a record stays on one line.

use crate::time::Stamp;

/// One record as the sink reads it from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkRecord {
    /// Partition name.
    pub partition: String,
    /// Offset in the partition.
    pub offset: u64,
    /// The producer's transactionId.
    pub transaction_id: String,
    /// The push's stamp.
    pub ts: Stamp,
    /// The stored payload bytes (JSON text).
    pub payload: Vec<u8>,
}

/// Append one record's line (with its trailing `\n`) to `out`.
pub fn write_line(out: &mut Vec<u8>, r: &SinkRecord) {
    out.extend_from_slice(b"{\"partition\":");
    out.extend_from_slice(
        serde_json::Value::String(r.partition.clone())
            .to_string()
            .as_bytes(),
    );
    out.extend_from_slice(b",\"offset\":");
    out.extend_from_slice(r.offset.to_string().as_bytes());
    out.extend_from_slice(b",\"transactionId\":");
    out.extend_from_slice(
        serde_json::Value::String(r.transaction_id.clone())
            .to_string()
            .as_bytes(),
    );
    out.extend_from_slice(b",\"ts\":\"");
    out.extend_from_slice(r.ts.iso_micros().as_bytes());
    out.extend_from_slice(b"\",\"payload\":");
    if r.payload.iter().all(u8::is_ascii_whitespace) {
        out.extend_from_slice(b"null");
    } else {
        out.extend(
            r.payload
                .iter()
                .map(|b| if matches!(b, b'\n' | b'\r') { b' ' } else { *b }),
        );
    }
    out.extend_from_slice(b"}\n");
}

/// The lines of a window's records, sorted by partition then offset.
#[must_use]
pub fn encode_window(records: &mut [SinkRecord]) -> Vec<u8> {
    records.sort_by(|a, b| a.partition.cmp(&b.partition).then(a.offset.cmp(&b.offset)));
    let mut out = Vec::with_capacity(records.iter().map(|r| r.payload.len() + 128).sum());
    for r in records.iter() {
        write_line(&mut out, r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(p: &str, o: u64, payload: &[u8]) -> SinkRecord {
        SinkRecord {
            partition: p.into(),
            offset: o,
            transaction_id: format!("t{o}"),
            ts: Stamp(1_791_009_457_501_942),
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn the_documents_lines_byte_for_byte() {
        let mut rs = vec![
            rec("cust-2", 0, br#"{"order":2,"total":17.50}"#),
            rec("cust-1", 1, b"{\n  \"total\": 42.00\n}"),
            rec("cust-1", 0, b""),
        ];
        let text = String::from_utf8(encode_window(&mut rs)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            r#"{"partition":"cust-1","offset":0,"transactionId":"t0","ts":"2026-10-03T06:37:37.501942Z","payload":null}"#
        );
        assert_eq!(
            lines[1],
            r#"{"partition":"cust-1","offset":1,"transactionId":"t1","ts":"2026-10-03T06:37:37.501942Z","payload":{   "total": 42.00 }}"#
        );
        assert!(
            lines[2].ends_with(r#""payload":{"order":2,"total":17.50}}"#),
            "payloads are never re-printed"
        );
    }

    proptest! {
        // Every line parses as JSON with the five fields, and the payload round-trips as a value.
        #[test]
        fn lines_are_json_and_keep_the_payload(p in ".{1,20}", t in ".{1,20}", v in proptest::collection::vec(any::<i32>(), 0..5), pretty in any::<bool>()) {
            let value = serde_json::json!({"v": v, "s": "a\"b\\c"});
            let payload = if pretty { serde_json::to_vec_pretty(&value).unwrap() } else { serde_json::to_vec(&value).unwrap() };
            let mut out = Vec::new();
            write_line(&mut out, &SinkRecord { partition: p.clone(), offset: 7, transaction_id: t.clone(), ts: Stamp(5), payload });
            prop_assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
            let parsed: serde_json::Value = serde_json::from_slice(&out).unwrap();
            prop_assert_eq!(&parsed["partition"], &serde_json::Value::String(p));
            prop_assert_eq!(&parsed["transactionId"], &serde_json::Value::String(t));
            prop_assert_eq!(&parsed["payload"], &value);
            let keys: Vec<&String> = parsed.as_object().unwrap().keys().collect();
            prop_assert_eq!(keys.len(), 5);
        }
    }
}
