//! What the control plane reads of the metering: usage by minute and activity.

use super::*;

impl<A: ClientApi> Cp<'_, A> {
    /// `GET /api/cp/clusters/:id/usage`: the last hour by minute and op class, summed over the
    /// nodes' rows.
    pub(super) async fn usage(&self, id: &str) -> Result<(u16, Value), ApiError> {
        if self.get::<ClusterDoc>(CLUSTERS, id).await?.is_none() {
            return Err(cluster_unknown());
        }
        let now = self.api.now().0;
        let since = (now / 60_000_000).saturating_sub(60) * 60_000_000;
        let mut sums: std::collections::BTreeMap<(u64, String), crate::proxy::limits::Counters> =
            std::collections::BTreeMap::new();
        let mut after = Some(format!("#{id}/{since:020}"));
        loop {
            let page = self
                .api
                .kv(vec![KvOp::GetPrefix {
                    ns: d::ns(d::USAGE_MIN),
                    prefix: format!("#{id}/"),
                    after: after.take(),
                    limit: queen_domain::kv::MAX_PREFIX_LIMIT,
                    keys_only: false,
                }])
                .await?;
            let Some(KvResult::Prefix {
                rows,
                truncated,
                next_after,
                ..
            }) = page.results.into_iter().next()
            else {
                break;
            };
            for r in rows {
                // #<cluster>/<minute>/<op>/<process>
                let mut parts = r.key.split('/').skip(1);
                let (Some(minute), Some(op)) = (parts.next(), parts.next()) else {
                    continue;
                };
                let (Ok(minute), Ok(c)) = (
                    minute.parse::<u64>(),
                    serde_json::from_slice::<crate::proxy::limits::Counters>(&r.value),
                ) else {
                    continue;
                };
                if minute < since {
                    continue;
                }
                let sum = sums.entry((minute, op.to_owned())).or_default();
                sum.reqs += c.reqs;
                sum.msgs += c.msgs;
                sum.bytes_in += c.bytes_in;
                sum.bytes_out += c.bytes_out;
            }
            if !truncated || next_after.is_none() {
                break;
            }
            after = next_after;
        }
        let minutes: Vec<Value> = sums
            .into_iter()
            .map(|((minute, op), c)| {
                json!({
                    "minute": queen_domain::time::Stamp(minute).iso_millis(),
                    "op": op,
                    "reqs": c.reqs,
                    "msgs": c.msgs,
                    "bytes_in": c.bytes_in,
                    "bytes_out": c.bytes_out,
                })
            })
            .collect();
        Ok((200, json!({ "minutes": minutes })))
    }

    /// `POST /api/cp/activity`: for each cluster slug, when a key last used it and when it was
    /// first pushed to (the latest and earliest over the nodes' rows); what is not known is
    /// null, never 0.
    pub(super) async fn activity(&self, m: &Map<String, Value>) -> Result<(u16, Value), ApiError> {
        let Some(Value::Array(slugs)) = m.get("clusters") else {
            return Err(invalid("clusters", "must be a list of cluster slugs"));
        };
        if slugs.len() > 256 {
            return Err(invalid("clusters", "holds more than 256 slugs"));
        }
        let mut out = Vec::with_capacity(slugs.len());
        for s in slugs {
            let Some(text) = s.as_str() else {
                return Err(invalid("clusters", "must be a list of strings"));
            };
            let Some(c) = self.cluster_by_slug(text).await? else {
                out.push(json!({"slug": text, "found": false, "cluster_id": null, "last_activity_at": null, "first_push_at": null, "last_key_used_at": null, "retained_bytes": null}));
                continue;
            };
            let page = self
                .api
                .kv(vec![KvOp::GetPrefix {
                    ns: d::ns(d::ACTIVITY),
                    prefix: format!("#{}/", c.id),
                    after: None,
                    limit: queen_domain::kv::MAX_PREFIX_LIMIT,
                    keys_only: false,
                }])
                .await?;
            let rows: Vec<d::ActivityDoc> = match page.results.into_iter().next() {
                Some(KvResult::Prefix { rows, .. }) => rows
                    .iter()
                    .filter_map(|r| serde_json::from_slice(&r.value).ok())
                    .collect(),
                _ => Vec::new(),
            };
            let at = |us: Option<u64>| {
                us.filter(|u| *u > 0)
                    .map(|u| queen_domain::time::Stamp(u).iso_millis())
            };
            let last = at(rows.iter().map(|a| a.last_activity_us).max());
            let first = at(rows
                .iter()
                .map(|a| a.first_push_us)
                .filter(|u| *u > 0)
                .min());
            // What this node stores for the cluster; null when it cannot tell.
            let retained = match queen_domain::tenant::Tenant::parse(&c.broker_tenant_uuid) {
                Ok(t) => {
                    let counting = self.groups.of(&t).clone();
                    tokio::task::spawn_blocking(move || counting.retained_bytes(&t))
                        .await
                        .ok()
                        .flatten()
                }
                Err(_) => None,
            };
            out.push(json!({
                "slug": c.slug,
                "found": true,
                "cluster_id": c.id,
                "last_activity_at": last,
                "first_push_at": first,
                "last_key_used_at": last,
                "retained_bytes": retained,
            }));
        }
        Ok((200, json!({ "clusters": out })))
    }
}
