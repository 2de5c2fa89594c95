//! The proxy's documents in the replicated KV store, under the proxy's reserved tenant: one
//! namespace per table with keys `#<id>`, one namespace per unique index (`<table>.<column>`,
//! keys `#<value>`, values `{"id": ...}`) written in the same atomic batch as the row with a
//! must-be-absent precondition, a change marker (`px.meta` `#gen`) that every write rewrites so
//! that nodes notice a change by one read, and audit rows (`px.ops`). Values are JSON documents;
//! times are epoch microseconds (`*_us`).
//!
//! [`Directory::load`] reads every row from a node's applied state (no log entry), so each node
//! keeps the whole directory in memory: its size is that of the tenants, clusters and keys, not
//! of any traffic.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{ClusterStatus, Effective, Scopes, TenantStatus, effective};
use crate::kv::{Expiry, KvOp};
use crate::store::{StateRead, StoreError};
use crate::tenant::{PROXY_TENANT, Tenant};
use crate::time::Stamp;

/// The tenants table.
pub const TENANTS: &str = "px.tenants";
/// The unique index of tenant slugs.
pub const TENANT_SLUGS: &str = "px.tenants.slug";
/// The clusters table.
pub const CLUSTERS: &str = "px.clusters";
/// The unique index of cluster slugs.
pub const CLUSTER_SLUGS: &str = "px.clusters.slug";
/// The API keys table.
pub const KEYS: &str = "px.keys";
/// The unique index of key hashes.
pub const KEY_HASHES: &str = "px.keys.key_hash";
/// The tenant sinks (one per cluster, keyed by the cluster's id).
pub const S3_SINKS: &str = "px.s3sinks";
/// People of a tenant (records for the control plane; this proxy has no console sign-in).
pub const USERS: &str = "px.users";
/// The unique index of user emails.
pub const USER_EMAILS: &str = "px.users.email";
/// Per cluster and process: when it was last used and first pushed to.
pub const ACTIVITY: &str = "px.activity";
/// Usage per cluster, minute, op class and process (rows the processes overwrite).
pub const USAGE_MIN: &str = "px.usage.min";
/// Messages pushed per cluster and calendar month (UTC), summed over processes by `incr`.
pub const USAGE_MONTH: &str = "px.usage.month";
/// The change marker's table.
pub const META: &str = "px.meta";
/// The audit rows.
pub const OPS: &str = "px.ops";
/// The change marker's key.
pub const GEN: &str = "#gen";

/// A namespace of the proxy's tenant, as stored.
#[must_use]
pub fn ns(table: &str) -> String {
    proxy_tenant().name(table)
}

fn proxy_tenant() -> Tenant {
    // A constant UUID: always parses.
    Tenant::any(PROXY_TENANT).unwrap_or_default()
}

/// The key of a row or an index entry.
#[must_use]
pub fn key(id: &str) -> String {
    format!("#{id}")
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantDoc {
    /// A UUID.
    pub id: String,
    /// Unique DNS label.
    pub slug: String,
    /// A display name.
    pub name: String,
    /// Its status.
    pub status: TenantStatus,
    /// Who administers it (from the bootstrap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_email: Option<String>,
    /// Created, epoch µs.
    pub created_us: u64,
    /// Last change, epoch µs.
    pub updated_us: u64,
}

/// A cluster: what clients address, with its own broker tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterDoc {
    /// A UUID.
    pub id: String,
    /// Unique DNS label (the first label of its `Host`).
    pub slug: String,
    /// Its tenant's id.
    pub tenant_id: String,
    /// The broker tenant its data is stored under (a random UUID; the broker never sees slugs).
    pub broker_tenant_uuid: String,
    /// One of [`super::PLANS`].
    pub plan_code: String,
    /// Its status.
    pub status: ClusterStatus,
    /// Per-cluster limit overrides (an object; plan keys, `null` meaning unlimited).
    #[serde(default)]
    pub overrides: serde_json::Map<String, serde_json::Value>,
    /// Created, epoch µs.
    pub created_us: u64,
    /// Last change, epoch µs.
    pub updated_us: u64,
}

/// An API key: its hash, never the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDoc {
    /// A UUID.
    pub id: String,
    /// The cluster it opens.
    pub cluster_id: String,
    /// A name for people.
    pub name: String,
    /// SHA-256 of the key, lowercase hexadecimal.
    pub key_hash: String,
    /// Its scopes' names.
    pub scopes: Vec<String>,
    /// Created, epoch µs.
    pub created_us: u64,
    /// When it was revoked, epoch µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_us: Option<u64>,
}

