//! `queen-bench cluster --groups N`: three queen nodes with one raft group against three nodes
//! with `QUEEN_RAFT_GROUPS=N`, in the same run. The clients write N tenants in turn (one placed
//! in each group by the documented hash: FNV-1a of the tenant id modulo N), 100 messages per
//! request, `--batch-inflight` requests in flight, each request sent to the leader of its
//! tenant's group. Per round and per system: messages per second, p50/p99, the servers' CPU per
//! message, each node's CPU (cores) and the groups each node leads, so it shows where the
//! leader work sits.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use queen_bench::load::{self, Procs, Stats, drive};
use serde_json::Value;

use super::ClusterArgs;
use super::start::start_cluster_spaced;
use crate::{Args, Target, http_client};

const QUEUE: &str = "bench-groups";

/// The documented placement: FNV-1a (64 bits) of the tenant id, modulo the group count.
fn group_of(tenant: &str, groups: u16) -> u16 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tenant.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    u16::try_from(h % u64::from(groups.max(1))).unwrap_or(0)
}

/// `n` tenant ids, the i-th placed in group `i mod groups`.
fn tenants(n: u16, groups: u16) -> Vec<String> {
    (0..n)
        .map(|i| {
            (0u32..)
                .map(|k| format!("00000000-0000-4000-8000-{:04x}{k:08x}", i))
                .find(|t| group_of(t, groups) == i % groups)
                .unwrap_or_default()
        })
        .collect()
}

/// One system under test: its processes, client ports, and per group the node index that
/// leads it.
struct Side {
    label: String,
    groups: u16,
    procs: Procs,
    ports: Vec<u16>,
    /// The three nodes' client ports, in node order.
    nodes: Arc<Target>,
}

impl Side {
    /// Each group's leader (node index), from the nodes' own `/health`.
    async fn leaders(&self) -> Vec<Option<usize>> {
        let mut out = vec![None; usize::from(self.groups)];
        for i in 0..self.ports.len() {
            let v = self.nodes.json_at(i as u64, "/health").await;
            let rows: Vec<Value> = match v["groups"].as_array() {
                Some(g) => g.clone(),
                None => vec![v["raft"].clone()],
            };
            for (g, row) in rows.iter().enumerate() {
                if row["role"] == "leader"
                    && let Some(slot) = out.get_mut(g)
                {
                    *slot = Some(i);
                }
            }
        }
        out
    }
}

