use super::*;

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

/// The block of one family: its HELP and TYPE lines and every sample line.
fn family<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
    let help = format!("# HELP {name} ");
    let start = text
        .lines()
        .position(|l| l.starts_with(&help))
        .unwrap_or_else(|| panic!("no HELP line for {name} in:\n{text}"));
    let mut block = vec![];
    for (i, line) in text.lines().enumerate().skip(start) {
        if i > start + 1 && line.starts_with("# HELP ") {
            break;
        }
        block.push(line);
    }
    block
}

#[test]
fn counters_with_labels_render_exactly_with_escaped_values() {
    let telemetry = Telemetry::metrics_only(7);
    let m = telemetry.metrics();
    m.http_request("/api/v1/push", 200, 0.003);
    m.http_request("/api/v1/push", 200, 0.004);
    m.http_request("/a\"b\\c\nd", 503, 0.2);
    m.proposal("push", true, 0.01);
    m.proposal("push", false, 0.02);
    let text = telemetry.render_prometheus();
    assert_eq!(
        family(&text, "queen_http_requests_total"),
        [
            "# HELP queen_http_requests_total Client HTTP requests answered, by route and status code.",
            "# TYPE queen_http_requests_total counter",
            r#"queen_http_requests_total{route="/a\"b\\c\nd",status="503"} 1"#,
            r#"queen_http_requests_total{route="/api/v1/push",status="200"} 2"#,
        ]
    );
    assert_eq!(
        family(&text, "queen_raft_proposals_total"),
        [
            "# HELP queen_raft_proposals_total Commands proposed to the replicated log, by kind and result.",
            "# TYPE queen_raft_proposals_total counter",
            r#"queen_raft_proposals_total{kind="push",result="error"} 1"#,
            r#"queen_raft_proposals_total{kind="push",result="ok"} 1"#,
        ]
    );
}

