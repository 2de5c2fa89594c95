//! `queen-bench cluster --ephemeral [--vs-nats]`: ephemeral queues on three queen nodes, and in
//! the same run a three-server NATS JetStream cluster with a memory-storage stream of one
//! replica (what NATS offers for messages that need not survive a restart). Phases alternate
//! between the systems per round:
//! - push, one message per request, `--inflight` in flight: queen's requests go to the three
//!   nodes in turn (each hands a push to its partition's owner), twelve partitions; NATS: one
//!   publish awaiting its PubAck;
//! - pop 100 + ack: `--consumers` loops popping up to 100 (each through a node in turn) and
//!   acking them with one request; NATS: the pull consumer, fetching up to 100 and acking each.
//!
//! Prints each phase, then per mode the medians, the ratio queen/NATS and the issue's goal
//! (push at least 1.5x NATS), and every process's peak RSS beside `QUEEN_EPHEMERAL_MAX_BYTES`.

use std::path::Path;
use std::sync::Arc;

use async_nats::jetstream;
use queen_bench::load::{self, Procs, Stats, drain, drive};
use serde_json::{Value, json};

use super::nats::{nats_pop_ack, nats_publish, start_nats_with};
use super::start::start_queen;
use super::{ClusterArgs, rss_mib};
use crate::{Args, Target, http_client};

const QUEUE: &str = "bench-eph";
const PARTITIONS: u64 = 12;

struct Phase {
    system: &'static str,
    mode: &'static str,
    st: Stats,
    cpu_us: f64,
}

fn cpu_us(procs: &Procs, before: f64, st: &Stats) -> f64 {
    (procs.cpu_seconds() - before) * 1e6 / st.messages.max(1) as f64
}

async fn queen_push(t: &Arc<Target>, inflight: usize, seconds: u64, size: usize) -> Stats {
    let t = t.clone();
    drive(inflight, seconds, move |n| {
        let t = t.clone();
        async move {
            let mut rng = load::Rng::seeded(n);
            let mut payload = String::with_capacity(size);
            load::random_payload(&mut rng, size, &mut payload);
            let body = format!(
                r#"{{"queue":"{QUEUE}","partition":"p{}","messages":[{{"payload":{payload}}}]}}"#,
                n % PARTITIONS
            );
            match t
                .call_at(n, "POST", "/api/v1/ephemeral/push", Some(body))
                .await?
            {
                (201, _) => Ok(1),
                (s, b) => Err(format!("push: {s} {}", String::from_utf8_lossy(&b))),
            }
        }
    })
    .await
}

async fn queen_pop_ack(t: &Arc<Target>, consumers: usize, seconds: u64) -> Stats {
    let t = t.clone();
    drain(consumers, seconds, 3, move |n| {
        let t = t.clone();
        async move {
            let path = format!("/api/v1/ephemeral/pop?queue={QUEUE}&batch=100&group=bench");
            let (s, b) = t.call_at(n, "GET", &path, None).await?;
            if s != 200 {
                return Err(format!("pop: {s} {}", String::from_utf8_lossy(&b)));
            }
            let v: Value = serde_json::from_slice(&b).map_err(|e| e.to_string())?;
            let ids: Vec<Value> = v["messages"]
                .as_array()
                .map(|a| a.iter().map(|m| json!({"id": m["id"]})).collect())
                .unwrap_or_default();
            if ids.is_empty() {
                return Ok(None);
            }
            let n_ids = ids.len() as u64;
            let body = json!({"queue": QUEUE, "group": "bench", "acks": ids}).to_string();
            match t
                .call_at(n, "POST", "/api/v1/ephemeral/ack", Some(body))
                .await?
            {
                (200, _) => Ok(Some(n_ids)),
                (s, b) => Err(format!("ack: {s} {}", String::from_utf8_lossy(&b))),
            }
        }
    })
    .await
}

