//! The [`Telemetry`] handle: setup, the Prometheus rendering, shutdown.

use std::fmt;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::logging::{self, BoxedLayer};
use crate::otlp::{self, ExportRuntime, OtlpPipeline};
use crate::{Metrics, TelemetryConfig, TelemetryError, targets};

/// The name of the meter (instrumentation scope) and tracer of the node.
const SCOPE: &str = "queen";
/// How long [`Telemetry::shutdown`] waits for exporters to flush.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(2);

/// Set by the first `init` that got past validation; a later `init` is refused.
static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// The node's telemetry: the metric instruments, their Prometheus rendering, and (after
/// [`Telemetry::init`]) the log subscriber and OTLP exporters. Cheap to clone.
#[derive(Clone)]
pub struct Telemetry {
    /// Shared by every clone.
    inner: Arc<Inner>,
}

struct Inner {
    /// Every instrument.
    metrics: Metrics,
    /// The registry the Prometheus reader is registered in; gathered on each render.
    registry: prometheus::Registry,
    /// Owns the readers (Prometheus, and OTLP when configured).
    meter_provider: SdkMeterProvider,
    /// Present when OTLP is configured.
    tracer_provider: Option<SdkTracerProvider>,
    /// Drives OTLP requests; present when OTLP is configured.
    export_runtime: Option<ExportRuntime>,
    /// Set by the first `shutdown`.
    shut_down: AtomicBool,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("otlp", &self.inner.tracer_provider.is_some())
            .field("shut_down", &self.inner.shut_down.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Installs the global tracing subscriber (human or JSON lines on stderr, filtered by
    /// `cfg.log_filter`) and, when `cfg.otlp_endpoint` is set, an OTLP pipeline (http/protobuf)
    /// exporting traces to `<endpoint>/v1/traces` and metrics to `<endpoint>/v1/metrics`.
    /// No collector needs to be up: failed exports are logged as warnings.
    ///
    /// # Errors
    /// A filter that does not parse, an endpoint that is not a plain `http://` URL without
    /// credentials, or an exporter that cannot be built; [`TelemetryError::AlreadyInitialized`]
    /// when `init` already succeeded in this process or another global subscriber is installed.
    pub fn init(cfg: TelemetryConfig) -> Result<Telemetry, TelemetryError> {
        let filter = logging::parse_filter(&cfg.log_filter)?;
        let endpoint = match cfg.otlp_endpoint.as_deref().map(str::trim) {
            Some(raw) if !raw.is_empty() => Some(otlp::validate_endpoint(raw)?),
            _ => None,
        };
        if INITIALIZED.swap(true, Ordering::SeqCst) {
            return Err(TelemetryError::AlreadyInitialized);
        }
        let built = Self::build(&cfg, endpoint.as_deref(), filter);
        if built.is_err() {
            INITIALIZED.store(false, Ordering::SeqCst);
        }
        let telemetry = built?;
        tracing::info!(
            target: targets::TELEMETRY,
            service = %cfg.service_name,
            node_id = cfg.node_id,
            log_format = ?cfg.log_format,
            otlp_endpoint = endpoint.as_deref().unwrap_or("off"),
            "telemetry started"
        );
        Ok(telemetry)
    }

    fn build(
        cfg: &TelemetryConfig,
        endpoint: Option<&str>,
        filter: tracing_subscriber::EnvFilter,
    ) -> Result<Telemetry, TelemetryError> {
        let resource = resource(&cfg.service_name, cfg.node_id);
        let pipeline = endpoint
            .map(|base| OtlpPipeline::new(base, resource.clone()))
            .transpose()?;
        let mut layers: Vec<BoxedLayer> = vec![logging::fmt_layer(
            cfg.log_format,
            std::io::stderr,
            std::io::stderr().is_terminal(),
        )];
        let (tracer_provider, export_runtime, metric_reader) = match pipeline {
            Some(p) => {
                let tracer = p.tracer_provider.tracer(SCOPE);
                // Spans of the exporter's own stack would feed back into the exporter.
                let not_exporter = tracing_subscriber::filter::filter_fn(|meta| {
                    let target = meta.target();
                    !(target.starts_with("opentelemetry")
                        || target.starts_with("hyper")
                        || target.starts_with("h2"))
                });
                layers.push(
                    tracing_opentelemetry::layer()
                        .with_tracer(tracer)
                        .with_filter(not_exporter)
                        .boxed(),
                );
                (
                    Some(p.tracer_provider),
                    Some(p.runtime),
                    Some(p.metric_reader),
                )
            }
            None => (None, None, None),
        };
        let telemetry = Self::assemble(resource, metric_reader, tracer_provider, export_runtime)?;
        if logging::subscriber(layers, filter).try_init().is_err() {
            telemetry.shutdown();
            return Err(TelemetryError::AlreadyInitialized);
        }
        Ok(telemetry)
    }

    /// A telemetry with metrics only: no global subscriber, no export. For tests and embedding;
    /// any number may exist in one process, each with its own registry.
    pub fn metrics_only(node_id: u64) -> Telemetry {
        match Self::assemble(resource(SCOPE, node_id), None, None, None) {
            Ok(telemetry) => telemetry,
            // Registering the one collector of a fresh registry cannot conflict.
            Err(e) => unreachable!("a fresh prometheus registry refused its only collector: {e}"),
        }
    }

    /// Builds the meter provider with the Prometheus reader (plus `otlp_reader`) and the
    /// instruments.
    fn assemble(
        resource: Resource,
        otlp_reader: Option<
            opentelemetry_sdk::metrics::PeriodicReader<opentelemetry_otlp::MetricExporter>,
        >,
        tracer_provider: Option<SdkTracerProvider>,
        export_runtime: Option<ExportRuntime>,
    ) -> Result<Telemetry, TelemetryError> {
        let registry = prometheus::Registry::new();
        let prometheus_reader = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_units()
            .without_counter_suffixes()
            .without_target_info()
            .scope_info_enabled(false)
            .build()?;
        let mut builder = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(prometheus_reader);
        if let Some(reader) = otlp_reader {
            builder = builder.with_reader(reader);
        }
        let meter_provider = builder.build();
        let metrics = Metrics::new(&meter_provider.meter(SCOPE));
        Ok(Telemetry {
            inner: Arc::new(Inner {
                metrics,
                registry,
                meter_provider,
                tracer_provider,
                export_runtime,
                shut_down: AtomicBool::new(false),
            }),
        })
    }

    /// The metric instruments.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Every metric in the Prometheus text exposition format, version 0.0.4 (content type
    /// `text/plain; version=0.0.4`), families sorted by name, each with HELP and TYPE lines.
    /// After [`Telemetry::shutdown`] the result is empty.
    pub fn render_prometheus(&self) -> String {
        let encoder = prometheus::TextEncoder::new();
        let mut out = String::new();
        for family in self.inner.registry.gather() {
            if let Err(e) = encoder.encode_utf8(std::slice::from_ref(&family), &mut out) {
                tracing::warn!(
                    target: targets::TELEMETRY,
                    metric = family.name(),
                    error = %e,
                    "metric family left out of the prometheus text"
                );
            }
        }
        out
    }

    /// Flushes and stops the exporters, waiting at most about two seconds; a collector that
    /// does not answer by then loses what was not sent. Idempotent; later calls return at once.
    pub fn shutdown(&self) {
        if self.inner.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
        let started = Instant::now();
        let (done, finished) = mpsc::channel::<&'static str>();
        let mut pending = 0;
        if let Some(tracer_provider) = self.inner.tracer_provider.clone() {
            let done = done.clone();
            pending += spawn_shutdown("queen-otlp-traces", done, move || {
                tracer_provider.shutdown_with_timeout(SHUTDOWN_BUDGET)
            });
        }
        let meter_provider = self.inner.meter_provider.clone();
        pending += spawn_shutdown("queen-otlp-metrics", done, move || {
            meter_provider.shutdown_with_timeout(SHUTDOWN_BUDGET)
        });
        while pending > 0 {
            let left = SHUTDOWN_BUDGET.saturating_sub(started.elapsed());
            match finished.recv_timeout(left) {
                Ok(_) => pending -= 1,
                Err(_) => {
                    tracing::warn!(
                        target: targets::TELEMETRY,
                        budget_ms = SHUTDOWN_BUDGET.as_millis() as u64,
                        "telemetry exporters did not finish within the shutdown budget"
                    );
                    break;
                }
            }
        }
        if let Some(runtime) = &self.inner.export_runtime {
            runtime.stop();
        }
    }
}

/// Runs one provider shutdown on a thread of its own and reports on `done`; returns how many
/// reports to wait for (0 when no thread could start: that provider is then left to its drop).
fn spawn_shutdown<F>(name: &'static str, done: mpsc::Sender<&'static str>, work: F) -> usize
where
    F: FnOnce() -> opentelemetry_sdk::error::OTelSdkResult + Send + 'static,
{
    let run = move || {
        // The SDK already logs each failed export where it happens; this only adds context.
        if let Err(e) = work() {
            tracing::debug!(target: targets::TELEMETRY, provider = name, error = %e, "telemetry shutdown incomplete");
        }
        let _ = done.send(name);
    };
    match std::thread::Builder::new().name(name.to_owned()).spawn(run) {
        Ok(_) => 1,
        Err(e) => {
            tracing::warn!(target: targets::TELEMETRY, error = %e, "no thread for the telemetry shutdown");
            0
        }
    }
}

/// The resource every exported trace and metric carries.
fn resource(service_name: &str, node_id: u64) -> Resource {
    Resource::builder_empty()
        .with_service_name(service_name.to_owned())
        .with_attribute(KeyValue::new("service.instance.id", node_id.to_string()))
        .build()
}

#[cfg(test)]
mod tests {
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
        m.set_raft(4, 120, 121, true);
        m.set_raft(5, 130, 131, false);
        m.set_store_disk_bytes(1 << 40);
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
        m.set_raft(5, 131, 131, true);
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
        m.set_log_fsyncs(10);
        assert_eq!(value(&telemetry)[2], "queen_raft_log_fsyncs_total 10");
        m.set_log_fsyncs(4);
        assert_eq!(value(&telemetry)[2], "queen_raft_log_fsyncs_total 10");
        m.set_log_fsyncs(12);
        assert_eq!(value(&telemetry)[2], "queen_raft_log_fsyncs_total 12");
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
}
