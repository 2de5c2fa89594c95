//! Errors of telemetry setup.

/// Why [`crate::Telemetry::init`] could not set telemetry up.
///
/// Every variant is a configuration or process-state problem: retrying the same call cannot help.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `init` already ran in this process, or another global `tracing` subscriber is installed.
    #[error("telemetry is already initialized in this process")]
    AlreadyInitialized,
    /// The RUST_LOG-style filter does not parse.
    #[error("invalid log filter {filter:?}: {source}")]
    InvalidLogFilter {
        /// The filter as given.
        filter: String,
        /// What the parser said.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// The OTLP endpoint is not usable. The value itself is not repeated: it may carry a secret.
    #[error("invalid otlp endpoint: {reason}")]
    InvalidOtlpEndpoint {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The OTLP exporter could not be built.
    #[error("otlp exporter setup failed: {0}")]
    OtlpExporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// The Prometheus reader could not be registered.
    #[error("prometheus reader setup failed: {0}")]
    PrometheusReader(#[from] opentelemetry_sdk::error::OTelSdkError),
    /// The thread that drives OTLP requests could not start.
    #[error("the otlp export thread could not start: {0}")]
    ExportThread(#[source] std::io::Error),
}
