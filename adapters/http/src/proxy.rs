//! The embedded proxy (`QUEEN_PROXY_EMBEDDED`): a listener mode in which every request is for a
//! *cluster* (from the first label of `Host`, `QUEEN_PROXY_DEFAULT_CLUSTER`, or the API key on a
//! shared host), is authenticated by an API key bound to that cluster, passes the cluster's
//! status and the key's scopes, and then reaches the broker's router in process under the
//! cluster's own broker tenant. What a client sends as `x-queen-tenant` or
//! `x-queen-raft-token` is never read in this mode. The control plane (`/api/cp/*`, [`cp`])
//! keeps tenants, clusters and keys in the replicated KV store; every node keeps the whole
//! directory in memory and re-reads it when the change marker moves (checked every
//! `QUEEN_PROXY_INVAL_POLL_MS`, 1 s by default), so a revoked key is refused on every node
//! within about a second. The rules themselves are in `queen_domain::proxy`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;
use queen_domain::proxy as rules;
use queen_domain::proxy::directory::{self, Directory};
use queen_domain::proxy::routes::{self, Class, Refusal};
use queen_domain::tenant::Tenant;
use queen_ports::ClientApi;
use subtle::ConstantTimeEq;

use crate::api::ApiError;
use crate::tenancy::Scope;

pub(crate) mod cp;
pub(crate) mod limits;

/// The header that carries the control-plane token.
pub const CP_TOKEN_HEADER: &str = "x-queen-cp-token";

/// A proxy setting that stops the boot.
#[derive(Debug, thiserror::Error)]
#[error("{variable} {problem}")]
pub struct ProxyConfigError {
    /// The variable.
    pub variable: &'static str,
    /// What is wrong with it (never its value when it is a secret).
    pub problem: String,
}

/// The boot-time bootstrap (`QUEEN_PROXY_BOOTSTRAP_*`): a tenant and a cluster of the same slug,
/// and optionally an API key with every scope; made at every boot if missing.
#[derive(Clone)]
pub struct Bootstrap {
    /// The tenant's and cluster's slug.
    pub tenant: String,
    /// The cluster's plan (`dev` by default).
    pub plan: String,
    /// The tenant's administrator (`admin@localhost` by default).
    pub email: String,
    /// A key (`qk_...`) to register for the cluster; only its hash is stored.
    pub api_key: Option<String>,
}

/// The proxy's settings.
#[derive(Clone)]
pub struct ProxySettings {
    /// `QUEEN_PROXY_PORT`: its own listener; `None` when it is unset or equal to `PORT`, so the
    /// proxy fronts the client port itself.
    pub port: Option<u16>,
    /// `QUEEN_PROXY_CP_TOKEN`: the control plane's credential; unset, `/api/cp/*` answers 404.
    pub cp_token: Option<String>,
    /// `QUEEN_PROXY_DEFAULT_CLUSTER`: the cluster of a `Host` that names none.
    pub default_cluster: Option<String>,
    /// `QUEEN_PROXY_SHARED_HOSTS`: hosts whose requests take their cluster from the key.
    pub shared_hosts: Vec<String>,
    /// `QUEEN_PROXY_INVAL_POLL_MS`: how often a node checks the change marker.
    pub poll: Duration,
    /// `QUEEN_PROXY_KEY_ENV`: the `<env>` of keys the control plane mints (`live`).
    pub key_env: String,
    /// `QUEEN_PROXY_BOOTSTRAP_*`.
    pub bootstrap: Option<Bootstrap>,
    /// `QUEEN_PROXY_ENFORCE`: refuse what the rate, cap and parked limits would block (off:
    /// shadow mode, only logged).
    pub enforce: bool,
    /// `QUEEN_PROXY_METER_FLUSH_MS`: how often usage is written.
    pub meter_flush: Duration,
    /// `QUEEN_PROXY_RECONCILE_MS`: how often a cluster's stored bytes are counted again for
    /// its storage quota.
    pub reconcile: Duration,
    /// `QUEEN_PROXY_TENANT_HEADER` (on by default): each cluster under its own broker tenant.
    /// Off, every cluster shares the broker's default tenant, and the control-plane routes that
    /// act on a cluster's broker data answer 409 `system_tenant`.
    pub tenant_header: bool,
}

