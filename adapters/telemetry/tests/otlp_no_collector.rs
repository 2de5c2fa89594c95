//! With an endpoint but no collector listening, `init` succeeds and `shutdown` returns promptly.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use queen_telemetry::{LogFormat, Telemetry, TelemetryConfig};

#[test]
fn init_succeeds_and_shutdown_returns_without_a_collector() {
    // A loopback port nobody listens on.
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let telemetry = Telemetry::init(TelemetryConfig {
        log_format: LogFormat::Human,
        log_filter: "info".to_owned(),
        service_name: "queen".to_owned(),
        node_id: 2,
        otlp_endpoint: Some(format!("http://127.0.0.1:{port}")),
    })
    .expect("init without a collector");
    telemetry.metrics().acks("completed", 1);
    tracing::info_span!("work").in_scope(|| tracing::info!("a span nobody receives"));
    assert!(
        telemetry
            .render_prometheus()
            .lines()
            .any(|l| l == r#"queen_acks_total{status="completed"} 1"#)
    );

    let started = Instant::now();
    telemetry.shutdown();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
}
