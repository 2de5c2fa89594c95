//! Assembling a node and running it until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use queen_ports::{ReplicatedLog, SystemClock};
use queen_raft::{RaftNode, RaftNodeConfig};
use queen_store::{FjallStore, StoreConfig};
use queen_telemetry::Telemetry;
use tokio::net::TcpListener;

use crate::broker::Broker;
use crate::config::Config;
use crate::error::AppError;

/// How long a stop waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(30);
/// How often the leader appends a tick.
const TICK_EVERY: Duration = Duration::from_secs(1);

/// What the client port's front (the HTTP adapter, chosen by the binary) is handed to serve:
/// the bound listener, the broker's use cases, and when to stop accepting and how long to wait
/// for requests in flight after that.
pub struct Serving {
    /// The client port, bound.
    pub listener: TcpListener,
    /// The use cases (`queen_ports::ClientApi`).
    pub broker: Arc<Broker>,
    /// How long requests in flight may take once `stop` resolved.
    pub drain: Duration,
    /// Resolves when the node should stop accepting (after SIGTERM and the leadership
    /// hand-off).
    pub stop: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Run a node until `shutdown` resolves; then stop accepting, finish requests in flight, and
/// stop the replicated log. `serve` runs the client port's front until its `stop` resolves
/// and its requests in flight are done.
///
/// # Errors
/// When the node cannot start (directory, store, log, port).
pub async fn run<F, Fut>(
    cfg: Config,
    sink: Option<crate::SinkSettings>,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + 'static,
    serve: F,
) -> Result<(), AppError>
where
    F: FnOnce(Serving) -> Fut,
    Fut: Future<Output = ()>,
{
    std::fs::create_dir_all(&cfg.raft_dir).map_err(|source| AppError::DataDir {
        dir: cfg.raft_dir.display().to_string(),
        source,
    })?;
    let knobs = crate::cluster::TestKnobs::from_env(&cfg.raft_dir);
    let kinds = knobs.log_kinds.unwrap_or(crate::broker::LOG_KINDS);
    let marker = crate::cluster::check_marker(&cfg.raft_dir, kinds)?;
    let addr = SocketAddr::new(cfg.host, cfg.port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Bind { addr, source })?;
    let store = FjallStore::open(&StoreConfig::new(cfg.raft_dir.join("state")))?;
    crate::cluster::refuse_newer(
        &cfg.raft_dir,
        queen_domain::reads::cluster_version(&store).unwrap_or(0),
        kinds,
    )?;
    let mut raft_cfg = RaftNodeConfig::single(cfg.node_id, cfg.raft_dir.clone());
    raft_cfg.token = cfg.token.clone();
    raft_cfg.heartbeat_ms = cfg.heartbeat_ms;
    raft_cfg.election_min_ms = cfg.election_min_ms;
    raft_cfg.election_max_ms = cfg.election_max_ms;
    raft_cfg.join = cfg.join;
    raft_cfg.log_kinds = kinds;
    raft_cfg.faults_file = knobs.faults_file;
    if let Some(every) = knobs.snapshot_every {
        raft_cfg.snapshot_every_entries = every;
    }
    if let Some(bytes) = knobs.log_segment_bytes {
        raft_cfg.log_segment_bytes = bytes;
    }
    // The raft port carries one client body per forwarded command, and appends split at
    // `MAX_APPEND_BYTES` unless one entry is larger: bound its bodies by the largest client
    // body plus room for the entry's own framing.
    raft_cfg.max_body_bytes = cfg
        .max_body_bytes
        .saturating_add(1 << 20)
        .max(queen_raft::MAX_APPEND_BYTES);
    raft_cfg.body_timeout = cfg.body_timeout;
    raft_cfg.body_budget_bytes = cfg.body_budget_bytes.max(raft_cfg.max_body_bytes);
    raft_cfg.peers = cfg
        .peers
        .iter()
        .map(|p| queen_raft::Peer {
            id: p.id,
            raft_addr: p.raft.clone(),
            http_addr: p.http.clone(),
        })
        .collect();
    let raft = RaftNode::start(raft_cfg, Arc::new(store.clone())).await?;
    let fsync_source = raft.clone();
    let broker = Arc::new(
        Broker::new(
            Arc::new(raft.clone()) as Arc<dyn ReplicatedLog>,
            Arc::new(store.clone()) as Arc<dyn queen_ports::StateReader>,
            Arc::new(SystemClock),
            telemetry.clone(),
            cfg.request_timeout,
            Arc::new(move || fsync_source.fsync_count()),
        )
        .with_disk_gate(cfg.disk_high_pct, cfg.disk_reserve_bytes)
        .with_max_message_bytes(cfg.max_message_bytes)
        .with_cluster(
            Arc::new(raft.clone()) as Arc<dyn queen_ports::Membership>,
            cfg.promote_max_lag,
            cfg.ready_lag_entries,
            cfg.ready_lag_ms,
        )
        .with_client_offload(cfg.client_offload)
        .with_log_kinds(kinds)
        .with_cipher(
            match &cfg.encryption {
                Some(c) => c.clone() as Arc<dyn queen_ports::PayloadCipher>,
                None => Arc::new(queen_crypto::NoKey),
            },
            cfg.encryption.is_some(),
        )
        .with_ephemeral_limits(cfg.ephemeral.clone())
        .with_sink_settings(sink.clone())
        .with_samples_if(analytics_log(&cfg)?)
        .with_peers(Arc::new(raft.clone()) as Arc<dyn queen_ports::PeerCalls>)
        .with_push_lane(),
    );
    broker.warn_flagged_without_key();
    broker.serve_peers();
    sample_disk(&broker, &cfg.raft_dir);
    // Detached: it serves pushes for as long as the runtime runs, the drain at SIGTERM included.
    tokio::spawn(broker.clone().run_push_lane());
    let (tenant_stop, tenant_stop_rx) = tokio::sync::watch::channel(false);
    let (sink, tenant_sinks) = match sink {
        Some(settings) => {
            let handle = Arc::new(crate::sink::SinkHandle::start(
                settings.clone(),
                broker.clone(),
                telemetry.clone(),
            )?);
            // The control plane's tenant sinks run beside the node's own.
            let tenants = crate::sink::tenants::TenantSinks::new(
                broker.clone(),
                Arc::new(settings),
                telemetry.clone(),
            );
            tokio::spawn(tenants.clone().run(tenant_stop_rx));
            let own = handle.status_source();
            let weak = Arc::downgrade(&tenants);
            broker.set_s3_status(Box::new(move || {
                let mut block = own();
                if let Some(t) = weak.upgrade() {
                    let (rows, cp_error) = t.status();
                    if let Some(sinks) = block["sinks"].as_array_mut() {
                        sinks.extend(rows);
                    }
                    block["cpError"] = serde_json::json!(cp_error);
                }
                block
            }));
            (Some(handle), Some(tenants))
        }
        None => (None, None),
    };
    tracing::info!(target: "queen-app", %addr, node_id = cfg.node_id, dir = %cfg.raft_dir.display(), settings = %cfg.describe(), "listening");

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let applied_watch = {
        let broker = broker.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move { broker.watch_applied(stop).await })
    };
    let gate = {
        let broker = broker.clone();
        let mut stop = stop_rx.clone();
        let mut gate = crate::cluster::Gate::new(
            raft.clone(),
            cfg.raft_dir.clone(),
            kinds,
            cfg.max_clock_skew_ms,
            marker,
        );
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = async { tokio::time::sleep(TICK_EVERY).await; gate.step(&broker).await } => {}
                    _ = stop.changed() => break,
                }
            }
        })
    };
    // The disk gate's sample, often: what was admitted since the last one is only estimated.
    let disk_sampler = {
        let broker = broker.clone();
        let dir = cfg.raft_dir.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(crate::disk_gate::SAMPLE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => sample_disk(&broker, &dir),
                    _ = stop.changed() => break,
                }
            }
        })
    };
    // Ephemeral ages, leases and idle queues, and their gauges.
    let ephemeral_sweeper = {
        let broker = broker.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => broker.ephemeral_sweep(),
                    _ = stop.changed() => break,
                }
            }
        })
    };
    let sampler = {
        let every = Duration::from_millis(cfg.analytics.interval_ms.max(1));
        let stop = stop_rx.clone();
        let on = cfg.analytics.interval_ms > 0;
        let broker = broker.clone();
        tokio::spawn(async move {
            if on {
                crate::broker::analytics::run_sampler(broker, every, stop).await;
            }
        })
    };
    let ephemeral_placement = {
        let broker = broker.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move { broker.ephemeral_placement(stop).await })
    };
    let ticker = {
        let broker = broker.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(TICK_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stop_rx.changed() => break,
                }
                // A tick is a proposal: without a quorum it would wait out the whole request
                // deadline (30 s) and hold the stop that long. Dropping it is harmless: ticks
                // are housekeeping, and one that still commits applies like any other.
                tokio::select! {
                    () = broker.tick() => {}
                    _ = stop_rx.changed() => break,
                }
            }
        })
    };
    // On SIGTERM a leader hands leadership over first (openraft's transfer, at most ~3 s), so
    // the cluster has a new leader before this node stops listening; requests still in flight
    // here are forwarded to it while the listener drains.
    // A raft core that stopped on an error (a write refused by a full disk, say) can no longer
    // replicate or apply: the node stops at once with that error, so that a supervisor starts
    // it again on its data once the cause is fixed (fail-stop, as after kill -9: every write it
    // acknowledged is on a majority of disks), instead of answering 503 forever.
    let failed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let handover = {
        let raft = raft.clone();
        let sink = sink.clone();
        let tenant_sinks = tenant_sinks.clone();
        let broker = broker.clone();
        let failed = failed.clone();
        async move {
            tokio::select! {
                () = shutdown => {}
                reason = raft.core_failed() => {
                    tracing::error!(target: "queen-app", error = %reason, "the replicated log stopped on an error; this node stops");
                    *failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reason);
                    return;
                }
            }
            // Ephemeral rings go to their next owners first (at most 15 s), while this node
            // still serves and the others still reach it.
            broker.ephemeral_drain().await;
            if let Some(s) = &sink {
                s.begin_drain();
            }
            if let Some(t) = &tenant_sinks {
                t.begin_drain();
            }
            if let Some((to, ms)) = raft.transfer_leadership().await {
                tracing::info!(target: "queen-app", to, ms, "leadership handed off before draining");
            }
        }
    };
    serve(Serving {
        listener,
        broker: broker.clone(),
        drain: DRAIN,
        stop: Box::pin(handover),
    })
    .await;
    tracing::info!(target: "queen-app", "listener closed, stopping");
    let failed = failed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(reason) = failed {
        // Nothing below can finish without the log (the sink's commits, the hand-offs).
        let _ = stop_tx.send(true);
        return Err(AppError::LogStopped(reason));
    }
    if let Some(s) = &sink {
        s.finish().await;
    }
    if let Some(t) = &tenant_sinks {
        t.finish().await;
    }
    let _ = tenant_stop.send(true);
    let _ = stop_tx.send(true);
    let _ = ticker.await;
    let _ = disk_sampler.await;
    let _ = ephemeral_sweeper.await;
    let _ = ephemeral_placement.await;
    let _ = sampler.await;
    let _ = gate.await;
    let _ = applied_watch.await;
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(target: "queen-app", error = %e, "raft did not stop cleanly");
    }
    drop(broker);
    tracing::info!(target: "queen-app", "stopped");
    Ok(())
}

