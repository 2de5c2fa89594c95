//! queen-sink-bench: how fast the embedded S3 sink mirrors what the broker takes in.
//!
//! Starts one `queen` node (release build beside this binary) with the sink writing to a local
//! folder (or to `--s3-endpoint`), pushes `--mb` megabytes of records into one queue and then
//! into eight, and reports for each run: the push rate, how long the lake took to hold every
//! record, lake records/s and bytes/s (uncompressed and as stored), CPU seconds per MB, the
//! node's peak memory against `QUEEN_S3_MEMORY_MB`, and the largest lag the sink reported.
//!
//!     cargo build --release -p queen -p queen-bench
//!     ./target/release/queen-sink-bench --mb 256

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use queen_bench::load::{cpu_seconds, peak_rss_kib};
use serde_json::Value;

#[derive(Parser, Debug)]
#[command(about = "Throughput, CPU, memory and lag of the embedded S3 sink")]
struct Args {
    /// Megabytes of payload to push per run.
    #[arg(long, default_value_t = 256)]
    mb: u64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    record_bytes: usize,
    /// Records per push request.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Concurrent pushing connections.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// QUEEN_S3_MEMORY_MB for the node.
    #[arg(long, default_value_t = 128)]
    memory_mb: u64,
    /// QUEEN_S3_TARGET_MB for the node.
    #[arg(long, default_value_t = 32)]
    target_mb: u64,
    /// Object format: jsonl or parquet.
    #[arg(long, default_value = "jsonl")]
    format: String,
    /// An S3 endpoint (path style, bucket `lake`, keys from QUEEN_S3_ACCESS_KEY/SECRET_KEY)
    /// instead of a local folder.
    #[arg(long)]
    s3_endpoint: Option<String>,
    /// The queen binary [default: beside this one].
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Run the same pushes with the sink off too, to show the broker's own CPU and memory.
    #[arg(long)]
    baseline: bool,
    /// Give up waiting for the lake after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

struct NodeProc {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(6632, |a| a.port())
}

/// One HTTP/1.1 request on a fresh or kept connection; the status and body.
fn request(
    stream: &mut BufReader<TcpStream>,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let w = stream.get_mut();
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    let mut line = String::new();
    stream.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut len = 0usize;
    let mut chunked = false;
    loop {
        line.clear();
        stream.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let lower = l.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let mut out = Vec::new();
    if chunked {
        loop {
            line.clear();
            stream.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0u8; n + 2];
            stream.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
    } else {
        out.resize(len, 0);
        stream.read_exact(&mut out)?;
    }
    Ok((status, out))
}

fn connect(port: u16) -> std::io::Result<BufReader<TcpStream>> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    Ok(BufReader::new(s))
}

fn get_json(port: u16, path: &str) -> Option<Value> {
    let mut c = connect(port).ok()?;
    let (status, body) = request(&mut c, "GET", path, b"").ok()?;
    if status != 200 {
        return None;
    }
    match serde_json::from_slice(&body) {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!(
                "{path}: {e}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            );
            None
        }
    }
}

fn start(args: &Args, bin: &PathBuf, sink: bool) -> NodeProc {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.env("PORT", port.to_string())
        .env("HOST", "127.0.0.1")
        .env("QUEEN_RAFT_DIR", dir.path().join("data"))
        .env("RUST_LOG", "warn")
        // Measure the sink, not the shared disk: the 85% disk gate must not refuse pushes here.
        .env("QUEEN_RAFT_DISK_HIGH_PCT", "100")
        .env("QUEEN_S3_EMBEDDED", if sink { "true" } else { "false" })
        .env("QUEEN_S3_QUEUES", "*")
        .env("QUEEN_S3_START", "earliest")
        .env("QUEEN_S3_MAX_WINDOW_MS", "2000")
        .env("QUEEN_S3_SAFE_GUARD_MS", "1000")
        .env("QUEEN_S3_FORMAT", &args.format)
        .env("QUEEN_S3_MEMORY_MB", args.memory_mb.to_string())
        .env("QUEEN_S3_TARGET_MB", args.target_mb.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match &args.s3_endpoint {
        Some(e) => {
            cmd.env("QUEEN_S3_ENDPOINT", e)
                .env("QUEEN_S3_PATH_STYLE", "true")
                .env("QUEEN_S3_BUCKET", "lake");
        }
        None => {
            cmd.env(
                "QUEEN_S3_ENDPOINT",
                format!("file://{}", dir.path().join("lake").display()),
            );
        }
    }
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let node = NodeProc {
        child,
        port,
        _dir: dir,
    };
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if get_json(port, "/health").is_some() {
            return node;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("queen did not become healthy");
}

/// Peak resident memory (VmHWM), in MiB.
fn peak_mib(pid: u32) -> f64 {
    peak_rss_kib(pid) as f64 / 1024.0
}

/// Records and object bytes the sink committed, and the largest lag among queues.
fn sink_progress(port: u16) -> (u64, u64, f64) {
    let Some(s) = get_json(port, "/status") else {
        return (0, 0, 0.0);
    };
    let rows = s["s3"]["sinks"][0]["queues"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let records = rows
        .iter()
        .map(|q| q["records"].as_u64().unwrap_or(0))
        .sum();
    let bytes = rows.iter().map(|q| q["bytes"].as_u64().unwrap_or(0)).sum();
    let lag = rows
        .iter()
        .map(|q| q["lagSeconds"].as_f64().unwrap_or(0.0))
        .fold(0.0, f64::max);
    (records, bytes, lag)
}

fn run(args: &Args, bin: &PathBuf, queues: usize, sink: bool) {
    let node = start(args, bin, sink);
    let pid = node.child.id();
    let port = node.port;
    let total_records = (args.mb * 1024 * 1024) / args.record_bytes as u64;
    let requests = total_records.div_ceil(args.batch as u64);
    let next = Arc::new(AtomicU64::new(0));
    let pushed = Arc::new(AtomicU64::new(0));
    let cpu0 = cpu_seconds(&pid.to_string());
    let t0 = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.connections {
        let (next, pushed) = (next.clone(), pushed.clone());
        let (batch, record_bytes) = (args.batch, args.record_bytes);
        workers.push(std::thread::spawn(move || {
            let mut c = connect(port).expect("connect");
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    return;
                }
                let q = i as usize % queues;
                // A fresh random payload per record: a repeated one would compress to nothing in
                // the sink's files and flatter its figures.
                let mut rng = queen_bench::load::Rng::seeded(i);
                let items: Vec<String> = (0..batch)
                    .map(|j| {
                        let mut payload = String::with_capacity(record_bytes);
                        queen_bench::load::random_payload(&mut rng, record_bytes, &mut payload);
                        format!("{{\"queue\":\"bench-{q}\",\"partition\":\"p{}\",\"payload\":{payload}}}", j % 4)
                    })
                    .collect();
                let body = format!("{{\"items\":[{}]}}", items.join(","));
                match request(&mut c, "POST", "/api/v1/push", body.as_bytes()) {
                    Ok((200, _)) => {
                        pushed.fetch_add(batch as u64, Ordering::Relaxed);
                    }
                    _ => {
                        c = connect(port).expect("reconnect");
                    }
                }
            }
        }));
    }
    let mut max_lag: f64 = 0.0;
    while workers.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(Duration::from_millis(500));
        max_lag = max_lag.max(sink_progress(port).2);
    }
    for w in workers {
        let _ = w.join();
    }
    let push_secs = t0.elapsed().as_secs_f64();
    let pushed = pushed.load(Ordering::Relaxed);
    if !sink {
        let cpu = cpu_seconds(&pid.to_string()) - cpu0;
        let mb = (pushed * args.record_bytes as u64) as f64 / (1024.0 * 1024.0);
        let push_peak = peak_mib(pid);
        // A consumer reading every record once fills the store's block cache as the sink's
        // reads do: that share of memory is the broker's, whoever reads.
        let t1 = Instant::now();
        let read = read_back(port, queues, args.timeout_secs);
        println!(
            "{queues:>2} queue(s), sink off | pushed {pushed} records ({mb:.0} MB) in {push_secs:.1} s = {:.0} rec/s | CPU {:.2} s per MB | peak RSS {push_peak:.0} MiB; after a consumer read all {read} records back in {:.1} s: {:.0} MiB",
            pushed as f64 / push_secs,
            cpu / mb.max(1.0),
            t1.elapsed().as_secs_f64(),
            peak_mib(pid)
        );
        return;
    }
    let until = Instant::now() + Duration::from_secs(args.timeout_secs);
    let (mut records, mut bytes) = (0, 0);
    while Instant::now() < until {
        let (r, b, lag) = sink_progress(port);
        (records, bytes) = (r, b);
        max_lag = max_lag.max(lag);
        if r >= pushed {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let lake_secs = t0.elapsed().as_secs_f64();
    let peak_buffered = get_json(port, "/status")
        .and_then(|s| s["s3"]["sinks"][0]["memory"]["peakBytes"].as_u64())
        .unwrap_or(0);
    let cpu = cpu_seconds(&pid.to_string()) - cpu0;
    let mb = (pushed * args.record_bytes as u64) as f64 / (1024.0 * 1024.0);
    println!(
        "{queues:>2} queue(s) | pushed {pushed} records ({mb:.0} MB) in {push_secs:.1} s = {:.0} rec/s | lake complete after {lake_secs:.1} s: {records} records, {:.0} rec/s, {:.1} MB/s uncompressed, {:.1} MB/s stored ({} MB objects) | CPU {:.2} s per MB (whole node) | peak RSS {:.0} MiB, sink buffers at most {:.0} MiB (QUEEN_S3_MEMORY_MB={}, QUEEN_S3_TARGET_MB={}) | max lag {max_lag:.1} s{}",
        pushed as f64 / push_secs,
        records as f64 / lake_secs,
        mb / lake_secs,
        bytes as f64 / (1024.0 * 1024.0) / lake_secs,
        bytes / (1024 * 1024),
        cpu / mb.max(1.0),
        peak_mib(pid),
        peak_buffered as f64 / (1024.0 * 1024.0),
        args.memory_mb,
        args.target_mb,
        if records < pushed {
            "  (INCOMPLETE: timed out)"
        } else {
            ""
        },
    );
}

/// Pop every record of the bench's queues once (consumer group `bench-reader`, committed at
/// delivery); answers how many were read.
fn read_back(port: u16, queues: usize, timeout_secs: u64) -> u64 {
    let until = Instant::now() + Duration::from_secs(timeout_secs);
    let mut read = 0;
    let Ok(mut c) = connect(port) else { return 0 };
    for q in 0..queues {
        for p in 0..4 {
            let path = format!(
                "/api/v1/pop/queue/bench-{q}/partition/p{p}?batch=1000&autoAck=true&consumerGroup=bench-reader"
            );
            while Instant::now() < until {
                let Ok((status, body)) = request(&mut c, "GET", &path, b"") else {
                    return read;
                };
                let n = if status == 200 {
                    serde_json::from_slice::<Value>(&body)
                        .ok()
                        .and_then(|v| v["messages"].as_array().map(Vec::len))
                        .unwrap_or(0)
                } else {
                    0
                };
                if n == 0 {
                    break;
                }
                read += n as u64;
            }
        }
    }
    read
}

fn main() {
    let args = Args::parse();
    let bin = args.bin.clone().unwrap_or_else(|| {
        let sibling = std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.join("queen")));
        sibling
            .filter(|s| s.is_file())
            .unwrap_or_else(|| PathBuf::from("target/release/queen"))
    });
    println!(
        "queen-sink-bench: {} MB of {}-byte records, {} per request, {} connections, format {}",
        args.mb, args.record_bytes, args.batch, args.connections, args.format
    );
    for queues in [1, 8] {
        if args.baseline {
            run(&args, &bin, queues, false);
        }
        run(&args, &bin, queues, true);
    }
}
