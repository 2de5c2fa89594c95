//! The S3 sink's soak: three real nodes on loopback, a real S3 server (moto), eight queues, a
//! writer pushing through every node, and a kill -9 or a SIGTERM of a queue owner every minute
//! (the node comes back a few seconds later). At the end the lake must hold every acknowledged
//! record exactly once (`queen lake verify`, then DuckDB and pyarrow read it all back). Prints
//! what each stop moved and how long it took, the lag, the fences and the totals.
//!
//!     bench/soak.sh                      # 10 minutes, the defaults below
//!     bench/soak.sh --minutes 2 --every-secs 30
//!
//! Not a CI test: it runs for as long as it is told to.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use queen_tests::s3::{self, S3Server};
use queen_tests::sink::{self, WriterPlan};
use queen_tests::{eventually, try_get_url};
use serde_json::Value;

struct Args {
    bin: PathBuf,
    minutes: u64,
    queues: usize,
    every_secs: u64,
    per_push: u64,
    pause_ms: u64,
    lease_ttl_ms: u64,
    window_ms: u64,
    down_secs: u64,
}

fn usage() -> ! {
    eprintln!(
        "usage: queen-soak [--bin target/release/queen] [--minutes 10] [--queues 8] [--every-secs 60] [--per-push 10] [--pause-ms 20] [--lease-ttl-ms 10000] [--window-ms 5000] [--down-secs 5]"
    );
    std::process::exit(2)
}

fn parse() -> Args {
    let mut a = Args {
        bin: PathBuf::from("target/release/queen"),
        minutes: 10,
        queues: 8,
        every_secs: 60,
        per_push: 10,
        pause_ms: 20,
        lease_ttl_ms: 10_000,
        window_ms: 5_000,
        down_secs: 5,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else { usage() };
        let num = || value.parse::<u64>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--bin" => a.bin = PathBuf::from(value),
            "--minutes" => a.minutes = num(),
            "--queues" => a.queues = usize::try_from(num()).unwrap_or_else(|_| usage()),
            "--every-secs" => a.every_secs = num().max(10),
            "--per-push" => a.per_push = num().max(1),
            "--pause-ms" => a.pause_ms = num(),
            "--lease-ttl-ms" => a.lease_ttl_ms = num(),
            "--window-ms" => a.window_ms = num(),
            "--down-secs" => a.down_secs = num(),
            _ => usage(),
        }
    }
    if !a.bin.is_file() {
        eprintln!(
            "queen-soak: no binary at {} (cargo build --release -p queen)",
            a.bin.display()
        );
        std::process::exit(2);
    }
    a
}

/// What the watcher saw, once a second, on every live node.
#[derive(Default)]
struct Watch {
    max_lag: f64,
    max_lag_at: f64,
    fenced_seen: u64,
    samples: u64,
}

