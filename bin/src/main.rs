//! queen: the broker binary. Parses flags and environment, sets up telemetry, validates the
//! configuration and runs the node until SIGTERM or Ctrl-C. Nothing else lives here.

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main`: freed pages go back to the system within about a
/// fifth of a second (the default keeps them ten seconds, and under batch pushes that held
/// 50-60 MiB more per node at the peak; one second still held 5-6 MiB more than a fifth:
/// docs/performance.md), by a background thread rather than by the threads that free.
/// `_RJEM_MALLOC_CONF` in the environment still overrides any of them.
#[allow(non_upper_case_globals, unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: Option<&'static std::ffi::c_char> =
    // SAFETY: a C string literal is 'static and NUL-terminated; its first byte lives as long
    // as the program, which is what jemalloc reads at start.
    Some(unsafe { &*c"background_thread:true,dirty_decay_ms:200,muzzy_decay_ms:0".as_ptr() });

mod env;

use clap::{Parser, Subcommand};
use env::env_var;
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
    Serve(Box<ServeArgs>),
    /// Work with the lake the S3 sink writes.
    #[command(subcommand)]
    Lake(LakeCmd),
}

#[derive(Subcommand, Debug)]
enum LakeCmd {
    /// Check a lake: every manifest, each object's sha256, counts and bounds, windows contiguous
    /// and never overlapping, each (partition, offset) once. Credentials come from
    /// QUEEN_S3_ACCESS_KEY and QUEEN_S3_SECRET_KEY. Prints a JSON report; exits 1 on a problem.
    Verify {
        /// The bucket (for a file:// endpoint, a folder inside it; optional there).
        #[arg(long, env = "QUEEN_S3_BUCKET")]
        bucket: Option<String>,
        /// Key prefix [default: queen].
        #[arg(long, env = "QUEEN_S3_PREFIX")]
        prefix: Option<String>,
        /// http(s):// endpoint, file://<folder> or unset for AWS.
        #[arg(long, env = "QUEEN_S3_ENDPOINT")]
        endpoint: Option<String>,
        /// Region [default: us-east-1].
        #[arg(long, env = "QUEEN_S3_REGION")]
        region: Option<String>,
        /// Bucket in the URL path (MinIO, GCS, test servers).
        #[arg(long, env = "QUEEN_S3_PATH_STYLE")]
        path_style: Option<String>,
    },
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
    /// Largest payload of one message, KV value or timer payload, in bytes [default: 8388608].
    #[arg(long, env = "QUEEN_MAX_MESSAGE_BYTES")]
    max_message_bytes: Option<String>,
    /// How long a request body may take to arrive, in ms (client and raft ports) [default: 30000].
    #[arg(long, env = "QUEEN_BODY_TIMEOUT_MS")]
    body_timeout_ms: Option<String>,
    /// Bytes of request bodies held in memory at once, per port [default: 268435456].
    #[arg(long, env = "QUEEN_BODY_BUDGET_BYTES")]
    body_budget_bytes: Option<String>,
    /// Disk use (percent) above which client writes answer 507 [default: 85].
    #[arg(long, env = "QUEEN_RAFT_DISK_HIGH_PCT")]
    disk_high_pct: Option<String>,
    /// Free bytes no write may take; pops and acks stop there too [default: 33554432].
    #[arg(long, env = "QUEEN_RAFT_DISK_RESERVE_BYTES")]
    disk_reserve_bytes: Option<String>,
    /// Start empty and wait to be added as a learner [default: false].
    #[arg(long, env = "QUEEN_RAFT_JOIN")]
    join: Option<String>,
    /// Followers forward their clients' writes to the leader [default: true].
    #[arg(long, env = "QUEEN_RAFT_CLIENT_OFFLOAD")]
    client_offload: Option<String>,
    /// Take each request's tenant from the x-queen-tenant header; needs QUEEN_KV_TRUSTED_PROXY=1 [default: false].
    #[arg(long, env = "QUEEN_TENANCY_HEADER")]
    tenancy_header: Option<String>,
    /// A trusted proxy in front of this node sets x-queen-tenant and drops the clients' own [default: false].
    #[arg(long, env = "QUEEN_KV_TRUSTED_PROXY")]
    kv_trusted_proxy: Option<String>,
    /// Most entries a learner may lag and still be promoted without force [default: 1000].
    #[arg(long, env = "QUEEN_RAFT_PROMOTE_MAX_LAG")]
    promote_max_lag: Option<String>,
    /// Ready within this many entries of the commit [default: 1000].
    #[arg(long, env = "QUEEN_RAFT_READY_LAG_ENTRIES")]
    ready_lag_entries: Option<String>,
    /// Ready when the last applied entry is this recent, in ms [default: 2000].
    #[arg(long, env = "QUEEN_RAFT_READY_LAG_MS")]
    ready_lag_ms: Option<String>,
    /// After a leader change, hold leases timed by another node this long past expiry, in ms [default: 500].
    #[arg(long, env = "QUEEN_RAFT_MAX_CLOCK_SKEW_MS")]
    max_clock_skew_ms: Option<String>,
    /// The leader's heartbeat period in ms, 10-5000 [default: 100].
    #[arg(long, env = "QUEEN_RAFT_HEARTBEAT_MS")]
    heartbeat_ms: Option<String>,
    /// Shortest election timeout in ms, at least three heartbeats [default: 500].
    #[arg(long, env = "QUEEN_RAFT_ELECTION_MIN_MS")]
    election_min_ms: Option<String>,
    /// Longest election timeout in ms, also how long a voter refuses other candidates after it last heard the leader [default: 1000].
    #[arg(long, env = "QUEEN_RAFT_ELECTION_MAX_MS")]
    election_max_ms: Option<String>,
    /// Raft groups in each node, the same on every node, 1-64 [default: 1].
    #[arg(long, env = "QUEEN_RAFT_GROUPS")]
    raft_groups: Option<String>,
    /// Tenants pinned to groups: <tenant id>=<group>,... (the others by a hash of their id).
    #[arg(long, env = "QUEEN_TENANT_GROUPS")]
    tenant_groups: Option<String>,
    /// Log format: human or json [default: human].
    #[arg(long, env = "QUEEN_LOG_FORMAT")]
    log_format: Option<String>,
}

/// Serve the client port, and the embedded proxy's own port when it has one, until the node
/// stops accepting.
async fn serve_fronts(
    s: queen_app::Serving,
    front: queen_http::ServeConfig,
    proxy: Option<(std::sync::Arc<queen_http::Proxy>, std::net::TcpListener)>,
    tls: Option<queen_http::Tls>,
) {
    let front = queen_http::ServeConfig {
        drain: s.drain,
        ..front
    };
    // Each request reaches its tenant's raft group (one group: the node's).
    let groups = || queen_http::Groups::new(s.groups.clone(), s.placement.clone());
    let Some((proxy, listener)) = proxy else {
        return queen_http::serve_groups(s.listener, groups(), front, s.stop).await;
    };
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(target: "queen", error = %e, "the proxy's listener cannot be used");
            return queen_http::serve_groups(s.listener, groups(), front, s.stop).await;
        }
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(target: "queen", %addr, "proxy listening");
    }
    // One stop for both listeners.
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stop = s.stop;
    tokio::spawn(async move {
        stop.await;
        let _ = tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let proxied = queen_http::ServeConfig {
        proxy: Some(proxy),
        tls,
        ..front.clone()
    };
    tokio::join!(
        queen_http::serve_groups(s.listener, groups(), front, stopped(rx.clone())),
        queen_http::serve_groups(listener, groups(), proxied, stopped(rx)),
    );
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Cmd::Serve(a)) => *a,
        Some(Cmd::Lake(LakeCmd::Verify {
            bucket,
            prefix,
            endpoint,
            region,
            path_style,
        })) => {
            return lake_verify([
                ("QUEEN_S3_BUCKET", bucket),
                ("QUEEN_S3_PREFIX", prefix),
                ("QUEEN_S3_ENDPOINT", endpoint),
                ("QUEEN_S3_REGION", region),
                ("QUEEN_S3_PATH_STYLE", path_style),
            ]);
        }
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
        max_message_bytes: args.max_message_bytes,
        body_timeout_ms: args.body_timeout_ms,
        body_budget_bytes: args.body_budget_bytes,
        disk_high_pct: args.disk_high_pct,
        disk_reserve_bytes: args.disk_reserve_bytes,
        join: args.join,
        client_offload: args.client_offload,
        tenancy_header: args.tenancy_header,
        kv_trusted_proxy: args.kv_trusted_proxy,
        promote_max_lag: args.promote_max_lag,
        ready_lag_entries: args.ready_lag_entries,
        ready_lag_ms: args.ready_lag_ms,
        max_clock_skew_ms: args.max_clock_skew_ms,
        heartbeat_ms: args.heartbeat_ms,
        election_min_ms: args.election_min_ms,
        election_max_ms: args.election_max_ms,
        raft_groups: args.raft_groups,
        tenant_groups: args.tenant_groups,
        hostname: env_var("HOSTNAME"),
        ephemeral: [
            "QUEEN_EPHEMERAL_MAX_BYTES",
            "QUEEN_EPHEMERAL_QUEUE_MAX_BYTES",
            "QUEEN_EPHEMERAL_QUEUE_MAX_LENGTH",
            "QUEEN_EPHEMERAL_LEASE_S",
            "QUEEN_EPHEMERAL_RETRY_LIMIT",
            "QUEEN_EPHEMERAL_IDLE_S",
            "QUEEN_EPHEMERAL_MAX_QUEUES",
            "QUEEN_EPHEMERAL_MAX_QUEUES_PER_TENANT",
        ]
        .map(env_var),
        analytics: [
            "QUEEN_ANALYTICS_INTERVAL_MS",
            "QUEEN_ANALYTICS_RETENTION_S",
            "QUEEN_ANALYTICS_MAX_BYTES",
        ]
        .map(env_var),
        // A secret: read from the environment only (a flag would show in `ps`).
        encryption_key: env_var("QUEEN_ENCRYPTION_KEY").map(queen_app::SecretText),
        test_hooks: queen_app::RawTestHooks::read(&env_var),
    };
    let log_format = match args
        .log_format
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        None => LogFormat::Human,
        Some(f) if f.eq_ignore_ascii_case("human") || f.eq_ignore_ascii_case("text") => {
            LogFormat::Human
        }
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
    // The embedded proxy (QUEEN_PROXY_EMBEDDED), and its own listener when QUEEN_PROXY_PORT
    // names another port than PORT: bound now, so a taken port stops the boot with one line.
    let proxy = match queen_http::ProxySettings::from_env(&env_var, config.port) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ERROR boot: FATAL: {e}");
            return ExitCode::from(2);
        }
    };
    let proxy_listener = match proxy.as_ref().and_then(|p| p.port) {
        None => None,
        Some(port) => match std::net::TcpListener::bind((config.host, port))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
        {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!(
                    "ERROR boot: FATAL: QUEEN_PROXY_PORT {port} cannot be bound on {}: {e}",
                    config.host
                );
                return ExitCode::from(2);
            }
        },
    };
    let tls = match queen_http::Tls::from_env(&env_var) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ERROR boot: FATAL: {e}");
            return ExitCode::from(2);
        }
    };
    if tls.is_some() && proxy.is_none() {
        eprintln!(
            "ERROR boot: FATAL: QUEEN_TLS_CERT is set without QUEEN_PROXY_EMBEDDED: TLS is served on the embedded proxy's listener"
        );
        return ExitCode::from(2);
    }
    let proxy = proxy.map(queen_http::Proxy::new);
    let sink = match queen_app::sink_from_env(&env_var, config.node_id) {
        Ok(boot) => boot,
        Err(e) => {
            eprintln!("ERROR boot: FATAL: {e}");
            return ExitCode::from(2);
        }
    };
    let telemetry = match Telemetry::init(TelemetryConfig {
        log_format,
        log_filter: env_var("RUST_LOG")
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| queen_telemetry::DEFAULT_LOG_FILTER.to_owned()),
        service_name: "queen".to_owned(),
        node_id: config.node_id,
        otlp_endpoint: env_var("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|s| !s.trim().is_empty()),
    }) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("telemetry: {e}");
            return ExitCode::from(2);
        }
    };
    // Broker JWT on the client port (after the log is up: a short secret is warned about).
    let auth = match queen_http::Auth::from_env(&env_var) {
        Ok(a) => a.map(std::sync::Arc::new),
        Err(e) => {
            tracing::error!(target: "queen", error = %e, "broker JWT settings refused");
            eprintln!("ERROR boot: FATAL: {e}");
            telemetry.shutdown();
            return ExitCode::from(2);
        }
    };
    // The client port's browser rules and scrape token (`QUEEN_ALLOWED_*`, `QUEEN_METRICS_TOKEN`).
    let front = match queen_http::FrontRules::from_env(&env_var) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("ERROR boot: FATAL: {e}");
            telemetry.shutdown();
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    for w in &sink.warnings {
        tracing::warn!(target: "queen-s3", "{w}");
    }
    // The client port's front is the HTTP adapter; the application hands it the bound
    // listener and the use cases.
    let front = queen_http::ServeConfig {
        max_body_bytes: config.max_body_bytes,
        body_timeout: config.body_timeout,
        body_budget_bytes: config.body_budget_bytes,
        admin_token: config.token.clone(),
        drain: std::time::Duration::ZERO,
        tenancy: queen_http::Tenancy {
            header: config.tenancy_header,
            claims: auth.is_some(),
        },
        auth,
        // The proxy fronts the client port itself unless it has a port of its own.
        proxy: proxy.clone().filter(|_| proxy_listener.is_none()),
        tls: tls.clone().filter(|_| proxy_listener.is_none()),
        front,
    };
    let result = runtime.block_on(queen_app::run(
        config,
        sink.settings,
        telemetry.clone(),
        shutdown_signal(),
        move |s: queen_app::Serving| serve_fronts(s, front, proxy.zip(proxy_listener), tls),
    ));
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(target: "queen", error = %e, "node stopped");
            eprintln!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `queen lake verify`: the flags over the environment, then the report.
fn lake_verify(flags: [(&'static str, Option<String>); 5]) -> ExitCode {
    let get = move |k: &str| -> Option<String> {
        match k {
            "QUEEN_S3_EMBEDDED" => Some("true".to_owned()),
            "QUEEN_S3_QUEUES" => Some("*".to_owned()),
            _ => flags
                .iter()
                .find(|(n, _)| *n == k)
                .and_then(|(_, v)| v.clone())
                .or_else(|| env_var(k)),
        }
    };
    let settings = match queen_app::sink_from_env(&get, 0) {
        Ok(queen_app::SinkBoot {
            settings: Some(s), ..
        }) => s,
        Ok(_) => return ExitCode::from(2),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(queen_app::verify_lake(&settings)) {
        Ok((report, ok)) => {
            println!("{report}");
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("lake verify: {e}");
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
