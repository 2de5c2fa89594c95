//! queen-bench: starts a real node (the release binary) on loopback and measures push
//! throughput (one message per request with 128 in flight, and 100 per request), pop+ack
//! throughput, latency percentiles, fsyncs per second beside requests per second, and the
//! node's peak RSS. Prints one table; every phase is bounded in time.
//!
//! `queen-bench cluster [--vs-nats]` starts a three-node cluster instead (and, with `--vs-nats`,
//! a three-node NATS JetStream cluster with replicas 3 and `sync_interval: always` in the same
//! run) and compares push throughput and latency; see `cluster.rs`.
//!
//! `queen-bench partitions --counts 1000,50000,1000000 [--nodes one|three|both]` fills one
//! queue with one message in each of N partitions and drains it the way the official client's
//! default consumer does, for each N; see `partitions.rs` and docs/performance.md.

mod cluster;
mod http1;
mod noop;
mod partitions;
mod pop;
mod qpb1;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use serde_json::Value;

use queen_bench::load::{self, Proc, Procs, Stats, drive};

#[derive(Parser, Debug)]
#[command(
    about = "Benchmark queen on loopback: one node (default), or a three-node cluster against NATS JetStream"
)]
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
    /// One message in each of N partitions of one queue, drained by consumers that pop the
    /// queue without naming a partition (the official client's autopilot), for each N, on one
    /// node and on three: drain rate, messages per pop, pop latency, server CPU per message,
    /// peak RSS and store bytes per partition. E.g. `queen-bench partitions --counts
    /// 1000,50000,1000000 --nodes both`.
    Partitions(partitions::PartitionsArgs),
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
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("queen")));
    match sibling {
        Some(s) if s.is_file() => s,
        _ => PathBuf::from("target/release/queen"),
    }
}

type Http = Arc<http1::Client>;

fn http_client() -> Http {
    Arc::new(http1::Client::new())
}

/// One or more queen nodes to send requests to.
struct Target {
    http: Http,
    addrs: Vec<std::net::SocketAddr>,
}

impl Target {
    fn new(http: Http, ports: &[u16]) -> Target {
        Target {
            http,
            addrs: ports
                .iter()
                .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], *p)))
                .collect(),
        }
    }

    /// A request to the first node.
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, Bytes), String> {
        self.call_at(0, method, path, body).await
    }

    /// A request to node `i` (modulo the number of nodes).
    async fn call_at(
        &self,
        i: u64,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, Bytes), String> {
        self.send_at(
            i,
            method,
            path,
            "application/json",
            Bytes::from(body.unwrap_or_default()),
        )
        .await
    }

    /// A request with a body of any content type to node `i` (modulo the number of nodes).
    async fn send_at(
        &self,
        i: u64,
        method: &str,
        path: &str,
        content_type: &str,
        body: Bytes,
    ) -> Result<(u16, Bytes), String> {
        self.send_with(i, method, path, content_type, body, &[])
            .await
    }

    /// [`Target::send_at`] with more headers.
    async fn send_with(
        &self,
        i: u64,
        method: &str,
        path: &str,
        content_type: &str,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Result<(u16, Bytes), String> {
        let addr = self.addrs[(i % self.addrs.len() as u64) as usize];
        let mut all = Vec::with_capacity(headers.len() + 1);
        all.push(("content-type", content_type));
        all.extend_from_slice(headers);
        let req = http1::Request {
            method,
            path,
            headers: &all,
            body: &body,
        };
        self.http.request(addr, &req).await
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
        for i in 0..self.addrs.len() as u64 {
            sum += self.json_at(i, "/status").await["storage"]["logFsyncs"]
                .as_u64()
                .unwrap_or(0);
        }
        sum
    }
}

/// How a push request carries its messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// `{"items": [...]}`, Content-Type application/json.
    Json,
    /// QPB1 with FRAMES (API.md 4.6), Content-Type application/x-queen-push.
    Qpb1,
}

/// The messages of push request `n`: `count` of them, as (transactionId, payload JSON). Every
/// payload is `size` bytes of fresh random base64 in a JSON string (`load::random_payload`), so
/// nothing compresses or repeats; the transactionId `{tag}{n}-{i}` is unique in the run (`tag`
/// holds a random run prefix and the phase, `n` is the phase's request sequence number shared
/// by all its loops, `i` the message's place in the request).
fn messages(tag: &str, n: u64, count: usize, size: usize) -> Vec<(String, String)> {
    let mut rng = load::Rng::seeded(n);
    (0..count)
        .map(|i| {
            let mut payload = String::with_capacity(size);
            load::random_payload(&mut rng, size, &mut payload);
            (format!("{tag}{n}-{i}"), payload)
        })
        .collect()
}

/// The partition push request `n` goes to (eight partitions, as many as the consumers).
fn partition_of(n: u64) -> String {
    format!("p{}", n % 8)
}

