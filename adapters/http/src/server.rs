//! The listener: one hyper HTTP/1.1 connection task per client, a tower service per request,
//! the admin credential check, body bounds (size, deadline, node-wide budget), and a graceful
//! stop that lets requests in flight finish.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;

use crate::api::ApiError;
use crate::auth::{Auth, routes};
use crate::body::{self, BodyBudget, BodyLimits};
use crate::error::{closing, closing_if_body, error_response};
use crate::groups::Groups;
use crate::proxy::{Gate, Proxy};
use crate::router::{self, finish, handle, route_label, segments};
use crate::tenancy::{self, Scope, TENANT_HEADER, Tenancy};
use crate::writes::{self, BodyKind};
use queen_ports::ClientApi;

/// Listener settings.
#[derive(Clone)]
pub struct ServeConfig {
    /// Largest request body accepted, in bytes (larger: 413).
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive, from the end of its headers (then 408).
    pub body_timeout: Duration,
    /// Bytes of request bodies held in memory at once, over every connection (then 503).
    pub body_budget_bytes: usize,
    /// The credential of the state-changing admin routes (`/api/v1/system/*`): the cluster's
    /// raft token, sent in `x-queen-raft-token`. Unset: those routes are refused.
    pub admin_token: Option<String>,
    /// How long a stop waits for requests in flight.
    pub drain: Duration,
    /// Broker JWT (`JWT_ENABLED`): every route but the skipped ones needs a token of its level.
    pub auth: Option<Arc<Auth>>,
    /// How a request names its tenant (`QUEEN_TENANCY_HEADER`; a token's tenant claim when
    /// JWT is on).
    pub tenancy: Tenancy,
    /// The embedded proxy (`QUEEN_PROXY_EMBEDDED`): when set, this listener serves clients
    /// through it (API keys, clusters, the control plane) instead of the settings above.
    pub proxy: Option<Arc<Proxy>>,
    /// TLS on this listener (the proxy's, with `QUEEN_TLS_CERT` and `QUEEN_TLS_KEY`).
    pub tls: Option<crate::Tls>,
    /// The browser rules (body type, `Origin`, `Host`) and the scrape credential of
    /// `/metrics*`.
    pub front: crate::FrontRules,
}

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("body_timeout", &self.body_timeout)
            .field("body_budget_bytes", &self.body_budget_bytes)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<set>"))
            .field("drain", &self.drain)
            .field("auth", &self.auth)
            .field("tenancy", &self.tenancy)
            .field("proxy", &self.proxy)
            .field("tls", &self.tls.is_some())
            .field("front", &self.front)
            .finish()
    }
}

/// How long a client may take to finish its TLS handshake.
const TLS_HANDSHAKE: Duration = Duration::from_secs(10);

/// The header that carries the admin credential (the raft token).
pub const ADMIN_TOKEN_HEADER: &str = "x-queen-raft-token";

/// What every request of one listener shares.
struct Shared<A> {
    /// Group 0's use cases: the node's own routes.
    api: Arc<A>,
    /// Every group's, and where each tenant lives.
    groups: Arc<Groups<A>>,
    limits: BodyLimits,
    budget: BodyBudget,
    admin_token: Option<String>,
    auth: Option<Arc<Auth>>,
    tenancy: Tenancy,
    proxy: Option<Arc<Proxy>>,
    front: crate::FrontRules,
}

impl<A> Shared<A> {
    /// The group that serves a request: the node's own routes are group 0's, every other the
    /// group of the request's tenant.
    fn api_for(&self, segs: &[&str], scope: &Scope) -> &Arc<A> {
        if self.groups.len() == 1 || node_wide(segs) {
            return &self.api;
        }
        self.groups.of(&scope.tenant)
    }
}

/// Routes that answer for the node rather than for a tenant.
fn node_wide(segs: &[&str]) -> bool {
    matches!(
        segs,
        ["health"]
            | ["status"]
            | ["metrics", ..]
            | ["api", "v1", "system", ..]
            // The analytics samples are the node's (group 0 samples every group's queues).
            | ["api", "v1", "status", "analytics"]
            | ["api", "v1", "analytics", ..]
    )
}

