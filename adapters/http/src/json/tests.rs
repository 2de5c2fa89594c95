use super::*;

#[test]
fn push_names_the_bad_field() {
    let e = push_items(br#"{"items":[{"queue":"q"},{"queue":5}]}"#).unwrap_err();
    assert_eq!(e.message, "items[1].queue must be a string");
    let e = push_items(br#"{"items":[{"queue":"a/b"}]}"#).unwrap_err();
    assert!(e.message.starts_with("items[0].queue"));
    assert_eq!(push_items(b"{").unwrap_err().code, "bad_json");
    assert_eq!(push_items(br#"{"items":[]}"#).unwrap().len(), 0);
}

#[test]
fn push_mints_missing_ids_and_keeps_payload_verbatim() {
    let v = push_items(br#"{"items":[{"queue":"q","payload":{"a":[1,2]}}]}"#).unwrap();
    assert_eq!(v[0].transaction_id.as_str().len(), 36);
    assert_eq!(v[0].payload, br#"{"a":[1,2]}"#);
    let v = push_items(
        br#"{"items":[{"queue":"q","payload":{"total": 42.00}},{"queue":"q","data":1.50}]}"#,
    )
    .unwrap();
    assert_eq!(
        v[0].payload, br#"{"total": 42.00}"#,
        "the producer's own text"
    );
    assert_eq!(v[1].payload, b"1.50");
    assert_eq!(v[0].partition.as_str(), "Default");
}

#[test]
fn acks_accept_nulls_and_numbers() {
    let (g, a) =
        ack_single(br#"{"transactionId":"t","partitionId":7,"consumerGroup":null,"error":null}"#)
            .unwrap();
    assert!(g.is_queue_mode());
    assert_eq!(a.partition_id, PartitionRef::Id(7));
    assert_eq!(a.status, AckStatus::Completed);
    assert!(
        ack_single(br#"{"transactionId":"t"}"#)
            .unwrap_err()
            .message
            .contains("partitionId")
    );
}

#[test]
fn push_stores_every_payload_as_written() {
    for p in crate::raw::ODD_PAYLOADS {
        let body = format!(
            r#"{{"items":[{{"queue":"q","payload": {p} , "unknown": 1e999}}, {{"queue":"q","data":{p}}}]}}"#
        );
        let v = push_items(body.as_bytes()).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(String::from_utf8_lossy(&v[0].payload), *p);
        assert_eq!(
            String::from_utf8_lossy(&v[1].payload),
            *p,
            "data is the payload's other name"
        );
    }
    let v = push_items(br#"{"items":[{"queue":"q"}]}"#).unwrap();
    assert_eq!(v[0].payload, b"null");
    let e = push_items(br#"{"items":[{"queue":1e400}]}"#).unwrap_err();
    assert_eq!(e.message, "items[0].queue holds a number out of range");
    assert_eq!(
        push_items(br#"{"items":{}}"#).unwrap_err().message,
        "items must be a list"
    );
    assert_eq!(
        push_items(br#"{"items":null}"#).unwrap_err().message,
        "items is required"
    );
    assert_eq!(
        push_items(br#"{"items":[7]}"#).unwrap_err().message,
        "items[0] must be an object"
    );
}

#[test]
fn transaction_pushes_keep_payloads_and_errors_name_the_exact_path() {
    let body = format!(
        r#"{{"operations":[{{"type":"push","items":[{{"queue":"q","payload":{}}}]}}]}}"#,
        crate::raw::ODD_PAYLOADS[0]
    );
    let (ops, _, _, _) = transaction(body.as_bytes()).unwrap();
    let TxnOp::Push(p) = &ops[0] else {
        panic!("{ops:?}")
    };
    assert_eq!(p.payload, crate::raw::ODD_PAYLOADS[0].as_bytes());
    let msg = |b: &str| transaction(b.as_bytes()).unwrap_err().message;
    assert_eq!(
        msg(r#"{"operations":[{"type":"push","items":[{"queue":"q"},{"queue":5}]}]}"#),
        "operations[0].items[1].queue must be a string"
    );
    assert_eq!(
        msg(r#"{"operations":[{"type":"push"}]}"#),
        "operations[0].items is required"
    );
    assert_eq!(
        msg(r#"{"operations":[{"type":"ack"}]}"#),
        "operations[0].transactionId is required"
    );
    assert_eq!(
        msg(r#"{"operations":[5]}"#),
        "operations[0] must be an object"
    );
    let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"put","ns":"a","key":"k","value":1,"forever":true},{"ns":"a"}]}"#;
    assert_eq!(msg(kv), "kv[1].op is required");
    let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"nope"}]}"#;
    assert_eq!(msg(kv), "kv[0].op 'nope' is not a KV operation");
    let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"incr","ns":"a","key":"k","forever":true,"delta":1e400}]}"#;
    assert!(msg(kv).starts_with("kv[0].delta must be a finite number"));
    let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"put","ns":"a","key":"k","value":{"x": 1e400},"ttlSeconds":9223372036854775807}]}"#;
    assert_eq!(
        msg(kv),
        "kv[0].ttlSeconds must be 1 to 315360000 seconds (ten years)"
    );
    let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"put","ns":"a","key":"k","value":{"x": 1e400},"forever":true}]}"#;
    let (_, _, kv_ops, _) = transaction(kv.as_bytes()).unwrap();
    let queen_domain::kv::KvOp::Put { value, .. } = &kv_ops[0] else {
        panic!()
    };
    assert_eq!(value, br#"{"x": 1e400}"#);
    let t = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"timers":[{"op":"schedule","queue":"q","timerKey":"k","payload":"MQ==","delayMs":315360000001}]}"#;
    assert_eq!(
        msg(t),
        "timers[0].delayMs must be 0 to 315360000000 ms (ten years)"
    );
}

#[test]
fn configure_bounds_what_reaches_replicated_state() {
    let msg = |b: String| configure(b.as_bytes()).unwrap_err().message;
    assert_eq!(
        msg(format!(
            r#"{{"queue":"q","namespace":"{}"}}"#,
            "n".repeat(256)
        )),
        "namespace must be at most 255 bytes"
    );
    assert_eq!(
        msg(format!(
            r#"{{"queue":"q","task":"{}"}}"#,
            "t".repeat(1 << 20)
        )),
        "task must be at most 255 bytes"
    );
    assert_eq!(
        msg(r#"{"queue":"q","task":"a\u0000b"}"#.to_owned()),
        "task must not contain control characters"
    );
    let (_, ns, _, _) =
        configure(format!(r#"{{"queue":"q","namespace":"{}"}}"#, "n".repeat(255)).as_bytes())
            .unwrap();
    assert_eq!(ns.map(|n| n.len()), Some(255));
    assert_eq!(
        msg(r#"{"queue":"q","options":{"leaseTime":9223372036854775807}}"#.to_owned()),
        "options.leaseTime must be 0 to 315360000 seconds (ten years)"
    );
    assert_eq!(
        msg(format!(
            r#"{{"queue":"q","options":{{"custom":"{}"}}}}"#,
            "x".repeat(1 << 20)
        )),
        "options.custom is an unknown option; its value must be at most 4096 bytes of JSON"
    );
    let many: Vec<String> = (0..100_000).map(|i| format!(r#""k{i}":1"#)).collect();
    assert!(
        msg(format!(
            r#"{{"queue":"q","options":{{{}}}}}"#,
            many.join(",")
        ))
        .contains("at most 64 are kept")
    );
}

/// The one-pass reading of a push body gives the same items as the field-by-field one
/// (apart from the minted message ids), and leaves every refusal to it.
#[test]
fn one_pass_push_reading_agrees_with_the_field_by_field_one() {
    type Seen = (String, String, String, Vec<u8>, Option<String>);
    let strip = |v: Vec<PushItem>| -> Vec<Seen> {
        v.into_iter()
            .map(|i| {
                let minted =
                    i.transaction_id == uuid::Uuid::from_bytes(i.message_id).to_string().as_str();
                let txn = if minted {
                    "<minted>".to_owned()
                } else {
                    i.transaction_id.into_string()
                };
                (
                    i.queue.as_str().to_owned(),
                    i.partition.as_str().to_owned(),
                    txn,
                    i.payload,
                    i.trace_id,
                )
            })
            .collect()
    };
    let bodies = [
        r#"{"items":[{"queue":"q","payload":{"a":[1,2.50]},"transactionId":"t1"}]}"#,
        r#"{"x":1e400,"items":[{"queue":"q","partition":"p","data":42.00,"traceId":"tr","other":[1e400,{"y":null}]}]}"#,
        r#"{"items":[{"queue":"q","queue":"r","payload":"caf\u00e9","transactionId":"t\"2"}],"items":[{"queue":"s","payload":-0}]}"#,
        r#"{"items":[{"queue":"q","partition":null,"transactionId":null,"traceId":null,"payload":null}]}"#,
        r#" { "items" : [ { "queue" : "q" , "payload" : { "z" : 1 ,
            "a" : [ 1.10 ] } } , {"queue":"q"} ] } "#,
        r#"{"items":[]}"#,
        r#"{"items":[{"queue":"\u0071","partition":"p\u00e9"}]}"#,
    ];
    for b in bodies {
        assert!(
            crate::raw::pick_list(
                b.as_bytes(),
                "items",
                &[],
                &PUSH_FIELDS,
                MAX_PUSH_ITEMS,
                crate::raw::Unknown::Lax
            )
            .is_some(),
            "{b}"
        );
        let fast = strip(push_items(b.as_bytes()).unwrap_or_else(|e| panic!("{b}: {e}")));
        let slow = strip(push_items_slow(b.as_bytes()).unwrap_or_else(|e| panic!("{b}: {e}")));
        assert_eq!(fast, slow, "{b}");
    }
    let refused = [
        r#"{"items":[{"queue":"q"},{"queue":5}]}"#,
        r#"{"items":[{"queue":"a/b"}]}"#,
        r#"{"items":[{"queue":"q","transactionId":""}]}"#,
        r#"{"items":[{"queue":"q","traceId":7}]}"#,
        r#"{"items":[{"queue":1e400}]}"#,
        r#"{"items":[{"queue":5,"traceId":1e400}]}"#,
        r#"{"items":[{"queue":"q","transactionId":7}]}"#,
        r#"{"items":[{"queue":"q"},{"queue":"q","partition":"a/b"}]}"#,
        r#"{"items":[{"partition":"p"}]}"#,
        r#"{"items":[1]}"#,
        r#"{"items":{}}"#,
        r#"{"items":null}"#,
        r#"{"items":[{"queue":"q"}]} x"#,
        r#"{"items":[{"queue":"q"}"#,
        "[]",
        "",
    ];
    for b in refused {
        let fast = push_items(b.as_bytes()).unwrap_err();
        let slow = push_items_slow(b.as_bytes()).unwrap_err();
        assert_eq!((fast.code, fast.message), (slow.code, slow.message), "{b}");
    }
}

/// A status is checked once, here: an unknown word is a 400 naming the item's field, by
/// either reading; `success` is `completed`.
#[test]
fn an_ack_status_is_checked_at_the_edge() {
    let e = ack_batch(
        br#"{"acknowledgments":[{"transactionId":"t","partitionId":"1"},{"transactionId":"t","partitionId":"1","status":"weird"}]}"#,
    )
    .unwrap_err();
    assert_eq!((e.status, e.code), (400, "bad_request"));
    assert!(
        e.message.starts_with("acknowledgments[1].status must be"),
        "{}",
        e.message
    );
    let (_, items) = ack_batch(
        br#"{"acknowledgments":[{"transactionId":"t","partitionId":"1","status":"success"},{"transactionId":"t","partitionId":"1","status":"dlq"}]}"#,
    )
    .unwrap();
    assert_eq!(items[0].status, AckStatus::Completed);
    assert_eq!(items[1].status, AckStatus::Dlq);
}

/// The one-pass reading of an ack batch gives what the map-of-values reading gives, for the
/// bodies it takes, and every other body (refused or not) is answered by the latter alone.
#[test]
fn one_pass_ack_reading_agrees_with_the_map_reading() {
    let seen = |r: Result<(GroupName, Vec<AckItem>), ApiError>| match r {
        Ok((g, items)) => Ok((format!("{g:?}"), format!("{items:?}"))),
        Err(e) => Err((e.status, e.code, e.message)),
    };
    let bodies = [
        r#"{"consumerGroup":"g","acknowledgments":[{"transactionId":"t1","partitionId":"p","leaseId":"l"},{"transactionId":"t\"2","partitionId":"p\u00e9","status":"failed","error":"boom"}]}"#,
        r#"{"acknowledgments":[{"transactionId":"","partitionId":"p","leaseId":"","error":null,"status":null,"extra":{"a":[1,2.5]}}],"consumerGroup":null}"#,
        r#"{"acknowledgments":[],"x":"y"}"#,
        r#"{"acknowledgments":[{"transactionId":"a","partitionId":"p"}],"acknowledgments":[{"transactionId":"b","partitionId":"q"}]}"#,
        // Taken by the map reading only: a number, a null id, a number no value holds.
        r#"{"acknowledgments":[{"transactionId":"t","partitionId":7}]}"#,
        r#"{"acknowledgments":[{"transactionId":"t","partitionId":"p","other":1e400}]}"#,
        r#"{"x":1e400,"acknowledgments":[{"transactionId":"t","partitionId":"p"}]}"#,
        r#"{"acknowledgments":[{"transactionId":null,"partitionId":"p"}]}"#,
        r#"{"acknowledgments":[{"transactionId":"t","partitionId":""}]}"#,
        r#"{"acknowledgments":[{"transactionId":"t","partitionId":"p","status":5}]}"#,
        r#"{"acknowledgments":[{"transactionId":"t","partitionId":"p","status":"weird"}]}"#,
        r#"{"acknowledgments":[{"transactionId":"t","partitionId":"p","status":"success"}]}"#,
        r#"{"consumerGroup":5,"acknowledgments":[]}"#,
        r#"{"consumerGroup":"a/b","acknowledgments":[]}"#,
        r#"{"acknowledgments":[7]}"#,
        r#"{"acknowledgments":null}"#,
        r#"{"acknowledgments":{}}"#,
        r#"{"acknowledgments":[]} x"#,
        r#"{}"#,
        "[]",
        " ",
        "",
    ];
    for b in bodies {
        assert_eq!(
            seen(ack_batch(b.as_bytes())),
            seen(ack_batch_slow(b.as_bytes())),
            "{b}"
        );
    }
    let fast = |b: &str| {
        crate::raw::pick_list(
            b.as_bytes(),
            "acknowledgments",
            &["consumerGroup"],
            &ACK_FIELDS,
            MAX_ACK_ITEMS,
            crate::raw::Unknown::Strict,
        )
        .is_some()
    };
    assert!(fast(bodies[0]) && fast(bodies[1]));
    assert!(
        !fast(bodies[5]) && !fast(bodies[6]),
        "a number no value holds is left to the map reading"
    );
    assert!(ack_batch(bodies[5].as_bytes()).is_err());
}
