//! The simulation's tests: many seeds must run clean, a seed must replay event for event, and
//! the checks must catch a backend that breaks its durability promise.

use super::Report;
use super::run;
use super::run_with;

/// Virtual seconds of faults per seed.
const SECONDS: u64 = 40;

#[allow(clippy::disallowed_methods, reason = "a test: the simulation's seeds")]
fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn fail_with(report: &Report) -> ! {
    for line in &report.trace {
        eprintln!("{line}");
    }
    panic!(
        "{}\nanomalies: {:#?}\nreplay: QUEEN_RAFT_SIM_SEED={} cargo test -p queen-raft --lib sim:: -- --nocapture",
        report.summary(),
        report.anomalies,
        report.seed
    );
}

/// QUEEN_RAFT_SIM_SEEDS seeds (default 24) from QUEEN_RAFT_SIM_FIRST (default 1), or the one
/// seed QUEEN_RAFT_SIM_SEED: each runs
/// 40 virtual seconds of faults and must end with every check clean.
#[test]
fn every_seed_keeps_every_acknowledged_write_once_and_in_order() {
    let seeds: Vec<u64> = match env_u64("QUEEN_RAFT_SIM_SEED") {
        Some(s) => vec![s],
        None => {
            let first = env_u64("QUEEN_RAFT_SIM_FIRST").unwrap_or(1);
            let count = env_u64("QUEEN_RAFT_SIM_SEEDS").unwrap_or(24);
            (first..first.saturating_add(count)).collect()
        }
    };
    let seconds = env_u64("QUEEN_RAFT_SIM_SECONDS").unwrap_or(SECONDS);
    let started = std::time::Instant::now();
    let mut total = Report::default();
    let n = seeds.len();
    for seed in seeds {
        let r = run(seed, seconds);
        println!("{}", r.summary());
        if !r.anomalies.is_empty() {
            fail_with(&r);
        }
        total.acked += r.acked;
        total.refused += r.refused;
        total.unknown += r.unknown;
        total.reads += r.reads;
        total.crashes += r.crashes;
        total.applied += r.applied;
        total.term = total.term.max(r.term);
        total.snapshots += r.snapshots;
        for (k, v) in r.faults {
            *total.faults.entry(k).or_default() += v;
        }
        total.sent += r.sent;
        total.lost += r.lost;
        total.cut += r.cut;
    }
    println!(
        "all seeds ({n} seeds, {:.1} s): {}",
        started.elapsed().as_secs_f64(),
        total.figures()
    );
    assert!(total.acked > 0, "no write was acknowledged in any seed");
}

/// The same seed gives the same run: every event at the same virtual instant, for three seeds.
#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "a test: where a diverging replay writes its traces"
)]
fn one_seed_replays_event_for_event() {
    let seeds = match env_u64("QUEEN_RAFT_SIM_SEED") {
        Some(s) => vec![s],
        None => vec![7, 8, 9],
    };
    let dump = std::env::var("QUEEN_RAFT_SIM_DUMP").ok();
    for seed in seeds {
        let a = run_with(seed, 20, false, dump.is_some());
        let b = run_with(seed, 20, false, dump.is_some());
        assert!(
            a.trace.len() > 50,
            "too short a run to compare: {}",
            a.summary()
        );
        if let Some(i) =
            (0..a.trace.len().max(b.trace.len())).find(|&i| a.trace.get(i) != b.trace.get(i))
        {
            if let Some(d) = &dump {
                let _ = std::fs::write(format!("{d}.a"), a.trace.join("\n"));
                let _ = std::fs::write(format!("{d}.b"), b.trace.join("\n"));
                let _ = std::fs::write(format!("{d}.net.a"), a.detail.join("\n"));
                let _ = std::fs::write(format!("{d}.net.b"), b.detail.join("\n"));
            }
            let around = |t: &[String]| t[i.saturating_sub(3)..(i + 6).min(t.len())].join("\n");
            panic!(
                "seed {seed} diverged at event {i}:\n--- first run\n{}\n--- second run\n{}",
                around(&a.trace),
                around(&b.trace)
            );
        }
        println!("seed {seed} replayed {} events identically", a.trace.len());
    }
    let unseeded = crate::runtime::UNSEEDED.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        unseeded, 0,
        "openraft drew {unseeded} numbers outside the seeded scope"
    );
}

/// The checks can fail: a backend that forgets what it had made durable (after the log below
/// its snapshot was purged) is caught in some seed of the first ten.
#[test]
fn a_backend_that_forgets_durable_state_is_caught() {
    let caught = (1..=10).find_map(|seed| {
        let r = run_with(seed, SECONDS, true, false);
        println!("sabotaged {}", r.summary());
        (!r.anomalies.is_empty()).then_some(r)
    });
    let r = caught.expect("no seed of ten caught a backend that forgets durable state");
    println!("seed {} caught it: {:?}", r.seed, r.anomalies.first());
}
