//! What the caller decides about telemetry (read once from flags and environment by the app).

/// The shape of log lines on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event (the default).
    #[default]
    Human,
    /// One JSON object per line, event fields at the top level.
    Json,
}

/// The log filter when `RUST_LOG` is unset: our own targets at INFO (a line per subsystem at
/// start, then what an operator should read), the engines' own INFO chatter (openraft's state
/// dumps on every election, fjall's and lsm-tree's table housekeeping) only from WARN. Ask for
/// it with `RUST_LOG=info,openraft=info`.
pub const DEFAULT_LOG_FILTER: &str = "info,openraft=warn,fjall=warn,lsm_tree=warn";

/// Settings for [`crate::Telemetry::init`].
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// Human text or JSON lines.
    pub log_format: LogFormat,
    /// RUST_LOG-style directives, e.g. `info` or `info,queen-raft=debug`; default
    /// [`DEFAULT_LOG_FILTER`].
    pub log_filter: String,
    /// `service.name` on exported traces and metrics; `queen` for the broker.
    pub service_name: String,
    /// This node's id, exported as `service.instance.id` so series of different nodes stay apart.
    pub node_id: u64,
    /// The value of `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL such as `http://collector:4318`),
    /// read by the caller; `None` or empty turns OTLP export off. Signal paths (`/v1/traces`,
    /// `/v1/metrics`) are appended as the OpenTelemetry specification says for this variable.
    pub otlp_endpoint: Option<String>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Human,
            log_filter: DEFAULT_LOG_FILTER.to_owned(),
            service_name: "queen".to_owned(),
            node_id: 1,
            otlp_endpoint: None,
        }
    }
}
