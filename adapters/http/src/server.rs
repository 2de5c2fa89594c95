//! The listener: one hyper HTTP/1.1 connection task per client, a tower service per request,
//! body limits, and a graceful stop that lets requests in flight finish.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::api::{Api, ApiError};
use crate::error::error_response;
use crate::router::{finish, handle, route_label, segments};

/// Listener settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Largest request body accepted, in bytes (larger: 413).
    pub max_body_bytes: usize,
    /// How long a stop waits for requests in flight.
    pub drain: Duration,
}

async fn serve_one<A: Api>(api: Arc<A>, max_body: usize, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let segs_owned = segments(&path);
    let segs: Vec<&str> = segs_owned.iter().map(String::as_str).collect();
    let label = route_label(&method, &segs);
    let too_large = || ApiError::new(413, "payload_too_large", format!("body must be at most {max_body} bytes"));
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let response = if declared.is_some_and(|n| n > max_body) {
        error_response(&too_large())
    } else {
        match Limited::new(req.into_body(), max_body).collect().await {
            Ok(body) => {
                let body = body.to_bytes();
                finish(handle(&api, &method, &segs, &query, &body).await)
            }
            Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => error_response(&too_large()),
            Err(e) => error_response(&ApiError::new(400, "bad_body", format!("body could not be read: {e}"))),
        }
    };
    let status = response.status().as_u16();
    api.observe_request(label, status, started.elapsed().as_secs_f64());
    if status >= 500 {
        tracing::warn!(target: "queen-http", %method, route = label, status, "request failed");
    }
    response
}

/// Serve the API on `listener` until `shutdown` resolves, then stop accepting and let the
/// requests in flight finish (at most `cfg.drain`).
pub async fn serve<A: Api>(listener: TcpListener, api: Arc<A>, cfg: ServeConfig, shutdown: impl Future<Output = ()>) {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).keep_alive(true).header_read_timeout(Duration::from_secs(30));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(target: "queen-http", error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let api = api.clone();
                let max_body = cfg.max_body_bytes;
                let svc = tower::service_fn(move |req: Request<Incoming>| {
                    let api = api.clone();
                    async move { Ok::<_, Infallible>(serve_one(api, max_body, req).await) }
                });
                let svc = tower::ServiceBuilder::new().concurrency_limit(1024).service(svc);
                let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(cfg.drain, graceful.shutdown()).await.is_err() {
        tracing::warn!(target: "queen-http", "requests still in flight after the drain period");
    }
}
