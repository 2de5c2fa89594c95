//! `queen-bench partitions --counts 1000,50000,...`: consumption at scale (issue 60). For each
//! partition count N, on fresh nodes with an empty store (one node, three nodes, or both):
//! fill one queue with one message in each of N partitions (100 per push request, a few
//! requests in flight), then drain it with consumers that pop the queue without naming a
//! partition, the way the official client's default consumer does (`autopilot=true`, long poll,
//! no knobs unless `--batch`/`--pop-partitions` set them), acking every answer with one
//! `ack/batch`. Prints, per N and topology: fill time, drain rate, messages per pop, pop
//! p50/p99, the servers' CPU per message during the drain (every node summed), each node's peak
//! RSS and its store's bytes on disk per partition. Every phase is bounded in time; a drain cut
//! short says how far it got.

mod drain;
mod report;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use queen_bench::load::{self, Procs, drain};

use crate::cluster::{To, start_queen};
use crate::pop::pop_ack;
use crate::{Args, Target, http_client, queen_bin, start_single};
use drain::{Drained, drain_queue};

/// The queue every run fills and drains (each run has a store of its own).
const QUEUE: &str = "scale";

#[derive(clap::Args, Debug)]
pub struct PartitionsArgs {
    /// Partition counts, comma-separated; one message in each partition, fresh nodes and an
    /// empty store for every count and topology.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000")]
    counts: Vec<u64>,
    /// Topologies to run for each count: one node, three nodes, or both.
    #[arg(long, value_enum, default_value_t = Nodes::Both)]
    nodes: Nodes,
    /// Consumers draining the queue, each with one request at a time.
    #[arg(long, default_value_t = 16)]
    consumers: usize,
    /// Push requests (100 messages each) in flight during the fill.
    #[arg(long, default_value_t = 4)]
    fill_inflight: usize,
    /// Longest fill, seconds; what a fill cut short stored is drained and reported.
    #[arg(long, default_value_t = 600)]
    fill_max_seconds: u64,
    /// Longest drain, seconds; a drain cut short is reported as "drained X of N".
    #[arg(long, default_value_t = 300)]
    max_seconds: u64,
    /// `batch` sent on every pop (default: not sent; the broker's autopilot picks it).
    #[arg(long)]
    batch: Option<u32>,
    /// `partitions` sent on every pop (default: not sent; the broker's autopilot picks it).
    #[arg(long)]
    pop_partitions: Option<u32>,
    /// The pops' long-poll `timeout` in ms (they send `wait=true`, as the client's consumer).
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Which of the three nodes the fill and the consumers talk to (consumer i to node i mod 3
    /// with `all`; followers forward).
    #[arg(long, value_enum, default_value_t = To::Leader)]
    to: To,
    /// On one node: after the fill, stop the node (SIGTERM) and start it again on the same
    /// store, and time its /health and its first pop (issue 60: within 10 s at a million
    /// partitions).
    #[arg(long)]
    restart: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Nodes {
    One,
    Three,
    Both,
}

impl Nodes {
    fn list(self) -> &'static [usize] {
        match self {
            Nodes::One => &[1],
            Nodes::Three => &[3],
            Nodes::Both => &[1, 3],
        }
    }
}

/// What one run (one count, one topology) found.
struct Outcome {
    nodes: usize,
    partitions: u64,
    /// Messages the fill stored, and how long it took.
    filled: u64,
    fill_seconds: f64,
    fill_error: Option<String>,
    drain: Drained,
    /// Peak RSS (VmHWM) of each node over the whole run, MiB.
    rss_mib: Vec<u64>,
    /// Bytes on disk of each node's store after the fill and after the drain.
    disk_filled: Vec<u64>,
    disk_drained: Vec<u64>,
    restart: Option<Restart>,
}

/// A restart on the filled store: seconds to /health, then to the first pop's answer with
/// messages (which are acked and counted in the drain).
struct Restart {
    healthy_s: f64,
    first_pop_s: f64,
}

/// The pop request of every consumer, with the knobs the client would send (API.md 2.0.7):
/// `autopilot=true` and only the knobs set; both knobs set: no autopilot, `partitions` only
/// above 1.
fn pop_path(p: &PartitionsArgs) -> String {
    let mut q = String::new();
    let both = p.batch.is_some() && p.pop_partitions.is_some();
    if !both {
        q.push_str("autopilot=true&");
    }
    if let Some(b) = p.batch {
        let _ = write!(q, "batch={b}&");
    }
    let _ = write!(q, "wait=true&timeout={}", p.timeout_ms);
    match p.pop_partitions {
        Some(n) if n > 1 || !both => {
            let _ = write!(q, "&partitions={n}");
        }
        _ => {}
    }
    format!("/api/v1/pop/queue/{QUEUE}?{q}")
}

pub async fn run(args: &Args, p: &PartitionsArgs) -> Result<(), String> {
    // Declared first so it is removed last, after every process below has stopped.
    let dir = tempfile::tempdir_in(".")
        .or_else(|_| tempfile::tempdir())
        .map_err(|e| format!("a temp dir: {e}"))?;
    let bin = queen_bin(args.bin.as_ref());
    let path = pop_path(p);
    let prefix = load::run_prefix(&mut load::Rng::seeded(u64::from(std::process::id())));
    println!(
        "queen-bench partitions: {} ({}), {}-byte messages, fill 100/request with {} in flight, {} consumers popping `GET {path}` and acking with ack/batch{}, drain capped at {} s; data in {}",
        bin.display(),
        version(&bin),
        args.size,
        p.fill_inflight,
        p.consumers,
        if p.nodes == Nodes::One {
            String::new()
        } else {
            format!(
                ", on three nodes to {}",
                if p.to == To::All {
                    "every node"
                } else {
                    "the leader"
                }
            )
        },
        p.max_seconds,
        dir.path().display()
    );
    let mut found = Vec::new();
    for &n in &p.counts {
        for &nodes in p.nodes.list() {
            let run_dir = dir.path().join(format!("n{n}-{nodes}"));
            let tag = format!("{prefix}-{n}-{nodes}-");
            let r = one_run(args, p, &bin, &run_dir, nodes, n, &tag, &path).await;
            // A million partitions take a few GB: free them before the next run.
            let _ = std::fs::remove_dir_all(&run_dir);
            match r {
                Ok(o) => {
                    report::print_run(&o);
                    found.push(o);
                }
                Err(e) => println!("{n} partitions on {nodes} node(s): failed: {e}"),
            }
        }
    }
    println!("\n{}", report::table(&found));
    Ok(())
}

/// The queen binary's `--version` line, or "?".
fn version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "?".into())
}

