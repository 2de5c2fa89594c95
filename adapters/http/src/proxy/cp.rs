//! The control plane, `/api/cp/*`: tenants, clusters, API keys and the bootstrap, stored as the
//! proxy's documents in the replicated KV store (`queen_domain::proxy::directory`). Guarded by
//! `QUEEN_PROXY_CP_TOKEN` in `x-queen-cp-token`, compared in constant time before any body byte
//! is read (unset: every route answers 404); bodies are at most 1 MiB. Every route can be
//! repeated: a retry finds what the first call made and answers the same ids. Reads go through
//! the log (linearizable), so an answer never reflects a node that lags.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use queen_domain::kv::{KvOp, KvResult};
use queen_domain::proxy::directory::{
    self as d, CLUSTER_SLUGS, CLUSTERS, ClusterDoc, IndexDoc, KEY_HASHES, KEYS, KeyDoc,
    OperationDoc, S3_SINKS, S3SinkDoc, TENANT_SLUGS, TENANTS, TenantDoc,
};
use queen_domain::proxy::{self as rules, ClusterStatus, Scopes, TenantStatus};
use queen_ports::ClientApi;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::{Proxy, ProxySettings};

mod keys;
mod lifecycle;
mod s3;
mod usage;

pub(crate) use keys::bootstrap_at_boot;

use crate::api::ApiError;
use crate::body::{self, BodyBudget, BodyLimits};
use crate::error::{error_response, json_response};

/// Largest control-plane body.
const MAX_BODY: usize = 1 << 20;
/// How many times a create that lost a race to a concurrent one looks again.
const RACES: usize = 4;
/// The fields a plan (and so a cluster's overrides) has.
const PLAN_FIELDS: [&str; 14] = [
    "max_req_per_sec",
    "req_burst",
    "max_msgs_per_sec",
    "msgs_burst",
    "max_queues",
    "max_partitions_per_queue",
    "max_parked_pops",
    "max_payload_bytes",
    "max_batch_items",
    "max_retained_bytes",
    "max_retention_seconds",
    "monthly_msgs_quota",
    "features",
    "cell_class",
];

fn invalid(field: &str, problem: &str) -> ApiError {
    ApiError::new(400, "invalid", format!("{field} {problem}"))
}

fn not_found() -> ApiError {
    ApiError::new(404, "not_found", "not found")
}

/// Answer one control-plane request.
pub(crate) async fn answer<A: ClientApi>(
    groups: &crate::groups::Groups<A>,
    proxy: &Proxy,
    method: &hyper::Method,
    segs: &[&str],
    query: &str,
    req: Request<Incoming>,
    (limits, budget): (BodyLimits, &BodyBudget),
) -> Response<Full<Bytes>> {
    if proxy.settings.cp_token.is_none() {
        return error_response(&not_found());
    }
    if !proxy.cp_token_ok(req.headers()) {
        return crate::error::closing_if_body(
            &req,
            error_response(&ApiError::new(
                401,
                "unauthorized",
                "bad control-plane token",
            )),
        );
    }
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let limits = BodyLimits {
        max_bytes: MAX_BODY,
        ..limits
    };
    let body = match body::read(req.into_body(), declared, limits, budget).await {
        Ok(b) => b,
        Err(e) => return crate::error::closing(error_response(&e)),
    };
    let cp = Cp {
        api: groups.home(),
        groups,
        settings: &proxy.settings,
    };
    // The two relays answer as the broker does, for the cluster's tenant.
    if let (m @ ("GET" | "POST"), ["api", "cp", "clusters", s, rest @ ("queues" | "configure")]) =
        (method.as_str(), segs)
    {
        return match cp.relay(m, s, rest, query, &body.bytes).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
    }
    let result = cp.route(method.as_str(), segs, query, &body.bytes).await;
    match result {
        Ok((status, v)) => json_response(status, &v),
        Err(e) => {
            if e.status >= 500 {
                tracing::warn!(target: "queen-proxy", code = e.code, error = %e.message, "control-plane request failed");
            }
            error_response(&e)
        }
    }
}

