//! queen-bench: starts a real node (the release binary) on loopback and measures push
//! throughput (one message per request with 128 in flight, and 100 per request), pop+ack
//! throughput, latency percentiles, fsyncs per second beside requests per second, and the
//! node's peak RSS. Prints one table; every phase is bounded in time.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(about = "Benchmark a single queen node on loopback")]
struct Args {
    /// The queen binary to run.
    #[arg(long, default_value = "target/release/queen")]
    bin: PathBuf,
    /// Seconds per phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 256)]
    size: usize,
}

type Http = Client<HttpConnector, Full<Bytes>>;

struct Target {
    http: Http,
    base: String,
}

impl Target {
    async fn call(&self, method: &str, path: &str, body: Option<String>) -> Result<(u16, Bytes), String> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        let resp = self.http.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, body))
    }

    async fn json(&self, path: &str) -> Value {
        match self.call("GET", path, None).await {
            Ok((_, b)) => serde_json::from_slice(&b).unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    }
}

struct Phase {
    name: String,
    messages: u64,
    requests: u64,
    errors: u64,
    seconds: f64,
    fsyncs: u64,
    lat: Vec<Duration>,
}

impl Phase {
    fn print(&self) {
        let mut lat = self.lat.clone();
        lat.sort();
        let pct = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or_default();
        println!(
            "{:<34} {:>10.0} msg/s {:>9.0} req/s {:>8.0} fsync/s {:>8.2} ms p50 {:>8.2} ms p99 {:>6} errors",
            self.name,
            self.messages as f64 / self.seconds,
            self.requests as f64 / self.seconds,
            self.fsyncs as f64 / self.seconds,
            pct(0.50).as_secs_f64() * 1000.0,
            pct(0.99).as_secs_f64() * 1000.0,
            self.errors,
        );
    }
}

async fn fsyncs(t: &Target) -> u64 {
    t.json("/status").await["storage"]["logFsyncs"].as_u64().unwrap_or(0)
}

/// Run `inflight` loops of `one` for `seconds`; `one` returns messages moved (0 = error).
async fn run_phase<F, Fut>(name: &str, t: Arc<Target>, inflight: usize, seconds: u64, one: F) -> Phase
where
    F: Fn(Arc<Target>, u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<u64, ()>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let seq = Arc::new(AtomicU64::new(0));
    let f0 = fsyncs(&t).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..inflight {
        let (t, stop, seq, one) = (t.clone(), stop.clone(), seq.clone(), one.clone());
        tasks.push(tokio::spawn(async move {
            let (mut msgs, mut reqs, mut errs, mut lat) = (0u64, 0u64, 0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let n = seq.fetch_add(1, Ordering::Relaxed);
                let s = Instant::now();
                match one(t.clone(), n).await {
                    Ok(m) => {
                        msgs += m;
                        reqs += 1;
                        lat.push(s.elapsed());
                    }
                    Err(()) => {
                        errs += 1;
                        if errs > 1000 {
                            break;
                        }
                    }
                }
            }
            (msgs, reqs, errs, lat)
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut p = Phase { name: name.to_owned(), messages: 0, requests: 0, errors: 0, seconds: 0.0, fsyncs: 0, lat: Vec::new() };
    for task in tasks {
        if let Ok((m, r, e, l)) = task.await {
            p.messages += m;
            p.requests += r;
            p.errors += e;
            p.lat.extend(l);
        }
    }
    p.seconds = started.elapsed().as_secs_f64();
    p.fsyncs = fsyncs(&t).await.saturating_sub(f0);
    p
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

fn start_node(bin: &PathBuf, dir: &std::path::Path, port: u16) -> Child {
    Command::new(bin)
        .env("PORT", port.to_string())
        .env("HOST", "127.0.0.1")
        .env("QUEEN_RAFT_DIR", dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e} (build it with cargo build --release -p queen)", bin.display()))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let dir = tempfile::tempdir_in(".").or_else(|_| tempfile::tempdir()).expect("a temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
    let mut child = start_node(&args.bin, dir.path(), port);
    let pid = child.id();
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let http: Http = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(512).build(connector);
    let t = Arc::new(Target { http, base: format!("http://127.0.0.1:{port}") });
    let ready = Instant::now() + Duration::from_secs(30);
    while !matches!(t.call("GET", "/health", None).await, Ok((200, _))) {
        assert!(Instant::now() < ready, "the node did not become healthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let payload: String = "x".repeat(args.size.saturating_sub(12));
    println!("queen-bench: {} s per phase, {}-byte messages, node pid {pid}, data in {}", args.seconds, args.size, dir.path().display());

    let body1 = payload.clone();
    let single = run_phase("push 1/request, 128 in flight", t.clone(), 128, args.seconds, move |t, n| {
        let body = json!({"items": [{"queue": "bench", "partition": format!("p{}", n % 8), "transactionId": format!("s{n}"), "payload": {"d": body1}}]}).to_string();
        async move {
            match t.call("POST", "/api/v1/push", Some(body)).await {
                Ok((200, _)) => Ok(1),
                _ => Err(()),
            }
        }
    })
    .await;
    single.print();

    let body100 = payload.clone();
    let batched = run_phase("push 100/request, 8 in flight", t.clone(), 8, args.seconds, move |t, n| {
        let items: Vec<Value> = (0..100)
            .map(|i| json!({"queue": "bench", "partition": format!("p{}", n % 8), "transactionId": format!("b{n}-{i}"), "payload": {"d": body100}}))
            .collect();
        let body = json!({ "items": items }).to_string();
        async move {
            match t.call("POST", "/api/v1/push", Some(body)).await {
                Ok((200, _)) => Ok(100),
                _ => Err(()),
            }
        }
    })
    .await;
    batched.print();

    let consume = run_phase("pop 100 + ack/batch, 8 consumers", t.clone(), 8, args.seconds, move |t, _| async move {
        let Ok((status, body)) = t.call("GET", "/api/v1/pop/queue/bench?batch=100&wait=false", None).await else { return Err(()) };
        if status == 204 {
            return Ok(0);
        }
        let v: Value = serde_json::from_slice(&body).map_err(|_| ())?;
        let acks: Vec<Value> = v["messages"]
            .as_array()
            .ok_or(())?
            .iter()
            .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": v["leaseId"], "status": "completed"}))
            .collect();
        let n = acks.len() as u64;
        match t.call("POST", "/api/v1/ack/batch", Some(json!({ "acknowledgments": acks }).to_string())).await {
            Ok((200, _)) => Ok(n),
            _ => Err(()),
        }
    })
    .await;
    consume.print();

    let status = t.json("/status").await;
    println!(
        "backlog left: {} messages; node peak RSS: {} MiB; state on disk: {} MiB",
        status["queues"]["messages"],
        peak_rss_kib(pid) / 1024,
        status["storage"]["diskBytes"].as_u64().unwrap_or(0) >> 20
    );
    let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}