/// Poll every live node's `/status` once a second until told to stop: the largest
/// `lagSeconds` of any queue, and how often a queue showed `fenced`.
fn spawn_watcher(
    ports: Vec<u16>,
    live: Arc<Vec<AtomicBool>>,
    watch: Arc<Mutex<Watch>>,
    stop: Arc<AtomicBool>,
    t0: Instant,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(6 * 3600) {
            for (i, port) in ports.iter().enumerate() {
                if !live[i].load(Ordering::Relaxed) {
                    continue;
                }
                let Ok((200, text)) = try_get_url(
                    &format!("http://127.0.0.1:{port}/status"),
                    Duration::from_secs(5),
                ) else {
                    continue;
                };
                let Ok(status) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                let rows = sink::rows(&status["s3"]["sinks"][0]);
                let mut w = watch.lock().unwrap_or_else(PoisonError::into_inner);
                w.samples += 1;
                for row in rows.values() {
                    if sink::runs(i, row) {
                        let lag = row["lagSeconds"].as_f64().unwrap_or(0.0);
                        if lag > w.max_lag {
                            w.max_lag = lag;
                            w.max_lag_at = t0.elapsed().as_secs_f64();
                        }
                    }
                    if row["state"] == "fenced" {
                        w.fenced_seen += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    })
}

/// Peak resident memory (VmHWM) of a process, MiB.
fn peak_mib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let args = parse();
    let t0 = Instant::now();
    let queues: Vec<String> = (1..=args.queues).map(|i| format!("soak-{i}")).collect();
    let server = S3Server::start();
    server.create_bucket("lake");
    let dir = tempfile::tempdir().expect("temp dir");
    let env = s3::sink_env(
        &server.endpoint,
        &queues.join(","),
        &[
            ("QUEEN_S3_LEASE_TTL_MS", args.lease_ttl_ms.to_string()),
            ("QUEEN_S3_MAX_WINDOW_MS", args.window_ms.to_string()),
            ("QUEEN_S3_SAFE_GUARD_MS", "1000".into()),
            ("QUEEN_S3_CHECKPOINT_EVERY", "10".into()),
            ("RUST_LOG", "info".into()),
        ],
    );
    let mut nodes = sink::cluster(&args.bin, dir.path(), &env);
    let mut live = vec![true; 3];
    let live_flags = Arc::new((0..3).map(|_| AtomicBool::new(true)).collect::<Vec<_>>());
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    println!(
        "queen-soak: 3 nodes, {} queues, {} min, a stop every {} s (kill -9 and SIGTERM in turn, back after {} s), lease TTL {} ms, windows {} ms, {} records per push",
        args.queues,
        args.minutes,
        args.every_secs,
        args.down_secs,
        args.lease_ttl_ms,
        args.window_ms,
        args.per_push
    );

    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let duration = Duration::from_secs(args.minutes * 60);
    let plan = WriterPlan {
        queues: queues.clone(),
        prefix: "soak".into(),
        per_push: args.per_push,
        pause: Duration::from_millis(args.pause_ms),
        limit: duration + Duration::from_secs(300),
    };
    let writer = sink::spawn_writer(
        ports.clone(),
        live_flags.clone(),
        plan,
        acked.clone(),
        stop.clone(),
    );
    let watch = Arc::new(Mutex::new(Watch::default()));
    let watcher_stop = Arc::new(AtomicBool::new(false));
    let watcher = spawn_watcher(
        ports.clone(),
        live_flags.clone(),
        watch.clone(),
        watcher_stop.clone(),
        t0,
    );

    let settled = eventually(Duration::from_secs(120), || {
        sink::owners(&nodes, &live, &queues).is_some()
    });
    assert!(
        settled,
        "the queues found no owners: {:#?}",
        sink::reports(&nodes, &live)
    );
    let placed = sink::owners(&nodes, &live, &queues).unwrap_or_default();
    println!(
        "{:>6.1} s  every queue has one owner: {:?}",
        t0.elapsed().as_secs_f64(),
        counts(&placed)
    );

    let start = Instant::now();
    let mut stops = Vec::new();
    let mut event = 0u64;
    while start.elapsed() + Duration::from_secs(args.every_secs) <= duration {
        let due = start + Duration::from_secs(args.every_secs * (event + 1));
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let kill = event.is_multiple_of(2);
        // Stop the owner of a queue, a different queue each time.
        let queue = &queues[usize::try_from(event).unwrap_or(0) % queues.len()];
        let before = sink::owners(&nodes, &live, &queues).unwrap_or_default();
        let victim =
            sink::owner(&nodes, &live, queue).unwrap_or(usize::try_from(event % 3).unwrap_or(0));
        let held: Vec<&String> = before
            .iter()
            .filter(|(_, o)| **o == victim)
            .map(|(q, _)| q)
            .collect();
        let acked_before = acked.lock().unwrap_or_else(PoisonError::into_inner).len();
        let t = Instant::now();
        live_flags[victim].store(false, Ordering::Relaxed);
        live[victim] = false;
        if kill {
            nodes[victim].kill9();
        } else {
            let status = nodes[victim].sigterm(Duration::from_secs(90));
            assert!(
                status.success(),
                "node {} exited {status} after SIGTERM",
                victim + 1
            );
        }
        let stopped = t.elapsed();
        let moved = eventually(Duration::from_secs(180), || {
            let ok = sink::owners(&nodes, &live, &queues).is_some();
            if !ok {
                std::thread::sleep(Duration::from_millis(250));
            }
            ok
        });
        assert!(
            moved,
            "the stopped node's queues found no new owner: {:#?}",
            sink::reports(&nodes, &live)
        );
        let moved_after = t.elapsed();
        std::thread::sleep(Duration::from_secs(args.down_secs).saturating_sub(t.elapsed()));
        let t_back = Instant::now();
        nodes[victim].restart();
        live[victim] = true;
        live_flags[victim].store(true, Ordering::Relaxed);
        let back = t_back.elapsed();
        let acked_now = acked.lock().unwrap_or_else(PoisonError::into_inner).len();
        let line = format!(
            "{:>6.1} s  {} node {} ({} queues): stopped in {:.1} s, its queues had new owners {:.1} s after the signal, healthy again {:.1} s after restart; {} records acknowledged meanwhile",
            t0.elapsed().as_secs_f64(),
            if kill { "kill -9 " } else { "SIGTERM " },
            victim + 1,
            held.len(),
            stopped.as_secs_f64(),
            moved_after.as_secs_f64(),
            back.as_secs_f64(),
            acked_now - acked_before
        );
        println!("{line}");
        stops.push((kill, moved_after.as_secs_f64()));
        event += 1;
    }
    std::thread::sleep(duration.saturating_sub(start.elapsed()));
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();
    let write_secs = start.elapsed().as_secs_f64();
    let acked = acked.lock().unwrap_or_else(PoisonError::into_inner).clone();
    println!(
        "{:>6.1} s  writer stopped: {} records acknowledged ({:.0}/s); waiting for the lake",
        t0.elapsed().as_secs_f64(),
        acked.len(),
        acked.len() as f64 / write_secs
    );
    // Counters as whole numbers (an empty f64 sum is -0).
    let total = |name: &str| {
        nodes
            .iter()
            .map(|n| sink::metric(n, name) as u64)
            .sum::<u64>()
    };
    let fences = total("queen_s3_commit_precondition_lost_total");
    let given_back = total("queen_s3_queues_given_back_total");
    let t_lake = Instant::now();
    let report = sink::assert_lake_is_the_log(
        &args.bin,
        &server,
        &nodes,
        0,
        &queues,
        &acked,
        Duration::from_secs(600),
    );
    let lake_secs = t_lake.elapsed().as_secs_f64();
    watcher_stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let w = watch.lock().unwrap_or_else(PoisonError::into_inner);
    let windows: u64 = report["queues"].as_array().map_or(0, |qs| {
        qs.iter().map(|q| q["windows"].as_u64().unwrap_or(0)).sum()
    });
    let bytes: u64 = report["queues"].as_array().map_or(0, |qs| {
        qs.iter().map(|q| q["bytes"].as_u64().unwrap_or(0)).sum()
    });
    let takeover = |k: bool| -> String {
        let v: Vec<f64> = stops
            .iter()
            .filter(|(kill, _)| *kill == k)
            .map(|(_, s)| *s)
            .collect();
        if v.is_empty() {
            return "none".into();
        }
        let max = v.iter().copied().fold(0.0, f64::max);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        format!(
            "{} stops, new owners after {mean:.1} s on average, {max:.1} s at most",
            v.len()
        )
    };
    let rss: Vec<String> = nodes
        .iter()
        .map(|n| {
            n.pid()
                .map_or("-".into(), |p| format!("{:.0}", peak_mib(p)))
        })
        .collect();
    println!(
        "PASS: the lake holds every one of the {} acknowledged records exactly once ({} windows, {:.1} MiB of objects; verify clean; DuckDB and pyarrow agree), complete {lake_secs:.1} s after the writer stopped",
        acked.len(),
        windows,
        bytes as f64 / 1048576.0
    );
    println!("  kill -9: {}", takeover(true));
    println!("  SIGTERM: {}", takeover(false));
    println!(
        "  largest lagSeconds seen: {:.1} s (at {:.0} s); a queue row showed `fenced` in {} of {} status samples",
        w.max_lag, w.max_lag_at, w.fenced_seen, w.samples
    );
    println!(
        "  precondition losses counted (since each node's last start): {fences}; queues given back: {given_back}"
    );
    println!(
        "  peak RSS of the nodes since their last start: {} MiB; total {:.0} s",
        rss.join(" / "),
        t0.elapsed().as_secs_f64()
    );
}

fn counts(o: &BTreeMap<String, usize>) -> Vec<usize> {
    (0..3)
        .map(|i| o.values().filter(|v| **v == i).count())
        .collect()
}