/// The body as a JSON object (an empty body reads as `{}`).
fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(invalid("body", "must be a JSON object")),
        Err(e) => Err(invalid("body", &format!("is not JSON ({e})"))),
    }
}

fn text<'a>(m: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, ApiError> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(invalid(field, "must be a string")),
    }
}

fn required<'a>(m: &'a Map<String, Value>, field: &str) -> Result<&'a str, ApiError> {
    text(m, field)?
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| invalid(field, "is required"))
}

fn slug(value: &str, field: &str) -> Result<String, ApiError> {
    if rules::is_slug(value) {
        Ok(value.to_owned())
    } else {
        Err(invalid(
            field,
            "must be a DNS label (a-z, 0-9 and -, 1 to 63 characters)",
        ))
    }
}

fn uuid(value: &str, field: &str) -> Result<String, ApiError> {
    uuid::Uuid::parse_str(value)
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| invalid(field, "must be a UUID"))
}

fn plan(value: Option<&str>, default: &str) -> Result<String, ApiError> {
    let p = value.unwrap_or(default);
    if rules::PLANS.contains(&p) {
        Ok(p.to_owned())
    } else {
        Err(invalid(
            "plan",
            &format!("must be one of {}", rules::PLANS.join(", ")),
        ))
    }
}

fn new_id() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .hyphenated()
        .to_string()
}

fn doc<T: DeserializeOwned>(value: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(value).map_err(|_| {
        ApiError::new(
            500,
            "internal",
            "a stored control-plane document does not parse",
        )
    })
}

/// One control-plane call's view of the store.
struct Cp<'a, A> {
    /// The use cases of the group that holds the proxy's own state (the directory).
    api: &'a Arc<A>,
    /// Every group's: a cluster's broker data lives in the group of its broker tenant.
    groups: &'a crate::groups::Groups<A>,
    settings: &'a ProxySettings,
}

/// Whether a create wrote or found.
struct Made<T> {
    doc: T,
    created: bool,
}

