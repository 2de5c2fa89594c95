//! queen-bench: starts a real node (the release binary) on loopback and measures push
//! throughput (one message per request with 128 in flight, and 100 per request), pop+ack
//! throughput, latency percentiles, fsyncs per second beside requests per second, and the
//! node's peak RSS. Prints one table; every phase is bounded in time.
//!
//! `queen-bench cluster [--vs-nats]` starts a three-node cluster instead (and, with `--vs-nats`,
//! a three-node NATS JetStream cluster with replicas 3 and `sync_interval: always` in the same
//! run) and compares push throughput and latency; see `cluster.rs`.

mod cluster;
mod noop;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use queen_bench::load::{self, Proc, Procs, Stats, drive};

#[derive(Parser, Debug)]
#[command(about = "Benchmark queen on loopback: one node (default), or a three-node cluster against NATS JetStream")]
struct Args {
    /// The queen binary to run (default: `queen` beside this binary, i.e. in the same target dir).
    #[arg(long, global = true)]
    bin: Option<PathBuf>,
    /// Seconds per phase.
    #[arg(long, default_value_t = 10, global = true)]
    seconds: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 256, global = true)]
    size: usize,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Three queen nodes on loopback; with --vs-nats, also three NATS JetStream servers.
    Cluster(cluster::ClusterArgs),
    /// A push server that stores nothing (started by `cluster --floor`).
    #[command(hide = true)]
    NoopServer {
        #[arg(long)]
        port: u16,
    },
}

/// The target dir this binary was built into (`<target>/release/queen-bench` → `<target>`).
fn target_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.to_path_buf())
}

/// `--bin`, else `queen` beside this binary, else `target/release/queen`.
fn queen_bin(arg: Option<&PathBuf>) -> PathBuf {
    if let Some(b) = arg {
        return b.clone();
    }
    let sibling = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.join("queen")));
    match sibling {
        Some(s) if s.is_file() => s,
        _ => PathBuf::from("target/release/queen"),
    }
}

type Http = Client<HttpConnector, Full<Bytes>>;

fn http_client() -> Http {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(512).build(connector)
}

/// One or more queen nodes to send requests to.
struct Target {
    http: Http,
    bases: Vec<String>,
}

impl Target {
    fn new(http: Http, ports: &[u16]) -> Target {
        Target { http, bases: ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect() }
    }

    /// A request to the first node.
    async fn call(&self, method: &str, path: &str, body: Option<String>) -> Result<(u16, Bytes), String> {
        self.call_at(0, method, path, body).await
    }

    /// A request to node `i` (modulo the number of nodes).
    async fn call_at(&self, i: u64, method: &str, path: &str, body: Option<String>) -> Result<(u16, Bytes), String> {
        let base = &self.bases[(i % self.bases.len() as u64) as usize];
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        let resp = self.http.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, body))
    }

    async fn json_at(&self, i: u64, path: &str) -> Value {
        match self.call_at(i, "GET", path, None).await {
            Ok((_, b)) => serde_json::from_slice(&b).unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    }

    async fn json(&self, path: &str) -> Value {
        self.json_at(0, path).await
    }

    /// Log fsyncs so far, summed over every node.
    async fn fsyncs(&self) -> u64 {
        let mut sum = 0;
        for i in 0..self.bases.len() as u64 {
            sum += self.json_at(i, "/status").await["storage"]["logFsyncs"].as_u64().unwrap_or(0);
        }
        sum
    }
}

/// A push request body: `count` messages of about `size` bytes of JSON payload each.
/// Transaction ids start with `tag`, unique per phase (a repeated id would be deduplicated).
fn push_body(tag: &str, n: u64, count: usize, payload: &str) -> String {
    let items: Vec<Value> = (0..count)
        .map(|i| {
            let txn = if count == 1 { format!("{tag}{n}") } else { format!("{tag}{n}-{i}") };
            json!({"queue": "bench", "partition": format!("p{}", n % 8), "transactionId": txn, "payload": {"d": payload}})
        })
        .collect();
    json!({ "items": items }).to_string()
}

/// A payload string that makes a message's JSON payload (`{"d":"…"}`) about `size` bytes.
fn payload_of(size: usize) -> Arc<str> {
    Arc::from("x".repeat(size.saturating_sub(12)))
}

/// Push `count` messages per request for `seconds` with `inflight` requests, request `n` going
/// to node `n % nodes` of `t`; `status` reads the fsync counters (every node of the cluster),
/// if there are any. `tag` prefixes the transaction ids.
async fn push_phase(t: &Arc<Target>, status: Option<&Target>, tag: &str, inflight: usize, count: usize, seconds: u64, payload: &Arc<str>) -> (Stats, u64) {
    let f0 = match status {
        Some(s) => s.fsyncs().await,
        None => 0,
    };
    let (t, payload, tag): (_, _, Arc<str>) = (t.clone(), payload.clone(), Arc::from(tag));
    let st = drive(inflight, seconds, move |n| {
        let (t, payload, tag) = (t.clone(), payload.clone(), tag.clone());
        async move {
            let body = push_body(&tag, n, count, &payload);
            match t.call_at(n, "POST", "/api/v1/push", Some(body)).await? {
                (200, _) => Ok(count as u64),
                (code, b) => Err(format!("push answered {code}: {}", String::from_utf8_lossy(&b))),
            }
        }
    })
    .await;
    let fsyncs = match status {
        Some(s) => s.fsyncs().await.saturating_sub(f0),
        None => 0,
    };
    (st, fsyncs)
}

