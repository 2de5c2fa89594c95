use super::*;

/// The answer as it was built before (a map of values per item), for comparison.
fn push_as_values(outcomes: &[PushOutcome]) -> Value {
    Value::Array(
        outcomes
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let (status, error) = match &o.status {
                    PushStatus::Queued => ("queued", None),
                    PushStatus::Duplicate => ("duplicate", None),
                    PushStatus::Failed(e) => ("failed", Some(e.clone())),
                };
                let mut v = json!({
                    "index": i,
                    "message_id": uuid_text(&o.message_id),
                    "transaction_id": o.transaction_id,
                    "queueName": o.queue,
                    "partitionId": o.partition_id.to_string(),
                    "status": status,
                    "offset": o.offset,
                });
                if let Some(e) = error {
                    v["error"] = Value::String(e);
                }
                v
            })
            .collect(),
    )
}

/// The ack answer is byte for byte what it was when built as values.
#[test]
fn ack_answers_keep_their_bytes() {
    let o = |success, error: Option<&str>, txn: &str| AckOutcome {
        transaction_id: txn.to_owned(),
        verdict: queen_domain::model::AckVerdict {
            success,
            error: error.map(str::to_owned),
            lease_released: success,
            dlq: !success,
            noop: success,
        },
    };
    let outcomes = vec![
        o(true, None, "t-1"),
        o(false, Some("no live lease covers this message"), "t\"2"),
    ];
    let as_values = Value::Array(
        outcomes
            .iter()
            .enumerate()
            .map(|(i, o)| {
                json!({
                    "index": i,
                    "transactionId": o.transaction_id,
                    "success": o.verdict.success,
                    "error": o.verdict.error,
                    "leaseReleased": o.verdict.lease_released,
                    "dlq": o.verdict.dlq,
                    "noop": o.verdict.noop,
                })
            })
            .collect(),
    );
    assert_eq!(
        serde_json::to_string(&acks(&outcomes)).unwrap(),
        serde_json::to_string(&as_values).unwrap()
    );
}

/// The push answer is byte for byte what it was when built as values.
#[test]
fn push_answers_keep_their_bytes() {
    let o = |status, txn: &str, q: &str| PushOutcome {
        status,
        message_id: [0x5a; 16],
        offset: 7_000_000_123,
        partition_id: u64::MAX,
        transaction_id: txn.to_owned(),
        queue: q.to_owned(),
    };
    let outcomes = vec![
        o(PushStatus::Queued, "t-1", "q"),
        o(PushStatus::Duplicate, "t\"2\u{e9}", "queue.a"),
        o(
            PushStatus::Failed("queue 'q' is full (maxSize 3)".to_owned()),
            "t3",
            "q",
        ),
    ];
    assert_eq!(
        String::from_utf8(push(&outcomes)).unwrap(),
        serde_json::to_string(&push_as_values(&outcomes)).unwrap()
    );
    assert_eq!(push(&[]), b"[]");
}

/// Every string a client chose is escaped as `serde_json` escapes it: quotes, backslashes,
/// control characters, and text beyond ASCII kept as it is.
#[test]
fn push_answers_escape_what_clients_wrote() {
    let texts = [
        "plain",
        "",
        "quote\"",
        "back\\slash",
        "line\nfeed\ttab\r",
        "nul\u{0}bell\u{7}esc\u{1b}unit\u{1f}",
        "del\u{7f}",
        "\u{e9}t\u{e9} \u{1f600} \u{2028}",
        "slash/</script>",
    ];
    let outcomes: Vec<PushOutcome> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| PushOutcome {
            status: if i % 2 == 0 {
                PushStatus::Queued
            } else {
                PushStatus::Failed(format!("refused: {t}"))
            },
            message_id: [i as u8; 16],
            offset: i as u64 * 1_000_003,
            partition_id: i as u64,
            transaction_id: (*t).to_owned(),
            queue: texts[texts.len() - 1 - i].to_owned(),
        })
        .collect();
    let written = String::from_utf8(push(&outcomes)).unwrap();
    assert_eq!(
        written,
        serde_json::to_string(&push_as_values(&outcomes)).unwrap()
    );
    let back: Value = serde_json::from_str(&written).unwrap();
    assert_eq!(back[3]["transaction_id"], "back\\slash");
    assert_eq!(back[5]["queueName"], texts[3]);
}
