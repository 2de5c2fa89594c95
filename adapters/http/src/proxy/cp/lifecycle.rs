//! A tenant's way out: purge passes, then the delete of its rows.

use super::*;

impl<A: ClientApi> Cp<'_, A> {
    /// A tenant by slug with its row's version, and its clusters.
    pub(super) async fn tenant_with_clusters(
        &self,
        slug: &str,
    ) -> Result<Option<(TenantDoc, u64, Vec<(ClusterDoc, u64)>)>, ApiError> {
        let Some(id) = self.lookup(TENANT_SLUGS, slug).await? else {
            return Ok(None);
        };
        let Some((t, version)) = self.get::<TenantDoc>(TENANTS, &id).await? else {
            return Ok(None);
        };
        let mut clusters = Vec::new();
        for c in self.list::<ClusterDoc>(CLUSTERS).await? {
            if c.tenant_id == t.id
                && let Some(found) = self.get::<ClusterDoc>(CLUSTERS, &c.id).await?
            {
                clusters.push(found);
            }
        }
        Ok(Some((t, version, clusters)))
    }

    /// `POST /api/cp/tenants/:slug/purge`: one pass over a deleting tenant: its sinks' rows
    /// first, then a bounded pass of the broker's purge per cluster. A cluster is done when a
    /// pass deleted nothing and found nothing left, so the pass that deletes is always
    /// followed by one that confirms.
    pub(super) async fn purge(&self, slug: &str) -> Result<(u16, Value), ApiError> {
        let Some((t, _, clusters)) = self.tenant_with_clusters(slug).await? else {
            return Ok((200, json!({"existed": false, "done": true, "clusters": []})));
        };
        if t.status != TenantStatus::Deleting {
            return Err(not_deleting());
        }
        let mut rows = Vec::new();
        self.own_broker_data()?;
        let mut all_done = true;
        for (c, _) in &clusters {
            if let Some((_, version)) = self.get::<S3SinkDoc>(S3_SINKS, &c.id).await? {
                let delete = KvOp::Delete {
                    ns: d::ns(S3_SINKS),
                    key: d::key(&c.id),
                    expect: Some(version),
                    required: false,
                };
                self.commit(
                    vec![delete],
                    &self.op("s3.delete", &c.id, json!({"purge": true})),
                )
                .await?;
            }
            let tenant = broker_tenant(c)?;
            match self.groups.of(&tenant).purge_tenant(tenant.clone()).await {
                Ok(r) => {
                    let done = r.done && r.partitions_deleted == 0;
                    all_done &= done;
                    rows.push(json!({"slug": c.slug, "broker_tenant_uuid": c.broker_tenant_uuid, "done": done, "partitions_deleted": r.partitions_deleted}));
                }
                Err(e) => {
                    all_done = false;
                    rows.push(json!({"slug": c.slug, "broker_tenant_uuid": c.broker_tenant_uuid, "done": false, "partitions_deleted": 0, "error": ApiError::from(e).message}));
                }
            }
        }
        Ok((
            200,
            json!({"existed": true, "done": all_done, "clusters": rows}),
        ))
    }

    /// `DELETE /api/cp/tenants/:slug`: the tenant, its clusters, their keys and sinks, in one
    /// batch, once it is deleting and (unless `force`) purged.
    pub(super) async fn delete_tenant(
        &self,
        slug: &str,
        force: bool,
    ) -> Result<(u16, Value), ApiError> {
        let Some((t, version, clusters)) = self.tenant_with_clusters(slug).await? else {
            return Ok((200, json!({"existed": false, "clusters": []})));
        };
        if t.status != TenantStatus::Deleting {
            return Err(not_deleting());
        }
        if !force {
            for (c, _) in &clusters {
                let tenant = broker_tenant(c)?;
                let state = self.groups.of(&tenant).state();
                let left =
                    queen_domain::reads::tenant_queues(&*state, &tenant, 1).map_err(|_| {
                        ApiError::new(
                            503,
                            "unavailable",
                            "the broker's queue listing cannot be read",
                        )
                    })?;
                if !left.is_empty() {
                    return Err(ApiError::new(
                        409,
                        "not_purged",
                        format!(
                            "cluster '{}' still has queues: purge the tenant first",
                            c.slug
                        ),
                    ));
                }
            }
        }
        let keys = self.list::<KeyDoc>(KEYS).await?;
        let mut ops = Vec::new();
        let del = |table: &str, id: &str, expect: Option<u64>| KvOp::Delete {
            ns: d::ns(table),
            key: d::key(id),
            expect,
            required: expect.is_some(),
        };
        ops.push(del(TENANTS, &t.id, Some(version)));
        ops.push(del(TENANT_SLUGS, &t.slug, None));
        let mut rows = Vec::new();
        for (c, v) in &clusters {
            ops.push(del(CLUSTERS, &c.id, Some(*v)));
            ops.push(del(CLUSTER_SLUGS, &c.slug, None));
            ops.push(del(S3_SINKS, &c.id, None));
            for k in keys.iter().filter(|k| k.cluster_id == c.id) {
                ops.push(del(KEYS, &k.id, None));
                ops.push(del(KEY_HASHES, &k.key_hash, None));
            }
            rows.push(json!({"cluster_id": c.id, "slug": c.slug, "broker_tenant_uuid": c.broker_tenant_uuid}));
        }
        let op = self.op(
            "tenant.delete",
            &t.id,
            json!({"slug": t.slug, "force": force}),
        );
        if !self.commit(ops, &op).await? {
            return Err(race());
        }
        Ok((200, json!({"existed": true, "clusters": rows})))
    }
}

pub(super) fn not_deleting() -> ApiError {
    ApiError::new(
        409,
        "not_deleting",
        "set the tenant's status to deleting first",
    )
}