impl<A: ClientApi> Cp<'_, A> {
    async fn route(
        &self,
        method: &str,
        segs: &[&str],
        query: &str,
        body: &[u8],
    ) -> Result<(u16, Value), ApiError> {
        let rest = &segs[2..];
        match (method, rest) {
            ("POST", ["bootstrap"]) => self.bootstrap(&object(body)?).await,
            ("POST", ["provision"]) => self.provision(&object(body)?).await,
            ("POST", ["activity"]) => self.activity(&object(body)?).await,
            ("POST", ["tenants"]) => {
                let m = object(body)?;
                let slug = slug(required(&m, "slug")?, "slug")?;
                let t = self.ensure_tenant(&slug, text(&m, "name")?, None).await?;
                Ok((if t.created { 201 } else { 200 }, json!({"id": t.doc.id})))
            }
            ("PUT", ["tenants", s, "status"]) => {
                let s = slug(s, "slug")?;
                self.tenant_status(&s, &object(body)?).await
            }
            ("POST", ["tenants", s, "purge"]) => {
                let s = slug(s, "slug")?;
                self.purge(&s).await
            }
            ("DELETE", ["tenants", s]) => {
                let s = slug(s, "slug")?;
                let force = match crate::pop_query::parse_query(query)
                    .iter()
                    .find(|(k, _)| k == "force")
                    .map(|(_, v)| v.as_str())
                {
                    None | Some("false") => false,
                    Some("true") => true,
                    Some(_) => return Err(invalid("force", "must be true or false")),
                };
                self.delete_tenant(&s, force).await
            }
            ("GET", ["clusters"]) => self.clusters(query).await,
            ("POST", ["clusters"]) => self.create_cluster(&object(body)?).await,
            ("GET", ["clusters", s]) => {
                let s = slug(s, "slug")?;
                let c = self
                    .cluster_by_slug(&s)
                    .await?
                    .ok_or_else(cluster_unknown)?;
                Ok((200, self.row(&c).await?))
            }
            ("PUT", ["clusters", s, "s3"]) => {
                let s = slug(s, "slug")?;
                self.put_sink(&s, &object(body)?).await
            }
            ("GET", ["clusters", s, "s3"]) => {
                let s = slug(s, "slug")?;
                self.get_sink(&s).await
            }
            ("DELETE", ["clusters", s, "s3"]) => {
                let s = slug(s, "slug")?;
                self.delete_sink(&s).await
            }
            ("PUT", ["clusters", id, "status"]) => {
                let id = uuid(id, "id")?;
                self.cluster_status(&id, &object(body)?).await
            }
            ("GET", ["clusters", id, "usage"]) => {
                let id = uuid(id, "id")?;
                self.usage(&id).await
            }
            ("PUT", ["clusters", id, "overrides"]) => {
                let id = uuid(id, "id")?;
                self.overrides(&id, body).await
            }
            ("POST", ["keys"]) => self.create_key(&object(body)?).await,
            ("DELETE", ["keys", id]) => {
                let id = uuid(id, "id")?;
                self.revoke(&id).await
            }
            _ => Err(not_found()),
        }
    }

    /// 409 `system_tenant` when every cluster shares the broker's default tenant
    /// (`QUEEN_PROXY_TENANT_HEADER=false`): a route acting on one cluster's broker data would
    /// act on all of them.
    fn own_broker_data(&self) -> Result<(), ApiError> {
        if self.settings.tenant_header {
            Ok(())
        } else {
            Err(ApiError::new(
                409,
                "system_tenant",
                "QUEEN_PROXY_TENANT_HEADER=false puts every cluster in the broker's default tenant: this route would act on all of them",
            ))
        }
    }

    fn op(&self, action: &str, target: &str, meta: Value) -> OperationDoc {
        OperationDoc {
            actor: "control_plane".to_owned(),
            action: action.to_owned(),
            target: target.to_owned(),
            meta,
            at_us: d::micros(self.api.now()),
        }
    }

    async fn get<T: DeserializeOwned>(
        &self,
        table: &str,
        id: &str,
    ) -> Result<Option<(T, u64)>, ApiError> {
        let out = self
            .api
            .kv(vec![KvOp::Get {
                ns: d::ns(table),
                key: d::key(id),
            }])
            .await?;
        match out.results.into_iter().next() {
            Some(KvResult::Get(Some(row))) => Ok(Some((doc(&row.value)?, row.version))),
            _ => Ok(None),
        }
    }

    async fn lookup(&self, index: &str, value: &str) -> Result<Option<String>, ApiError> {
        Ok(self.get::<IndexDoc>(index, value).await?.map(|(i, _)| i.id))
    }

    async fn list<T: DeserializeOwned>(&self, table: &str) -> Result<Vec<T>, ApiError> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .api
                .kv(vec![KvOp::GetPrefix {
                    ns: d::ns(table),
                    prefix: "#".to_owned(),
                    after: after.take(),
                    limit: queen_domain::kv::MAX_PREFIX_LIMIT,
                    keys_only: false,
                }])
                .await?;
            match page.results.into_iter().next() {
                Some(KvResult::Prefix {
                    rows,
                    truncated,
                    next_after,
                    ..
                }) => {
                    for r in rows {
                        out.push(doc(&r.value)?);
                    }
                    if !truncated || next_after.is_none() {
                        return Ok(out);
                    }
                    after = next_after;
                }
                _ => return Ok(out),
            }
        }
    }

    /// Apply `ops` with the change marker and an audit row; false when a required
    /// precondition failed (nothing was written).
    async fn commit(&self, mut ops: Vec<KvOp>, op: &OperationDoc) -> Result<bool, ApiError> {
        ops.extend(d::changed(op, &new_id()));
        Ok(self.api.kv(ops).await?.failed.is_none())
    }

    async fn ensure_tenant(
        &self,
        slug: &str,
        name: Option<&str>,
        email: Option<&str>,
    ) -> Result<Made<TenantDoc>, ApiError> {
        for _ in 0..RACES {
            if let Some(id) = self.lookup(TENANT_SLUGS, slug).await?
                && let Some((t, _)) = self.get::<TenantDoc>(TENANTS, &id).await?
            {
                return Ok(Made {
                    doc: t,
                    created: false,
                });
            }
            let now = d::micros(self.api.now());
            let t = TenantDoc {
                id: new_id(),
                slug: slug.to_owned(),
                name: name.unwrap_or(slug).to_owned(),
                status: TenantStatus::Active,
                admin_email: email.map(str::to_owned),
                created_us: now,
                updated_us: now,
            };
            let ops = d::create(TENANTS, &t.id, &t, &[(TENANT_SLUGS, slug)]);
            if self
                .commit(ops, &self.op("tenant.create", &t.id, json!({"slug": slug})))
                .await?
            {
                return Ok(Made {
                    doc: t,
                    created: true,
                });
            }
        }
        Err(race())
    }

    async fn ensure_cluster(
        &self,
        tenant: &TenantDoc,
        slug: &str,
        plan: &str,
    ) -> Result<Made<ClusterDoc>, ApiError> {
        for _ in 0..RACES {
            if let Some(c) = self.cluster_by_slug(slug).await? {
                if c.tenant_id != tenant.id {
                    return Err(ApiError::new(
                        409,
                        "conflict",
                        format!("cluster slug '{slug}' belongs to another tenant"),
                    ));
                }
                return Ok(Made {
                    doc: c,
                    created: false,
                });
            }
            let now = d::micros(self.api.now());
            let c = ClusterDoc {
                id: new_id(),
                slug: slug.to_owned(),
                tenant_id: tenant.id.clone(),
                broker_tenant_uuid: new_id(),
                plan_code: plan.to_owned(),
                status: ClusterStatus::Active,
                overrides: Map::new(),
                created_us: now,
                updated_us: now,
            };
            let ops = d::create(CLUSTERS, &c.id, &c, &[(CLUSTER_SLUGS, slug)]);
            if self
                .commit(
                    ops,
                    &self.op(
                        "cluster.create",
                        &c.id,
                        json!({"slug": slug, "tenant_id": tenant.id, "plan": plan}),
                    ),
                )
                .await?
            {
                return Ok(Made {
                    doc: c,
                    created: true,
                });
            }
        }
        Err(race())
    }

    async fn cluster_by_slug(&self, slug: &str) -> Result<Option<ClusterDoc>, ApiError> {
        let Some(id) = self.lookup(CLUSTER_SLUGS, slug).await? else {
            return Ok(None);
        };
        Ok(self.get::<ClusterDoc>(CLUSTERS, &id).await?.map(|(c, _)| c))
    }

    /// A cluster as the control plane lists it.
    async fn row(&self, c: &ClusterDoc) -> Result<Value, ApiError> {
        let t = self
            .get::<TenantDoc>(TENANTS, &c.tenant_id)
            .await?
            .map(|(t, _)| t);
        Ok(row(c, t.as_ref()))
    }

    async fn create_cluster(&self, m: &Map<String, Value>) -> Result<(u16, Value), ApiError> {
        let tenant_slug = slug(required(m, "tenant_slug")?, "tenant_slug")?;
        let cluster_slug = slug(required(m, "slug")?, "slug")?;
        let plan = plan(text(m, "plan")?, "free")?;
        let t = self
            .ensure_tenant(&tenant_slug, text(m, "tenant_name")?, None)
            .await?;
        let c = self.ensure_cluster(&t.doc, &cluster_slug, &plan).await?;
        Ok((if c.created { 201 } else { 200 }, row(&c.doc, Some(&t.doc))))
    }

    async fn clusters(&self, query: &str) -> Result<(u16, Value), ApiError> {
        let want = crate::pop_query::parse_query(query)
            .into_iter()
            .find(|(k, _)| k == "plan")
            .map(|(_, v)| v);
        let tenants: std::collections::HashMap<String, TenantDoc> = self
            .list::<TenantDoc>(TENANTS)
            .await?
            .into_iter()
            .map(|t| (t.id.clone(), t))
            .collect();
        let rows: Vec<Value> = self
            .list::<ClusterDoc>(CLUSTERS)
            .await?
            .iter()
            .filter(|c| want.as_deref().is_none_or(|p| c.plan_code == p))
            .map(|c| row(c, tenants.get(&c.tenant_id)))
            .collect();
        Ok((200, json!({"clusters": rows})))
    }

    async fn tenant_status(
        &self,
        slug: &str,
        m: &Map<String, Value>,
    ) -> Result<(u16, Value), ApiError> {
        let status =
            TenantStatus::parse(required(m, "status")?).map_err(|e| invalid("status", e))?;
        for _ in 0..RACES {
            let Some(id) = self.lookup(TENANT_SLUGS, slug).await? else {
                return Err(tenant_unknown());
            };
            let Some((mut t, version)) = self.get::<TenantDoc>(TENANTS, &id).await? else {
                return Err(tenant_unknown());
            };
            if t.status != status {
                let from = t.status;
                t.status = status;
                t.updated_us = d::micros(self.api.now());
                let op = self.op(
                    "tenant.status",
                    &t.id,
                    json!({"from": from.as_str(), "to": status.as_str()}),
                );
                if !self
                    .commit(vec![d::replace(TENANTS, &t.id, &t, version)], &op)
                    .await?
                {
                    continue;
                }
            }
            let clusters: Vec<Value> = self
                .list::<ClusterDoc>(CLUSTERS)
                .await?
                .iter()
                .filter(|c| c.tenant_id == t.id)
                .map(|c| json!({"id": c.id, "slug": c.slug, "broker_tenant_uuid": c.broker_tenant_uuid}))
                .collect();
            return Ok((
                200,
                json!({"ok": true, "tenant_id": t.id, "clusters": clusters}),
            ));
        }
        Err(race())
    }

    async fn cluster_status(
        &self,
        id: &str,
        m: &Map<String, Value>,
    ) -> Result<(u16, Value), ApiError> {
        let status =
            ClusterStatus::parse(required(m, "status")?).map_err(|e| invalid("status", e))?;
        self.change_cluster(id, "cluster.status", json!({"to": status.as_str()}), |c| {
            c.status = status;
        })
        .await
    }

    async fn overrides(&self, id: &str, body: &[u8]) -> Result<(u16, Value), ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| invalid("body", &format!("is not JSON ({e})")))?;
        let overrides = check_overrides(value, "body")?;
        let keys: Vec<&String> = overrides.keys().collect();
        let meta = json!({"fields": keys});
        self.change_cluster(id, "cluster.overrides", meta, |c| {
            c.overrides = overrides.clone();
        })
        .await
    }

    async fn change_cluster(
        &self,
        id: &str,
        action: &str,
        meta: Value,
        change: impl Fn(&mut ClusterDoc),
    ) -> Result<(u16, Value), ApiError> {
        for _ in 0..RACES {
            let Some((mut c, version)) = self.get::<ClusterDoc>(CLUSTERS, id).await? else {
                return Err(cluster_unknown());
            };
            let before = c.clone();
            change(&mut c);
            if c == before {
                return Ok((200, json!({"ok": true})));
            }
            c.updated_us = d::micros(self.api.now());
            let op = self.op(action, id, meta.clone());
            if self
                .commit(vec![d::replace(CLUSTERS, id, &c, version)], &op)
                .await?
            {
                return Ok((200, json!({"ok": true})));
            }
        }
        Err(race())
    }

    /// `GET /api/cp/clusters/:slug/queues` (the broker's queue listing, query passed through)
    /// and `POST /api/cp/clusters/:slug/configure` (`{queue, options}`), as the cluster's
    /// tenant.
    async fn relay(
        &self,
        method: &str,
        slug_text: &str,
        what: &str,
        query: &str,
        body: &[u8],
    ) -> Result<Response<Full<Bytes>>, ApiError> {
        let (path, want): (&[&str], &str) = match what {
            "queues" => (&["api", "v1", "resources", "queues"], "GET"),
            _ => (&["api", "v1", "configure"], "POST"),
        };
        if method != want {
            return Err(not_found());
        }
        self.own_broker_data()?;
        let s = slug(slug_text, "slug")?;
        let c = self
            .cluster_by_slug(&s)
            .await?
            .ok_or_else(cluster_unknown)?;
        if what == "configure" {
            self.refuse_deleting(&c).await?;
            let m = object(body)?;
            if text(&m, "queue")?.is_none_or(|q| q.trim().is_empty()) {
                return Err(invalid("queue", "is required"));
            }
        }
        let tenant = broker_tenant(&c)?;
        let scope = crate::tenancy::Scope::proxied(tenant);
        let method = hyper::Method::from_bytes(want.as_bytes())
            .map_err(|_| ApiError::new(500, "internal", "bad method"))?;
        crate::router::handle(
            self.groups.of(&scope.tenant),
            &scope,
            &method,
            path,
            query,
            body,
            crate::writes::BodyKind::Json,
        )
        .await
    }
}

