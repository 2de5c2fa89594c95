//! With an endpoint, `init` exports traces and metrics over OTLP http/protobuf, and `shutdown`
//! flushes them. One `init` per process, so this file holds one test.

mod support;

use std::time::{Duration, Instant};

use queen_telemetry::{LogFormat, Telemetry, TelemetryConfig, TelemetryError};
use support::{Behaviour, Collector};

#[test]
fn init_exports_traces_and_metrics_to_the_collector_and_refuses_a_second_init() {
    let collector = Collector::start(Behaviour::Answer);
    let telemetry = Telemetry::init(TelemetryConfig {
        log_format: LogFormat::Json,
        log_filter: "info".to_owned(),
        service_name: "queen".to_owned(),
        node_id: 3,
        otlp_endpoint: Some(format!("{}/", collector.endpoint())),
    })
    .expect("init with a collector");

    telemetry.metrics().messages_pushed(5);
    telemetry.metrics().http_request("/api/v1/push", 201, 0.002);
    tracing::info_span!(target: "queen-app", "push", queue = "orders").in_scope(|| {
        tracing::info!(target: "queen-app", "inside a span");
    });

    let again = Telemetry::init(TelemetryConfig::default());
    assert!(
        matches!(again, Err(TelemetryError::AlreadyInitialized)),
        "{again:?}"
    );

    let started = Instant::now();
    telemetry.shutdown();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");

    let metrics = collector
        .wait_for("/v1/metrics", Duration::from_secs(5))
        .expect("a metrics export");
    assert_eq!(metrics.method, "POST");
    assert_eq!(metrics.content_type, "application/x-protobuf");
    assert!(metrics.body_len > 0);
    let traces = collector
        .wait_for("/v1/traces", Duration::from_secs(5))
        .expect("a trace export");
    assert_eq!(traces.method, "POST");
    assert_eq!(traces.content_type, "application/x-protobuf");
    assert!(traces.body_len > 0);

    // Shutdown is idempotent and the Prometheus rendering no longer collects.
    telemetry.shutdown();
    assert_eq!(telemetry.render_prometheus(), "");
}