/// Routes whose answers name every tenant's queues or the nodes' addresses: the operator's,
/// refused to any request acting for a tenant, whatever credential it also carries.
fn tenant_barred(segs: &[&str]) -> bool {
    matches!(
        segs,
        ["status"] | ["metrics", ..] | ["api", "v1", "system", ..]
    )
}

/// Whether a route changes the cluster's administration (membership): those need the admin
/// credential. Reading the membership does not.
fn is_admin_change(method: &hyper::Method, segs: &[&str]) -> bool {
    method != hyper::Method::GET && matches!(segs, ["api", "v1", "system", ..])
}

/// The admin credential check, before any body byte is read (so a stranger's request holds no
/// memory and reaches no membership code).
fn check_admin(
    expected: Option<&str>,
    given: Option<&hyper::header::HeaderValue>,
) -> Result<(), ApiError> {
    let Some(expected) = expected else {
        return Err(ApiError::new(
            403,
            "forbidden",
            "membership changes are refused on this node: it has no QUEEN_RAFT_TOKEN, the credential they need",
        ));
    };
    let Some(given) = given else {
        return Err(ApiError::new(
            401,
            "unauthorized",
            format!(
                "membership changes need the cluster's raft token in the {ADMIN_TOKEN_HEADER} header"
            ),
        ));
    };
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::new(
            401,
            "unauthorized",
            format!("the {ADMIN_TOKEN_HEADER} header does not hold this cluster's raft token"),
        ))
    }
}

/// The address a request's connection came from (a request extension).
#[derive(Debug, Clone, Copy)]
struct Peer(std::net::IpAddr);

async fn serve_one<A: ClientApi>(
    shared: Arc<Shared<A>>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let (response, label) = match segments(&path) {
        Err(e) => (error_response(&e), "other"),
        Ok(segs_owned) => {
            let segs: Vec<&str> = segs_owned.iter().map(String::as_str).collect();
            let label = route_label(&method, &segs);
            (answer(&shared, &method, &segs, &query, req).await, label)
        }
    };
    let status = response.status().as_u16();
    shared
        .api
        .observe_request(label, status, started.elapsed().as_secs_f64());
    if status >= 500 {
        tracing::warn!(target: "queen-http", %method, route = label, status, "request failed");
    }
    response
}

