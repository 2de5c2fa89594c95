//! Assembling a node and running it until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use queen_raft::RaftNode;
use queen_telemetry::Telemetry;
use tokio::net::TcpListener;

use crate::broker::Broker;
use crate::config::Config;
use crate::error::AppError;

mod group;

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
    /// The use cases (`queen_ports::ClientApi`) of group 0, which also answers for the node
    /// (health, status, metrics, membership).
    pub broker: Arc<Broker>,
    /// Every group's use cases, by group number (one entry with one group).
    pub groups: Vec<Arc<Broker>>,
    /// Which group holds each tenant.
    pub placement: queen_domain::groups::Placement,
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
    let hooks = cfg.test_hooks;
    if hooks.faults {
        tracing::warn!(target: "queen-app", ?hooks, "QUEEN_TEST_FAULTS=1: test-only switches are on; never use this in production");
    }
    let kinds = hooks.log_kinds.unwrap_or(crate::broker::LOG_KINDS);
    let count = cfg.placement.groups();
    let record = group::check_count(&cfg.raft_dir, count)?;
    group::check_peers(&cfg, count).await?;
    if record {
        group::record_count(&cfg.raft_dir, count)?;
    }
    let addr = SocketAddr::new(cfg.host, cfg.port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Bind { addr, source })?;
    let common = group::Common {
        cfg: &cfg,
        kinds,
        telemetry: &telemetry,
    };
    let mut groups = Vec::with_capacity(usize::from(count));
    for index in 0..count {
        // The analytics belong to group 0 (with one group, to the node); the node's own sink
        // runs in every group that holds queues it mirrors.
        let samples = if index == 0 {
            analytics_log(&cfg)?
        } else {
            None
        };
        let settings = sink
            .as_ref()
            .and_then(|s| group::sink_settings(s, index, &cfg.placement));
        groups.push(group::start(&common, index, settings, samples).await?);
    }
    group::check_tenants(&groups, &cfg.placement)?;
    let broker = groups[0].broker.clone();
    for g in &groups {
        g.broker.warn_flagged_without_key();
        g.broker.serve_peers();
        sample_disk(&g.broker, &cfg.raft_dir);
        // Detached: it serves pushes for as long as the runtime runs, the drain at SIGTERM
        // included.
        tokio::spawn(g.broker.clone().run_push_lane());
    }
    let (tenant_stop, tenant_stop_rx) = tokio::sync::watch::channel(false);
    // The group that holds the embedded proxy's directory: the other groups read the tenants
    // with sinks of their own from it.
    let home = usize::from(
        cfg.placement
            .group_of_id(queen_domain::tenant::PROXY_TENANT),
    );
    for g in &groups {
        if usize::from(g.index) != home {
            g.broker.set_directory(groups[home].broker.state_reader());
        }
    }
    // The analytics (sampled by group 0) take in every group's queues.
    broker.sample_groups(
        groups
            .iter()
            .skip(1)
            .map(|g| g.broker.state_reader())
            .collect(),
    );
    // The node's own sink in each group that runs one.
    let mut sinks: Vec<Arc<crate::sink::SinkHandle>> = Vec::new();
    let mut own_status = Vec::with_capacity(groups.len());
    for g in &groups {
        let Some(settings) = g.broker.sink_settings() else {
            own_status.push(None);
            continue;
        };
        let handle = Arc::new(crate::sink::SinkHandle::start(
            (*settings).clone(),
            g.broker.clone(),
            telemetry.clone(),
            hooks.s3_crash_at,
        )?);
        own_status.push(Some(handle.status_source()));
        sinks.push(handle);
    }
    // The control plane's tenant sinks run beside the node's own, each over its tenant's
    // group; their rows show on the status of the group holding the directory.
    let tenant_sinks = sink.map(|settings| {
        let tenants = crate::sink::tenants::TenantSinks::new(
            groups.iter().map(|g| g.broker.clone()).collect(),
            cfg.placement.clone(),
            Arc::new(settings),
            telemetry.clone(),
            hooks.s3_crash_at,
        );
        tokio::spawn(tenants.clone().run(tenant_stop_rx));
        tenants
    });
    for (i, (g, own)) in groups.iter().zip(own_status).enumerate() {
        let tenants = tenant_sinks
            .as_ref()
            .filter(|_| i == home)
            .map(Arc::downgrade);
        match (own, tenants) {
            (Some(own), None) => g.broker.set_s3_status(own),
            (own, Some(weak)) => g.broker.set_s3_status(Box::new(move || {
                let mut block = own.as_ref().map_or_else(
                    || serde_json::json!({"phase": "running", "sinks": []}),
                    |o| o(),
                );
                if let Some(t) = weak.upgrade() {
                    let (rows, cp_error) = t.status();
                    if let Some(sinks) = block["sinks"].as_array_mut() {
                        sinks.extend(rows);
                    }
                    block["cpError"] = serde_json::json!(cp_error);
                }
                block
            })),
            (None, None) => {}
        }
    }
    tracing::info!(target: "queen-app", %addr, node_id = cfg.node_id, dir = %cfg.raft_dir.display(), settings = %cfg.describe(), "listening");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for g in &groups {
        tasks.extend(group_tasks(g, &cfg, kinds, count, &stop_rx));
    }
    // The disk gate's sample, often: what was admitted since the last one is only estimated.
    // One file system holds every group's directory.
    tasks.push({
        let brokers: Vec<Arc<Broker>> = groups.iter().map(|g| g.broker.clone()).collect();
        let dir = cfg.raft_dir.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(crate::disk_gate::SAMPLE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => for b in &brokers { sample_disk(b, &dir) },
                    _ = stop.changed() => break,
                }
            }
        })
    });
    tasks.push({
        let every = Duration::from_millis(cfg.analytics.interval_ms.max(1));
        let stop = stop_rx.clone();
        let on = cfg.analytics.interval_ms > 0;
        let broker = broker.clone();
        tokio::spawn(async move {
            if on {
                crate::broker::analytics::run_sampler(broker, every, stop).await;
            }
        })
    });
    // On SIGTERM a leader hands leadership over first (openraft's transfer, at most ~3 s per
    // group, all groups at once), so each group has a new leader before this node stops
    // listening; requests still in flight here are forwarded to it while the listener drains.
    // A raft core that stopped on an error (a write refused by a full disk, say) can no longer
    // replicate or apply: the node stops at once with that error, so that a supervisor starts
    // it again on its data once the cause is fixed (fail-stop, as after kill -9: every write it
    // acknowledged is on a majority of disks), instead of answering 503 forever.
    let failed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let handover = {
        let rafts: Vec<RaftNode> = groups.iter().map(|g| g.raft.clone()).collect();
        let brokers: Vec<Arc<Broker>> = groups.iter().map(|g| g.broker.clone()).collect();
        let sinks = sinks.clone();
        let tenant_sinks = tenant_sinks.clone();
        let failed = failed.clone();
        async move {
            let (failed_tx, mut failed_rx) = tokio::sync::mpsc::channel::<String>(rafts.len());
            let watchers: Vec<_> = rafts
                .iter()
                .map(|r| {
                    let (r, tx) = (r.clone(), failed_tx.clone());
                    tokio::spawn(async move {
                        let _ = tx.send(r.core_failed().await).await;
                    })
                })
                .collect();
            tokio::select! {
                () = shutdown => {}
                Some(reason) = failed_rx.recv() => {
                    tracing::error!(target: "queen-app", error = %reason, "the replicated log stopped on an error; this node stops");
                    *failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reason);
                    return;
                }
            }
            for w in watchers {
                w.abort();
            }
            // Ephemeral rings go to their next owners first (at most 15 s), while this node
            // still serves and the others still reach it.
            let mut drains = tokio::task::JoinSet::new();
            for b in brokers {
                drains.spawn(async move { b.ephemeral_drain().await });
            }
            while drains.join_next().await.is_some() {}
            for s in &sinks {
                s.begin_drain();
            }
            if let Some(t) = &tenant_sinks {
                t.begin_drain();
            }
            let mut handoffs = tokio::task::JoinSet::new();
            for (index, raft) in rafts.into_iter().enumerate() {
                handoffs.spawn(async move { (index, raft.transfer_leadership().await) });
            }
            while let Some(done) = handoffs.join_next().await {
                if let Ok((group, Some((to, ms)))) = done {
                    tracing::info!(target: "queen-app", group, to, ms, "leadership handed off before draining");
                }
            }
        }
    };
    serve(Serving {
        listener,
        broker: broker.clone(),
        groups: groups.iter().map(|g| g.broker.clone()).collect(),
        placement: cfg.placement.clone(),
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
    crate::sink::SinkHandle::finish_all(sinks).await;
    if let Some(t) = &tenant_sinks {
        t.finish().await;
    }
    let _ = tenant_stop.send(true);
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    for g in &groups {
        if let Err(e) = g.raft.shutdown().await {
            tracing::warn!(target: "queen-app", group = g.index, error = %e, "raft did not stop cleanly");
        }
    }
    drop(broker);
    drop(groups);
    tracing::info!(target: "queen-app", "stopped");
    Ok(())
}

/// The background work of one group until `stop`: the cluster version gate, the ephemeral
/// queues' sweep and placement, the tick, and (with several groups) the hand-back to the
/// group's preferred leader.
fn group_tasks(
    g: &group::Group,
    cfg: &Config,
    kinds: u32,
    count: u16,
    stop_rx: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    tasks.push({
        let broker = g.broker.clone();
        let mut stop = stop_rx.clone();
        let mut gate = crate::cluster::Gate::new(
            g.raft.clone(),
            g.dir.clone(),
            kinds,
            cfg.max_clock_skew_ms,
            g.marker,
        );
        tokio::spawn(async move {
            // The first step at once: a fresh cluster reads its newest format before its
            // first queues are made (a queue made earlier fills its ready index as it is read).
            loop {
                tokio::select! {
                    () = gate.step(&broker) => {}
                    _ = stop.changed() => break,
                }
                tokio::select! {
                    () = tokio::time::sleep(TICK_EVERY) => {}
                    _ = stop.changed() => break,
                }
            }
        })
    });
    // Ephemeral ages, leases and idle queues, and their gauges; with several groups also the
    // group's raft figures (a scrape renders group 0's on its own).
    tasks.push({
        let broker = g.broker.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        broker.ephemeral_sweep();
                        if count > 1 {
                            broker.progress_gauges();
                        }
                    }
                    _ = stop.changed() => break,
                }
            }
        })
    });
    tasks.push({
        let broker = g.broker.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move { broker.ephemeral_placement(stop).await })
    });
    tasks.push({
        let broker = g.broker.clone();
        let mut stop_rx = stop_rx.clone();
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
    });
    if count > 1 {
        tasks.push(tokio::spawn(group::keep_preferred(
            g.raft.clone(),
            g.index,
            stop_rx.clone(),
        )));
    }
    tasks
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