pub(super) async fn ephemeral(
    args: &Args,
    c: &ClusterArgs,
    bin: &Path,
    nats_bin: Option<&Path>,
    dir: &Path,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let qdir = dir.join("queen");
    std::fs::create_dir_all(&qdir).map_err(|e| format!("{}: {e}", qdir.display()))?;
    let mut queen = start_queen(bin, &qdir).await?;
    let t = Arc::new(Target::new(http_client(), &queen.ports));
    // Room for a whole push phase: the budget, not the queue's default length, bounds it.
    let (s, b) = t
        .call(
            "POST",
            "/api/v1/ephemeral/configure",
            Some(json!({"queue": QUEUE, "options": {"maxLength": 10_000_000, "maxBytes": 1u64 << 40}}).to_string()),
        )
        .await?;
    if s != 200 {
        return Err(format!("configure: {s} {}", String::from_utf8_lossy(&b)));
    }
    let mut nats = match nats_bin {
        Some(nb) => Some(
            start_nats_with(
                nb,
                &dir.join("nats"),
                jetstream::stream::StorageType::Memory,
                1,
            )
            .await?,
        ),
        None => None,
    };
    let mut phases: Vec<Phase> = Vec::new();
    for round in 0..c.rounds.max(1) {
        let queen_first = round % 2 == 0;
        for step in 0..2 {
            let queen_turn = (step == 0) == queen_first;
            let before_step = phases.len();
            if queen_turn {
                let before = queen.procs.cpu_seconds();
                let st = queen_push(&t, c.inflight, args.seconds, args.size).await;
                let cpu = cpu_us(&queen.procs, before, &st);
                phases.push(Phase {
                    system: "queen",
                    mode: "push",
                    st,
                    cpu_us: cpu,
                });
                let before = queen.procs.cpu_seconds();
                let st = queen_pop_ack(&t, c.consumers, args.seconds).await;
                let cpu = cpu_us(&queen.procs, before, &st);
                phases.push(Phase {
                    system: "queen",
                    mode: "pop",
                    st,
                    cpu_us: cpu,
                });
            } else if let Some(n) = &nats {
                let before = n.procs.cpu_seconds();
                let (js, size) = (n.js.clone(), args.size);
                let st = drive(c.inflight, args.seconds, move |seq| {
                    let js = js.clone();
                    async move { nats_publish(&js, seq, 1, size).await }
                })
                .await;
                let cpu = cpu_us(&n.procs, before, &st);
                phases.push(Phase {
                    system: "NATS",
                    mode: "push",
                    st,
                    cpu_us: cpu,
                });
                let before = n.procs.cpu_seconds();
                let consumer = n.consumer.clone();
                let st = drain(c.consumers, args.seconds, 3, move |_| {
                    let consumer = consumer.clone();
                    async move { nats_pop_ack(&consumer).await }
                })
                .await;
                let cpu = cpu_us(&n.procs, before, &st);
                phases.push(Phase {
                    system: "NATS",
                    mode: "pop",
                    st,
                    cpu_us: cpu,
                });
            }
            {
                for p in &phases[before_step..] {
                    println!(
                        "round {} {:5} {:4}: {:>9.0} msg/s  p50 {:.2} ms  p99 {:.2} ms  {:.1} us CPU/msg  errors {}",
                        round + 1,
                        p.system,
                        p.mode,
                        p.st.msg_per_s(),
                        p.st.pct_ms(0.5),
                        p.st.pct_ms(0.99),
                        p.cpu_us,
                        p.st.errors
                    );
                }
            }
        }
    }
    let median = |system: &str, mode: &str| -> Option<f64> {
        let mut v: Vec<f64> = phases
            .iter()
            .filter(|p| p.system == system && p.mode == mode)
            .map(|p| p.st.msg_per_s())
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    println!(
        "\nephemeral queues, {} rounds, {}-byte payloads (medians)",
        c.rounds.max(1),
        args.size
    );
    println!("| mode | queen msg/s | NATS (memory, 1 replica) msg/s | queen / NATS | goal |");
    println!("|---|---|---|---|---|");
    for (mode, label, goal) in [
        (
            "push",
            format!("push 1/request, {} in flight", c.inflight),
            "1.5x",
        ),
        (
            "pop",
            format!("pop 100 + ack, {} consumers", c.consumers),
            "-",
        ),
    ] {
        let q = median("queen", mode).unwrap_or(0.0);
        let n = median("NATS", mode);
        println!(
            "| {label} | {q:.0} | {} | {} | {goal} |",
            n.map_or("-".into(), |n| format!("{n:.0}")),
            n.map_or("-".into(), |n| format!("{:.2}x", q / n.max(1.0)))
        );
    }
    println!(
        "peak RSS MiB: queen {:?} (QUEEN_EPHEMERAL_MAX_BYTES 256 MiB per node), NATS {:?}",
        rss_mib(&queen.procs),
        nats.as_ref().map(|n| rss_mib(&n.procs))
    );
    queen.procs.stop_all();
    if let Some(n) = &mut nats {
        n.procs.stop_all();
    }
    Ok(())
}