/// A cluster's S3 sink: its settings and its secret, sealed under the nodes'
/// `QUEEN_ENCRYPTION_KEY` (never in the clear in the log, a snapshot or the store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct S3SinkDoc {
    /// The cluster.
    pub cluster_id: String,
    /// The broker tenant it mirrors.
    pub tenant: String,
    /// Runs while true (and the cluster's status lets it).
    pub enabled: bool,
    /// The per-sink settings, by their document field names.
    pub config: serde_json::Map<String, serde_json::Value>,
    /// The secret key's envelope.
    pub secret_key_sealed: String,
    /// Last write, epoch µs: every node rebuilds the sink when it moves.
    pub updated_us: u64,
}

/// A person of a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserDoc {
    /// A UUID (the caller's).
    pub id: String,
    /// The tenant.
    pub tenant_id: String,
    /// Unique email.
    pub email: String,
    /// `admin`, `producer`, `consumer` or `viewer`.
    pub role: String,
    /// Created, epoch µs.
    pub created_us: u64,
}

/// One process's view of a cluster's activity (the control plane takes the latest and
/// earliest over the processes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivityDoc {
    /// The last request a key of the cluster made, epoch µs.
    pub last_activity_us: u64,
    /// The first accepted push, epoch µs (0: none).
    pub first_push_us: u64,
}

/// An index entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexDoc {
    /// The row it points at.
    pub id: String,
}

/// An audit row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationDoc {
    /// `control_plane` or `system` (the boot-time bootstrap).
    pub actor: String,
    /// What was done (`tenant.create`, `key.revoke`, ...).
    pub action: String,
    /// The id it was done to.
    pub target: String,
    /// Details (never a secret).
    pub meta: serde_json::Value,
    /// When, epoch µs.
    pub at_us: u64,
}

/// Epoch microseconds of a stamp (stamps are microseconds already).
#[must_use]
pub fn micros(now: Stamp) -> u64 {
    now.0
}

fn json<T: Serialize>(doc: &T) -> Vec<u8> {
    // Documents of plain fields and JSON values: serialising cannot fail.
    serde_json::to_vec(doc).unwrap_or_default()
}

/// Write a new row and its unique index entries, all absent before, or nothing (`required`).
#[must_use]
pub fn create<T: Serialize>(table: &str, id: &str, doc: &T, unique: &[(&str, &str)]) -> Vec<KvOp> {
    let mut ops: Vec<KvOp> = unique
        .iter()
        .map(|(index, value)| KvOp::Put {
            ns: ns(index),
            key: key(value),
            value: json(&IndexDoc { id: id.to_owned() }),
            expiry: Expiry::Forever,
            expect: Some(0),
            required: true,
        })
        .collect();
    ops.push(KvOp::Put {
        ns: ns(table),
        key: key(id),
        value: json(doc),
        expiry: Expiry::Forever,
        expect: Some(0),
        required: true,
    });
    ops
}

/// Replace a row read at `version`, or nothing when it changed since (`required`).
#[must_use]
pub fn replace<T: Serialize>(table: &str, id: &str, doc: &T, version: u64) -> KvOp {
    KvOp::Put {
        ns: ns(table),
        key: key(id),
        value: json(doc),
        expiry: Expiry::Forever,
        expect: Some(version),
        required: true,
    }
}

/// The operations every change ends with: the change marker and an audit row.
#[must_use]
pub fn changed(op: &OperationDoc, audit_id: &str) -> Vec<KvOp> {
    vec![
        KvOp::Put {
            ns: ns(META),
            key: GEN.to_owned(),
            value: b"{}".to_vec(),
            expiry: Expiry::Forever,
            expect: None,
            required: false,
        },
        KvOp::Put {
            ns: ns(OPS),
            key: format!("#{:020}/{audit_id}", op.at_us),
            value: json(op),
            expiry: Expiry::Forever,
            expect: None,
            required: false,
        },
    ]
}

/// A key as the gateway needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// The key's id.
    pub id: String,
    /// The cluster it opens.
    pub cluster_id: String,
    /// What it may do.
    pub scopes: Scopes,
    /// Revoked keys are kept to answer 401 (and so a revoked hash is never reused).
    pub revoked: bool,
}

