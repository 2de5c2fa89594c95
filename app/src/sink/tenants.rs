//! One sink per tenant, from the control plane's rows (`px.s3sinks`): every node reads the rows
//! from its applied state every five seconds and runs, for each cluster whose row is enabled
//! and whose status (the worse of the cluster's and its tenant's) is active or push_blocked, a
//! sink of that cluster's broker tenant only, with the row's settings, the node-wide settings
//! of the node's own sink and the row's secret opened with this node's `QUEEN_ENCRYPTION_KEY`.
//! A row whose `updatedAt` moved is a new sink: the old one drains and the new one starts. A
//! secret this node cannot open leaves that tenant's sink in phase `error` on this node, and
//! the other nodes carry on. Nothing here deletes an object.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use queen_domain::proxy::Effective;
use queen_domain::proxy::directory::Directory;
use queen_ports::{Opened, SinkLog};
use queen_telemetry::Telemetry;
use serde_json::{Value, json};

use super::SinkHandle;
use super::config::{SinkSettings, tenant_settings};
use crate::Broker;
use crate::config::S3CrashPoint;

/// How often the rows are read again.
const REREAD_EVERY: Duration = Duration::from_secs(5);

/// One cluster's sink on this node.
struct Entry {
    cluster: String,
    tenant: String,
    /// The row's `updated_us` this entry was built from.
    updated_us: u64,
    /// Whether the row and the statuses asked for a running sink.
    wanted: bool,
    phase: &'static str,
    error: Option<String>,
    handle: Option<Arc<SinkHandle>>,
    status: Option<Box<dyn Fn() -> Value + Send + Sync>>,
}

/// The tenant sinks of this node.
pub(crate) struct TenantSinks {
    /// The group that holds the control plane's rows.
    broker: Arc<Broker>,
    /// Every group's broker, by number, and where each tenant lives: a tenant's sink reads
    /// its own group.
    groups: Vec<Arc<Broker>>,
    placement: queen_domain::groups::Placement,
    node: Arc<SinkSettings>,
    telemetry: Telemetry,
    sinks: Mutex<BTreeMap<String, Entry>>,
    /// The last failure to read the rows.
    cp_error: Mutex<Option<String>>,
    /// The node is stopping: no sink starts any more.
    stopping: std::sync::atomic::AtomicBool,
    /// The test hook `QUEEN_TEST_S3_CRASH_AT`, handed to every tenant sink.
    crash_at: Option<S3CrashPoint>,
}