async fn start(bin: &Path, dir: &Path, groups: u16) -> Result<Side, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let extra: Vec<(String, String)> = [
        ("QUEEN_RAFT_GROUPS", groups.to_string()),
        ("QUEEN_TENANCY_HEADER", "true".to_owned()),
        ("QUEEN_KV_TRUSTED_PROXY", "true".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let (queen, _) = start_cluster_spaced(bin, dir, &extra, groups).await?;
    let side = Side {
        label: format!("{groups} group{}", if groups == 1 { "" } else { "s" }),
        groups,
        nodes: Arc::new(Target::new(http_client(), &queen.ports)),
        procs: queen.procs,
        ports: queen.ports,
    };
    // Every group led, and with as many groups as nodes each node leading one (the hand-back
    // to preferred members takes a few seconds).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let leaders = side.leaders().await;
        let mut nodes: Vec<usize> = leaders.iter().flatten().copied().collect();
        nodes.sort_unstable();
        nodes.dedup();
        let spread = usize::from(groups) < side.ports.len() || nodes.len() == side.ports.len();
        if leaders.iter().all(Option::is_some) && spread {
            return Ok(side);
        }
        if std::time::Instant::now() > until {
            return Err(format!(
                "{}: groups not led one per node within 60 s: {leaders:?}",
                side.label
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

struct Phase {
    label: String,
    round: usize,
    st: Stats,
    cpu_us: f64,
    node_cores: Vec<f64>,
    leads: Vec<Vec<usize>>,
}

async fn phase(
    side: &Side,
    args: &Args,
    c: &ClusterArgs,
    tenants: &[String],
    tag: &str,
    round: usize,
) -> Phase {
    let leaders = side.leaders().await;
    // Request n: tenant n mod tenants, sent to the leader of its group.
    let targets: Arc<Vec<(String, u64)>> = Arc::new(
        tenants
            .iter()
            .map(|t| {
                let g = usize::from(group_of(t, side.groups));
                let node = leaders.get(g).copied().flatten().unwrap_or(0);
                (t.clone(), node as u64)
            })
            .collect(),
    );
    let pids: Vec<String> = side.procs.pids().iter().map(u32::to_string).collect();
    let before: Vec<f64> = pids.iter().map(|p| load::cpu_seconds(p)).collect();
    let nodes = side.nodes.clone();
    let (size, tag) = (args.size, tag.to_owned());
    let st = drive(c.batch_inflight, args.seconds, move |n| {
        let (nodes, targets, tag) = (nodes.clone(), targets.clone(), tag.clone());
        async move {
            let (tenant, node) = &targets[(n % targets.len() as u64) as usize];
            let mut rng = load::Rng::seeded(n);
            let mut body = String::with_capacity(100 * (size + 80));
            body.push_str("{\"items\":[");
            for i in 0..100 {
                if i > 0 {
                    body.push(',');
                }
                body.push_str(&format!(
                    "{{\"queue\":\"{QUEUE}\",\"transactionId\":\"{tag}{n}-{i}\",\"payload\":"
                ));
                load::random_payload(&mut rng, size, &mut body);
                body.push('}');
            }
            body.push_str("]}");
            let sent = nodes
                .send_with(
                    *node,
                    "POST",
                    "/api/v1/push",
                    "application/json",
                    Bytes::from(body),
                    &[("x-queen-tenant", tenant)],
                )
                .await?;
            match sent {
                (200, _) => Ok(100),
                (s, b) => Err(format!("push: {s} {}", String::from_utf8_lossy(&b))),
            }
        }
    })
    .await;
    let node_cores: Vec<f64> = pids
        .iter()
        .zip(&before)
        .map(|(p, b)| (load::cpu_seconds(p) - b) / st.seconds.max(1e-9))
        .collect();
    let total: f64 = node_cores.iter().sum::<f64>() * st.seconds;
    let mut leads = vec![Vec::new(); side.ports.len()];
    for (g, l) in side.leaders().await.iter().enumerate() {
        if let Some(i) = l {
            leads[*i].push(g);
        }
    }
    Phase {
        label: side.label.clone(),
        round,
        cpu_us: total * 1e6 / st.messages.max(1) as f64,
        st,
        node_cores,
        leads,
    }
}

/// The run: both systems up for its length, `--rounds` rounds alternating which goes first.
pub(super) async fn groups(
    args: &Args,
    c: &ClusterArgs,
    bin: &Path,
    dir: &Path,
    prefix: &str,
) -> Result<(), String> {
    let n = c.groups;
    let mut one = start(bin, &dir.join("one"), 1).await?;
    let mut many = match start(bin, &dir.join("many"), n).await {
        Ok(s) => s,
        Err(e) => {
            one.procs.stop_all();
            return Err(e);
        }
    };
    let tenants = tenants(n.max(1), n);
    println!(
        "tenants {tenants:?}, one per group of {n}; 100 messages of {} bytes per request, {} in flight, {} s per phase",
        args.size, c.batch_inflight, args.seconds
    );
    let mut phases = Vec::new();
    for round in 0..c.rounds.max(1) {
        let order: [&Side; 2] = if round % 2 == 0 {
            [&one, &many]
        } else {
            [&many, &one]
        };
        for side in order {
            let tag = format!("{prefix}-g{}r{round}-", side.groups);
            let p = phase(side, args, c, &tenants, &tag, round + 1).await;
            println!(
                "round {} {:>9}: {:>9.0} msg/s  p50 {:>6.1} ms  p99 {:>6.1} ms  {:>5.1} µs CPU/msg  node cores {:?}  groups led by node {:?}{}",
                p.round,
                p.label,
                p.st.msg_per_s(),
                p.st.pct_ms(0.5),
                p.st.pct_ms(0.99),
                p.cpu_us,
                p.node_cores
                    .iter()
                    .map(|c| (c * 100.0).round() / 100.0)
                    .collect::<Vec<_>>(),
                p.leads,
                if p.st.errors > 0 {
                    format!(
                        "  ({} errors: {})",
                        p.st.errors,
                        p.st.first_error.as_deref().unwrap_or("")
                    )
                } else {
                    String::new()
                }
            );
            phases.push(p);
        }
    }
    one.procs.stop_all();
    many.procs.stop_all();
    let median = |label: &str, f: &dyn Fn(&Phase) -> f64| {
        let mut v: Vec<f64> = phases.iter().filter(|p| p.label == label).map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    println!(
        "\n| system | msg/s (median) | µs CPU per message | max node cores / min node cores |"
    );
    println!("|---|---|---|---|");
    for side in [&one, &many] {
        let l = side.label.as_str();
        let spread = median(l, &|p| {
            let max = p.node_cores.iter().copied().fold(0.0, f64::max);
            let min = p.node_cores.iter().copied().fold(f64::INFINITY, f64::min);
            max / min.max(1e-9)
        });
        println!(
            "| {l} | {:.0} | {:.1} | {:.2} |",
            median(l, &|p| p.st.msg_per_s()),
            median(l, &|p| p.cpu_us),
            spread
        );
    }
    Ok(())
}