/// A cluster as the gateway needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterEntry {
    /// The cluster's document.
    pub doc: ClusterDoc,
    /// Its tenant's status (a cluster whose tenant row is missing counts as suspended).
    pub tenant_status: TenantStatus,
    /// Its tenant's slug.
    pub tenant_slug: String,
}

impl ClusterEntry {
    /// What its statuses let through.
    #[must_use]
    pub fn effective(&self) -> Effective {
        effective(self.doc.status, self.tenant_status)
    }
}

/// Every cluster and key, as one node's applied state holds them.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    /// The change marker's version when this was read (0: none yet).
    pub generation: u64,
    /// Clusters by slug.
    pub clusters: HashMap<String, ClusterEntry>,
    /// Cluster slugs by id.
    pub cluster_ids: HashMap<String, String>,
    /// Keys by hash.
    pub keys: HashMap<String, KeyEntry>,
    /// Tenant sinks by cluster id.
    pub sinks: HashMap<String, S3SinkDoc>,
}

/// The change marker's version in `s` (0 when nothing was ever written).
///
/// # Errors
/// When the store cannot be read.
pub fn generation(s: &dyn StateRead, now: Stamp) -> Result<u64, StoreError> {
    Ok(crate::machine::kv::live_row(s, &ns(META), GEN, now)?.map_or(0, |r| r.version))
}

