use queen_domain::kv::{KvOutcome, KvResult, KvRowView};
use queen_domain::time::Stamp;

use super::*;

fn one(op: &str) -> Result<KvOp, ApiError> {
    kv_ops(format!(r#"{{"operations":[{op}]}}"#).as_bytes(), false).map(|mut v| v.remove(0))
}

fn view(value: &str) -> KvRowView {
    KvRowView {
        key: "k".into(),
        value: value.as_bytes().to_vec(),
        version: 7,
        expires: None,
        updated: Stamp(1),
        created: Stamp(1),
    }
}

#[test]
fn put_stores_the_clients_text() {
    for p in crate::raw::ODD_PAYLOADS {
        let KvOp::Put { value, .. } = one(&format!(
            r#"{{"op":"put","ns":"a","key":"k","value": {p} ,"forever":true}}"#
        ))
        .unwrap() else {
            panic!()
        };
        assert_eq!(String::from_utf8_lossy(&value), *p);
        let KvOp::Put { value, .. } = path_put(
            format!(r#"{{"value":{p},"ttlSeconds":5}}"#).as_bytes(),
            "a".into(),
            "k".into(),
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(String::from_utf8_lossy(&value), *p, "path form");
    }
    assert_eq!(
        path_put(br#"{"forever":true}"#, "a".into(), "k".into())
            .unwrap_err()
            .message,
        "value is required"
    );
    assert_eq!(
        path_put(
            br#"{"value":1,"ttlSeconds":315360001}"#,
            "a".into(),
            "k".into()
        )
        .unwrap_err()
        .message,
        "ttlSeconds must be 1 to 315360000 seconds (ten years)"
    );
    assert_eq!(
        path_put(br#"{"value":1}"#, "a".into(), "k".into())
            .unwrap_err()
            .code,
        "kv_expiry_not_specified"
    );
}

#[test]
fn incr_reads_delta_and_bounds_exactly() {
    let incr = |extra: &str| {
        one(&format!(
            r#"{{"op":"incr","ns":"a","key":"k","forever":true{extra}}}"#
        ))
    };
    let KvOp::Incr { delta, .. } = incr(r#","delta":9007199254740993"#).unwrap() else {
        panic!()
    };
    assert_eq!(delta, Num::Int(9_007_199_254_740_993));
    let KvOp::Incr {
        delta, min, max, ..
    } = incr(r#","delta":-2.5,"min":-9007199254740992,"max":1e300"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        (delta, min, max),
        (
            Num::Float(-2.5),
            Some(-9_007_199_254_740_992.0),
            Some(1e300)
        )
    );
    let KvOp::Incr { delta, .. } = incr("").unwrap() else {
        panic!()
    };
    assert_eq!(delta, Num::Int(1));
    let msg = |extra: &str| incr(extra).unwrap_err().message;
    assert!(
        msg(r#","delta":9223372036854775808"#)
            .starts_with("operations[0].delta must be an integer from -9223372036854775808")
    );
    assert!(msg(r#","delta":1e400"#).starts_with("operations[0].delta must be a finite number"));
    assert_eq!(
        msg(r#","delta":"1""#),
        "operations[0].delta must be a number"
    );
    assert!(
        msg(r#","max":9007199254740993"#)
            .starts_with("operations[0].max must be an integer a 64-bit float holds exactly")
    );
    assert!(msg(r#","min":-1e400"#).starts_with("operations[0].min must be a finite number"));
    assert_eq!(
        msg(r#","ttlSeconds":5"#),
        "operations[0] needs exactly one of ttlSeconds (an integer above 0) or forever: true"
    );
}

#[test]
fn durations_are_bounded() {
    let e = one(r#"{"op":"put","ns":"a","key":"k","value":1,"ttlSeconds":9223372036854775807}"#)
        .unwrap_err();
    assert_eq!(
        (e.status, e.message.as_str()),
        (
            400,
            "operations[0].ttlSeconds must be 1 to 315360000 seconds (ten years)"
        )
    );
    assert!(
        one(r#"{"op":"put","ns":"a","key":"k","value":1,"ttlSeconds":1e30}"#)
            .unwrap_err()
            .message
            .starts_with("operations[0].ttlSeconds must be 1 to")
    );
    assert!(matches!(
        one(r#"{"op":"put","ns":"a","key":"k","value":1,"ttlSeconds":315360000}"#),
        Ok(KvOp::Put {
            expiry: Expiry::Ttl(315_360_000),
            ..
        })
    ));
    let lock = |ttl: &str| {
        lock_ops(
            format!(r#"{{"operations":[{{"op":"acquire","name":"n","ttlSeconds":{ttl}}}]}}"#)
                .as_bytes(),
            &|| "me".to_owned(),
        )
    };
    assert_eq!(
        lock("9223372036854775807").unwrap_err().message,
        "operations[0].ttlSeconds must be 1 to 315360000 seconds (ten years)"
    );
    assert!(lock("315360000").is_ok());
    assert_eq!(
        lock("0").unwrap_err().message,
        "operations[0].ttlSeconds must be an integer above 0"
    );
    let renew = lock_ops(
        br#"{"operations":[{"op":"renew","name":"n","token":1,"ttlSeconds":315360001}]}"#,
        &|| "me".to_owned(),
    );
    assert!(
        renew
            .unwrap_err()
            .message
            .starts_with("operations[0].ttlSeconds must be 1 to")
    );
}

#[test]
fn answers_write_stored_values_verbatim() {
    let op = KvOp::Get {
        ns: "a".into(),
        key: "k".into(),
    };
    for p in crate::raw::ODD_PAYLOADS {
        let r = KvResult::Get(Some(view(p)));
        let text = serde_json::to_string(&result(0, &op, &r)).unwrap();
        assert!(text.contains(&format!(r#""value":{p}"#)), "{text}");
        let v: Value =
            serde_json::from_str(&text.replace(&format!(r#""value":{p}"#), r#""value":0"#))
                .unwrap();
        assert_eq!(v["found"], true);
        assert_eq!(v["op"], "get");
        assert_eq!(v["version"], 7);
        assert_eq!(v["expiresAt"], Value::Null);
    }
    let missing = serde_json::to_value(result(0, &op, &KvResult::Get(None))).unwrap();
    assert_eq!(
        missing,
        json!({"found": false, "key": "k", "index": 0, "op": "get"})
    );
    let broken =
        serde_json::to_string(&result(0, &op, &KvResult::Get(Some(view("not json"))))).unwrap();
    assert!(broken.contains(r#""value":"not json""#), "{broken}");
    let keys_only = KvResult::Prefix {
        rows: vec![view("1")],
        truncated: false,
        next_after: None,
        keys_only: true,
    };
    let v = serde_json::to_value(result(0, &op, &keys_only)).unwrap();
    assert!(v["rows"][0].get("value").is_none());
    assert_eq!(v["nextAfter"], Value::Null);
}

#[test]
fn a_lost_precondition_reports_the_winners_text() {
    let ops = vec![KvOp::Incr {
        ns: "a".into(),
        key: "k".into(),
        delta: Num::Int(1),
        min: None,
        max: None,
        expiry: Expiry::Forever,
        required: true,
    }];
    let out = KvOutcome {
        results: vec![KvResult::Write {
            applied: false,
            reason: Some("overflow".into()),
            current: Some(view("9223372036854775807")),
        }],
        failed: Some(0),
    };
    let text = serde_json::to_string(&outcome(&ops, &out)).unwrap();
    assert!(text.contains(r#""value":9223372036854775807"#), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (
            v["ok"].clone(),
            v["reason"].clone(),
            v["failedIndex"].clone(),
            v["kvReason"].clone(),
            v["version"].clone()
        ),
        (
            json!(false),
            json!("kv_precondition"),
            json!(0),
            json!("overflow"),
            json!(7)
        )
    );
    assert_eq!(v["results"][0]["reason"], "overflow");
    assert_eq!(v["results"][0]["applied"], false);
    assert_eq!(v["results"][0]["expiresAt"], Value::Null);
    let ok = KvOutcome {
        results: vec![KvResult::Write {
            applied: true,
            reason: None,
            current: None,
        }],
        failed: None,
    };
    let v = serde_json::to_value(outcome(&ops, &ok)).unwrap();
    assert_eq!(
        v,
        json!({"ok": true, "results": [{"applied": true, "value": null, "version": null, "index": 0, "op": "incr"}]})
    );
}
