//! The embedded S3 sink: mirrors queues into a Hive-layout lake, exactly once.
//!
//! It runs on its own threads (`queen-s3`), reads this node's applied state in memory, keeps its
//! documents in the replicated KV store (namespace `queen-s3`) and everything else in the bucket.
//! A supervisor probes the bucket, discovers queues every five seconds and runs one task per
//! queue; a task writes its queue only while it holds the queue's lease (see `queue.rs`).

pub mod config;
mod queue;
mod retry;
mod supervise;
pub(crate) mod tenants;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use queen_domain::sink::commit::LostRange;
use queen_lake::{Lake, LakeTarget, S3Target, Secret};
use queen_ports::SinkLog;
use queen_telemetry::{S3QueueGauges, Telemetry};
use serde_json::{Value, json};

use crate::config::S3CrashPoint;
use config::{SinkSettings, Target};
use supervise::supervise;

/// How often discovery looks for queues.
const DISCOVER_EVERY: Duration = Duration::from_secs(5);
/// A presence row rewritten within this long is a node running the sink.
const PRESENCE_FRESH: Duration = Duration::from_secs(12);

/// How many lost ranges a queue's status row keeps (the manifests keep every one).
const LOST_KEPT: usize = 8;

/// One queue's row on the status page.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueStatus {
    state: &'static str,
    held_by: Option<String>,
    k: u64,
    t_end: u64,
    complete_through: u64,
    safe_time: u64,
    lag_seconds: f64,
    safe_lag_seconds: f64,
    windows_committed: u64,
    records: u64,
    bytes: u64,
    buffered: u64,
    partitions: u64,
    checkpoint_age: u64,
    /// Records retention deleted before this node's sink read them, since this node started.
    records_lost: u64,
    /// The last few of those ranges (at most `LOST_KEPT`), each with the window that recorded it.
    lost_ranges: Vec<(u64, LostRange)>,
    /// The last error of this queue on this node; kept once the queue recovers, with its time.
    last_error: Option<String>,
    /// When `last_error` happened (ISO 8601, this node's clock).
    last_error_at: Option<String>,
    /// Whether the queue's last attempt on this node failed: set at the first failure, cleared
    /// when a later attempt succeeds, so the sink's health turns red at once.
    failing: bool,
    running: bool,
}

impl QueueStatus {
    /// Record a failure: the row shows it and counts as failing until an attempt succeeds.
    fn fail(&mut self, error: String) {
        self.last_error = Some(error);
        self.last_error_at = Some(queue::wall_iso());
        self.failing = true;
    }
}

/// What the supervisor and the queue tasks share.
pub(crate) struct Shared {
    settings: Arc<SinkSettings>,
    log: Arc<dyn SinkLog>,
    lake: Lake,
    telemetry: Telemetry,
    stop: tokio::sync::watch::Receiver<bool>,
    queues: Mutex<BTreeMap<String, QueueStatus>>,
    buffered: Mutex<BTreeMap<String, u64>>,
    buffered_total: AtomicU64,
    /// The most `buffered_total` has been since the start.
    buffered_peak: AtomicU64,
    sink: Mutex<SinkStatus>,
    /// `QUEEN_S3_FETCH_CONCURRENCY`: reads of the log running at once on this node.
    fetch: tokio::sync::Semaphore,
    /// The queue this node is giving back, if any.
    give_back: Mutex<Option<String>>,
    /// Taken while a queue task waits its turn and claims a free queue: one claim at a time on
    /// this node, so each wait counts the queue claimed just before it.
    claim_turn: tokio::sync::Mutex<()>,
    /// One window encoded at a time on this node (the "one window being built" of the budget).
    encode: tokio::sync::Semaphore,
    /// The test hook `QUEEN_TEST_S3_CRASH_AT`: abort the process at this commit point.
    crash_at: Option<S3CrashPoint>,
}

#[derive(Debug, Clone, Default)]
struct SinkStatus {
    phase: &'static str,
    bucket_reachable: bool,
    bucket_error: Option<String>,
    /// The last probe's failure, classified: a status and a reason, never the peer's words.
    bucket_failure: Option<queen_lake::Failure>,
    nodes: u64,
    /// Queues found by the last discovery.
    queues: u64,
    /// Whether another node present holds fewer than its share (see `someone_under_share`).
    someone_under: bool,
    /// How many nodes present claim a free queue before this one (see `claim_rank`).
    claim_rank: u64,
}

impl Shared {
    fn update_queue(&self, queue: &str, f: impl FnOnce(&mut QueueStatus)) {
        let mut all = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        let q = all.entry(queue.to_owned()).or_default();
        f(q);
        let gauges = q.running.then_some(S3QueueGauges {
            lag_seconds: q.lag_seconds,
            safe_lag_seconds: q.safe_lag_seconds,
            buffer_bytes: q.buffered,
            discovery_partitions: q.partitions,
            checkpoint_age_windows: q.checkpoint_age,
            window_seconds: self.settings.max_window_ms as f64 / 1000.0,
        });
        drop(all);
        self.telemetry
            .metrics()
            .s3()
            .set_queue(&queue::metric_key(queue), gauges);
    }

