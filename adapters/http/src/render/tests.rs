use queen_domain::command::{Claim, Delivered};
use queen_domain::time::Stamp;

use super::*;

#[test]
fn pops_answer_the_producers_text() {
    let messages = crate::raw::ODD_PAYLOADS
        .iter()
        .chain([&"not json"])
        .enumerate()
        .map(|(i, p)| Delivered {
            offset: i as u64,
            transaction_id: format!("t{i}"),
            id: [1; 16],
            trace_id: None,
            payload: p.as_bytes().to_vec(),
            created: Stamp(5),
            attempt: 1,
            producer: None,
        })
        .collect();
    let out = PopOutcome {
        lease_id: "l".into(),
        lease_expires: Stamp(9),
        claims: vec![Claim {
            pid: 3,
            partition: "Default".into(),
            messages,
        }],
        conflation: Default::default(),
    };
    let text = serde_json::to_string(&pop(
        "q",
        "g",
        &out,
        Some(queen_ports::AutopilotEcho {
            partitions: 1,
            batch: 200,
            wait_ms: 0,
        }),
    ))
    .unwrap();
    for p in crate::raw::ODD_PAYLOADS {
        assert!(text.contains(&format!(r#""data":{p}"#)), "{p} in {text}");
    }
    assert!(
        text.contains(r#""data":"not json""#),
        "bytes that are not JSON come back as a string"
    );
    let mut readable = text.clone();
    for p in crate::raw::ODD_PAYLOADS {
        readable = readable.replace(&format!(r#""data":{p}"#), r#""data":0"#);
    }
    let v: Value = serde_json::from_str(&readable).unwrap();
    assert_eq!(v["leaseExpiresAt"], Stamp(9).iso_millis());
    assert_eq!(v["partitionId"], "3");
    assert_eq!(
        v["autopilot"],
        json!({"batch": 200, "partitions": 1, "waitMs": 0})
    );
    let m = &v["messages"][1];
    for key in [
        "id",
        "transactionId",
        "traceId",
        "producerSub",
        "createdAt",
        "queue",
        "partitionId",
        "partition",
        "leaseId",
        "consumerGroup",
        "offset",
        "deliveryAttempt",
        "retryCount",
    ] {
        assert!(m.get(key).is_some(), "{key}");
    }
    assert_eq!(
        (
            m["retryCount"].clone(),
            m["consumerGroup"].clone(),
            m["producerSub"].clone()
        ),
        (json!(0), json!("g"), Value::Null)
    );
    let auto_ack = PopOutcome {
        lease_id: String::new(),
        lease_expires: Stamp(9),
        claims: vec![],
        conflation: Default::default(),
    };
    let v = serde_json::to_value(pop(
        "q",
        queen_domain::names::QUEUE_MODE_GROUP,
        &auto_ack,
        None,
    ))
    .unwrap();
    assert_eq!(v["leaseExpiresAt"], Value::Null);
    assert!(v.get("autopilot").is_none());
}