#[derive(Serialize)]
struct Row<'a> {
    id: &'a str,
    slug: &'a str,
    tenant_id: &'a str,
    tenant_slug: Option<&'a str>,
    broker_tenant_uuid: &'a str,
    plan_code: &'a str,
    status: &'static str,
    tenant_status: Option<&'static str>,
    overrides: &'a Map<String, Value>,
}

fn row(c: &ClusterDoc, t: Option<&TenantDoc>) -> Value {
    serde_json::to_value(Row {
        id: &c.id,
        slug: &c.slug,
        tenant_id: &c.tenant_id,
        tenant_slug: t.map(|t| t.slug.as_str()),
        broker_tenant_uuid: &c.broker_tenant_uuid,
        plan_code: &c.plan_code,
        status: c.status.as_str(),
        tenant_status: t.map(|t| t.status.as_str()),
        overrides: &c.overrides,
    })
    .unwrap_or(Value::Null)
}

/// A cluster's overrides: an object of plan fields (`null` clears them all); each value a
/// non-negative integer or `null` (unlimited), `features` an object, `cell_class` a string.
fn check_overrides(value: Value, field: &str) -> Result<Map<String, Value>, ApiError> {
    let overrides = match value {
        Value::Null => Map::new(),
        Value::Object(m) => m,
        _ => return Err(invalid(field, "must be a JSON object or null")),
    };
    for (k, v) in &overrides {
        if !PLAN_FIELDS.contains(&k.as_str()) {
            return Err(invalid(
                k,
                &format!("is not a plan field ({})", PLAN_FIELDS.join(", ")),
            ));
        }
        let ok = match k.as_str() {
            "features" => v.is_object() || v.is_null(),
            "cell_class" => v.is_string() || v.is_null(),
            _ => v.is_null() || v.as_u64().is_some(),
        };
        if !ok {
            return Err(invalid(
                k,
                "must be a non-negative integer or null (features: an object; cell_class: a string)",
            ));
        }
    }
    Ok(overrides)
}

/// The broker tenant a cluster's data lives under (a UUID the control plane minted).
fn broker_tenant(c: &ClusterDoc) -> Result<queen_domain::tenant::Tenant, ApiError> {
    queen_domain::tenant::Tenant::parse(&c.broker_tenant_uuid).map_err(|_| {
        ApiError::new(
            500,
            "internal",
            "a cluster's broker tenant is not a tenant id",
        )
    })
}

fn cluster_unknown() -> ApiError {
    ApiError::new(404, "cluster_unknown", "no cluster has this slug or id")
}

fn tenant_unknown() -> ApiError {
    ApiError::new(404, "tenant_unknown", "no tenant has this slug")
}

fn race() -> ApiError {
    ApiError::new(
        409,
        "conflict",
        "a concurrent change won every attempt; repeat the request",
    )
}
