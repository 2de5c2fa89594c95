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

mod backlog;
mod ephemeral;
mod failover;
mod groups;
mod nats;
mod profile;
mod report;
mod rounds;
mod start;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream;

use crate::{Args, Target, http_client, queen_bin};
use backlog::backlog;
use nats::nats_bin;
use queen_bench::load::{self, Procs, Stats};
use report::{bench_cpu, goals_table, rounds_table};
use rounds::rounds;
pub(crate) use start::start_queen;

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
    /// Instead of the rounds: kill the serving leader with SIGKILL this many times (restarting
    /// it each time) and time the first acknowledged write and the sink's takeover of its queues.
    #[arg(long, default_value_t = 0)]
    failover: usize,
    /// The sink's lease TTL in the failover run, milliseconds.
    #[arg(long, default_value_t = 10_000)]
    sink_ttl_ms: u64,
    /// Instead of the rounds: ephemeral queues (push 1/request, pop + ack) beside a NATS
    /// JetStream stream in memory with one replica (`--vs-nats`).
    #[arg(long)]
    ephemeral: bool,
    /// Instead of the rounds: three nodes with one raft group against three nodes with this
    /// many (`QUEEN_RAFT_GROUPS`), clients writing one tenant per group, 100 per request, each
    /// request to its group's leader; prints rates, CPU per message and per node, and which
    /// node leads which group. 0 skips it.
    #[arg(long, default_value_t = 0)]
    groups: u16,
    /// The sink's queues in the failover run (rounded down to a multiple of 3).
    #[arg(long, default_value_t = 6)]
    sink_queues: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum To {
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
    /// (requests in flight, messages per request) of this mode.
    fn shape(self, c: &ClusterArgs) -> (usize, usize) {
        match self {
            Mode::Single => (c.inflight, 1),
            Mode::Pop => (c.consumers, 100),
            Mode::Batch | Mode::Qpb1 => (c.batch_inflight, 100),
        }
    }

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

pub(crate) struct Queen {
    pub(crate) procs: Procs,
    pub(crate) ports: Vec<u16>,
    pub(crate) leader: usize,
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

    /// The highest raft term any node reports (each election raises it).
    async fn term(&self) -> u64 {
        let mut term = 0;
        for i in 0..3u64 {
            term = term.max(
                self.all.json_at(i, "/health").await["raft"]["term"]
                    .as_u64()
                    .unwrap_or(0),
            );
        }
        term
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

    if c.ephemeral {
        return ephemeral::ephemeral(
            args,
            c,
            &bin,
            nats_bin.as_deref(),
            &dir.path().join("ephemeral"),
        )
        .await;
    }
    if c.groups > 0 {
        return groups::groups(args, c, &bin, &dir.path().join("groups"), &prefix).await;
    }
    if c.failover > 0 {
        return failover::failover(&bin, &dir.path().join("failover"), c).await;
    }
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
