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
mod tests;
