use super::*;

#[test]
fn fetched_records_and_dead_letters_carry_the_producers_text() {
    for p in crate::raw::ODD_PAYLOADS {
        let record = FetchRecord {
            offset: 1,
            transaction_id: "t".into(),
            payload: StoredJson(p.as_bytes()),
            ts: "x".into(),
        };
        let entry = FetchOut {
            entries: vec![FetchEntry {
                high_watermark: 2,
                log_start_offset: 0,
                records: vec![record],
                error: None,
            }],
        };
        let text = serde_json::to_string(&entry).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"entries":[{{"highWatermark":2,"logStartOffset":0,"records":[{{"offset":1,"transactionId":"t","payload":{p},"ts":"x"}}]}}]}}"#
            )
        );
        let d = DlqMessage {
            id: "i".into(),
            transaction_id: "t",
            partition_id: "1".into(),
            queue: "q",
            partition: "Default",
            consumer_group: None,
            error_message: Some("boom"),
            retry_count: 3,
            data: StoredJson(p.as_bytes()),
            created_at: "c".into(),
            failed_at: "f".into(),
            offset: 0,
        };
        let text = serde_json::to_string(&DlqOut {
            messages: vec![d],
            total: 1,
        })
        .unwrap();
        assert!(text.contains(&format!(r#""data":{p},"#)), "{text}");
        assert!(
            text.contains(r#""consumerGroup":null,"errorMessage":"boom","retryCount":3"#),
            "{text}"
        );
    }
}
