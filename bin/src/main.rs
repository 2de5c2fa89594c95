//! queen: the broker binary. Parses flags and environment, sets up telemetry, validates the
//! configuration and runs the node until SIGTERM or Ctrl-C. Nothing else lives here.

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use clap::{Parser, Subcommand};
use queen_app::RawConfig;
use queen_telemetry::{LogFormat, Telemetry, TelemetryConfig};

/// A partitioned message broker on a Raft-replicated log.
#[derive(Parser, Debug)]
#[command(name = "queen", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a node (the default).
    Serve(ServeArgs),
}

#[derive(clap::Args, Debug, Clone, Default)]
struct ServeArgs {
    /// Client HTTP port [default: 6632].
    #[arg(long, env = "PORT")]
    port: Option<String>,
    /// Address to bind [default: 0.0.0.0].
    #[arg(long, env = "HOST")]
    host: Option<String>,
    /// Data directory [default: ./queen-data].
    #[arg(long, env = "QUEEN_RAFT_DIR")]
    raft_dir: Option<String>,
    /// This node's id, or `ordinal` [default: 1].
    #[arg(long, env = "QUEEN_RAFT_NODE_ID")]
    node_id: Option<String>,
    /// Voters: id=raft_host:port/http_host:port,...
    #[arg(long, env = "QUEEN_RAFT_PEERS")]
    peers: Option<String>,
    /// Shared secret of raft RPCs.
    #[arg(long, env = "QUEEN_RAFT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Replicator (openraft).
    #[arg(long, env = "QUEEN_RAFT_REPLICATOR")]
    replicator: Option<String>,
    /// Largest request body in bytes [default: 67108864].
    #[arg(long, env = "QUEEN_MAX_BODY_BYTES")]
    max_body_bytes: Option<String>,
    /// Deadline of a request that has to commit, in ms [default: 30000].
    #[arg(long, env = "QUEEN_REQUEST_TIMEOUT_MS")]
    request_timeout_ms: Option<String>,
    /// Disk use (percent) above which client writes answer 507 [default: 85].
    #[arg(long, env = "QUEEN_RAFT_DISK_HIGH_PCT")]
    disk_high_pct: Option<String>,
    /// Start empty and wait to be added as a learner [default: false].
    #[arg(long, env = "QUEEN_RAFT_JOIN")]
    join: Option<String>,
    /// Followers forward their clients' writes to the leader [default: true].
    #[arg(long, env = "QUEEN_RAFT_CLIENT_OFFLOAD")]
    client_offload: Option<String>,
    /// Most entries a learner may lag and still be promoted without force [default: 1000].
    #[arg(long, env = "QUEEN_RAFT_PROMOTE_MAX_LAG")]
    promote_max_lag: Option<String>,
    /// Ready within this many entries of the commit [default: 1000].
    #[arg(long, env = "QUEEN_RAFT_READY_LAG_ENTRIES")]
    ready_lag_entries: Option<String>,
    /// Ready when the last applied entry is this recent, in ms [default: 2000].
    #[arg(long, env = "QUEEN_RAFT_READY_LAG_MS")]
    ready_lag_ms: Option<String>,
    /// Log format: human or json [default: human].
    #[arg(long, env = "QUEEN_LOG_FORMAT")]
    log_format: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Cmd::Serve(a)) => a,
        None => cli.serve,
    };
    let raw = RawConfig {
        port: args.port,
        host: args.host,
        raft_dir: args.raft_dir,
        node_id: args.node_id,
        peers: args.peers,
        token: args.token,
        replicator: args.replicator,
        max_body_bytes: args.max_body_bytes,
        request_timeout_ms: args.request_timeout_ms,
        disk_high_pct: args.disk_high_pct,
        join: args.join,
        client_offload: args.client_offload,
        promote_max_lag: args.promote_max_lag,
        ready_lag_entries: args.ready_lag_entries,
        ready_lag_ms: args.ready_lag_ms,
        hostname: std::env::var("HOSTNAME").ok(),
    };
    let log_format = match args.log_format.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        None => LogFormat::Human,
        Some(f) if f.eq_ignore_ascii_case("human") || f.eq_ignore_ascii_case("text") => LogFormat::Human,
        Some(f) if f.eq_ignore_ascii_case("json") => LogFormat::Json,
        Some(f) => {
            eprintln!("QUEEN_LOG_FORMAT: '{f}' is not a log format (human, json)");
            return ExitCode::from(2);
        }
    };
    let config = match raw.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let telemetry = match Telemetry::init(TelemetryConfig {
        log_format,
        log_filter: std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned()),
        service_name: "queen".to_owned(),
        node_id: config.node_id,
        otlp_endpoint: std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok().filter(|s| !s.trim().is_empty()),
    }) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("telemetry: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(queen_app::run(config, telemetry.clone(), shutdown_signal()));
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(target: "queen", error = %e, "node stopped");
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!(target: "queen", "shutdown requested");
}