impl std::fmt::Debug for ProxySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxySettings")
            .field("port", &self.port)
            .field("cp_token", &self.cp_token.as_ref().map(|_| "<set>"))
            .field("default_cluster", &self.default_cluster)
            .field("shared_hosts", &self.shared_hosts)
            .field("poll", &self.poll)
            .field("key_env", &self.key_env)
            .field("enforce", &self.enforce)
            .field("meter_flush", &self.meter_flush)
            .field("reconcile", &self.reconcile)
            .field("tenant_header", &self.tenant_header)
            .field(
                "bootstrap",
                &self
                    .bootstrap
                    .as_ref()
                    .map(|b| (&b.tenant, &b.plan, b.api_key.is_some())),
            )
            .finish()
    }
}

/// A duration in milliseconds within `range` (unset: `default`).
fn millis(
    value: Option<String>,
    variable: &'static str,
    default: Duration,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Duration, ProxyConfigError> {
    match value {
        None => Ok(default),
        Some(v) => match v.parse::<u64>() {
            Ok(ms) if range.contains(&ms) => Ok(Duration::from_millis(ms)),
            _ => Err(bad(
                variable,
                format!(
                    "must be a number of milliseconds in {}..={}",
                    range.start(),
                    range.end()
                ),
            )),
        },
    }
}

/// A yes-or-no setting (unset: no).
fn flag(value: Option<String>, variable: &'static str) -> Result<bool, ProxyConfigError> {
    match value.map(|v| v.to_ascii_lowercase()).as_deref() {
        None | Some("0" | "false" | "no" | "off") => Ok(false),
        Some("1" | "true" | "yes" | "on") => Ok(true),
        Some(_) => Err(bad(
            variable,
            "must be one of 1, true, yes, on, 0, false, no, off",
        )),
    }
}

fn bad(variable: &'static str, problem: impl Into<String>) -> ProxyConfigError {
    ProxyConfigError {
        variable,
        problem: problem.into(),
    }
}

impl ProxySettings {
    /// The settings from the environment; `None` unless `QUEEN_PROXY_EMBEDDED` is on.
    /// `client_port` is the node's `PORT`.
    ///
    /// # Errors
    /// A malformed setting (the boot stops with this line; a secret's value is never in it).
    pub fn from_env(
        get: &dyn Fn(&str) -> Option<String>,
        client_port: u16,
    ) -> Result<Option<Self>, ProxyConfigError> {
        let set = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let on = flag(set("QUEEN_PROXY_EMBEDDED"), "QUEEN_PROXY_EMBEDDED")?;
        if !on {
            return Ok(None);
        }
        let port = match set("QUEEN_PROXY_PORT") {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => {
                    return Err(bad("QUEEN_PROXY_PORT", "must be a port number 1..=65535"));
                }
                Ok(p) if p == client_port => None,
                Ok(p) => Some(p),
            },
        };
        let slug = |variable: &'static str, v: String| {
            let v = v.to_ascii_lowercase();
            if rules::is_slug(&v) {
                Ok(v)
            } else {
                Err(bad(
                    variable,
                    "must be a DNS label (a-z, 0-9 and -, at most 63 characters)",
                ))
            }
        };
        let default_cluster = set("QUEEN_PROXY_DEFAULT_CLUSTER")
            .map(|v| slug("QUEEN_PROXY_DEFAULT_CLUSTER", v))
            .transpose()?;
        let shared_hosts = set("QUEEN_PROXY_SHARED_HOSTS")
            .map(|v| {
                v.split(',')
                    .map(rules::host_name)
                    .filter(|h| !h.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let poll = millis(
            set("QUEEN_PROXY_INVAL_POLL_MS"),
            "QUEEN_PROXY_INVAL_POLL_MS",
            Duration::from_millis(1000),
            50..=60_000,
        )?;
        let key_env = set("QUEEN_PROXY_KEY_ENV").unwrap_or_else(|| "live".to_owned());
        if !rules::is_api_key(&rules::format_key(&key_env, &[0; 32])) {
            return Err(bad(
                "QUEEN_PROXY_KEY_ENV",
                "must be 1 to 16 lowercase letters or digits",
            ));
        }
        let bootstrap = match set("QUEEN_PROXY_BOOTSTRAP_TENANT") {
            None => None,
            Some(t) => {
                let plan = set("QUEEN_PROXY_BOOTSTRAP_PLAN").unwrap_or_else(|| "dev".to_owned());
                if !rules::PLANS.contains(&plan.as_str()) {
                    return Err(bad(
                        "QUEEN_PROXY_BOOTSTRAP_PLAN",
                        format!("must be one of {}", rules::PLANS.join(", ")),
                    ));
                }
                let api_key = set("QUEEN_PROXY_BOOTSTRAP_API_KEY");
                if api_key.as_deref().is_some_and(|k| !rules::is_api_key(k)) {
                    return Err(bad(
                        "QUEEN_PROXY_BOOTSTRAP_API_KEY",
                        "must be a key of the form qk_<env>_<43 base64url characters>",
                    ));
                }
                Some(Bootstrap {
                    tenant: slug("QUEEN_PROXY_BOOTSTRAP_TENANT", t)?,
                    plan,
                    email: set("QUEEN_PROXY_BOOTSTRAP_EMAIL")
                        .unwrap_or_else(|| "admin@localhost".to_owned()),
                    api_key,
                })
            }
        };
        let enforce = flag(set("QUEEN_PROXY_ENFORCE"), "QUEEN_PROXY_ENFORCE")?;
        let meter_flush = millis(
            set("QUEEN_PROXY_METER_FLUSH_MS"),
            "QUEEN_PROXY_METER_FLUSH_MS",
            Duration::from_secs(15),
            100..=600_000,
        )?;
        let reconcile = millis(
            set("QUEEN_PROXY_RECONCILE_MS"),
            "QUEEN_PROXY_RECONCILE_MS",
            Duration::from_secs(60),
            100..=3_600_000,
        )?;
        let tenant_header = match set("QUEEN_PROXY_TENANT_HEADER") {
            None => true,
            v => flag(v, "QUEEN_PROXY_TENANT_HEADER")?,
        };
        Ok(Some(Self {
            tenant_header,
            reconcile,
            enforce,
            meter_flush,
            port,
            cp_token: set("QUEEN_PROXY_CP_TOKEN"),
            default_cluster,
            shared_hosts,
            poll,
            key_env,
            bootstrap,
        }))
    }
}

/// The proxy of one node: its settings and its copy of the directory.
pub struct Proxy {
    settings: ProxySettings,
    pub(crate) limits: limits::Limits,
    dir: RwLock<Arc<Directory>>,
    /// When the directory was last read or its change marker checked (a missed key checks the
    /// marker again at most every [`MISS_RELOAD`]).
    reloaded: Mutex<Option<Instant>>,
    started: AtomicBool,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// How soon after a check a request with an unknown key may check the change marker again.
const MISS_RELOAD: Duration = Duration::from_millis(250);

/// What the gate decided about one request.
pub(crate) enum Gate {
    /// On to the broker's router with this scope (and, for a cluster's request, what its
    /// body check and metering need).
    Pass(Scope, Option<limits::Ticket>),
    /// The control plane.
    ControlPlane,
    /// Refused (before any body byte was read).
    Refuse(ApiError),
}

impl Proxy {
    /// A proxy with an empty directory (read at the first request and by its refresher).
    #[must_use]
    pub fn new(settings: ProxySettings) -> Arc<Self> {
        Arc::new(Self {
            limits: limits::Limits::new(settings.enforce, settings.meter_flush, settings.reconcile),
            settings,
            dir: RwLock::new(Arc::new(Directory::default())),
            reloaded: Mutex::new(None),
            started: AtomicBool::new(false),
        })
    }

    /// The settings.
    #[must_use]
    pub fn settings(&self) -> &ProxySettings {
        &self.settings
    }

    fn directory(&self) -> Arc<Directory> {
        self.dir
            .read()
            .map_or_else(|p| p.into_inner().clone(), |d| d.clone())
    }

    /// Read the directory from this node's applied state.
    fn reload<A: ClientApi>(&self, api: &A) {
        let now = api.now();
        let loaded = {
            let state = api.state();
            Directory::load(&*state, now)
        };
        match loaded {
            Ok(d) => {
                match self.dir.write() {
                    Ok(mut g) => *g = Arc::new(d),
                    Err(p) => *p.into_inner() = Arc::new(d),
                }
                if let Ok(mut r) = self.reloaded.lock() {
                    *r = Some(Instant::now());
                }
            }
            Err(e) => {
                tracing::warn!(target: "queen-proxy", error = %e, "cannot read the proxy's directory");
            }
        }
    }

    /// Read the directory again if the change marker moved.
    fn refresh<A: ClientApi>(&self, api: &A) {
        let now = api.now();
        let current = {
            let state = api.state();
            directory::generation(&*state, now)
        };
        let stale = match current {
            Ok(g) => g != self.directory().generation || g == 0,
            Err(_) => true,
        };
        if stale {
            self.reload(api);
        }
    }

    fn reload_after_miss<A: ClientApi>(&self, api: &A) {
        let due = self
            .reloaded
            .lock()
            .map(|r| r.is_none_or(|t| t.elapsed() >= MISS_RELOAD))
            .unwrap_or(true);
        if due {
            // One read of the change marker; the whole directory only when it moved, so a
            // flood of unknown keys costs no directory reads.
            if let Ok(mut r) = self.reloaded.lock() {
                *r = Some(Instant::now());
            }
            self.refresh(api);
        }
    }

    /// Start the refresher (once per process, whatever the number of listeners): it runs the
    /// boot-time bootstrap until it succeeds and checks the change marker every poll period.
    pub(crate) fn start<A: ClientApi>(self: &Arc<Self>, groups: Arc<crate::groups::Groups<A>>) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let proxy = self.clone();
        // The proxy's own state lives in the group of its reserved tenant.
        let api = groups.home().clone();
        tokio::spawn(async move {
            let mut bootstrapped = proxy.settings.bootstrap.is_none();
            let mut failures = 0u32;
            loop {
                if !bootstrapped {
                    match cp::bootstrap_at_boot(&groups, &proxy.settings).await {
                        Ok(()) => bootstrapped = true,
                        Err(e) => {
                            failures += 1;
                            // The log may have no leader yet: say so only once it lasts.
                            if failures % 30 == 10 {
                                tracing::warn!(target: "queen-proxy", code = e.code, error = %e.message, "the boot-time bootstrap has not succeeded yet; retrying");
                            }
                        }
                    }
                }
                proxy.refresh(&*api);
                proxy.limits.flush(&*api).await;
                proxy.limits.reconcile(&groups, &proxy.directory()).await;
                tokio::time::sleep(proxy.settings.poll).await;
            }
        });
    }

    fn is_shared_host(&self, host: Option<&str>) -> bool {
        !self.settings.shared_hosts.is_empty()
            && host.is_some_and(|h| {
                let name = rules::host_name(h);
                self.settings.shared_hosts.contains(&name)
            })
    }

    /// Whether a request carries the control-plane token (in `x-queen-cp-token` or as a
    /// bearer), compared in constant time.
    pub(crate) fn cp_token_ok(&self, headers: &hyper::HeaderMap) -> bool {
        let Some(expected) = self.settings.cp_token.as_deref() else {
            return false;
        };
        let given = headers
            .get(CP_TOKEN_HEADER)
            .map(HeaderValue::as_bytes)
            .or_else(|| bearer(headers).map(str::as_bytes));
        given.is_some_and(|g| bool::from(g.ct_eq(expected.as_bytes())))
    }

    /// The gate, before any body byte is read: cluster, status, route class, key, scopes.
    pub(crate) fn gate<A: ClientApi>(
        &self,
        api: &A,
        method: &hyper::Method,
        segs: &[&str],
        query: &str,
        headers: &hyper::HeaderMap,
    ) -> Gate {
        match self.check(api, method, segs, query, headers) {
            Ok(g) => g,
            Err(e) => Gate::Refuse(e),
        }
    }

    fn check<A: ClientApi>(
        &self,
        api: &A,
        method: &hyper::Method,
        segs: &[&str],
        query: &str,
        headers: &hyper::HeaderMap,
    ) -> Result<Gate, ApiError> {
        let class = routes::classify(method.as_str(), segs);
        match class {
            Class::Health | Class::Dashboard => return Ok(Gate::Pass(Scope::default(), None)),
            Class::ControlPlane => return Ok(Gate::ControlPlane),
            Class::Metrics => {
                return if self.cp_token_ok(headers) {
                    Ok(Gate::Pass(Scope::default(), None))
                } else {
                    Err(ApiError::new(404, "not_found", "not found"))
                };
            }
            _ => {}
        }
        // The route's class refuses the same to everyone, and says nothing of any cluster.
        gate_refusal(routes::authorize(class, rules::Scopes::ALL))?;
        let mut dir = self.directory();
        if dir.generation == 0 {
            self.reload_after_miss(api);
            dir = self.directory();
        }
        // 1. The key, before anything about a cluster: without a valid key every request gets
        //    the same 401, whatever its Host names and whatever that cluster's status.
        let Some(token) = bearer(headers) else {
            return Err(ApiError::new(
                401,
                "unauthorized",
                "missing bearer credential (an API key: Authorization: Bearer qk_...)",
            ));
        };
        if !rules::is_api_key(token) {
            return Err(ApiError::new(
                401,
                "unauthorized",
                "the bearer credential is not an API key (qk_...)",
            ));
        }
        let hash = rules::key_hash(token);
        let known = |d: &Directory| {
            d.keys
                .get(&hash)
                .is_some_and(|k| d.cluster_by_id(&k.cluster_id).is_some())
        };
        if !known(&dir) {
            // A key or cluster made a moment ago on another node.
            self.reload_after_miss(api);
            dir = self.directory();
        }
        let unknown = || ApiError::new(401, "unauthorized", "unknown or revoked API key");
        let key = match dir.keys.get(&hash) {
            Some(k) if !k.revoked => k,
            _ => return Err(unknown()),
        };
        let entry = dir.cluster_by_id(&key.cluster_id).ok_or_else(unknown)?;
        // 2. The cluster the Host names must be the key's: one answer whether the named
        //    cluster exists or not, so a key cannot list other clusters.
        let host = headers
            .get(hyper::header::HOST)
            .and_then(|h| h.to_str().ok());
        if !self.is_shared_host(host)
            && !rules::host_admits(
                host.and_then(rules::host_label).as_deref(),
                &entry.doc.slug,
                self.settings.default_cluster.as_deref(),
            )
        {
            return Err(ApiError::new(
                403,
                "forbidden",
                "this API key is not valid for the cluster this request's Host names",
            ));
        }
        // 3. The cluster's status, now that the caller is one of its keys.
        gate_refusal(routes::status_gate(class, entry.effective(), true))?;
        // 4. The key's scopes, then the plan's limits.
        gate_refusal(routes::authorize(class, key.scopes))?;
        let ticket = self.limits.admit(api, entry, class, segs, query)?;
        let tenant = Tenant::parse(&entry.doc.broker_tenant_uuid).map_err(|_| {
            ApiError::new(
                500,
                "internal",
                "the cluster's broker tenant is not a valid tenant id",
            )
        })?;
        let scope = if self.settings.tenant_header {
            Scope::proxied(tenant)
        } else {
            Scope::default()
        };
        Ok(Gate::Pass(scope, Some(ticket)))
    }
}

/// `Authorization: Bearer <token>`.
fn bearer(headers: &hyper::HeaderMap) -> Option<&str> {
    let v = headers.get(hyper::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn gate_refusal(r: Result<(), Refusal>) -> Result<(), ApiError> {
    r.map_err(|r| match r {
        Refusal::RouteBlocked => ApiError::new(
            404,
            "route_blocked",
            "this route is not served through the proxy",
        ),
        Refusal::Scope(why) => ApiError::new(403, "forbidden", why),
        Refusal::Suspended => ApiError::new(
            403,
            "cluster_suspended",
            "this cluster or its tenant is suspended",
        ),
        Refusal::PushBlocked => push_blocked(),
    })
}

/// 403 `push_blocked`.
pub(crate) fn push_blocked() -> ApiError {
    ApiError::new(
        403,
        "push_blocked",
        "pushes to this cluster are blocked; consumers may still drain it",
    )
}