    fn set_buffered(&self, queue: &str, bytes: u64) {
        let mut b = self.buffered.lock().unwrap_or_else(PoisonError::into_inner);
        if bytes == 0 {
            b.remove(queue);
        } else {
            b.insert(queue.to_owned(), bytes);
        }
        let total = b.values().sum();
        self.buffered_total.store(total, Ordering::Relaxed);
        self.buffered_peak.fetch_max(total, Ordering::Relaxed);
    }

    fn budget(&self) -> u64 {
        self.settings.memory_mb * 1024 * 1024
    }

    fn over_budget(&self) -> bool {
        self.buffered_total.load(Ordering::Relaxed) >= self.budget()
    }

    /// The node's buffers are over budget and `queue` holds the most: it closes first.
    fn memory_pressure(&self, queue: &str, bytes: u64) -> bool {
        if !self.over_budget() || bytes == 0 {
            return false;
        }
        let b = self.buffered.lock().unwrap_or_else(PoisonError::into_inner);
        b.iter()
            .max_by_key(|(_, v)| **v)
            .is_some_and(|(q, _)| q == queue)
    }

    fn giving_back(&self, queue: &str) -> bool {
        self.give_back
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_deref()
            == Some(queue)
    }

    fn held(&self) -> u64 {
        self.queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|q| q.running)
            .count() as u64
    }

    /// This node's fair share: the queues found over the nodes running the sink, rounded up.
    fn share(&self) -> u64 {
        let s = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        s.queues.div_ceil(s.nodes.max(1))
    }

    fn set_sink(&self, f: impl FnOnce(&mut SinkStatus)) {
        f(&mut self.sink.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// The running sink, owned by the node.
pub struct SinkHandle {
    shared: Arc<Shared>,
    stop: tokio::sync::watch::Sender<bool>,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

/// Why the sink could not start, or the lake could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The object store client cannot be built, or the lake cannot be listed.
    #[error(transparent)]
    Lake(#[from] queen_lake::LakeError),
    /// The sink's threads could not be made.
    #[error("cannot start the sink's threads: {0}")]
    Threads(#[source] std::io::Error),
}

/// Open the lake a setting names.
///
/// # Errors
/// When the object store client cannot be built.
pub fn open_lake(settings: &SinkSettings, telemetry: &Telemetry) -> Result<Lake, SinkError> {
    let target = match &settings.target {
        Target::S3 {
            endpoint,
            region,
            path_style,
            bucket,
            access_key,
            secret_key,
            sse,
        } => LakeTarget::S3(S3Target {
            endpoint: endpoint.clone(),
            region: region.clone(),
            path_style: *path_style,
            bucket: bucket.clone(),
            access_key: access_key.clone(),
            secret_key: Secret::new(secret_key.clone()),
            sse: match sse {
                Some(s) => Some(s.parse::<queen_lake::Sse>()?),
                None => None,
            },
            addresses: settings.addresses,
        }),
        Target::Local(p) => LakeTarget::Local(p.clone()),
        Target::Memory => LakeTarget::Memory,
    };
    let t = telemetry.clone();
    Ok(
        Lake::open(&target)?.with_observer(Arc::new(move |op, status| {
            t.metrics().s3().s3_request(op, status)
        })),
    )
}

/// Check the lake a setting names (`queen lake verify`): the report as pretty JSON, and whether
/// it found no problem.
///
/// # Errors
/// When the lake cannot be opened or listed.
pub async fn verify_lake(settings: &SinkSettings) -> Result<(String, bool), SinkError> {
    let lake = open_lake(settings, &Telemetry::metrics_only(0))?;
    let report = queen_lake::verify(&lake, &settings.prefix).await?;
    Ok((
        serde_json::to_string_pretty(&report).unwrap_or_default(),
        report.ok(),
    ))
}

impl SinkHandle {
    /// Start the sink on threads of its own. `crash_at` is the test hook
    /// `QUEEN_TEST_S3_CRASH_AT` (`None` outside the crash tests).
    ///
    /// # Errors
    /// When its threads or its object store client cannot be made.
    pub fn start(
        settings: SinkSettings,
        log: Arc<dyn SinkLog>,
        telemetry: Telemetry,
        crash_at: Option<S3CrashPoint>,
    ) -> Result<SinkHandle, SinkError> {
        let lake = open_lake(&settings, &telemetry)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("queen-s3")
            .enable_all()
            .build()
            .map_err(SinkError::Threads)?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        tracing::info!(target: "queen-s3", settings = %settings.describe(), lake = %lake.describe(), "sink starting");
        let shared = Arc::new(Shared {
            settings: Arc::new(settings.clone()),
            log,
            lake,
            telemetry,
            stop: stop_rx,
            queues: Mutex::default(),
            buffered: Mutex::default(),
            buffered_total: AtomicU64::new(0),
            buffered_peak: AtomicU64::new(0),
            sink: Mutex::new(SinkStatus {
                phase: "starting",
                nodes: 1,
                someone_under: true,
                ..SinkStatus::default()
            }),
            give_back: Mutex::new(None),
            claim_turn: tokio::sync::Mutex::new(()),
            encode: tokio::sync::Semaphore::new(1),
            crash_at,
            fetch: tokio::sync::Semaphore::new(
                usize::try_from(settings.fetch_concurrency).unwrap_or(1),
            ),
        });
        let supervisor = runtime.spawn(supervise(shared.clone()));
        Ok(SinkHandle {
            shared,
            stop,
            supervisor: Mutex::new(Some(supervisor)),
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// The `s3` block of `/status`, as a source the broker can hold without keeping the sink
    /// alive.
    #[must_use]
    pub fn status_source(&self) -> Box<dyn Fn() -> Value + Send + Sync> {
        let weak = Arc::downgrade(&self.shared);
        Box::new(move || weak.upgrade().map_or(Value::Null, |s| status_json(&s)))
    }

    /// Begin the drain: every queue stops reading and finishes what it can.
    pub fn begin_drain(&self) {
        let _ = self.stop.send(true);
    }

    /// [`SinkHandle::finish`] of every one of `sinks`, all at once (one slow drain holds up
    /// none of the others).
    pub async fn finish_all(sinks: Vec<Arc<SinkHandle>>) {
        let mut drains = tokio::task::JoinSet::new();
        for s in sinks {
            drains.spawn(async move { s.finish().await });
        }
        while drains.join_next().await.is_some() {}
    }

    /// Wait for the drain (within `QUEEN_S3_SHUTDOWN_GRACE_MS`, plus the ten seconds a lease
    /// release may take), then stop the sink's threads.
    pub async fn finish(&self) {
        self.begin_drain();
        let grace =
            Duration::from_millis(self.shared.settings.shutdown_grace_ms) + Duration::from_secs(11);
        let supervisor = self
            .supervisor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(s) = supervisor
            && tokio::time::timeout(grace, s).await.is_err()
        {
            tracing::warn!(target: "queen-s3", "the sink's drain ran out of time; the next owner redoes what was left");
        }
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(rt) = runtime {
            rt.shutdown_background();
        }
    }
}

impl Drop for SinkHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(rt) = runtime {
            rt.shutdown_background();
        }
    }
}

fn status_json(shared: &Shared) -> Value {
    let sink = shared
        .sink
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let queues = shared
        .queues
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let max_lag = 3.0 * (shared.settings.max_window_ms as f64 / 1000.0).max(10.0);
    let lagging = queues
        .values()
        .filter(|q| q.running && q.lag_seconds > max_lag)
        .count();
    // A queue this node cannot write is unhealthy from its first failed attempt: waiting for
    // the lag to pass `max_lag` would keep the sink green for minutes while nothing lands.
    let failing = queues.values().filter(|q| q.failing).count();
    let health_ok = lagging == 0 && failing == 0;
    let held = queues.values().filter(|q| q.running).count() as u64;
    let n_queues = queues.len() as u64;
    let share = n_queues.div_ceil(sink.nodes.max(1));
    let rows: Vec<Value> = queues
        .iter()
        .map(|(name, q)| {
            json!({
                "queue": queen_domain::tenant::display(name),
                "state": q.state,
                "heldBy": q.held_by,
                "running": q.running,
                "k": q.k,
                "tEnd": q.t_end,
                "completeThrough": q.complete_through,
                "safeTime": q.safe_time,
                "lagSeconds": q.lag_seconds,
                "safeLagSeconds": q.safe_lag_seconds,
                "windowsCommitted": q.windows_committed,
                "records": q.records,
                "bytes": q.bytes,
                "bufferedBytes": q.buffered,
                "partitions": q.partitions,
                "recordsLost": q.records_lost,
                "lostRanges": q.lost_ranges.iter().map(|(k, l)| json!({"k": k, "partition": l.partition, "from": l.from, "to": l.to})).collect::<Vec<_>>(),
                "lastError": q.last_error,
                "lastErrorAt": q.last_error_at,
                "failing": q.failing,
            })
        })
        .collect();
    json!({
        "phase": sink.phase,
        "threads": "queen-s3",
        "cpError": null,
        "sinks": [{
            "name": shared.settings.name,
            "tenant": shared.settings.tenant,
            "source": "env",
            "phase": sink.phase,
            "error": sink.bucket_error,
            "ok": health_ok && sink.bucket_reachable,
            "health": {"ok": health_ok, "queues": n_queues, "lagging": lagging, "failing": failing},
            "bucket": {"reachable": sink.bucket_reachable, "error": sink.bucket_error, "failure": sink.bucket_failure.map(|f| json!({"status": f.status, "reason": f.reason.as_str()})), "target": shared.lake.describe(), "createOnly": shared.lake.supports_create_only()},
            "placement": {"givingBack": shared.give_back.lock().unwrap_or_else(PoisonError::into_inner).clone(), "held": held, "nodes": sink.nodes, "queues": n_queues, "share": share},
            "memory": {
                "bufferedBytes": shared.buffered_total.load(Ordering::Relaxed),
                "peakBytes": shared.buffered_peak.load(Ordering::Relaxed),
                "budgetBytes": shared.budget(),
            },
            "queues": rows,
        }],
    })
}
