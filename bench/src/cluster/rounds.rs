//! The scored rounds: for each mode, one queen phase and one NATS phase in alternating order
//! (each mode's shape, requests in flight and messages per request, is `Mode::shape`).

use std::path::Path;

use queen_bench::load::drain;

use super::nats::{nats_phase, start_nats};
use super::profile::profile;
use super::report::print_row;
use super::start::start_floor;
use super::{ClusterArgs, MODES, Meter, Mode, QueenSide, Row, System, To, rss_mib};
use crate::pop::pop_ack_one;
use crate::{Args, Format, Pushes, push_one, push_phase};

/// The rounds: every mode once per system per round, then the peak RSS and the profile.
pub(super) async fn rounds(
    args: &Args,
    c: &ClusterArgs,
    bin: &Path,
    nats_bin: Option<&Path>,
    dir: &Path,
    prefix: &str,
) -> Result<(Vec<Row>, Result<(), String>, (Vec<u64>, Vec<u64>)), String> {
    let mut q = QueenSide::start(bin, &dir.join("queen"), c.to).await?;
    let term_at_start = q.term().await;
    let mut nats = match nats_bin {
        Some(b) => Some(start_nats(b, &dir.join("nats")).await?),
        None => None,
    };
    let mut floor = if c.floor {
        Some(start_floor(dir).await?)
    } else {
        None
    };
    let systems: Vec<System> = [
        Some(System::Queen),
        nats.as_ref().map(|_| System::Nats),
        floor.as_ref().map(|_| System::Floor),
    ]
    .into_iter()
    .flatten()
    .collect();
    println!(
        "queen-bench cluster: {} s per phase, {}-byte messages, {} round(s); queen: 3 nodes, pids {:?}, leader node {}, clients to {}",
        args.seconds,
        args.size,
        c.rounds,
        q.queen.procs.pids(),
        q.queen.leader + 1,
        if c.to == To::All {
            "all three nodes in turn"
        } else {
            "the leader"
        },
    );
    if let Some(n) = &nats {
        println!(
            "nats: 3 servers, pids {:?}, JetStream file stream with replicas 3 and sync_interval: always; client connected to the stream leader {}",
            n.procs.pids(),
            n.leader
        );
    }
    if let Some(f) = &floor {
        println!(
            "floor: one server, pid {:?}, that parses and answers pushes like queen but stores nothing (the HTTP cost alone)",
            f.procs.pids()
        );
    }

    // Does the server take QPB1? One request of one message tells.
    let qpb1 = match push_one(
        &q.clients,
        &format!("{prefix}-probe-"),
        0,
        1,
        args.size,
        Format::Qpb1,
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(e) => Err(e.replace("push answered", "server answered")),
    };
    match &qpb1 {
        Ok(()) => println!("QPB1 with FRAMES: the server takes it"),
        Err(e) => println!("QPB1 with FRAMES: not measured ({e})"),
    }

    let mut rows: Vec<Row> = Vec::new();
    for round in 0..c.rounds.max(1) {
        for mode in MODES {
            if mode == Mode::Qpb1 && qpb1.is_err() {
                continue;
            }
            // Each system goes first in turn, one round after another.
            let mut order = systems.clone();
            order.rotate_left(round % systems.len());
            for system in order {
                let exited = [
                    Some(&mut q.queen.procs),
                    nats.as_mut().map(|n| &mut n.procs),
                    floor.as_mut().map(|f| &mut f.procs),
                ];
                if let Some(e) = exited.into_iter().flatten().find_map(|p| p.exited()) {
                    return Err(e);
                }
                let tag = format!("{prefix}-{}r{round}m{mode:?}-", system.name());
                let row = match (system, &nats, &floor) {
                    (System::Queen, _, _) => {
                        Some(queen_phase(&q, args, c, mode, &tag, args.seconds).await)
                    }
                    (System::Nats, Some(n), _) if mode != Mode::Qpb1 => {
                        Some(nats_phase(n, args, c, mode, args.seconds).await)
                    }
                    (System::Floor, _, Some(f)) if matches!(mode, Mode::Single | Mode::Batch) => {
                        let m = Meter::start(&f.procs);
                        let (inflight, count) = mode.shape(c);
                        let (st, _) = push_phase(
                            &f.target,
                            None,
                            &Pushes {
                                tag: &tag,
                                inflight,
                                count,
                                size: args.size,
                                format: Format::Json,
                            },
                            args.seconds,
                        )
                        .await;
                        let (cpu_s, disk, bench_cores) = m.stop(&f.procs, &st);
                        Some(Row {
                            round: 0,
                            system: "",
                            mode,
                            st,
                            fsyncs: None,
                            cpu_s,
                            disk,
                            bench_cores,
                        })
                    }
                    _ => None,
                };
                if let Some(mut row) = row {
                    row.round = round;
                    row.system = system.name();
                    print_row(&row, c);
                    rows.push(row);
                }
            }
        }
    }

    let stored = q.stored().await;
    let term_at_end = q.term().await;
    println!(
        "\nqueen: {} elections during the rounds (raft term {term_at_start} -> {term_at_end})",
        term_at_end.saturating_sub(term_at_start)
    );
    let rss = (
        rss_mib(&q.queen.procs),
        nats.as_ref().map(|n| rss_mib(&n.procs)).unwrap_or_default(),
    );
    println!(
        "\nqueen: {stored} messages left stored, peak RSS per node {:?} MiB",
        rss.0
    );
    if let Some(n) = &nats {
        let info =
            n.js.get_stream("BENCH")
                .await
                .map_err(|e| format!("stream info: {e}"))?
                .get_info()
                .await
                .map_err(|e| format!("stream info: {e}"))?;
        println!(
            "NATS: {} messages in the stream, peak RSS per server {:?} MiB",
            info.state.messages, rss.1
        );
    }
    if c.profile_seconds > 0 {
        // Both batch bodies, so their costs can be told apart.
        let formats: &[Format] = if qpb1.is_ok() {
            &[Format::Json, Format::Qpb1]
        } else {
            &[Format::Json]
        };
        for (i, format) in formats.iter().enumerate() {
            profile(&q, args, c, dir, &format!("{prefix}-profile{i}-"), *format).await;
        }
    }
    if let Some(n) = nats.as_mut() {
        n.procs.stop_all();
    }
    if let Some(f) = floor.as_mut() {
        f.procs.stop_all();
    }
    q.queen.procs.stop_all();
    Ok((rows, qpb1, rss))
}

