use super::*;

#[test]
fn options_parse_known_keep_unknown_and_name_bad_fields() {
    let v = serde_json::json!({"leaseTime": 10, "retryLimit": 1, "custom": {"a": 1}, "namespace": null});
    let o = QueueOptions::from_json(v.as_object().unwrap()).unwrap();
    assert_eq!(o.lease_time, 10);
    assert_eq!(o.retry_limit, 1);
    assert_eq!(o.extra.get("custom").map(String::as_str), Some("{\"a\":1}"));
    assert_eq!(o.to_json()["custom"]["a"], 1);
    let bad = serde_json::json!({"leaseTime": "ten"});
    let e = QueueOptions::from_json(bad.as_object().unwrap()).unwrap_err();
    assert_eq!(e.field, "leaseTime");
    let zero = serde_json::json!({"leaseTime": 0});
    assert!(QueueOptions::from_json(zero.as_object().unwrap()).is_err());
}

#[test]
fn durations_are_bounded_to_ten_years() {
    let parse = |v: serde_json::Value| QueueOptions::from_json(v.as_object().unwrap());
    assert_eq!(
        parse(serde_json::json!({"leaseTime": MAX_DURATION_SECONDS}))
            .unwrap()
            .lease_time,
        MAX_DURATION_SECONDS
    );
    for key in [
        "leaseTime",
        "delayedProcessing",
        "windowBuffer",
        "retentionSeconds",
        "completedRetentionSeconds",
        "maxWaitTimeSeconds",
        "ttl",
        "retentionSinkHoldMaxSeconds",
    ] {
        let e = parse(serde_json::json!({key: MAX_DURATION_SECONDS + 1})).unwrap_err();
        assert_eq!(e.field, key);
        assert_eq!(e.problem, "must be 0 to 315360000 seconds (ten years)");
        assert!(
            parse(serde_json::json!({key: 9_223_372_036_854_775_807_u64})).is_err(),
            "{key}"
        );
    }
    assert_eq!(
        parse(serde_json::json!({"retryDelay": MAX_DURATION_MS}))
            .unwrap()
            .retry_delay,
        MAX_DURATION_MS
    );
    assert_eq!(
        parse(serde_json::json!({"retryDelay": MAX_DURATION_MS + 1}))
            .unwrap_err()
            .field,
        "retryDelay"
    );
}

#[test]
fn unknown_options_are_bounded() {
    let parse = |v: serde_json::Value| QueueOptions::from_json(v.as_object().unwrap());
    let mut many = serde_json::Map::new();
    for i in 0..MAX_EXTRA_OPTIONS {
        many.insert(format!("k{i:03}"), serde_json::json!(i));
    }
    assert_eq!(
        QueueOptions::from_json(&many).unwrap().extra.len(),
        MAX_EXTRA_OPTIONS
    );
    many.insert("k999".to_owned(), serde_json::json!(1));
    let e = QueueOptions::from_json(&many).unwrap_err();
    assert_eq!(e.field, "k999");
    let e =
        parse(serde_json::json!({"big": "x".repeat(MAX_EXTRA_OPTION_VALUE_BYTES)})).unwrap_err();
    assert_eq!(e.field, "big");
    assert!(
        parse(serde_json::json!({"big": "x".repeat(MAX_EXTRA_OPTION_VALUE_BYTES - 2)})).is_ok()
    );
    let e = parse(serde_json::json!({"k".repeat(300): 1})).unwrap_err();
    assert_eq!(e.field.len(), 64);
}
