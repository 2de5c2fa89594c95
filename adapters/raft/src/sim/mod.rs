//! Deterministic simulation of the replicated log: three nodes built from the adapter's own log
//! store, state machine adapter and openraft configuration run in one thread on a virtual
//! clock (tokio's paused time), over a simulated network (`net`), while a driver injects faults
//! and clients write and read. Everything random comes from one seed: the faults and their
//! timing, the network's delays and losses, the clients' choices, and openraft's own draws
//! (election timeouts, tick phase) through `runtime::QueenRuntime`. The same seed gives the
//! same run, event for event; a failing seed is printed with the command that replays it:
//!
//! ```text
//! QUEEN_RAFT_SIM_SEED=<seed> cargo test -p queen-raft --lib sim:: -- --nocapture
//! ```
//!
//! Faults: a node cut off both ways, cut one way (it cannot send, or cannot hear), a bridge
//! (two nodes that cannot see each other but both see the third), a node held (its traffic
//! waits, then arrives late and out of order: a paused process or a stalled link), random
//! loss, long random delays (reordering), and crashes (kill -9) with restarts, where the
//! backend may lose what it applied since it last persisted.
//!
//! Checks at the end of a run, after the faults are healed and every node caught up: every
//! node holds the same applied sequence; every acknowledged write is in it once, at the index
//! its acknowledgement named; a write refused as "not the leader" is not in it; no write is in
//! it twice; each client's acknowledged writes are in the order it made them; every read saw
//! every write acknowledged before the read began; no node stopped on a fatal error.

mod net;
mod node;

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::ReadPolicy;
use openraft::async_runtime::WatchReceiver;
use rand::RngExt;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Deserialize;
use serde::Serialize;
use tokio::time::Instant;

use self::net::Faults;
use self::net::Net;
use self::node::SimNode;
use crate::error::map_write_error;
use crate::type_config::Command;

/// Voters of the simulated cluster.
const VOTERS: [u64; 3] = [1, 2, 3];
/// Clients writing and reading at once.
const CLIENTS: u64 = 3;
/// How long a client waits for one operation (virtual).
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// What one run did and found.
#[derive(Debug, Default)]
struct Report {
    seed: u64,
    /// Every event, stamped with virtual milliseconds, in order.
    trace: Vec<String>,
    acked: u64,
    refused: u64,
    unknown: u64,
    reads: u64,
    faults: BTreeMap<&'static str, u64>,
    crashes: u64,
    sent: u64,
    lost: u64,
    cut: u64,
    /// Snapshots sent to a lagging node and installed.
    snapshots: u64,
    /// Highest term reached (elections held).
    term: u64,
    /// Entries in the final applied sequence.
    applied: usize,
    /// Every message's fate (only when the run was asked to keep it: QUEEN_RAFT_SIM_DUMP).
    detail: Vec<String>,
    /// What the checks found; empty for a clean run.
    anomalies: Vec<String>,
}

/// A write's outcome as a forwarding node reports it over the net.
#[derive(Debug, Serialize, Deserialize)]
enum Written {
    /// Committed and applied at this index.
    At(u64),
    /// Not the leader: not proposed.
    NotLeader(Option<u64>),
    /// Proposed or not, nobody knows.
    Unknown(String),
}