#[test]
fn a_histogram_renders_cumulative_buckets_sum_and_count() {
    let telemetry = Telemetry::metrics_only(1);
    let m = telemetry.metrics();
    m.proposal("ack", true, 0.003);
    m.proposal("ack", true, 0.2);
    m.proposal("ack", false, 45.0);
    let text = telemetry.render_prometheus();
    let b = |le: &str, n: u64| {
        format!(r#"queen_raft_proposal_duration_seconds_bucket{{kind="ack",le="{le}"}} {n}"#)
    };
    let mut expected = vec![
        "# HELP queen_raft_proposal_duration_seconds Time from proposing a command to its outcome on this node, by kind.".to_owned(),
        "# TYPE queen_raft_proposal_duration_seconds histogram".to_owned(),
    ];
    for (le, n) in [
        ("0.001", 0),
        ("0.0025", 0),
        ("0.005", 1),
        ("0.01", 1),
        ("0.025", 1),
        ("0.05", 1),
        ("0.1", 1),
        ("0.25", 2),
        ("0.5", 2),
        ("1", 2),
        ("2.5", 2),
        ("5", 2),
        ("10", 2),
        ("30", 2),
        ("+Inf", 3),
    ] {
        expected.push(b(le, n));
    }
    expected.push(r#"queen_raft_proposal_duration_seconds_sum{kind="ack"} 45.203"#.to_owned());
    expected.push(r#"queen_raft_proposal_duration_seconds_count{kind="ack"} 3"#.to_owned());
    assert_eq!(
        family(&text, "queen_raft_proposal_duration_seconds"),
        expected
    );
}

#[test]
fn gauges_and_plain_counters_render_their_last_values() {
    let telemetry = Telemetry::metrics_only(1);
    let m = telemetry.metrics();
    m.set_raft(None, 4, 120, 121, true);
    m.set_raft(None, 5, 130, 131, false);
    m.set_store_disk_bytes(None, 1 << 40);
    m.set_waiting_pops(3);
    m.messages_pushed(10);
    m.messages_pushed(5);
    m.messages_duplicate(2);
    m.messages_delivered(9);
    let text = telemetry.render_prometheus();
    let all = lines(&text);
    for expected in [
        "# TYPE queen_raft_term gauge",
        "queen_raft_term 5",
        "queen_raft_applied_index 130",
        "queen_raft_commit_index 131",
        "queen_raft_is_leader 0",
        "# TYPE queen_store_disk_bytes gauge",
        "queen_store_disk_bytes 1099511627776",
        "# TYPE queen_pop_waiting gauge",
        "queen_pop_waiting 3",
        "# TYPE queen_messages_pushed_total counter",
        "queen_messages_pushed_total 15",
        "queen_messages_duplicate_total 2",
        "queen_messages_delivered_total 9",
    ] {
        assert!(all.contains(&expected), "missing {expected:?} in:\n{text}");
    }
    m.set_raft(None, 5, 131, 131, true);
    assert!(lines(&telemetry.render_prometheus()).contains(&"queen_raft_is_leader 1"));
}

#[test]
fn the_fsync_counter_follows_the_running_total_and_never_goes_back() {
    let telemetry = Telemetry::metrics_only(1);
    let m = telemetry.metrics();
    let value = |t: &Telemetry| {
        let text = t.render_prometheus();
        family(&text, "queen_raft_log_fsyncs_total")
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        value(&telemetry)[1],
        "# TYPE queen_raft_log_fsyncs_total counter"
    );
    assert_eq!(value(&telemetry)[2], "queen_raft_log_fsyncs_total 0");
    m.set_log_fsyncs(None, 10);
    assert_eq!(value(&telemetry)[2], "queen_raft_log_fsyncs_total 10");
    m.set_log_fsyncs(None, 4);
    assert_eq!(value(&telemetry)[2], "queen_raft_log_fsyncs_total 10");
    m.set_log_fsyncs(None, 12);
    assert_eq!(value(&telemetry)[2], "queen_raft_log_fsyncs_total 12");
}

#[test]
fn the_figures_of_several_raft_groups_carry_a_group_label() {
    let telemetry = Telemetry::metrics_only(1);
    let m = telemetry.metrics();
    m.set_raft(Some(0), 3, 10, 11, true);
    m.set_raft(Some(2), 4, 20, 21, false);
    m.set_log_fsyncs(Some(0), 7);
    m.set_log_fsyncs(Some(2), 9);
    m.set_store_disk_bytes(Some(2), 4096);
    let text = telemetry.render_prometheus();
    let all = lines(&text);
    for expected in [
        "queen_raft_is_leader{group=\"0\"} 1",
        "queen_raft_is_leader{group=\"2\"} 0",
        "queen_raft_applied_index{group=\"2\"} 20",
        "queen_raft_log_fsyncs_total{group=\"0\"} 7",
        "queen_raft_log_fsyncs_total{group=\"2\"} 9",
        "queen_store_disk_bytes{group=\"2\"} 4096",
    ] {
        assert!(all.contains(&expected), "missing {expected:?} in:\n{text}");
    }
    assert!(
        !all.contains(&"queen_raft_log_fsyncs_total 0"),
        "an unlabelled fsync series beside the groups':\n{text}"
    );
}

#[test]
fn ack_statuses_outside_the_known_set_count_as_other() {
    let telemetry = Telemetry::metrics_only(1);
    let m = telemetry.metrics();
    for status in ["completed", "failed", "dlq", "retry", "refused"] {
        m.acks(status, 1);
    }
    m.acks("COMPLETED", 2);
    m.acks("made\"up", 3);
    let text = telemetry.render_prometheus();
    assert_eq!(
        family(&text, "queen_acks_total")[2..],
        [
            r#"queen_acks_total{status="completed"} 1"#,
            r#"queen_acks_total{status="dlq"} 1"#,
            r#"queen_acks_total{status="failed"} 1"#,
            r#"queen_acks_total{status="other"} 5"#,
            r#"queen_acks_total{status="refused"} 1"#,
            r#"queen_acks_total{status="retry"} 1"#,
        ]
    );
}

#[test]
fn every_family_has_exactly_the_agreed_name_help_and_type() {
    let telemetry = Telemetry::metrics_only(1);
    let m = telemetry.metrics();
    m.http_request("/health", 200, 0.001);
    m.proposal("tick", true, 0.001);
    m.acks("completed", 1);
    let text = telemetry.render_prometheus();
    let mut typed: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect();
    typed.sort();
    let expected = [
        ("queen_acks_total", "counter"),
        ("queen_ephemeral_acked_total", "counter"),
        ("queen_ephemeral_bytes", "gauge"),
        ("queen_ephemeral_delivered_total", "counter"),
        ("queen_ephemeral_dropped_total", "counter"),
        ("queen_ephemeral_messages", "gauge"),
        ("queen_ephemeral_pushed_total", "counter"),
        ("queen_ephemeral_queues", "gauge"),
        ("queen_ephemeral_wipes_total", "counter"),
        ("queen_http_request_duration_seconds", "histogram"),
        ("queen_http_requests_total", "counter"),
        ("queen_messages_delivered_total", "counter"),
        ("queen_messages_duplicate_total", "counter"),
        ("queen_messages_pushed_total", "counter"),
        ("queen_pop_waiting", "gauge"),
        ("queen_raft_applied_index", "gauge"),
        ("queen_raft_commit_index", "gauge"),
        ("queen_raft_is_leader", "gauge"),
        ("queen_raft_log_fsyncs_total", "counter"),
        ("queen_raft_proposal_duration_seconds", "histogram"),
        ("queen_raft_proposals_total", "counter"),
        ("queen_raft_term", "gauge"),
        ("queen_store_disk_bytes", "gauge"),
    ]
    .map(|(n, k)| (n.to_owned(), k.to_owned()));
    assert_eq!(typed, expected);
    let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
    assert_eq!(helps, expected.len());
    // Every sample belongs to one of those families, with no unit or _total added twice.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| f.ends_with("_seconds")))
            .unwrap_or(name);
        assert!(
            expected.iter().any(|(n, _)| n == family),
            "unexpected series {line:?}"
        );
    }
    assert!(!text.contains("otel_scope"), "no scope labels:\n{text}");
    assert!(!text.contains("target_info"));
}

#[test]
fn registries_are_per_telemetry() {
    let a = Telemetry::metrics_only(1);
    let b = Telemetry::metrics_only(2);
    a.metrics().messages_pushed(4);
    assert!(lines(&a.render_prometheus()).contains(&"queen_messages_pushed_total 4"));
    assert!(lines(&b.render_prometheus()).contains(&"queen_messages_pushed_total 0"));
}

#[test]
fn shutdown_of_a_metrics_only_telemetry_is_quick_and_idempotent() {
    let telemetry = Telemetry::metrics_only(1);
    let clone = telemetry.clone();
    let started = Instant::now();
    telemetry.shutdown();
    clone.shutdown();
    assert!(started.elapsed() < Duration::from_secs(1));
    telemetry.metrics().messages_pushed(1);
    assert_eq!(telemetry.render_prometheus(), "");
}
