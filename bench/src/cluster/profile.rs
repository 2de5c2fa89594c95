//! The unscored profile phase: a few seconds of `perf record -g` on the queen leader during a
//! batch push phase, summarised by thread and symbol.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use queen_bench::load::{Proc, Procs};

use super::{ClusterArgs, Meter, Mode, QueenSide};
use crate::{Args, Format, Pushes, push_phase};

/// An unscored batch push phase with `perf record -g` on the queen leader for
/// `--profile-seconds`, summarised by thread and by symbol; says so when perf is missing or
/// fails, and never fails the run.
pub(super) async fn profile(
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
    let (inflight, count) = Mode::Batch.shape(c);
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
    #[allow(
        clippy::disallowed_methods,
        reason = "the bench tool's own switch, read where it is used"
    )]
    let keep_perf = std::env::var_os("QUEEN_BENCH_KEEP_PERF");
    match keep_perf {
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