/// One client operation, as the checker sees it.
#[derive(Debug, Clone)]
enum Op {
    Write {
        client: u64,
        value: String,
        outcome: Outcome,
    },
    Read {
        /// Values acknowledged before the read began that the read did not see.
        missing: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Acked(u64),
    Refused,
    Unknown,
}

/// The shared record of a run.
#[derive(Clone)]
struct Log {
    start: Instant,
    inner: Arc<Mutex<LogInner>>,
}

#[derive(Default)]
struct LogInner {
    trace: Vec<String>,
    ops: Vec<Op>,
    /// Values acknowledged so far, in acknowledgement order.
    acked: Vec<String>,
}

impl Log {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            inner: Arc::new(Mutex::new(LogInner::default())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn event(&self, what: impl AsRef<str>) {
        let us = self.start.elapsed().as_micros();
        let line = format!("{:>6}.{:03} ms {}", us / 1000, us % 1000, what.as_ref());
        self.lock().trace.push(line);
    }

    fn op(&self, op: Op) {
        let mut l = self.lock();
        if let Op::Write {
            value,
            outcome: Outcome::Acked(_),
            ..
        } = &op
        {
            l.acked.push(value.clone());
        }
        l.ops.push(op);
    }
}

/// Write `value` through node `at`: locally if it leads, else forwarded over the net to the
/// leader it names, as the product's followers forward.
async fn write(net: &Net, at: u64, value: &str) -> Written {
    let Some(raft) = net.node(at) else {
        return Written::Unknown("node down".into());
    };
    let local = async |raft: crate::state_machine::Raft, v: String| match raft
        .client_write(Command(v.into_bytes().into()))
        .await
    {
        Ok(r) => Written::At(r.log_id.index),
        Err(e) => match map_write_error(e) {
            queen_ports::ProposeError::NotLeader { leader } => Written::NotLeader(leader),
            other => Written::Unknown(other.to_string()),
        },
    };
    match local(raft, value.to_string()).await {
        Written::NotLeader(Some(leader)) if leader != at => {
            let forwarded = net
                .call(
                    at,
                    leader,
                    &value.to_string(),
                    OP_TIMEOUT,
                    |r, v| async move { Ok::<_, String>(local(r, v).await) },
                )
                .await;
            match forwarded {
                Ok(w) => w,
                Err(e) => Written::Unknown(e.to_string()),
            }
        }
        other => other,
    }
}

/// A linearizable read through node `at`: the leader confirms its leadership and names the
/// read index (over the net when `at` follows), `at` waits until it applied that far, then
/// reads its own state. Returns the values it holds, or `None` when the read failed.
async fn read(net: &Net, nodes: &Nodes, at: u64) -> Option<HashSet<String>> {
    let raft = net.node(at)?;
    let leader = raft.metrics().borrow_watched().current_leader?;
    let index = net
        .call(at, leader, &(), OP_TIMEOUT, |r, ()| async move {
            r.ensure_linearizable(ReadPolicy::ReadIndex)
                .await
                .map(|read| read.log_id().index)
                .map_err(|e| e.to_string())
        })
        .await
        .ok()?;
    raft.wait(Some(OP_TIMEOUT))
        .applied_index_at_least(Some(index), "read index applied")
        .await
        .ok()?;
    let backend = lock(nodes)
        .iter()
        .find(|n| n.id == at && n.raft.is_some())
        .map(|n| n.backend.clone())?;
    Some(
        backend
            .state()
            .applied
            .into_iter()
            .map(|(_, c)| String::from_utf8_lossy(&c).into_owned())
            .collect(),
    )
}

type Nodes = Arc<Mutex<Vec<SimNode>>>;
/// A node's applied commands with their indexes.
type Applied = Vec<(u64, Vec<u8>)>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One client: writes unique values through random nodes, now and then a read, until `stop`.
async fn client(id: u64, seed: u64, net: Net, nodes: Nodes, log: Log, stop: Arc<AtomicBool>) {
    let mut rng = SmallRng::seed_from_u64(seed ^ (id << 32));
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let at = VOTERS[rng.random_range(0..VOTERS.len())];
        if rng.random_range(0..5) == 0 {
            let before: Vec<String> = log.lock().acked.clone();
            let read = tokio::time::timeout(OP_TIMEOUT * 2, read(&net, &nodes, at)).await;
            if let Ok(Some(seen)) = read {
                let missing: Vec<String> =
                    before.into_iter().filter(|v| !seen.contains(v)).collect();
                log.event(format!(
                    "read  c{id} at n{at}: {} values, {} missing",
                    seen.len(),
                    missing.len()
                ));
                log.op(Op::Read { missing });
            }
        } else {
            n += 1;
            let value = format!("c{id}-{n}");
            let w = tokio::time::timeout(OP_TIMEOUT * 2, write(&net, at, &value))
                .await
                .unwrap_or(Written::Unknown("client timeout".into()));
            let outcome = match &w {
                Written::At(i) => Outcome::Acked(*i),
                Written::NotLeader(_) => Outcome::Refused,
                Written::Unknown(_) => Outcome::Unknown,
            };
            log.event(format!("write {value} at n{at}: {w:?}"));
            log.op(Op::Write {
                client: id,
                value,
                outcome,
            });
        }
        let pause = rng.random_range(5..60);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// The network faults the driver chooses from; `x` is the node it targets (often the leader).
fn network_fault(rng: &mut SmallRng, x: u64) -> (&'static str, Faults) {
    let others: Vec<u64> = VOTERS.iter().copied().filter(|&v| v != x).collect();
    let mut f = Faults {
        delay_ms: (1, 3),
        ..Faults::default()
    };
    let name = match rng.random_range(0..7) {
        0 => {
            for &o in &others {
                f.cut.insert((x, o));
                f.cut.insert((o, x));
            }
            "isolate"
        }
        1 => {
            for &o in &others {
                f.cut.insert((x, o));
            }
            "mute (cannot send)"
        }
        2 => {
            for &o in &others {
                f.cut.insert((o, x));
            }
            "deafen (cannot hear)"
        }
        3 => {
            // x is the bridge: the two others cannot see each other.
            f.cut.insert((others[0], others[1]));
            f.cut.insert((others[1], others[0]));
            "bridge"
        }
        4 => {
            f.held.insert(x);
            "hold (late delivery)"
        }
        5 => {
            f.loss_per_mille = rng.random_range(50..=300);
            "loss"
        }
        _ => {
            f.delay_ms = (1, rng.random_range(50..=400));
            "delay and reorder"
        }
    };
    (name, f)
}

/// Every node's term, role, last log index and last applied index, for the trace: the finest
/// view of the run's course, so that a replay that diverges shows where.
fn states(net: &Net) -> String {
    let mut out = String::from("nodes");
    for &v in &VOTERS {
        match net.node(v) {
            Some(r) => {
                let m = r.metrics().borrow_watched().clone();
                let _ = write!(
                    out,
                    " n{v}:t{}:{:?}:log{:?}:applied{:?}",
                    m.current_term,
                    m.state,
                    m.last_log_index,
                    m.last_applied.map(|l| l.index)
                );
            }
            None => {
                let _ = write!(out, " n{v}:down");
            }
        }
    }
    out
}

/// The leader as some running node sees it.
fn leader(net: &Net) -> Option<u64> {
    VOTERS
        .iter()
        .filter_map(|&v| net.node(v))
        .find_map(|r| r.metrics().borrow_watched().current_leader)
}

/// Run one seed for `seconds` of faults (virtual), then heal, catch up and check.
fn run(seed: u64, seconds: u64) -> Report {
    run_with(seed, seconds, false, false)
}

/// `run`; with `sabotage`, a crashed node's backend forgets everything, even what it had made
/// durable (a storage engine that lies about fsync): the checks must catch it. With `detail`,
/// the report keeps every message's fate (the tests ask for it when `QUEEN_RAFT_SIM_DUMP` is
/// set).
fn run_with(seed: u64, seconds: u64, sabotage: bool, detail: bool) -> Report {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let dir = sim_dir();
    rt.block_on(crate::runtime::seeded(
        seed,
        simulate(seed, seconds, dir.path(), sabotage, detail),
    ))
}

/// A directory on tmpfs when there is one (every fsync is real; tmpfs makes it cheap).
fn sim_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::Builder::new().prefix("queen-sim").tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().expect("temp dir")
}

async fn simulate(
    seed: u64,
    seconds: u64,
    dir: &std::path::Path,
    sabotage: bool,
    detail: bool,
) -> Report {
    let mut report = Report {
        seed,
        ..Report::default()
    };
    let net = Net::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), detail);
    let log = Log::new();
    let mut rng = SmallRng::seed_from_u64(seed);
    let nodes: Nodes = Arc::new(Mutex::new(
        VOTERS
            .iter()
            .map(|&v| SimNode::new(v, dir.join(format!("n{v}"))))
            .collect(),
    ));
    for i in 0..VOTERS.len() {
        let mut n = std::mem::replace(&mut lock(&nodes)[i], SimNode::new(0, dir.into()));
        if let Err(e) = n.start(&net).await {
            report
                .anomalies
                .push(format!("node {} did not start: {e}", n.id));
        }
        lock(&nodes)[i] = n;
    }
    let first = std::mem::replace(&mut lock(&nodes)[0], SimNode::new(0, dir.into()));
    let formed = first.initialize(&VOTERS).await;
    lock(&nodes)[0] = first;
    if let Err(e) = formed {
        report.anomalies.push(format!("initialize: {e}"));
    }
    log.event("cluster formed");

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            tokio::spawn(crate::runtime::seeded(
                seed ^ (c + 1),
                client(
                    c,
                    seed,
                    net.clone(),
                    nodes.clone(),
                    log.clone(),
                    stop.clone(),
                ),
            ))
        })
        .collect();

    // The driver: a new fault every 0.5-3 s; crashes and restarts beside the network faults.
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..3000))).await;
        log.event(states(&net));
        let target = if rng.random_range(0..2) == 0 {
            leader(&net).unwrap_or(1)
        } else {
            VOTERS[rng.random_range(0..VOTERS.len())]
        };
        match rng.random_range(0..10) {
            0..=1 => {
                net.set_faults(Faults {
                    delay_ms: (1, 3),
                    ..Faults::default()
                });
                log.event("heal network");
            }
            2 => {
                let down = lock(&nodes).iter().filter(|n| n.raft.is_none()).count();
                let i = VOTERS.iter().position(|&v| v == target).unwrap_or(0);
                if down == 0 && lock(&nodes)[i].raft.is_some() {
                    let mut n =
                        std::mem::replace(&mut lock(&nodes)[i], SimNode::new(0, dir.into()));
                    let keep = rng.random_range(0..3);
                    n.crash(&net, |c| if keep == 0 { 0 } else { c - 1 }).await;
                    if sabotage {
                        n.forget_backend();
                    }
                    lock(&nodes)[i] = n;
                    report.crashes += 1;
                    *report.faults.entry("crash (kill -9)").or_default() += 1;
                    log.event(format!(
                        "crash n{target} (backend keeps {})",
                        if keep == 0 {
                            "its durable state"
                        } else {
                            "all"
                        }
                    ));
                }
            }
            3 => restart_all(&net, &nodes, &log, dir, &mut report).await,
            _ => {
                let (name, f) = network_fault(&mut rng, target);
                *report.faults.entry(name).or_default() += 1;
                log.event(format!("{name} n{target}"));
                net.set_faults(f);
            }
        }
    }

    // Heal, restart, stop the clients, and let everyone catch up.
    net.set_faults(Faults {
        delay_ms: (1, 3),
        ..Faults::default()
    });
    restart_all(&net, &nodes, &log, dir, &mut report).await;
    log.event("healed");
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    let last = final_write(&net, &log).await;
    match last {
        Some(index) => {
            for &v in &VOTERS {
                let Some(r) = net.node(v) else { continue };
                let caught_up = r
                    .wait(Some(Duration::from_secs(60)))
                    .applied_index_at_least(Some(index), "caught up")
                    .await;
                if caught_up.is_err() {
                    report
                        .anomalies
                        .push(format!("node {v} did not apply index {index} within 60 s"));
                }
            }
        }
        None => report
            .anomalies
            .push("no write was acknowledged within 60 s after healing".into()),
    }

    check(&nodes, &log, &mut report);
    (report.sent, report.lost, report.cut, report.snapshots) = net.counts();
    for n in lock(&nodes).iter() {
        if let Some(r) = &n.raft {
            report.term = report.term.max(r.metrics().borrow_watched().current_term);
        }
    }
    let nodes_now: Vec<SimNode> = std::mem::take(&mut *lock(&nodes));
    for mut n in nodes_now {
        n.crash(&net, |c| c - 1).await;
    }
    report.trace = std::mem::take(&mut log.lock().trace);
    report.detail = net.detail();
    report
}