fn rows<T: for<'de> Deserialize<'de>>(
    s: &dyn StateRead,
    table: &str,
    now: Stamp,
) -> Result<Vec<T>, StoreError> {
    let start = crate::keys::kv_ns(&ns(table));
    let mut end = start.clone();
    // The namespace's rows are those after `ns\0`: end the range at `ns\x01`.
    if let Some(last) = end.last_mut() {
        *last = 1;
    }
    let mut out = Vec::new();
    let mut failed = None;
    s.scan(&start, &end, &mut |k, v| {
        match crate::machine::kv::live_value(k, v, now) {
            Ok(Some(value)) => {
                // A row that does not parse is skipped: one bad document must not close every
                // cluster of the node.
                if let Ok(doc) = serde_json::from_slice::<T>(&value) {
                    out.push(doc);
                }
            }
            Ok(None) => {}
            Err(e) => {
                failed = Some(e);
                return false;
            }
        }
        true
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The tenants that have a sink row of their own (enabled or not): the node's own sink leaves
/// their queues to it.
///
/// # Errors
/// When the store cannot be read.
pub fn sink_tenants(s: &dyn StateRead, now: Stamp) -> Result<Vec<Tenant>, StoreError> {
    Ok(rows::<S3SinkDoc>(s, S3_SINKS, now)?
        .into_iter()
        .filter_map(|d| Tenant::parse(&d.tenant).ok())
        .collect())
}

/// The key of a cluster's month counter (`month` as `YYYY-MM`).
#[must_use]
pub fn month_key(cluster: &str, month: &str) -> String {
    format!("#{cluster}/{month}")
}

/// Messages a cluster pushed in `month`, as this node's applied state has them.
///
/// # Errors
/// When the store cannot be read.
pub fn month_count(
    s: &dyn StateRead,
    cluster: &str,
    month: &str,
    now: Stamp,
) -> Result<u64, StoreError> {
    Ok(
        crate::machine::kv::live_row(s, &ns(USAGE_MONTH), &month_key(cluster, month), now)?
            .and_then(|r| {
                std::str::from_utf8(&r.value)
                    .ok()?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map_or(0, |n| n.max(0.0) as u64),
    )
}

impl Directory {
    /// Read every tenant, cluster and key from `s`.
    ///
    /// # Errors
    /// When the store cannot be read.
    pub fn load(s: &dyn StateRead, now: Stamp) -> Result<Self, StoreError> {
        let generation = generation(s, now)?;
        let tenants: HashMap<String, TenantDoc> = rows::<TenantDoc>(s, TENANTS, now)?
            .into_iter()
            .map(|t| (t.id.clone(), t))
            .collect();
        let mut dir = Self {
            generation,
            ..Self::default()
        };
        for c in rows::<ClusterDoc>(s, CLUSTERS, now)? {
            let (tenant_status, tenant_slug) = tenants
                .get(&c.tenant_id)
                .map_or((TenantStatus::Suspended, String::new()), |t| {
                    (t.status, t.slug.clone())
                });
            dir.cluster_ids.insert(c.id.clone(), c.slug.clone());
            dir.clusters.insert(
                c.slug.clone(),
                ClusterEntry {
                    doc: c,
                    tenant_status,
                    tenant_slug,
                },
            );
        }
        for k in rows::<KeyDoc>(s, KEYS, now)? {
            let scopes = Scopes::parse(&k.scopes).unwrap_or_default();
            dir.keys.insert(
                k.key_hash.clone(),
                KeyEntry {
                    id: k.id,
                    cluster_id: k.cluster_id,
                    scopes,
                    revoked: k.revoked_us.is_some(),
                },
            );
        }
        for sink in rows::<S3SinkDoc>(s, S3_SINKS, now)? {
            dir.sinks.insert(sink.cluster_id.clone(), sink);
        }
        Ok(dir)
    }

    /// The cluster with id `id`.
    #[must_use]
    pub fn cluster_by_id(&self, id: &str) -> Option<&ClusterEntry> {
        self.cluster_ids.get(id).and_then(|s| self.clusters.get(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Entry};
    use crate::store::{MemStore, Txn};

    fn apply(store: &mut MemStore, index: u64, ops: Vec<KvOp>) -> crate::kv::KvOutcome {
        let entry = Entry {
            proposed_at: 1_000 + index,
            command: Command::Kv(ops),
        };
        let mut txn = Txn::new(&*store);
        let r = crate::machine::apply_entry(&mut txn, &entry, index).expect("apply");
        let w = txn.into_writes();
        store.commit(w);
        r.outcome.into_kv().expect("kv outcome")
    }

    #[test]
    fn a_directory_reads_back_what_the_batches_wrote_and_unique_slugs_hold() {
        let mut store = MemStore::new();
        let t = TenantDoc {
            id: "t1".into(),
            slug: "acme".into(),
            name: "Acme".into(),
            status: TenantStatus::Active,
            admin_email: None,
            created_us: 1,
            updated_us: 1,
        };
        let c = ClusterDoc {
            id: "c1".into(),
            slug: "acme".into(),
            tenant_id: "t1".into(),
            broker_tenant_uuid: "0b0e6d62-0c0d-4a7b-8c55-7d9f3b0a1e11".into(),
            plan_code: "dev".into(),
            status: ClusterStatus::PushBlocked,
            overrides: serde_json::Map::new(),
            created_us: 1,
            updated_us: 1,
        };
        let k = KeyDoc {
            id: "k1".into(),
            cluster_id: "c1".into(),
            name: "ci".into(),
            key_hash: "ab".repeat(32),
            scopes: vec!["produce".into()],
            created_us: 1,
            revoked_us: None,
        };
        let op = OperationDoc {
            actor: "control_plane".into(),
            action: "test".into(),
            target: "t1".into(),
            meta: serde_json::Value::Null,
            at_us: 1,
        };
        let mut ops = create(TENANTS, "t1", &t, &[(TENANT_SLUGS, "acme")]);
        ops.extend(create(CLUSTERS, "c1", &c, &[(CLUSTER_SLUGS, "acme")]));
        ops.extend(create(KEYS, "k1", &k, &[(KEY_HASHES, &k.key_hash)]));
        ops.extend(changed(&op, "a1"));
        assert_eq!(apply(&mut store, 5, ops).failed, None);
        let dir = Directory::load(&store, Stamp(2_000)).expect("load");
        assert_eq!(dir.generation, 5);
        let entry = &dir.clusters["acme"];
        assert_eq!(entry.effective(), Effective::PushBlocked);
        assert_eq!(entry.tenant_slug, "acme");
        assert_eq!(
            dir.cluster_by_id("c1").map(|c| c.doc.slug.as_str()),
            Some("acme")
        );
        assert_eq!(dir.keys[&k.key_hash].scopes, Scopes::PRODUCE);

        // A second tenant with the same slug: the whole batch is refused, nothing written.
        let other = TenantDoc {
            id: "t2".into(),
            ..t.clone()
        };
        let mut ops = create(TENANTS, "t2", &other, &[(TENANT_SLUGS, "acme")]);
        ops.extend(changed(&op, "a2"));
        assert!(apply(&mut store, 6, ops).failed.is_some());
        let dir = Directory::load(&store, Stamp(2_000)).expect("load");
        assert_eq!(dir.generation, 5, "a refused batch changes nothing");
    }
}
