use super::*;

#[test]
fn defaults_and_named_refusals() {
    let c = RawConfig::default().validate().unwrap();
    assert_eq!((c.port, c.node_id), (6632, 1));
    let e = RawConfig {
        port: Some("abc".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.to_string(), "PORT: 'abc' is not a port number (1-65535)");
    let e = RawConfig {
        node_id: Some("0".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.variable, "QUEEN_RAFT_NODE_ID");
    let c = RawConfig {
        node_id: Some("ordinal".into()),
        hostname: Some("queen-2".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap();
    assert_eq!(c.node_id, 3);
    assert_eq!(
        RawConfig {
            port: Some("  ".into()),
            ..RawConfig::default()
        }
        .validate()
        .unwrap()
        .port,
        6632
    );
}

#[test]
fn body_bounds_have_defaults_and_ranges() {
    let c = RawConfig::default().validate().unwrap();
    assert_eq!(
        (c.body_timeout, c.body_budget_bytes),
        (Duration::from_secs(30), 256 << 20)
    );
    let big = RawConfig {
        max_body_bytes: Some((512u64 << 20).to_string()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap();
    assert_eq!(
        big.body_budget_bytes,
        512 << 20,
        "the default budget holds one largest body"
    );
    assert_eq!(c.max_message_bytes, 8 << 20);
    let small = RawConfig {
        max_body_bytes: Some("4096".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap();
    assert_eq!(
        small.max_message_bytes, 4096,
        "a message never exceeds the body limit"
    );
    let e = RawConfig {
        max_message_bytes: Some((128u64 << 20).to_string()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.variable, "QUEEN_MAX_MESSAGE_BYTES");
    let e = RawConfig {
        body_budget_bytes: Some("1000".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.variable, "QUEEN_BODY_BUDGET_BYTES");
    for bad in ["999", "600001", "soon"] {
        let e = RawConfig {
            body_timeout_ms: Some(bad.into()),
            ..RawConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.variable, "QUEEN_BODY_TIMEOUT_MS", "{bad}");
    }
}

#[test]
fn clock_skew_has_a_default_and_a_range() {
    assert_eq!(
        RawConfig::default().validate().unwrap().max_clock_skew_ms,
        500
    );
    let c = RawConfig {
        max_clock_skew_ms: Some("0".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap();
    assert_eq!(c.max_clock_skew_ms, 0);
    for bad in ["60001", "-1", "soon"] {
        let e = RawConfig {
            max_clock_skew_ms: Some(bad.into()),
            ..RawConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.variable, "QUEEN_RAFT_MAX_CLOCK_SKEW_MS", "{bad}");
    }
}

#[test]
fn the_disk_reserve_has_a_default_and_a_range() {
    assert_eq!(
        RawConfig::default().validate().unwrap().disk_reserve_bytes,
        32 << 20
    );
    let c = RawConfig {
        disk_reserve_bytes: Some("0".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap();
    assert_eq!(c.disk_reserve_bytes, 0);
    for bad in ["1099511627777", "-1", "lots"] {
        let e = RawConfig {
            disk_reserve_bytes: Some(bad.into()),
            ..RawConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.variable, "QUEEN_RAFT_DISK_RESERVE_BYTES", "{bad}");
    }
}

#[test]
fn peers_and_token_rules() {
    let p = parse_peers("1=a:7400/a:6632, 2=b:7400/b:6632").unwrap();
    assert_eq!(
        p[1],
        Peer {
            id: 2,
            raft: "b:7400".into(),
            http: "b:6632".into()
        }
    );
    assert!(parse_peers("1=a/a:1").is_err());
    let e = RawConfig {
        peers: Some("1=a:1/a:2,2=b:1/b:2".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.variable, "QUEEN_RAFT_TOKEN");
    let c = RawConfig {
        token: Some("s3cret".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap();
    assert!(
        !format!("{c:?}").contains("s3cret"),
        "the token never reaches a log line"
    );
    let line = c.describe();
    assert!(!line.contains("s3cret"), "{line}");
    assert!(line.contains("token=set"), "{line}");
    assert!(line.contains("request_timeout_ms="), "{line}");
}

#[test]
fn raft_timings_have_defaults_and_ranges() {
    let c = RawConfig::default().validate().unwrap();
    assert_eq!(
        (c.heartbeat_ms, c.election_min_ms, c.election_max_ms),
        (100, 400, 700)
    );
    let with = |hb: &str, min: &str, max: &str| {
        RawConfig {
            heartbeat_ms: Some(hb.into()),
            election_min_ms: Some(min.into()),
            election_max_ms: Some(max.into()),
            ..RawConfig::default()
        }
        .validate()
    };
    let c = with("50", "300", "600").unwrap();
    assert_eq!(
        (c.heartbeat_ms, c.election_min_ms, c.election_max_ms),
        (50, 300, 600)
    );
    assert_eq!(
        with("5", "300", "600").unwrap_err().variable,
        "QUEEN_RAFT_HEARTBEAT_MS"
    );
    assert_eq!(
        with("100", "250", "600").unwrap_err().variable,
        "QUEEN_RAFT_ELECTION_MIN_MS"
    );
    assert_eq!(
        with("100", "400", "400").unwrap_err().variable,
        "QUEEN_RAFT_ELECTION_MAX_MS"
    );
    assert_eq!(
        with("100", "x", "700").unwrap_err().variable,
        "QUEEN_RAFT_ELECTION_MIN_MS"
    );
    // A minimum above the default maximum moves the default maximum with it.
    let c = RawConfig {
        election_min_ms: Some("2000".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap();
    assert_eq!(c.election_max_ms, 2001);
}
