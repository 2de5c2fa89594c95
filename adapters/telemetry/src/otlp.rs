//! OTLP export over http/protobuf: endpoint checks, the HTTP client, and the exporters.
//!
//! The SDK exports from threads of its own (the batch span processor, the periodic metric
//! reader) and drives each export with a blocking executor, while the hyper client needs a tokio
//! runtime. So this module runs one small current-thread runtime on a thread of its own, and the
//! client hands each request to it. Stopping that runtime fails any request still in flight,
//! which is what bounds shutdown when a collector hangs.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{
    MetricExporter, Protocol, SpanExporter, WithExportConfig, WithHttpConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::PeriodicReader;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::TelemetryError;

/// Deadline of one export, retries included, and of each HTTP request in it.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest collector answer read; a larger one fails the request.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Checks the value of `OTEL_EXPORTER_OTLP_ENDPOINT` and returns the base URL without a trailing
/// slash. Errors never repeat the value, which may carry a secret.
pub(crate) fn validate_endpoint(raw: &str) -> Result<String, TelemetryError> {
    let refuse = |reason| Err(TelemetryError::InvalidOtlpEndpoint { reason });
    let value = raw.trim();
    let scheme_end = value.find("://").unwrap_or(0);
    let scheme = value[..scheme_end].to_ascii_lowercase();
    if scheme == "https" {
        return refuse("https is not supported: this build carries no tls client, use http://");
    }
    if scheme != "http" {
        return refuse("expected an http:// url");
    }
    let rest = &value[scheme_end + 3..];
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return refuse(
            "credentials in the url are refused: pass them in OTEL_EXPORTER_OTLP_HEADERS",
        );
    }
    if authority.is_empty() {
        return refuse("the url has no host");
    }
    if rest.contains(['?', '#']) {
        return refuse(
            "the url may not carry a query or fragment: signal paths are appended to it",
        );
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse("the url contains whitespace");
    }
    Ok(format!("http://{}", rest.trim_end_matches('/')))
}

/// The OTLP half of the telemetry: a tracer provider, the metric reader to add to the meter
/// provider, and the runtime their requests run on.
pub(crate) struct OtlpPipeline {
    /// Batches spans and exports them to `<base>/v1/traces`.
    pub(crate) tracer_provider: SdkTracerProvider,
    /// Exports every metric to `<base>/v1/metrics` once a period and at shutdown.
    pub(crate) metric_reader: PeriodicReader<MetricExporter>,
    /// Drives the HTTP requests of both.
    pub(crate) runtime: ExportRuntime,
}

impl OtlpPipeline {
    /// Builds the exporters for the validated base URL `base`. Nothing connects yet: a missing
    /// collector shows up later as failed exports, reported through `tracing` warnings.
    pub(crate) fn new(base: &str, resource: Resource) -> Result<Self, TelemetryError> {
        let runtime = ExportRuntime::start()?;
        let client = RuntimeHttpClient {
            client: Client::builder(TokioExecutor::new()).build_http(),
            runtime: runtime.handle.clone(),
        };
        let spans = SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/traces"))
            .with_timeout(EXPORT_TIMEOUT)
            .build()?;
        let metrics = MetricExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{base}/v1/metrics"))
            .with_timeout(EXPORT_TIMEOUT)
            .build()?;
        let tracer_provider = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_resource(resource)
            .build();
        let metric_reader = PeriodicReader::builder(metrics).build();
        Ok(Self {
            tracer_provider,
            metric_reader,
            runtime,
        })
    }
}

/// A current-thread tokio runtime on a thread named `queen-otlp`, alive until [`Self::stop`].
pub(crate) struct ExportRuntime {
    /// Where requests are spawned.
    handle: Handle,
    /// Dropping or sending ends the runtime thread; `None` once stopped.
    stop: Mutex<Option<oneshot::Sender<()>>>,
}

impl ExportRuntime {
    fn start() -> Result<Self, TelemetryError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(TelemetryError::ExportThread)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("queen-otlp".to_owned())
            .spawn(move || {
                // Either a stop message or the sender's drop ends the wait.
                let _ = runtime.block_on(stopped);
                // Requests still running are cancelled; their callers see an error at once.
                runtime.shutdown_background();
            })
            .map_err(TelemetryError::ExportThread)?;
        Ok(Self {
            handle,
            stop: Mutex::new(Some(stop)),
        })
    }

    /// Ends the runtime: requests in flight fail, later ones fail at once. Idempotent.
    pub(crate) fn stop(&self) {
        let sender = self
            .stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(sender) = sender {
            let _ = sender.send(());
        }
    }
}

impl Drop for ExportRuntime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A plain HTTP/1.1 hyper client whose requests run on the export runtime, whatever thread
/// calls it.
#[derive(Debug, Clone)]
struct RuntimeHttpClient {
    /// Pooled connections; `http://` only.
    client: Client<HttpConnector, Full<Bytes>>,
    /// The export runtime.
    runtime: Handle,
}

#[async_trait]
impl HttpClient for RuntimeHttpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let exchange = async move {
            let (parts, body) = request.into_parts();
            let response = client
                .request(Request::from_parts(parts, Full::new(body)))
                .await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let timed = async move {
            tokio::time::timeout(EXPORT_TIMEOUT, exchange)
                .await
                .map_err(|elapsed| Box::new(elapsed) as HttpError)?
        };
        self.runtime
            .spawn(timed)
            .await
            .map_err(|join| Box::new(join) as HttpError)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(raw: &str) -> &'static str {
        match validate_endpoint(raw) {
            Err(TelemetryError::InvalidOtlpEndpoint { reason }) => reason,
            other => panic!("expected a refusal for {raw:?}, got {other:?}"),
        }
    }

    #[test]
    fn endpoints_are_normalized() {
        assert_eq!(
            validate_endpoint("http://collector:4318").expect("valid"),
            "http://collector:4318"
        );
        assert_eq!(
            validate_endpoint(" HTTP://127.0.0.1:4318/otlp/ ").expect("valid"),
            "http://127.0.0.1:4318/otlp"
        );
    }

    #[test]
    fn bad_endpoints_are_refused_without_echoing_them() {
        assert!(reason("https://collector:4318").contains("tls"));
        assert!(reason("collector:4318").contains("http://"));
        assert!(reason("http://").contains("no host"));
        assert!(reason("http://user:hunter2@collector:4318").contains("credentials"));
        assert!(reason("http://collector:4318/?token=abc").contains("query"));
        assert!(reason("http://coll ector:4318").contains("whitespace"));
        let err = validate_endpoint("http://user:hunter2@collector:4318").expect_err("refused");
        assert!(!err.to_string().contains("hunter2"));
    }
}