impl TenantSinks {
    pub(crate) fn new(
        groups: Vec<Arc<Broker>>,
        placement: queen_domain::groups::Placement,
        node: Arc<SinkSettings>,
        telemetry: Telemetry,
        crash_at: Option<S3CrashPoint>,
    ) -> Arc<Self> {
        let home = usize::from(placement.group_of_id(queen_domain::tenant::PROXY_TENANT));
        Arc::new(Self {
            broker: groups.get(home).unwrap_or(&groups[0]).clone(),
            groups,
            placement,
            node,
            telemetry,
            sinks: Mutex::default(),
            cp_error: Mutex::default(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            crash_at,
        })
    }

    /// Read the rows every five seconds until `stop`, then drain every tenant sink.
    pub(crate) async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            self.reconcile().await;
            tokio::select! {
                () = tokio::time::sleep(REREAD_EVERY) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        self.finish().await;
    }

    /// Begin every tenant sink's drain (at SIGTERM, beside the node's own sink).
    pub(crate) fn begin_drain(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for e in self.lock().values() {
            if let Some(h) = &e.handle {
                h.begin_drain();
            }
        }
    }

    /// Drain and stop every tenant sink.
    pub(crate) async fn finish(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let handles: Vec<Arc<SinkHandle>> = self
            .lock()
            .values_mut()
            .filter_map(|e| e.handle.take())
            .collect();
        SinkHandle::finish_all(handles).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.sinks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn reconcile(&self) {
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let loaded = {
            let state = self.broker.applied();
            Directory::load(&*state, self.broker.wall_clock())
        };
        let dir = match loaded {
            Ok(d) => {
                *self.cp_error.lock().unwrap_or_else(PoisonError::into_inner) = None;
                d
            }
            Err(e) => {
                tracing::warn!(target: "queen-s3", error = %e, "cannot read the control plane's sink rows");
                *self.cp_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
                return;
            }
        };
        // Rows gone: their sinks stop and leave the status page. Rows changed: their old sinks
        // stop before the new ones start. All the drains run at once, so one slow drain does
        // not hold back the other tenants' changes.
        let mut changed = Vec::new();
        let mut stopping = Vec::new();
        {
            let mut sinks = self.lock();
            sinks.retain(|id, e| {
                let keep = dir.sinks.contains_key(id);
                if !keep {
                    stopping.extend(e.handle.take());
                }
                keep
            });
            for (id, row) in &dir.sinks {
                let cluster = dir.cluster_by_id(id);
                let wanted =
                    row.enabled && cluster.is_some_and(|c| c.effective() != Effective::Suspended);
                let unchanged = sinks
                    .get(id)
                    .is_some_and(|e| e.updated_us == row.updated_us && e.wanted == wanted);
                if !unchanged {
                    stopping.extend(sinks.remove(id).and_then(|e| e.handle));
                    changed.push((id, row, cluster, wanted));
                }
            }
        }
        SinkHandle::finish_all(stopping).await;
        for (id, row, cluster, wanted) in changed {
            let slug = cluster.map_or_else(|| id.clone(), |c| c.doc.slug.clone());
            let mut entry = Entry {
                cluster: slug.clone(),
                tenant: row.tenant.clone(),
                updated_us: row.updated_us,
                wanted,
                phase: "stopped",
                error: None,
                handle: None,
                status: None,
            };
            if wanted {
                match self.start(&slug, row) {
                    Ok(h) => {
                        entry.phase = "running";
                        entry.status = Some(h.status_source());
                        entry.handle = Some(Arc::new(h));
                        tracing::info!(target: "queen-s3", cluster = %slug, tenant = %row.tenant, "tenant sink started");
                    }
                    Err(e) => {
                        tracing::warn!(target: "queen-s3", cluster = %slug, tenant = %row.tenant, error = %e, "tenant sink not started");
                        entry.phase = "error";
                        entry.error = Some(e);
                    }
                }
            }
            self.lock().insert(id.clone(), entry);
        }
    }

    fn start(
        &self,
        slug: &str,
        row: &queen_domain::proxy::directory::S3SinkDoc,
    ) -> Result<SinkHandle, String> {
        let secret = match self.broker.cipher().open(row.secret_key_sealed.as_bytes()) {
            Opened::Plain(p) => String::from_utf8(p)
                .map_err(|_| "the sink's secret does not open to text".to_owned())?,
            Opened::NotSealed | Opened::Undecryptable => {
                return Err("the sink's secret cannot be opened with this node's QUEEN_ENCRYPTION_KEY (sealed with another key, or this node has none); this node runs none of this tenant's queues".to_owned());
            }
        };
        let mut settings = tenant_settings(&row.config, &secret, &self.node, &row.tenant)?;
        settings.name = format!("tenant-{slug}");
        settings.own_tenant = true;
        let group = queen_domain::tenant::Tenant::any(&row.tenant)
            .map_or(0, |t| usize::from(self.placement.group_of(&t)));
        let broker = self.groups.get(group).unwrap_or(&self.broker).clone();
        SinkHandle::start(
            settings,
            broker as Arc<dyn SinkLog>,
            self.telemetry.clone(),
            self.crash_at,
        )
        .map_err(|e| e.to_string())
    }

    /// The `sinks` rows of `/status` for the control plane's sinks, and the last error reading
    /// their rows.
    pub(crate) fn status(&self) -> (Vec<Value>, Option<String>) {
        let rows = self
            .lock()
            .values()
            .map(|e| {
                // The sink's own report is the one row of its block's `sinks`.
                let mut row = e
                    .status
                    .as_ref()
                    .filter(|_| e.handle.is_some())
                    .map_or_else(|| json!({}), |f| f()["sinks"][0].take());
                if let Value::Object(m) = &mut row {
                    let phase =
                        m.get("phase")
                            .and_then(Value::as_str)
                            .map_or(e.phase, |p| match p {
                                "starting" => "starting",
                                "backoff" => "backoff",
                                "stopped" => "stopped",
                                _ => e.phase,
                            });
                    m.insert("tenant".into(), json!(e.tenant));
                    m.insert("cluster".into(), json!(e.cluster));
                    m.insert("source".into(), json!("cp"));
                    m.insert("phase".into(), json!(phase));
                    m.insert("error".into(), json!(e.error));
                }
                row
            })
            .collect();
        let err = self
            .cp_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (rows, err)
    }
}