/// Start every crashed node again.
async fn restart_all(
    net: &Net,
    nodes: &Nodes,
    log: &Log,
    dir: &std::path::Path,
    report: &mut Report,
) {
    for i in 0..VOTERS.len() {
        if lock(nodes)[i].raft.is_some() {
            continue;
        }
        let mut n = std::mem::replace(&mut lock(nodes)[i], SimNode::new(0, dir.into()));
        match n.start(net).await {
            Ok(()) => log.event(format!("restart n{}", n.id)),
            Err(e) => report
                .anomalies
                .push(format!("node {} did not restart: {e}", n.id)),
        }
        lock(nodes)[i] = n;
    }
}

/// One write through the leader after healing, retried for 60 s: its index is where every node
/// must catch up to.
async fn final_write(net: &Net, log: &Log) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    while Instant::now() < deadline {
        n += 1;
        if let Some(l) = leader(net) {
            let value = format!("final-{n}");
            let w = write(net, l, &value).await;
            log.event(format!("write {value} at n{l}: {w:?}"));
            let outcome = match &w {
                Written::At(i) => Outcome::Acked(*i),
                Written::NotLeader(_) => Outcome::Refused,
                Written::Unknown(_) => Outcome::Unknown,
            };
            log.op(Op::Write {
                client: u64::MAX,
                value,
                outcome,
            });
            if let Written::At(i) = w {
                return Some(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Compare every node's applied sequence with the history of operations.
fn check(nodes: &Nodes, log: &Log, report: &mut Report) {
    let states: Vec<(u64, Applied, bool)> = lock(nodes)
        .iter()
        .map(|n| {
            let running = n
                .raft
                .as_ref()
                .is_some_and(|r| r.metrics().borrow_watched().running_state.is_ok());
            (n.id, n.backend.state().applied, running)
        })
        .collect();
    for (id, _, running) in &states {
        if !running {
            report
                .anomalies
                .push(format!("node {id} stopped on a fatal error"));
        }
    }
    let Some((first_id, reference, _)) = states.first() else {
        return;
    };
    for (id, applied, _) in &states[1..] {
        if applied != reference {
            let at = applied
                .iter()
                .zip(reference.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(applied.len().min(reference.len()));
            report.anomalies.push(format!(
                "node {id} applied {} entries, node {first_id} {}; they differ from position {at}",
                applied.len(),
                reference.len()
            ));
        }
    }
    report.applied = reference.len();

    let mut at: HashMap<String, Vec<u64>> = HashMap::new();
    for (index, cmd) in reference {
        at.entry(String::from_utf8_lossy(cmd).into_owned())
            .or_default()
            .push(*index);
    }
    let ops = log.lock().ops.clone();
    let mut last_by_client: HashMap<u64, u64> = HashMap::new();
    for op in &ops {
        match op {
            Op::Write {
                client,
                value,
                outcome,
            } => {
                let found = at.get(value).map(Vec::as_slice).unwrap_or_default();
                if found.len() > 1 {
                    report
                        .anomalies
                        .push(format!("{value} applied {} times: {found:?}", found.len()));
                }
                match outcome {
                    Outcome::Acked(i) => {
                        report.acked += 1;
                        if found != [*i] {
                            report.anomalies.push(format!(
                                "{value} acknowledged at index {i} but applied at {found:?}"
                            ));
                        }
                        let prev = last_by_client.insert(*client, *i);
                        if prev.is_some_and(|p| p >= *i) {
                            report.anomalies.push(format!(
                                "client {client}: {value} at index {i} after an earlier write at {prev:?}"
                            ));
                        }
                    }
                    Outcome::Refused => {
                        report.refused += 1;
                        if !found.is_empty() {
                            report.anomalies.push(format!(
                                "{value} was refused (not the leader) but applied at {found:?}"
                            ));
                        }
                    }
                    Outcome::Unknown => report.unknown += 1,
                }
            }
            Op::Read { missing } => {
                report.reads += 1;
                if !missing.is_empty() {
                    report.anomalies.push(format!(
                        "a read missed {} acknowledged writes, first {}",
                        missing.len(),
                        missing[0]
                    ));
                }
            }
        }
    }
}

impl Report {
    /// One line of figures, named by the seed.
    fn summary(&self) -> String {
        format!("seed {}: {}", self.seed, self.figures())
    }

    /// The figures alone.
    fn figures(&self) -> String {
        let mut faults = String::new();
        for (k, v) in &self.faults {
            let _ = write!(faults, "{k} {v}, ");
        }
        format!(
            "{} acked, {} refused, {} unknown, {} reads, {} applied, highest term {}, {} crashes, {} snapshots installed, faults [{}], messages {} ({} lost, {} cut), {} anomalies",
            self.acked,
            self.refused,
            self.unknown,
            self.reads,
            self.applied,
            self.term,
            self.crashes,
            self.snapshots,
            faults.trim_end_matches(", "),
            self.sent,
            self.lost,
            self.cut,
            self.anomalies.len()
        )
    }
}

#[cfg(test)]
mod tests;