/// The node-local analytics log under the data directory, when sampling is on.
fn analytics_log(cfg: &Config) -> Result<Option<Arc<dyn queen_ports::SampleLog>>, AppError> {
    if cfg.analytics.interval_ms == 0 {
        return Ok(None);
    }
    let dir = cfg.raft_dir.join("analytics");
    let log = queen_store::SampleFiles::open(
        &dir,
        Duration::from_secs(cfg.analytics.retention_s),
        cfg.analytics.max_bytes,
    )
    .map_err(|e| AppError::DataDir {
        dir: dir.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(Some(Arc::new(log)))
}

/// Sample the data directory's file system for the disk gate: its size and the bytes in use
/// (size minus what an unprivileged writer may still use). When it cannot be read, the gate
/// keeps its previous sample.
fn sample_disk(broker: &Broker, dir: &std::path::Path) {
    match rustix::fs::statvfs(dir) {
        Ok(s) if s.f_blocks > 0 => {
            let block = s.f_frsize.max(1);
            let total = s.f_blocks.saturating_mul(block);
            let used = s.f_blocks.saturating_sub(s.f_bavail).saturating_mul(block);
            broker.set_disk_use(total, used);
        }
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(target: "queen-app", error = %e, dir = %dir.display(), "statvfs of the data directory failed")
        }
    }
}
