//! The control plane's keys and the routes that make several things at once: keys from a
//! hash and their revocation, provision (with user records), the bootstrap route and the
//! boot-time bootstrap.

use super::*;

impl<A: ClientApi> Cp<'_, A> {
    /// `POST /api/cp/provision`: a tenant, its cluster on a plan with overrides, a user and a
    /// key (by its hash), each made if missing; a retry answers the same ids, nothing created.
    pub(super) async fn provision(&self, m: &Map<String, Value>) -> Result<(u16, Value), ApiError> {
        let tenant_slug = slug(required(m, "tenant_slug")?, "tenant_slug")?;
        let cluster_slug = slug(required(m, "cluster_slug")?, "cluster_slug")?;
        let plan = plan(Some(required(m, "plan")?), "free")?;
        let user_id = uuid(required(m, "user_id")?, "user_id")?;
        if user_id == "00000000-0000-0000-0000-000000000000" {
            return Err(invalid("user_id", "must not be the nil UUID"));
        }
        let email = required(m, "email")?.to_ascii_lowercase();
        if !email.contains('@') || email.len() > 254 {
            return Err(invalid("email", "must be an email address"));
        }
        let role = required(m, "role")?;
        if !["admin", "producer", "consumer", "viewer"].contains(&role) {
            return Err(invalid(
                "role",
                "must be one of admin, producer, consumer, viewer",
            ));
        }
        let key_name = required(m, "key_name")?;
        let (hash, scopes) = hash_and_scopes(m)?;
        let overrides = check_overrides(
            m.get("overrides").cloned().unwrap_or(Value::Null),
            "overrides",
        )?;
        let t = self
            .ensure_tenant(&tenant_slug, text(m, "tenant_name")?, None)
            .await?;
        let c = self.ensure_cluster(&t.doc, &cluster_slug, &plan).await?;
        if c.doc.overrides != overrides || c.doc.plan_code != plan {
            let (o, p) = (overrides.clone(), plan.clone());
            self.change_cluster(
                &c.doc.id,
                "cluster.provision",
                json!({"plan": plan}),
                move |d| {
                    d.overrides = o.clone();
                    d.plan_code = p.clone();
                },
            )
            .await?;
        }
        let user = self.ensure_user(&t.doc, &user_id, &email, role).await?;
        let key = self
            .ensure_key(&c.doc.id, key_name, hash, scopes, "control_plane")
            .await?;
        Ok((
            200,
            json!({
                "tenant_id": t.doc.id,
                "cluster_id": c.doc.id,
                "broker_tenant_uuid": c.doc.broker_tenant_uuid,
                "user_id": user.doc.id,
                "key_id": key.doc.id,
                "plan_code": plan,
                "overrides": overrides,
                "created": {"tenant": t.created, "cluster": c.created, "user": user.created, "key": key.created},
            }),
        ))
    }

    pub(super) async fn ensure_user(
        &self,
        tenant: &TenantDoc,
        id: &str,
        email: &str,
        role: &str,
    ) -> Result<Made<d::UserDoc>, ApiError> {
        for _ in 0..RACES {
            if let Some((u, _)) = self.get::<d::UserDoc>(d::USERS, id).await? {
                if u.tenant_id != tenant.id {
                    return Err(ApiError::new(
                        409,
                        "conflict",
                        "user_id is a user of another tenant",
                    ));
                }
                if u.email != email {
                    return Err(ApiError::new(
                        409,
                        "conflict",
                        "user_id already has another email",
                    ));
                }
                return Ok(Made {
                    doc: u,
                    created: false,
                });
            }
            if self.lookup(d::USER_EMAILS, email).await?.is_some() {
                return Err(ApiError::new(
                    409,
                    "conflict",
                    "email belongs to another user",
                ));
            }
            let u = d::UserDoc {
                id: id.to_owned(),
                tenant_id: tenant.id.clone(),
                email: email.to_owned(),
                role: role.to_owned(),
                created_us: d::micros(self.api.now()),
            };
            let ops = d::create(d::USERS, id, &u, &[(d::USER_EMAILS, email)]);
            if self
                .commit(
                    ops,
                    &self.op(
                        "user.create",
                        id,
                        json!({"tenant_id": tenant.id, "role": role}),
                    ),
                )
                .await?
            {
                return Ok(Made {
                    doc: u,
                    created: true,
                });
            }
        }
        Err(race())
    }

    pub(super) async fn create_key(
        &self,
        m: &Map<String, Value>,
    ) -> Result<(u16, Value), ApiError> {
        let cluster_id = uuid(required(m, "cluster_id")?, "cluster_id")?;
        let name = required(m, "name")?.to_owned();
        let (hash, scopes) = hash_and_scopes(m)?;
        if self
            .get::<ClusterDoc>(CLUSTERS, &cluster_id)
            .await?
            .is_none()
        {
            return Err(cluster_unknown());
        }
        let made = self
            .ensure_key(&cluster_id, &name, hash, scopes, "control_plane")
            .await?;
        Ok((
            if made.created { 201 } else { 200 },
            json!({"id": made.doc.id, "existed": !made.created}),
        ))
    }

    /// The key with `hash` on `cluster_id`, made if missing. 409 when another cluster holds the
    /// hash or it was revoked.
    pub(super) async fn ensure_key(
        &self,
        cluster_id: &str,
        name: &str,
        hash: &str,
        scopes: Scopes,
        actor: &str,
    ) -> Result<Made<KeyDoc>, ApiError> {
        for _ in 0..RACES {
            if let Some(id) = self.lookup(KEY_HASHES, hash).await?
                && let Some((k, _)) = self.get::<KeyDoc>(KEYS, &id).await?
            {
                if k.cluster_id != cluster_id || k.revoked_us.is_some() {
                    return Err(ApiError::new(
                        409,
                        "conflict",
                        "this key hash is held by another cluster or by a revoked key",
                    ));
                }
                return Ok(Made {
                    doc: k,
                    created: false,
                });
            }
            let k = KeyDoc {
                id: new_id(),
                cluster_id: cluster_id.to_owned(),
                name: name.to_owned(),
                key_hash: hash.to_owned(),
                scopes: scopes.names().into_iter().map(str::to_owned).collect(),
                created_us: d::micros(self.api.now()),
                revoked_us: None,
            };
            let mut op = self.op(
                "key.create",
                &k.id,
                json!({"cluster_id": cluster_id, "name": name, "scopes": k.scopes}),
            );
            actor.clone_into(&mut op.actor);
            if self
                .commit(d::create(KEYS, &k.id, &k, &[(KEY_HASHES, hash)]), &op)
                .await?
            {
                return Ok(Made {
                    doc: k,
                    created: true,
                });
            }
        }
        Err(race())
    }

    pub(super) async fn revoke(&self, id: &str) -> Result<(u16, Value), ApiError> {
        for _ in 0..RACES {
            let Some((mut k, version)) = self.get::<KeyDoc>(KEYS, id).await? else {
                return Err(ApiError::new(404, "key_unknown", "no key has this id"));
            };
            if k.revoked_us.is_some() {
                return Ok((200, json!({"ok": true, "already_revoked": true})));
            }
            k.revoked_us = Some(d::micros(self.api.now()));
            let op = self.op("key.revoke", id, json!({"cluster_id": k.cluster_id}));
            if self
                .commit(vec![d::replace(KEYS, id, &k, version)], &op)
                .await?
            {
                return Ok((200, json!({"ok": true, "already_revoked": false})));
            }
        }
        Err(race())
    }

    /// `POST /api/cp/bootstrap`: a tenant, a cluster and a key with every scope. The key is in
    /// the answer once, when it is made; a retry finds the tenant, the cluster and the live key
    /// of that name and answers their ids with `key: null`.
    pub(super) async fn bootstrap(&self, m: &Map<String, Value>) -> Result<(u16, Value), ApiError> {
        let tenant_slug = slug(required(m, "tenant_slug")?, "tenant_slug")?;
        let cluster_slug = match text(m, "cluster_slug")? {
            Some(s) => slug(s, "cluster_slug")?,
            None => tenant_slug.clone(),
        };
        let plan = plan(text(m, "plan")?, "free")?;
        let email = required(m, "admin_email")?;
        if !email.contains('@') || email.len() > 254 {
            return Err(invalid("admin_email", "must be an email address"));
        }
        let key_name = text(m, "key_name")?.unwrap_or("bootstrap").to_owned();
        let t = self
            .ensure_tenant(&tenant_slug, text(m, "tenant_name")?, Some(email))
            .await?;
        let c = self.ensure_cluster(&t.doc, &cluster_slug, &plan).await?;
        let live = self
            .list::<KeyDoc>(KEYS)
            .await?
            .into_iter()
            .find(|k| k.cluster_id == c.doc.id && k.name == key_name && k.revoked_us.is_none());
        let (key_id, key, key_created) = match live {
            Some(k) => (k.id, None, false),
            None => {
                let key = rules::format_key(&self.settings.key_env, &rand::random());
                let made = self
                    .ensure_key(
                        &c.doc.id,
                        &key_name,
                        &rules::key_hash(&key),
                        Scopes::ALL,
                        "control_plane",
                    )
                    .await?;
                (made.doc.id, Some(key), true)
            }
        };
        Ok((
            200,
            json!({
                "tenant_id": t.doc.id,
                "cluster_id": c.doc.id,
                "broker_tenant_uuid": c.doc.broker_tenant_uuid,
                "plan_code": c.doc.plan_code,
                "key_id": key_id,
                "key": key,
                "created": {"tenant": t.created, "cluster": c.created, "key": key_created},
            }),
        ))
    }
}