async fn answer<A: ClientApi>(
    shared: &Shared<A>,
    method: &hyper::Method,
    segs: &[&str],
    query: &str,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    // A foreign Host, a foreign page's Origin, a body a page could send without a preflight.
    if let Err(e) = shared.front.check(method, req.headers()) {
        return closing_if_body(&req, error_response(&e));
    }
    // The dashboard's page and files hold no data: served without a credential (the page then
    // calls the API with the user's token).
    if crate::dashboard::is_dashboard(method, segs) {
        return crate::dashboard::answer(segs);
    }
    let mut ticket = None;
    let admitted = match &shared.proxy {
        Some(proxy) => {
            match proxy.gate(&**shared.groups.home(), method, segs, query, req.headers()) {
                Gate::Pass(scope, t) => {
                    ticket = t;
                    Ok(scope)
                }
                Gate::Refuse(e) => Err(e),
                Gate::ControlPlane => {
                    return crate::proxy::cp::answer(
                        &shared.groups,
                        proxy,
                        method,
                        segs,
                        query,
                        req,
                        (shared.limits, &shared.budget),
                    )
                    .await;
                }
            }
        }
        None => admit(shared, method, segs, &req).await,
    };
    let scope = match admitted {
        Ok(s) if s.names_a_tenant() && tenant_barred(segs) => {
            return closing_if_body(&req, error_response(&ApiError::new(
                403,
                "forbidden",
                "this route names every tenant's queues or the nodes' addresses; a request acting for a tenant cannot use it",
            ).with_reason("node_wide")));
        }
        Ok(mut s) => {
            s.peer = req.extensions().get::<Peer>().map(|p| p.0);
            s
        }
        // Refused before its body is read: the body is still on the connection, so the answer
        // says the connection closes, and no client sends its next request on it.
        Err(e) => return closing_if_body(&req, error_response(&e)),
    };
    if shared.groups.len() > 1 && *method == hyper::Method::GET {
        if segs == ["health"] {
            let apis: Vec<&A> = shared.groups.all().iter().map(|a| &**a).collect();
            return router::health(&apis);
        }
        if segs == ["status"] && !scope.names_a_tenant() {
            return finish(router::status_groups(shared.groups.all()).await);
        }
    }
    let api = shared.api_for(segs, &scope);
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let kind = match req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        Some(t) if crate::push_binary::is_binary(t) => BodyKind::Binary {
            max_decoded: shared.limits.max_bytes,
        },
        _ => BodyKind::Json,
    };
    match body::read(req.into_body(), declared, shared.limits, &shared.budget).await {
        // The body's budget is held until the answer is built.
        Ok(body) => {
            let result = match (&shared.proxy, ticket.as_mut()) {
                // Several groups: a membership change is made in each.
                _ if shared.groups.len() > 1
                    && (is_admin_change(method, segs)
                        || segs == ["api", "v1", "system", "raft", "membership"]) =>
                {
                    router::membership_everywhere(shared.groups.all(), method, segs, &body.bytes)
                        .await
                }
                // A push through the proxy is read once: the plan's checks look at the items
                // the handler then stores. A refusal of the plan is not metered.
                (Some(proxy), Some(t))
                    if *method == hyper::Method::POST && segs == ["api", "v1", "push"] =>
                {
                    match writes::push_body(&body.bytes, kind) {
                        Ok(b) => {
                            if let Err(e) = proxy.limits.check_push(&**api, t, &b.items) {
                                return error_response(&e);
                            }
                            writes::push(api, &scope, b).await
                        }
                        Err(e) => Err(e),
                    }
                }
                (Some(proxy), Some(t)) => {
                    if let Err(e) = proxy.limits.check_body(&**api, t, segs, &body.bytes) {
                        return error_response(&e);
                    }
                    handle(api, &scope, method, segs, query, &body.bytes, kind).await
                }
                _ => handle(api, &scope, method, segs, query, &body.bytes, kind).await,
            };
            let response = finish(result);
            if let (Some(proxy), Some(t)) = (&shared.proxy, ticket.as_ref()) {
                let out = hyper::body::Body::size_hint(response.body())
                    .exact()
                    .unwrap_or(0);
                proxy.limits.meter(
                    t,
                    response.status().as_u16(),
                    body.bytes.len() as u64,
                    out,
                    shared.api.now().0,
                );
            }
            response
        }
        // Too large, too slow or cut short: what is left of it may still be on its way.
        Err(e) => closing(error_response(&e)),
    }
}

