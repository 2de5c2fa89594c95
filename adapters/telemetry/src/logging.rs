//! The `tracing` side: the fmt layer (human or JSON), the filter, and the subscriber they make.

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::{LogFormat, TelemetryError};

/// A layer over the bare registry, boxed so human, JSON and OTLP layers share one type.
pub(crate) type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync + 'static>;

/// Parses RUST_LOG-style directives.
pub(crate) fn parse_filter(filter: &str) -> Result<EnvFilter, TelemetryError> {
    EnvFilter::builder()
        .parse(filter)
        .map_err(|source| TelemetryError::InvalidLogFilter {
            filter: filter.to_owned(),
            source,
        })
}

/// The layer that writes log lines to `writer`: one human line, or one JSON object with the
/// event's fields at the top level, per event.
pub(crate) fn fmt_layer<W>(format: LogFormat, writer: W, ansi: bool) -> BoxedLayer
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    match format {
        LogFormat::Human => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(ansi)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(writer)
            .boxed(),
    }
}

/// The subscriber: every layer under one global filter.
pub(crate) fn subscriber(
    layers: Vec<BoxedLayer>,
    filter: EnvFilter,
) -> impl tracing::Subscriber + Send + Sync + 'static {
    Registry::default().with(layers).with(filter)
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex, PoisonError};

    use super::*;

    /// Collects everything written, for the assertions below.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Buffer {
        fn text(&self) -> String {
            let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

    impl io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    fn log_with(format: LogFormat, filter: &str, emit: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let filter = parse_filter(filter).expect("test filter parses");
        let subscriber = subscriber(vec![fmt_layer(format, buffer.clone(), false)], filter);
        tracing::subscriber::with_default(subscriber, emit);
        buffer.text()
    }

    #[test]
    fn json_format_writes_one_json_object_per_line_with_flattened_fields() {
        let out = log_with(LogFormat::Json, "info", || {
            let span = tracing::info_span!("push", tenant = "default");
            let _entered = span.enter();
            tracing::info!(target: crate::targets::APP, queue = "orders", count = 3, "messages pushed");
            tracing::warn!(target: crate::targets::S3, "lease lost");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "output: {out}");
        let first: serde_json::Value = serde_json::from_str(lines[0]).expect("a json line");
        assert_eq!(first["level"], "INFO");
        assert_eq!(first["target"], "queen-app");
        assert_eq!(first["message"], "messages pushed");
        assert_eq!(first["queue"], "orders");
        assert_eq!(first["count"], 3);
        assert_eq!(first["span"]["name"], "push");
        assert_eq!(first["span"]["tenant"], "default");
        assert!(first["timestamp"].is_string());
        let second: serde_json::Value = serde_json::from_str(lines[1]).expect("a json line");
        assert_eq!(second["level"], "WARN");
        assert_eq!(second["target"], "queen-s3");
    }

    #[test]
    fn the_default_filter_keeps_our_info_lines_and_drops_the_engines_chatter() {
        let out = log_with(LogFormat::Human, crate::DEFAULT_LOG_FILTER, || {
            tracing::info!(target: crate::targets::APP, "listening");
            tracing::info!(target: "openraft::engine::engine_impl", "startup begin: state: RaftState {{ .. }}");
            tracing::info!(target: "lsm_tree::tree::ingest", "Finished ingestion writer");
            tracing::info!(target: "fjall::db", "Creating database");
            tracing::warn!(target: "openraft::core", "a warning still shows");
        });
        assert!(out.contains("listening"), "{out}");
        assert!(out.contains("a warning still shows"), "{out}");
        assert!(
            !out.contains("RaftState")
                && !out.contains("ingestion")
                && !out.contains("Creating database"),
            "{out}"
        );
    }

    #[test]
    fn human_format_is_not_json_and_carries_the_fields() {
        let out = log_with(LogFormat::Human, "info", || {
            tracing::info!(target: crate::targets::HTTP, route = "/api/v1/push", "request answered");
        });
        let line = out.lines().next().expect("one line");
        assert!(serde_json::from_str::<serde_json::Value>(line).is_err());
        assert!(line.contains("INFO"), "{line}");
        assert!(line.contains("queen-http"), "{line}");
        assert!(line.contains("request answered"), "{line}");
        assert!(line.contains("route=\"/api/v1/push\""), "{line}");
        assert!(
            !line.contains('\u{1b}'),
            "no colour codes when ansi is off: {line}"
        );
    }

    #[test]
    fn the_filter_applies_per_target() {
        let out = log_with(LogFormat::Json, "warn,queen-raft=debug", || {
            tracing::info!(target: crate::targets::HTTP, "dropped");
            tracing::debug!(target: crate::targets::RAFT, "kept");
            tracing::trace!(target: crate::targets::RAFT, "dropped too");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "output: {out}");
        assert!(lines[0].contains("\"kept\""));
    }

    #[test]
    fn a_bad_filter_is_refused_with_the_filter_named() {
        let err = parse_filter("info,queen-raft=loud").expect_err("bad level");
        let text = err.to_string();
        assert!(
            text.starts_with("invalid log filter \"info,queen-raft=loud\""),
            "{text}"
        );
    }
}