/// One queen phase of `mode`, `seconds` long (a pop phase ends early once drained).
pub(super) async fn queen_phase(
    q: &QueenSide,
    args: &Args,
    c: &ClusterArgs,
    mode: Mode,
    tag: &str,
    seconds: u64,
) -> Row {
    let m = Meter::start(&q.queen.procs);
    let (inflight, count) = mode.shape(c);
    let (st, fsyncs) = match mode {
        Mode::Pop => {
            let f0 = q.all.fsyncs().await;
            let t = q.clients.clone();
            let st = drain(inflight, seconds, 3, move |n| {
                let t = t.clone();
                async move { pop_ack_one(&t, n).await }
            })
            .await;
            let f = q.all.fsyncs().await.saturating_sub(f0);
            (st, f)
        }
        _ => {
            let format = if mode == Mode::Qpb1 {
                Format::Qpb1
            } else {
                Format::Json
            };
            push_phase(
                &q.clients,
                Some(&q.all),
                &Pushes {
                    tag,
                    inflight,
                    count,
                    size: args.size,
                    format,
                },
                seconds,
            )
            .await
        }
    };
    let (cpu_s, disk, bench_cores) = m.stop(&q.queen.procs, &st);
    Row {
        round: 0,
        system: "queen",
        mode,
        st,
        fsyncs: Some(fsyncs),
        cpu_s,
        disk,
        bench_cores,
    }
}
