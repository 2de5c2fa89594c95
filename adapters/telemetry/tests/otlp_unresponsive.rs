//! A collector that accepts connections and never answers must not hold shutdown up.

mod support;

use std::time::{Duration, Instant};

use queen_telemetry::{LogFormat, Telemetry, TelemetryConfig};
use support::{Behaviour, Collector};

#[test]
fn shutdown_is_bounded_when_the_collector_hangs() {
    let collector = Collector::start(Behaviour::Hang);
    let telemetry = Telemetry::init(TelemetryConfig {
        log_format: LogFormat::Human,
        log_filter: "warn".to_owned(),
        service_name: "queen".to_owned(),
        node_id: 1,
        otlp_endpoint: Some(collector.endpoint()),
    })
    .expect("init");
    telemetry.metrics().messages_pushed(1);
    tracing::warn_span!("stuck").in_scope(|| tracing::warn!("a span to export"));

    let started = Instant::now();
    telemetry.shutdown();
    let took = started.elapsed();
    assert!(
        collector.wait_for_connection(Duration::from_secs(1)),
        "the flush reached the collector"
    );
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert!(
        took >= Duration::from_millis(1_500),
        "shutdown gave up early: {took:?}"
    );
}
