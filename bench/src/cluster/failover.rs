//! `queen-bench cluster --failover N`: N kills of the serving leader with SIGKILL on three nodes
//! that also run the embedded S3 sink (writing to a folder in the run's directory), each timed
//! twice from the kill:
//! - to the first push acknowledged through a surviving node (pushes alternate between the two
//!   survivors, each bounded to 0.5 s);
//! - to every sink queue the dead node ran being run again by exactly one survivor (the lease
//!   TTL is `--sink-ttl-ms`; the goal is the TTL plus 2 s).
//!
//! The sink runs `--sink-queues` queues (6 by default, a multiple of 3). After each kill the node
//! is started again on its own data and the bench waits until the queues are placed evenly
//! before the next kill. Prints every kill, then min / median /
//! max of both figures.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::ClusterArgs;
use super::start::{start_cluster, wait_healthy};
use crate::{Target, http_client};

pub(super) async fn failover(bin: &Path, dir: &Path, c: &ClusterArgs) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let lake = dir.join("lake");
    let queues: Vec<String> = (1..=c.sink_queues.max(3) / 3 * 3)
        .map(|i| format!("f{i}"))
        .collect();
    let extra: Vec<(String, String)> = [
        ("QUEEN_S3_EMBEDDED", "true".into()),
        ("QUEEN_S3_ENDPOINT", format!("file://{}", lake.display())),
        ("QUEEN_S3_QUEUES", queues.join(",")),
        ("QUEEN_S3_LEASE_TTL_MS", c.sink_ttl_ms.to_string()),
        ("QUEEN_S3_MAX_WINDOW_MS", "2000".into()),
        ("QUEEN_S3_SAFE_GUARD_MS", "500".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let (mut queen, spawner) = start_cluster(bin, dir, &extra).await?;
    let all = Target::new(http_client(), &queen.ports);
    for q in &queues {
        push_once(&all, queen.leader as u64, q, 500).await?;
    }
    let ttl = Duration::from_millis(c.sink_ttl_ms);
    println!(
        "failover: {} kills of the leader, sink lease TTL {:.1} s, {} queues",
        c.failover,
        ttl.as_secs_f64(),
        queues.len()
    );
    let mut writes = Vec::new();
    let mut takeovers = Vec::new();
    for kill in 1..=c.failover {
        let (leader, theirs) = placed_leader(&all, &queues).await?;
        let t0 = Instant::now();
        let p = &mut queen.procs.0[leader];
        let _ = p.child.kill();
        let _ = p.child.wait();
        let mut live = [true; 3];
        live[leader] = false;
        let survivors: Vec<u64> = (0..3u64).filter(|i| *i != leader as u64).collect();
        let mut write = None;
        let mut n = 0usize;
        while t0.elapsed() < Duration::from_secs(15) {
            let at = survivors[n % 2];
            n += 1;
            if push_once(&all, at, "failover", 500).await.is_ok() {
                write = Some(t0.elapsed());
                break;
            }
        }
        let write = write.ok_or("no write was acknowledged within 15 s of the kill")?;
        let take = taken_over(&all, &queues, &live, &theirs, t0, ttl).await?;
        println!(
            "kill {kill}: node {} (leader, ran {} queues) -> first write {:.2} s, its queues held again {:.2} s (TTL + {:.2} s)",
            leader + 1,
            theirs.len(),
            write.as_secs_f64(),
            take.as_secs_f64(),
            take.as_secs_f64() - ttl.as_secs_f64()
        );
        writes.push(write);
        takeovers.push(take);
        queen.procs.0[leader] = spawner.spawn(leader)?;
        wait_healthy(&mut queen.procs, &queen.ports).await?;
    }
    // SIGTERM hand-overs: the owner drains its queues and deletes their lease rows as it stops.
    let mut handovers = Vec::new();
    for term in 1..=c.failover {
        let (victim, theirs) = placed_leader(&all, &queues).await?;
        let t0 = Instant::now();
        let pid = queen.procs.0[victim].child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        let mut live = [true; 3];
        live[victim] = false;
        let took = taken_over(&all, &queues, &live, &theirs, t0, ttl).await?;
        println!(
            "SIGTERM {term}: node {} (leader, ran {} queues) -> its queues held again {:.2} s",
            victim + 1,
            theirs.len(),
            took.as_secs_f64()
        );
        handovers.push(took);
        let _ = queen.procs.0[victim].child.wait();
        queen.procs.0[victim] = spawner.spawn(victim)?;
        wait_healthy(&mut queen.procs, &queen.ports).await?;
    }
    println!(
        "\nkill -9 of the leader to the first acknowledged write: {}",
        spread(&mut writes, Duration::ZERO)
    );
    println!(
        "SIGTERM of a sink owner to its queues held again:   {}",
        spread(&mut handovers, Duration::ZERO)
    );
    println!(
        "kill -9 of a sink owner to its queues held again:   {} (minus the TTL: {})",
        spread(&mut takeovers, Duration::ZERO),
        spread(&mut takeovers, ttl)
    );
    queen.procs.stop_all();
    Ok(())
}

/// Once the queues are placed evenly: the leader, and the queues it runs.
async fn placed_leader(all: &Target, queues: &[String]) -> Result<(usize, Vec<String>), String> {
    let placed = settle(all, queues, Duration::from_secs(300)).await?;
    let leader = leader(all).await.ok_or("no leader")?;
    let theirs = placed
        .into_iter()
        .filter(|(_, h)| *h == leader)
        .map(|(q, _)| q)
        .collect();
    Ok((leader, theirs))
}

/// Wait until every queue of `theirs` is run by exactly one live node: the time since `t0`, or
/// an error naming the survivors' view after the TTL and a minute.
async fn taken_over(
    all: &Target,
    queues: &[String],
    live: &[bool; 3],
    theirs: &[String],
    t0: Instant,
    ttl: Duration,
) -> Result<Duration, String> {
    while t0.elapsed() < ttl + Duration::from_secs(60) {
        let o = owners(all, queues, live).await;
        if theirs.iter().all(|q| o.contains_key(q)) {
            return Ok(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut why = String::new();
    for i in (0..3u64).filter(|i| live[*i as usize]) {
        let s = all.json_at(i, "/status").await;
        let sink = &s["s3"]["sinks"][0];
        why.push_str(&format!(
            "\nnode {}: placement {}",
            i + 1,
            sink["placement"]
        ));
        for row in sink["queues"].as_array().into_iter().flatten() {
            if theirs.iter().any(|q| row["queue"] == q.as_str()) {
                why.push_str(&format!("\n  {row}"));
            }
        }
    }
    Err(format!(
        "the queues {theirs:?} were not taken over within the TTL and a minute:{why}"
    ))
}

/// "min / median / max" in seconds, less `minus`.
fn spread(v: &mut [Duration], minus: Duration) -> String {
    v.sort();
    let s = |d: Duration| format!("{:.2}", d.as_secs_f64() - minus.as_secs_f64());
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(a), Some(m), Some(b)) => {
            format!("min {} / median {} / max {} s", s(*a), s(*m), s(*b))
        }
        _ => "no kills".into(),
    }
}

/// One push through node `at`, bounded to `ms`.
async fn push_once(t: &Target, at: u64, queue: &str, ms: u64) -> Result<(), String> {
    let body = format!(r#"{{"items":[{{"queue":"{queue}","payload":{{"at":{at}}}}}]}}"#);
    match tokio::time::timeout(
        Duration::from_millis(ms),
        t.call_at(at, "POST", "/api/v1/push", Some(body)),
    )
    .await
    {
        Ok(Ok((200 | 201, _))) => Ok(()),
        Ok(Ok((status, b))) => Err(format!("{status}: {}", String::from_utf8_lossy(&b))),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("timed out".into()),
    }
}

async fn leader(t: &Target) -> Option<usize> {
    for i in 0..3u64 {
        if t.json_at(i, "/health").await["raft"]["role"] == "leader" {
            return usize::try_from(i).ok();
        }
    }
    None
}

/// Who runs each queue, from the live nodes' own `/status`: only queues exactly one live node
/// runs are listed.
async fn owners(t: &Target, queues: &[String], live: &[bool; 3]) -> BTreeMap<String, usize> {
    let mut runners: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for i in (0..3).filter(|i| live[*i]) {
        let status =
            tokio::time::timeout(Duration::from_millis(500), t.json_at(i as u64, "/status"))
                .await
                .unwrap_or(Value::Null);
        let rows = status["s3"]["sinks"][0]["queues"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for row in rows {
            let runs = row["running"] == true;
            if let Some(q) = queues.iter().find(|q| row["queue"] == q.as_str())
                && runs
            {
                runners.entry(q.clone()).or_default().push(i);
            }
        }
    }
    runners
        .into_iter()
        .filter_map(|(q, r)| match r[..] {
            [one] => Some((q, one)),
            _ => None,
        })
        .collect()
}

/// Wait until every queue is run by exactly one node and each node runs a third of them.
async fn settle(
    t: &Target,
    queues: &[String],
    limit: Duration,
) -> Result<BTreeMap<String, usize>, String> {
    let until = Instant::now() + limit;
    loop {
        let o = owners(t, queues, &[true; 3]).await;
        let even = (0..3).all(|i| o.values().filter(|h| **h == i).count() == queues.len() / 3);
        if o.len() == queues.len() && even {
            return Ok(o);
        }
        if Instant::now() > until {
            return Err(format!(
                "the sink's queues were not placed evenly within {} s: {o:?}",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
