//! The control plane's S3 routes: a cluster's own sink, its settings checked with the sink's
//! own rules and its secret sealed before anything is stored.

use super::*;

impl<A: ClientApi> Cp<'_, A> {
    pub(super) fn sinks_available(&self) -> Result<(), ApiError> {
        if self.api.tenant_sinks_available() {
            Ok(())
        } else {
            Err(ApiError::new(
                404,
                "s3_unavailable",
                "this node runs no embedded S3 sink (QUEEN_S3_EMBEDDED=true on every node)",
            ))
        }
    }

    /// `PUT /api/cp/clusters/:slug/s3`: the cluster's sink, checked with the sink's own rules,
    /// its secret sealed before anything is stored.
    pub(super) async fn put_sink(
        &self,
        slug: &str,
        m: &Map<String, Value>,
    ) -> Result<(u16, Value), ApiError> {
        self.sinks_available()?;
        let c = self
            .cluster_by_slug(slug)
            .await?
            .ok_or_else(cluster_unknown)?;
        self.refuse_deleting(&c).await?;
        self.own_broker_data()?;
        let mut config = m.clone();
        let secret = match config.remove("secretKey") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 4096 => Some(s),
            Some(_) => {
                return Err(invalid(
                    "secretKey",
                    "must be a non-empty string of at most 4096 bytes",
                ));
            }
        };
        let enabled = match config.remove("enabled") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => b,
            Some(_) => return Err(invalid("enabled", "must be true or false")),
        };
        self.api
            .check_tenant_sink(&config)
            .map_err(|e| ApiError::new(400, "invalid", e))?;
        let sealed = match &secret {
            None => None,
            Some(s) => Some(
                self.api
                    .seal_secret(s.as_bytes())
                    .map_err(|_| ApiError::new(500, "internal", "the secret could not be sealed"))?
                    .ok_or_else(|| {
                        ApiError::new(
                            409,
                            "encryption_required",
                            "this node has no QUEEN_ENCRYPTION_KEY: a sink's secret is stored only sealed with it",
                        )
                    })?,
            ),
        };
        for _ in 0..RACES {
            let current = self.get::<S3SinkDoc>(S3_SINKS, &c.id).await?;
            let secret_key_sealed = match (&sealed, &current) {
                (Some(s), _) => String::from_utf8_lossy(s).into_owned(),
                (None, Some((old, _))) => old.secret_key_sealed.clone(),
                (None, None) => {
                    return Err(invalid(
                        "secretKey",
                        "is required the first time a cluster's sink is set",
                    ));
                }
            };
            let doc = S3SinkDoc {
                cluster_id: c.id.clone(),
                tenant: c.broker_tenant_uuid.clone(),
                enabled,
                config: config.clone(),
                secret_key_sealed,
                updated_us: d::micros(self.api.now()),
            };
            let write = match &current {
                Some((_, version)) => d::replace(S3_SINKS, &c.id, &doc, *version),
                None => d::create(S3_SINKS, &c.id, &doc, &[]).remove(0),
            };
            let op = self.op(
                "s3.put",
                &c.id,
                json!({"enabled": enabled, "secretKeyChanged": sealed.is_some()}),
            );
            if self.commit(vec![write], &op).await? {
                return Ok((200, sink_view(&c, &doc)));
            }
        }
        Err(race())
    }

    pub(super) async fn get_sink(&self, slug: &str) -> Result<(u16, Value), ApiError> {
        self.sinks_available()?;
        let c = self
            .cluster_by_slug(slug)
            .await?
            .ok_or_else(cluster_unknown)?;
        match self.get::<S3SinkDoc>(S3_SINKS, &c.id).await? {
            Some((doc, _)) => Ok((200, sink_view(&c, &doc))),
            None => Err(ApiError::new(
                404,
                "s3_unset",
                "this cluster has no S3 sink",
            )),
        }
    }

    pub(super) async fn delete_sink(&self, slug: &str) -> Result<(u16, Value), ApiError> {
        self.sinks_available()?;
        let c = self
            .cluster_by_slug(slug)
            .await?
            .ok_or_else(cluster_unknown)?;
        for _ in 0..RACES {
            let Some((_, version)) = self.get::<S3SinkDoc>(S3_SINKS, &c.id).await? else {
                return Ok((200, json!({"cluster": c.slug, "removed": false})));
            };
            let delete = KvOp::Delete {
                ns: d::ns(S3_SINKS),
                key: d::key(&c.id),
                expect: Some(version),
                required: true,
            };
            if self
                .commit(vec![delete], &self.op("s3.delete", &c.id, Value::Null))
                .await?
            {
                return Ok((200, json!({"cluster": c.slug, "removed": true})));
            }
        }
        Err(race())
    }

    /// 409 `deleting` when the cluster or its tenant is on its way out.
    pub(super) async fn refuse_deleting(&self, c: &ClusterDoc) -> Result<(), ApiError> {
        let tenant_deleting = self
            .get::<TenantDoc>(TENANTS, &c.tenant_id)
            .await?
            .is_some_and(|(t, _)| t.status == TenantStatus::Deleting);
        if c.status == ClusterStatus::Deleting || tenant_deleting {
            return Err(ApiError::new(
                409,
                "deleting",
                "this cluster or its tenant is being deleted",
            ));
        }
        Ok(())
    }
}

/// A sink as answered: everything but the secret (and any user name or password a row stored
/// before endpoints were checked carries in its endpoint).
pub(super) fn sink_view(c: &ClusterDoc, doc: &S3SinkDoc) -> Value {
    let mut config = doc.config.clone();
    if let Some(Value::String(e)) = config.get_mut("endpoint") {
        *e = without_userinfo(e);
    }
    json!({
        "cluster": c.slug,
        "tenant": doc.tenant,
        "enabled": doc.enabled,
        "config": config,
        "secretKeySet": !doc.secret_key_sealed.is_empty(),
        "updatedAt": queen_domain::time::Stamp(doc.updated_us).iso_millis(),
    })
}

/// `scheme://user:pw@host/...` shown as `scheme://***@host/...`; anything else as it is.
fn without_userinfo(endpoint: &str) -> String {
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return endpoint.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => endpoint.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stored_user_name_and_password_are_never_shown() {
        assert_eq!(
            super::without_userinfo("http://u:p@s3.example.com:9000/x"),
            "http://***@s3.example.com:9000/x"
        );
        assert_eq!(
            super::without_userinfo("https://s3.example.com"),
            "https://s3.example.com"
        );
        assert_eq!(super::without_userinfo("u:p@h"), "u:p@h");
    }
}