fn print_phase(name: &str, st: &Stats, fsyncs: u64) {
    println!(
        "{:<34} {:>10.0} msg/s {:>9.0} req/s {:>8.0} fsync/s {:>8.2} ms p50 {:>8.2} ms p99 {:>6} errors",
        name,
        st.msg_per_s(),
        st.req_per_s(),
        fsyncs as f64 / st.seconds,
        st.pct_ms(0.50),
        st.pct_ms(0.99),
        st.errors,
    );
    if let Some(e) = &st.first_error {
        println!("    first error: {e}");
    }
}

fn start_node(bin: &PathBuf, dir: &std::path::Path, port: u16) -> Result<Proc, String> {
    let child = Command::new(bin)
        .env("PORT", port.to_string())
        .env("HOST", "127.0.0.1")
        .env("QUEEN_RAFT_DIR", dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e} (build it with cargo build --release -p queen)", bin.display()))?;
    Ok(Proc { name: format!("queen on port {port}"), child, log: None })
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).map_err(|e| format!("no free port: {e}"))
}

/// The single-node benchmark (the default).
async fn single_node(args: &Args) -> Result<(), String> {
    let bin = queen_bin(args.bin.as_ref());
    let dir = tempfile::tempdir_in(".").or_else(|_| tempfile::tempdir()).map_err(|e| format!("a temp dir: {e}"))?;
    let port = free_port()?;
    let mut procs = Procs::default();
    procs.0.push(start_node(&bin, dir.path(), port)?);
    let pid = procs.pids()[0];
    let t = Arc::new(Target::new(http_client(), &[port]));
    let ready = Instant::now() + Duration::from_secs(30);
    while !matches!(t.call("GET", "/health", None).await, Ok((200, _))) {
        if let Some(e) = procs.exited() {
            return Err(e);
        }
        if Instant::now() > ready {
            return Err("the node did not become healthy within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let payload = payload_of(args.size);
    println!("queen-bench: {} s per phase, {}-byte messages, node pid {pid}, data in {}", args.seconds, args.size, dir.path().display());

    let (single, f) = push_phase(&t, Some(&t), "s", 128, 1, args.seconds, &payload).await;
    print_phase("push 1/request, 128 in flight", &single, f);
    let (batched, f) = push_phase(&t, Some(&t), "b", 8, 100, args.seconds, &payload).await;
    print_phase("push 100/request, 8 in flight", &batched, f);

    let f0 = t.fsyncs().await;
    let tc = t.clone();
    let consume = drive(8, args.seconds, move |_| {
        let t = tc.clone();
        async move {
            let (status, body) = t.call("GET", "/api/v1/pop/queue/bench?batch=100&wait=false", None).await?;
            if status == 204 {
                return Ok(0);
            }
            let v: Value = serde_json::from_slice(&body).map_err(|e| format!("pop answered {status}: {e}"))?;
            let acks: Vec<Value> = v["messages"]
                .as_array()
                .ok_or_else(|| format!("pop answered {status} without messages"))?
                .iter()
                .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": v["leaseId"], "status": "completed"}))
                .collect();
            let n = acks.len() as u64;
            match t.call("POST", "/api/v1/ack/batch", Some(json!({ "acknowledgments": acks }).to_string())).await? {
                (200, _) => Ok(n),
                (code, _) => Err(format!("ack/batch answered {code}")),
            }
        }
    })
    .await;
    print_phase("pop 100 + ack/batch, 8 consumers", &consume, t.fsyncs().await.saturating_sub(f0));

    let status = t.json("/status").await;
    println!(
        "backlog left: {} messages; node peak RSS: {} MiB; state on disk: {} MiB",
        status["queues"]["messages"],
        load::peak_rss_kib(pid) / 1024,
        status["storage"]["diskBytes"].as_u64().unwrap_or(0) >> 20
    );
    procs.stop_all();
    Ok(())
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    // Dropping the run (on error, panic or Ctrl-C) drops its process guards, which stop every
    // process it started by PID.
    let outcome = tokio::select! {
        r = async {
            match &args.cmd {
                None => single_node(&args).await,
                Some(Cmd::Cluster(c)) => cluster::run(&args, c).await,
                Some(Cmd::NoopServer { port }) => noop::serve(*port).await,
            }
        } => r,
        _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
    };
    if let Err(e) = outcome {
        eprintln!("queen-bench: {e}");
        std::process::exit(1);
    }
}
