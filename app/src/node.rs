//! Assembling a node and running it until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use queen_ports::{ReplicatedLog, SystemClock};
use queen_raft::{RaftNode, RaftNodeConfig};
use queen_store::{FjallStore, StoreConfig};
use queen_telemetry::Telemetry;
use tokio::net::TcpListener;

use crate::broker::Broker;
use crate::config::Config;

/// Why the node stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The data directory could not be created.
    #[error("QUEEN_RAFT_DIR: cannot create {dir}: {source}")]
    DataDir {
        /// Which.
        dir: String,
        /// Why.
        source: std::io::Error,
    },
    /// The state store did not open.
    #[error(transparent)]
    Store(#[from] queen_store::StoreOpenError),
    /// The replicated log did not start.
    #[error("the replicated log did not start: {0}")]
    Raft(#[from] queen_raft::RaftStartError),
    /// The client port could not be bound.
    #[error("PORT: cannot listen on {addr}: {source}")]
    Bind {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Clustering needs the raft transport.
    #[error("QUEEN_RAFT_PEERS: {0}")]
    Cluster(String),
}

/// How long a stop waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(30);
/// How often the leader appends a tick.
const TICK_EVERY: Duration = Duration::from_secs(1);

/// Run a node until `shutdown` resolves; then stop accepting, finish requests in flight, and
/// stop the replicated log.
///
/// # Errors
/// When the node cannot start (directory, store, log, port).
pub async fn run(cfg: Config, telemetry: Telemetry, shutdown: impl Future<Output = ()> + Send) -> Result<(), AppError> {
    if cfg.peers.len() > 1 {
        return Err(AppError::Cluster(
            "more than one voter needs the cluster transport, which this build does not have yet; run one node".to_owned(),
        ));
    }
    std::fs::create_dir_all(&cfg.raft_dir)
        .map_err(|source| AppError::DataDir { dir: cfg.raft_dir.display().to_string(), source })?;
    let addr = SocketAddr::new(cfg.host, cfg.port);
    let listener = TcpListener::bind(addr).await.map_err(|source| AppError::Bind { addr, source })?;
    let store = FjallStore::open(&StoreConfig::new(cfg.raft_dir.join("state")))?;
    let mut raft_cfg = RaftNodeConfig::single(cfg.node_id, cfg.raft_dir.clone());
    raft_cfg.token = cfg.token.clone();
    let raft = RaftNode::start(raft_cfg, Arc::new(store.clone())).await?;
    let fsync_source = raft.clone();
    let broker = Arc::new(Broker::new(
        Arc::new(raft.clone()) as Arc<dyn ReplicatedLog>,
        store.clone(),
        Arc::new(SystemClock),
        telemetry,
        cfg.request_timeout,
        Arc::new(move || fsync_source.fsync_count()),
    ));
    tracing::info!(target: "queen-app", %addr, node_id = cfg.node_id, dir = %cfg.raft_dir.display(), "listening");

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let ticker = {
        let broker = broker.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(TICK_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => broker.tick().await,
                    _ = stop_rx.changed() => break,
                }
            }
        })
    };

    queen_http::serve(
        listener,
        broker.clone(),
        queen_http::ServeConfig { max_body_bytes: cfg.max_body_bytes, drain: DRAIN },
        shutdown,
    )
    .await;
    tracing::info!(target: "queen-app", "listener closed, stopping");
    let _ = stop_tx.send(true);
    let _ = ticker.await;
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(target: "queen-app", error = %e, "raft did not stop cleanly");
    }
    drop(broker);
    tracing::info!(target: "queen-app", "stopped");
    Ok(())
}