/// A push request body and its content type: `count` messages for queue `bench`, partition
/// `partition_of(n)`, in the given format.
fn push_body(
    tag: &str,
    n: u64,
    count: usize,
    size: usize,
    format: Format,
) -> Result<(&'static str, Bytes), String> {
    let msgs = messages(tag, n, count, size);
    let partition = partition_of(n);
    match format {
        Format::Json => {
            let mut out = String::with_capacity(count * (size + 80) + 12);
            out.push_str("{\"items\":[");
            for (i, (txn, payload)) in msgs.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                // Names, ids and payloads are JSON-safe by construction (no escapes needed).
                let _ = write!(
                    out,
                    "{{\"queue\":\"bench\",\"partition\":\"{partition}\",\"transactionId\":\"{txn}\",\"payload\":{payload}}}"
                );
            }
            out.push_str("]}");
            Ok(("application/json", Bytes::from(out)))
        }
        Format::Qpb1 => {
            let mut rng = load::Rng::seeded(n ^ 0x5150_4231);
            let body = qpb1::encode(
                &[qpb1::Group {
                    queue: "bench",
                    partition: &partition,
                    messages: &msgs,
                }],
                &mut rng,
            )?;
            Ok((qpb1::CONTENT_TYPE, Bytes::from(body)))
        }
    }
}

/// The shape of a push phase: `count` messages of `size` bytes per request in `format`,
/// `inflight` requests at a time; `tag` prefixes the transaction ids.
struct Pushes<'a> {
    tag: &'a str,
    inflight: usize,
    count: usize,
    size: usize,
    format: Format,
}

/// Push for `seconds` as `p` says, request `n` going to node `n % nodes` of `t`; `status` reads
/// the fsync counters (every node of the cluster), if there are any.
async fn push_phase(
    t: &Arc<Target>,
    status: Option<&Target>,
    p: &Pushes<'_>,
    seconds: u64,
) -> (Stats, u64) {
    let Pushes {
        tag,
        inflight,
        count,
        size,
        format,
    } = *p;
    let f0 = match status {
        Some(s) => s.fsyncs().await,
        None => 0,
    };
    let (t, tag): (_, Arc<str>) = (t.clone(), Arc::from(tag));
    let st = drive(inflight, seconds, move |n| {
        let (t, tag) = (t.clone(), tag.clone());
        async move { push_one(&t, &tag, n, count, size, format).await }
    })
    .await;
    let fsyncs = match status {
        Some(s) => s.fsyncs().await.saturating_sub(f0),
        None => 0,
    };
    (st, fsyncs)
}

/// Push request `n` (see `push_body`); the messages it stored, or what the node answered.
async fn push_one(
    t: &Target,
    tag: &str,
    n: u64,
    count: usize,
    size: usize,
    format: Format,
) -> Result<u64, String> {
    let (content_type, body) = push_body(tag, n, count, size, format)?;
    match t
        .send_at(n, "POST", "/api/v1/push", content_type, body)
        .await?
    {
        (200, _) => Ok(count as u64),
        (code, b) => Err(format!(
            "push answered {code}: {}",
            String::from_utf8_lossy(&b[..b.len().min(300)])
        )),
    }
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

fn start_node(bin: &std::path::Path, dir: &std::path::Path, port: u16) -> Result<Proc, String> {
    let child = Command::new(bin)
        .env("PORT", port.to_string())
        .env("HOST", "127.0.0.1")
        .env("QUEEN_RAFT_DIR", dir)
        .env("QUEEN_RAFT_DISK_HIGH_PCT", "97")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {}: {e} (build it with cargo build --release -p queen)",
                bin.display()
            )
        })?;
    Ok(Proc {
        name: format!("queen on port {port}"),
        child,
        log: None,
    })
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// One node on a free port with its data in `dir`; waits (30 s at most) until /health
/// answers 200.
async fn start_single(
    bin: &std::path::Path,
    dir: &std::path::Path,
) -> Result<(Procs, u16), String> {
    let port = free_port()?;
    let mut procs = Procs::default();
    procs.0.push(start_node(bin, dir, port)?);
    let t = Target::new(http_client(), &[port]);
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
    Ok((procs, port))
}

/// The single-node benchmark (the default).
async fn single_node(args: &Args) -> Result<(), String> {
    let bin = queen_bin(args.bin.as_ref());
    let dir = tempfile::tempdir_in(".")
        .or_else(|_| tempfile::tempdir())
        .map_err(|e| format!("a temp dir: {e}"))?;
    let (mut procs, port) = start_single(&bin, dir.path()).await?;
    let pid = procs.pids()[0];
    let t = Arc::new(Target::new(http_client(), &[port]));
    let tag = format!("{}-", load::run_prefix(&mut load::Rng::seeded(0)));
    println!(
        "queen-bench: {} s per phase, {}-byte messages, node pid {pid}, data in {}",
        args.seconds,
        args.size,
        dir.path().display()
    );

    let (single, f) = push_phase(
        &t,
        Some(&t),
        &Pushes {
            tag: &format!("{tag}s"),
            inflight: 128,
            count: 1,
            size: args.size,
            format: Format::Json,
        },
        args.seconds,
    )
    .await;
    print_phase("push 1/request, 128 in flight", &single, f);
    let (batched, f) = push_phase(
        &t,
        Some(&t),
        &Pushes {
            tag: &format!("{tag}b"),
            inflight: 8,
            count: 100,
            size: args.size,
            format: Format::Json,
        },
        args.seconds,
    )
    .await;
    print_phase("push 100/request, 8 in flight", &batched, f);

    let f0 = t.fsyncs().await;
    let tc = t.clone();
    let consume = load::drain(8, args.seconds, 3, move |n| {
        let t = tc.clone();
        async move { pop::pop_ack_one(&t, n).await }
    })
    .await;
    print_phase(
        "pop 100 + ack/batch, 8 consumers",
        &consume,
        t.fsyncs().await.saturating_sub(f0),
    );

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
                Some(Cmd::Partitions(p)) => partitions::run(&args, p).await,
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
