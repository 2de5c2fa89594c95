//! What the run prints: one row per phase, the rounds table, and the goals table with the
//! medians, ratios against NATS and verdicts.

use std::fmt::Write as _;

use queen_bench::load;

use super::{ClusterArgs, Found, MODES, Mode, Row, per_node_per_msg};
use crate::Args;

pub(super) fn bench_cpu() -> f64 {
    load::cpu_seconds("self")
}

pub(super) fn print_row(r: &Row, c: &ClusterArgs) {
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
pub(super) fn rounds_table(rows: &[Row], c: &ClusterArgs) -> String {
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

pub(super) fn median(mut v: Vec<f64>) -> Option<f64> {
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
pub(super) fn med(rows: &[Row], system: &str, mode: Mode, f: impl Fn(&Row) -> f64) -> Option<f64> {
    median(
        rows.iter()
            .filter(|r| r.system == system && r.mode == mode)
            .map(f)
            .collect(),
    )
}

/// The median over rounds of queen's `f` in `qm` over NATS's `f` in `nm` of the same round.
pub(super) fn ratio(rows: &[Row], qm: Mode, nm: Mode, f: impl Fn(&Row) -> f64) -> Option<f64> {
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
pub(super) fn end_to_end(rows: &[Row], system: &str, push: Mode) -> Option<f64> {
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
pub(super) struct Line {
    figure: String,
    queen: String,
    nats: String,
    ratio: String,
    goal: String,
    verdict: String,
}

pub(super) fn show(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or("n/a".to_owned(), f)
}

pub(super) fn verdict(v: Option<f64>, pass: impl Fn(f64) -> bool) -> String {
    match v {
        Some(v) if pass(v) => "pass".into(),
        Some(_) => "miss".into(),
        None => "n/a".into(),
    }
}

/// Every figure of issue 15's goals beside NATS: medians over the rounds, the ratio queen/NATS
/// (the median of the per-round ratios where both ran in each round), and the goal.
pub(super) fn goals_table(found: &Found, args: &Args, c: &ClusterArgs) -> String {
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