/// Fresh nodes in `dir`: their processes, where the clients send, and each node's data dir.
async fn start(
    bin: &Path,
    dir: &Path,
    nodes: usize,
    to: To,
) -> Result<(Procs, Arc<Target>, Vec<PathBuf>), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if nodes == 1 {
        let (procs, port) = start_single(bin, dir).await?;
        let t = Target::new(http_client(), &[port]);
        settled(&t).await?;
        return Ok((procs, Arc::new(t), vec![dir.to_path_buf()]));
    }
    let q = start_queen(bin, dir).await?;
    let ports = match to {
        To::All => q.ports.clone(),
        To::Leader => vec![q.ports[q.leader]],
    };
    let data = (1..=3).map(|i| dir.join(format!("queen-{i}"))).collect();
    let t = Target::new(http_client(), &ports);
    settled(&t).await?;
    Ok((q.procs, Arc::new(t), data))
}

/// Wait (30 s at most) until the cluster runs the newest log format its members read
/// (`raft.clusterVersion` = `raft.kinds`). A fresh cluster raises it a second or two after its
/// members answer: a queue made before fills its groups' ready indexes while it is drained
/// (the path of a store an older build wrote), which is not the shape this bench measures.
async fn settled(t: &Target) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let h = t.json("/health").await;
        let (version, kinds) = (&h["raft"]["clusterVersion"], &h["raft"]["kinds"]);
        if version.is_u64() && version == kinds {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!(
                "the cluster version did not reach the members' format within 30 s: {h}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn one_run(
    args: &Args,
    p: &PartitionsArgs,
    bin: &Path,
    dir: &Path,
    nodes: usize,
    n: u64,
    tag: &str,
    path: &str,
) -> Result<Outcome, String> {
    let (mut procs, mut t, data) = start(bin, dir, nodes, p.to).await?;
    println!(
        "\n{n} partitions on {nodes} node(s) (pids {:?}): filling",
        procs.pids()
    );
    let requests = n.div_ceil(100);
    let fill = drain(p.fill_inflight, p.fill_max_seconds, 1, {
        let (t, tag, size) = (t.clone(), Arc::<str>::from(tag), args.size);
        move |k| {
            let (t, tag) = (t.clone(), tag.clone());
            async move {
                if k < requests {
                    push_fill(&t, &tag, k, n, size).await.map(Some)
                } else {
                    Ok(None)
                }
            }
        }
    })
    .await;
    let disk_filled = data.iter().map(|d| du(d)).collect();
    println!(
        "  filled {} of {n} in {:.1} s ({:.0} msg/s), {} errors; draining",
        fill.messages,
        fill.seconds,
        fill.msg_per_s(),
        fill.errors
    );
    let mut rss_kib = vec![0; nodes];
    let mut restart = None;
    let mut moved = Drained::default();
    if p.restart && nodes == 1 {
        rss_kib[0] = load::peak_rss_kib(procs.pids()[0]);
        procs.stop_all();
        let started = Instant::now();
        let (again, port) = start_single(bin, dir).await?;
        let healthy_s = started.elapsed().as_secs_f64();
        (procs, t) = (again, Arc::new(Target::new(http_client(), &[port])));
        let first = pop_ack(&t, 0, path).await?;
        let first_pop_s = started.elapsed().as_secs_f64();
        if let Some(pa) = first {
            moved.messages = pa.messages;
            moved.pops = 1;
        }
        println!(
            "  restarted (pid {:?}): healthy after {healthy_s:.2} s, first pop answered {} message(s) after {first_pop_s:.2} s",
            procs.pids(),
            moved.messages
        );
        restart = Some(Restart {
            healthy_s,
            first_pop_s,
        });
    }
    let mut drained = drain_queue(
        &t,
        &procs,
        path,
        p.consumers,
        fill.messages.saturating_sub(moved.messages),
        Duration::from_secs(p.max_seconds),
    )
    .await;
    (drained.messages, drained.pops) =
        (drained.messages + moved.messages, drained.pops + moved.pops);
    let rss_mib = procs
        .pids()
        .into_iter()
        .zip(rss_kib)
        .map(|(pid, before)| load::peak_rss_kib(pid).max(before) / 1024)
        .collect();
    let disk_drained = data.iter().map(|d| du(d)).collect();
    drop(procs);
    Ok(Outcome {
        nodes,
        partitions: n,
        filled: fill.messages,
        fill_seconds: fill.seconds,
        fill_error: fill.first_error,
        drain: drained,
        rss_mib,
        disk_filled,
        disk_drained,
        restart,
    })
}

/// Push request `k` of the fill: partitions `p{100k}` to `p{100k+99}` (below `n`), one message
/// each; answers the messages it stored.
async fn push_fill(t: &Target, tag: &str, k: u64, n: u64, size: usize) -> Result<u64, String> {
    let (first, end) = (k * 100, (k * 100 + 100).min(n));
    let mut rng = load::Rng::seeded(k);
    let mut body = String::with_capacity((end - first) as usize * (size + 96) + 12);
    body.push_str("{\"items\":[");
    for idx in first..end {
        if idx > first {
            body.push(',');
        }
        // Names and ids are JSON-safe by construction (no escapes needed).
        let _ = write!(
            body,
            "{{\"queue\":\"{QUEUE}\",\"partition\":\"p{idx}\",\"transactionId\":\"{tag}{idx}\",\"payload\":"
        );
        load::random_payload(&mut rng, size, &mut body);
        body.push('}');
    }
    body.push_str("]}");
    match t
        .send_at(
            k,
            "POST",
            "/api/v1/push",
            "application/json",
            Bytes::from(body),
        )
        .await?
    {
        (200, b) if !b.windows(8).any(|w| w == b"\"failed\"") => Ok(end - first),
        (code, b) => Err(format!(
            "push answered {code}: {}",
            String::from_utf8_lossy(&b[..b.len().min(300)])
        )),
    }
}

/// Bytes a directory takes on disk (allocated blocks, as `du` counts them), recursively.
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => du(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        p: super::PartitionsArgs,
    }

    fn path(args: &[&str]) -> String {
        let cli = Cli::parse_from(std::iter::once("partitions").chain(args.iter().copied()));
        super::pop_path(&cli.p)
    }

    #[test]
    fn pops_carry_the_knobs_the_way_the_official_client_sends_them() {
        let q = "/api/v1/pop/queue/scale?";
        assert_eq!(
            path(&[]),
            format!("{q}autopilot=true&wait=true&timeout=30000")
        );
        assert_eq!(
            path(&["--batch", "5"]),
            format!("{q}autopilot=true&batch=5&wait=true&timeout=30000")
        );
        assert_eq!(
            path(&["--pop-partitions", "4", "--timeout-ms", "500"]),
            format!("{q}autopilot=true&wait=true&timeout=500&partitions=4")
        );
        assert_eq!(
            path(&["--batch", "100", "--pop-partitions", "100"]),
            format!("{q}batch=100&wait=true&timeout=30000&partitions=100")
        );
        assert_eq!(
            path(&["--batch", "100", "--pop-partitions", "1"]),
            format!("{q}batch=100&wait=true&timeout=30000")
        );
    }
}