/// The boot-time bootstrap of `QUEEN_PROXY_BOOTSTRAP_*`: the tenant and a cluster of the same
/// slug, and the configured key (by its hash) if it is not registered yet.
pub(crate) async fn bootstrap_at_boot<A: ClientApi>(
    groups: &crate::groups::Groups<A>,
    settings: &ProxySettings,
) -> Result<(), ApiError> {
    let Some(b) = &settings.bootstrap else {
        return Ok(());
    };
    let cp = Cp {
        api: groups.home(),
        groups,
        settings,
    };
    let t = cp.ensure_tenant(&b.tenant, None, Some(&b.email)).await?;
    let c = cp.ensure_cluster(&t.doc, &b.tenant, &b.plan).await?;
    if let Some(key) = &b.api_key {
        let hash = rules::key_hash(key);
        match cp
            .ensure_key(&c.doc.id, "bootstrap", &hash, Scopes::ALL, "system")
            .await
        {
            Ok(_) => {}
            // Held elsewhere or revoked: left as it is, and said once.
            Err(e) if e.status == 409 => {
                tracing::warn!(target: "queen-proxy", "QUEEN_PROXY_BOOTSTRAP_API_KEY is held by another cluster or was revoked; not registered");
            }
            Err(e) => return Err(e),
        }
    }
    if t.created || c.created {
        tracing::info!(target: "queen-proxy", tenant = %b.tenant, "bootstrap tenant and cluster made");
    }
    Ok(())
}

/// A body's `key_hash` (64 lowercase hexadecimal digits) and `scopes`.
fn hash_and_scopes(m: &Map<String, Value>) -> Result<(&str, Scopes), ApiError> {
    let hash = required(m, "key_hash")?;
    if !rules::is_hash(hash) {
        return Err(invalid(
            "key_hash",
            "must be the SHA-256 of the key in 64 lowercase hexadecimal digits",
        ));
    }
    Ok((hash, scopes_of(m.get("scopes"))?))
}

/// Scopes from a body's list of names.
fn scopes_of(v: Option<&Value>) -> Result<Scopes, ApiError> {
    match v {
        Some(Value::Array(a)) => {
            let names: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
            if names.len() != a.len() {
                return Err(invalid("scopes", "must be a list of strings"));
            }
            Scopes::parse(&names).map_err(|e| invalid("scopes", &e))
        }
        _ => Err(invalid("scopes", "must be a non-empty list")),
    }
}