/// The checks made before any body byte is read: the raft token of a membership change, broker
/// JWT, and the tenancy header. The request's scope, or the refusal.
async fn admit<A: ClientApi>(
    shared: &Shared<A>,
    method: &hyper::Method,
    segs: &[&str],
    req: &Request<Incoming>,
) -> Result<Scope, ApiError> {
    // The cluster's raft token, checked once: the credential of a membership change, and of
    // any `/api/v1/system/*` request when broker JWT is on (an operator's or a peer's).
    let raft_token = matches!(segs, ["api", "v1", "system", ..]).then(|| {
        check_admin(
            shared.admin_token.as_deref(),
            req.headers().get(ADMIN_TOKEN_HEADER),
        )
    });
    // The scrape credential of `/metrics*` (`QUEEN_METRICS_TOKEN`), JWT or not.
    let metrics = matches!(segs, ["metrics", ..]);
    let scraper = metrics && shared.front.is_metrics_bearer(req.headers());
    if metrics && !scraper && shared.auth.is_none() && shared.front.metrics_token_set() {
        return Err(ApiError::new(
            401,
            "unauthorized",
            "the metrics need the scrape token: send Authorization: Bearer <QUEEN_METRICS_TOKEN>",
        )
        .with_reason("missing_token"));
    }
    // Broker JWT, before anything else reads the request; a membership change needs the raft
    // token whatever the JWT says.
    let mut principal = None;
    let authorization = req.headers().get(hyper::header::AUTHORIZATION);
    if let Some(auth) = &shared.auth
        && !scraper
    {
        if !auth.skips(segs) && !matches!(raft_token, Some(Ok(()))) {
            principal = Some(
                auth.check(authorization, routes::need(method, segs))
                    .await?,
            );
        } else if tenant_barred(segs) && authorization.is_some() {
            // Skipped (a skip path, or the raft token): a token that verifies still says whom
            // the request acts for, and a tenant's is refused on the node-wide routes.
            principal = auth.identify(authorization).await;
        }
    }
    let scope = tenancy::resolve(
        shared.tenancy,
        req.headers().get(TENANT_HEADER),
        principal.as_ref(),
    )?;
    if is_admin_change(method, segs)
        && let Some(Err(e)) = raft_token
    {
        tracing::warn!(target: "queen-http", %method, path = req.uri().path(), code = e.code, "admin request refused");
        return Err(e);
    }
    Ok(scope)
}

/// Serve the API on `listener` until `shutdown` resolves, then stop accepting and let the
/// requests in flight finish (at most `cfg.drain`).
pub async fn serve<A: ClientApi>(
    listener: TcpListener,
    api: Arc<A>,
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()>,
) {
    serve_groups(listener, Groups::one(api), cfg, shutdown).await;
}

/// [`serve`] for a node of several raft groups: each request reaches the group of its tenant.
pub async fn serve_groups<A: ClientApi>(
    listener: TcpListener,
    groups: Groups<A>,
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()>,
) {
    let shared = Arc::new(Shared {
        api: groups.all()[0].clone(),
        groups: Arc::new(groups),
        limits: BodyLimits {
            max_bytes: cfg.max_body_bytes,
            timeout: cfg.body_timeout,
        },
        budget: BodyBudget::new(cfg.body_budget_bytes),
        admin_token: cfg.admin_token.clone(),
        auth: cfg.auth.clone(),
        tenancy: cfg.tenancy,
        proxy: cfg.proxy.clone(),
        front: cfg.front.clone(),
    });
    if let Some(a) = &shared.auth {
        a.warm().await;
    }
    if let Some(p) = &shared.proxy {
        p.start(shared.groups.clone());
    }
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(Duration::from_secs(30));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(target: "queen-http", error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                let svc = tower::service_fn(move |mut req: Request<Incoming>| {
                    let shared = shared.clone();
                    req.extensions_mut().insert(Peer(peer.ip()));
                    async move { Ok::<_, Infallible>(serve_one(shared, req).await) }
                });
                let svc = tower::ServiceBuilder::new().concurrency_limit(1024).service(svc);
                let svc = TowerToHyperService::new(svc);
                match &cfg.tls {
                    None => {
                        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
                        tokio::spawn(async move {
                            let _ = conn.await;
                        });
                    }
                    Some(tls) => {
                        // The handshake runs in the connection's own task, bounded in time, so a
                        // client that never finishes it holds nothing else up.
                        let acceptor = tls.acceptor().clone();
                        let http = http.clone();
                        let watcher = graceful.watcher();
                        tokio::spawn(async move {
                            let Ok(Ok(stream)) =
                                tokio::time::timeout(TLS_HANDSHAKE, acceptor.accept(stream)).await
                            else {
                                return;
                            };
                            let _ = watcher
                                .watch(http.serve_connection(TokioIo::new(stream), svc))
                                .await;
                        });
                    }
                }
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(cfg.drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(target: "queen-http", "requests still in flight after the drain period");
    }
}
