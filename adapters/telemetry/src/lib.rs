//! queen-telemetry: everything a node tells the outside world about itself.
//!
//! Owns:
//! - the one metrics registry: every metric the node exports is an `opentelemetry` instrument
//!   held by [`Metrics`], read back through one SDK meter provider;
//! - the Prometheus text exposition (format 0.0.4) of that registry, which the HTTP adapter serves
//!   on `/metrics/prometheus` ([`Telemetry::render_prometheus`]);
//! - the global `tracing` subscriber: human text or JSON lines, filtered RUST_LOG-style;
//! - OTLP export (http/protobuf, plain HTTP) of traces and metrics when the caller hands over the
//!   value of `OTEL_EXPORTER_OTLP_ENDPOINT`;
//! - the names of the tracing targets the node logs under ([`targets`]).
//!
//! Never depends on: an HTTP server (hyper here is only the OTLP client), openraft, the state
//! store, object_store, the domain or the ports. It reads no environment variable itself (the
//! OTLP exporter still honours `OTEL_EXPORTER_OTLP_HEADERS`, which may carry credentials and is
//! therefore never logged), and it never writes an endpoint's credentials into a log line: an
//! endpoint carrying user info is refused.

mod config;
mod error;
mod logging;
mod metrics;
mod otlp;
mod s3;
pub mod targets;
mod telemetry;

pub use config::{DEFAULT_LOG_FILTER, LogFormat, TelemetryConfig};
pub use error::TelemetryError;
pub use metrics::{EphemeralTotals, Metrics};
pub use s3::{QueueKey, S3Metrics, S3QueueGauges};
pub use telemetry::Telemetry;
