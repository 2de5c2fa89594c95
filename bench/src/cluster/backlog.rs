//! The backlog run: the push rate on an empty store, the stores filled to N messages, the rate
//! again, and the disk each store's parts take.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use queen_bench::load::{Stats, drain};

use super::nats::{nats_phase, nats_publish, start_nats, stream_messages};
use super::report::print_row;
use super::rounds::queen_phase;
use super::{Backlog, ClusterArgs, Meter, Mode, Nats, QueenSide, Row, System, rss_mib};
use crate::{Args, Format, push_one};

/// The backlog run: fresh clusters; 100/request JSON push phases on the empty store, a fill to
/// `--backlog` messages, the same phases again; disk bytes and peak RSS over the whole run.
pub(super) async fn backlog(
    args: &Args,
    c: &ClusterArgs,
    bin: &Path,
    nats_bin: Option<&Path>,
    dir: &Path,
    prefix: &str,
    qpb1: bool,
) -> Result<Backlog, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // About what the stores keep: queen ~1.7x the payload per node today, NATS ~1.2x; x3 nodes.
    let need = c.backlog.saturating_mul(args.size as u64).saturating_mul(9);
    if let Some(free) = free_bytes(dir) {
        println!(
            "\nbacklog run: {} GB free where the stores go, about {} GB needed",
            free >> 30,
            need >> 30
        );
        if free < need {
            println!(
                "backlog run: warning: the stores may not fit; a node that runs out answers 507 and the row shows it"
            );
        }
    }
    let mut q = QueenSide::start(bin, &dir.join("queen"), c.to).await?;
    let mut nats = match nats_bin {
        Some(b) => Some(start_nats(b, &dir.join("nats")).await?),
        None => None,
    };
    let q0 = Meter::start(&q.queen.procs);
    let n0 = nats.as_ref().map(|n| Meter::start(&n.procs));
    let secs = (args.seconds / 2).max(3);
    println!(
        "\nbacklog run: fresh clusters (queen pids {:?}{}); 100/request JSON pushes for {secs} s per phase on the empty store, then a fill to {} messages, then again",
        q.queen.procs.pids(),
        nats.as_ref()
            .map(|n| format!(", NATS pids {:?}", n.procs.pids()))
            .unwrap_or_default(),
        c.backlog
    );
    let mut pushed = [0u64; 2];
    let empty = batch_rounds(
        &q,
        nats.as_ref(),
        args,
        c,
        &format!("{prefix}-empty"),
        secs,
        &mut pushed,
    )
    .await?;
    let mut stored_after_empty = vec![("queen", q.stored().await)];
    if let Some(n) = &nats {
        stored_after_empty.push(("NATS", stream_messages(n).await));
    }

    // Fill what the empty-store phases did not already store.
    let format = if qpb1 { Format::Qpb1 } else { Format::Json };
    let want = c.backlog.saturating_sub(stored_after_empty[0].1);
    let st = fill(c, want, {
        let (t, tag, size) = (
            q.clients.clone(),
            Arc::<str>::from(format!("{prefix}-fill-")),
            args.size,
        );
        move |n| {
            let (t, tag) = (t.clone(), tag.clone());
            async move { push_one(&t, &tag, n, 100, size, format).await }
        }
    })
    .await;
    pushed[0] += st.messages;
    println!(
        "fill queen: {} messages in {:.0} s ({:.0} msg/s, {format:?}), {} errors; {} stored",
        st.messages,
        st.seconds,
        st.msg_per_s(),
        st.errors,
        q.stored().await
    );
    if let Some(e) = &st.first_error {
        println!("    first error: {e}");
    }
    if let Some(n) = &nats {
        let want = c.backlog.saturating_sub(stream_messages(n).await);
        let st = fill(c, want, {
            let (js, size) = (n.js.clone(), args.size);
            move |seq| {
                let js = js.clone();
                async move { nats_publish(&js, seq, 100, size).await }
            }
        })
        .await;
        pushed[1] += st.messages;
        println!(
            "fill NATS: {} messages in {:.0} s ({:.0} msg/s), {} errors; {} stored",
            st.messages,
            st.seconds,
            st.msg_per_s(),
            st.errors,
            stream_messages(n).await
        );
        if let Some(e) = &st.first_error {
            println!("    first error: {e}");
        }
    }

    let stored = q.stored().await;
    let fill_error = (stored < c.backlog).then(|| {
        format!(
            "queen stored {stored} of {}: {}",
            c.backlog,
            st.first_error.clone().unwrap_or_default()
        )
    });
    let full = batch_rounds(
        &q,
        nats.as_ref(),
        args,
        c,
        &format!("{prefix}-full"),
        secs,
        &mut pushed,
    )
    .await?;
    let mut disk = vec![("queen", q0.disk_since(&q.queen.procs), pushed[0])];
    let mut rss = vec![("queen", rss_mib(&q.queen.procs))];
    if let (Some(n), Some(n0)) = (nats.as_mut(), &n0) {
        disk.push(("NATS", n0.disk_since(&n.procs), pushed[1]));
        rss.push(("NATS", rss_mib(&n.procs)));
        n.procs.stop_all();
    }
    let stored_end = q.stored().await;
    println!(
        "backlog run: queen {stored_end} stored, peak RSS per node {:?} MiB",
        rss[0].1
    );
    // Where the bytes are kept (what each part holds now, not what was written over the run).
    for i in 0..3 {
        let parts = store_parts(&dir.join("queen").join(format!("queen-{}", i + 1)));
        let per = |b: u64| b as f64 / stored_end.max(1) as f64;
        println!(
            "    node {} keeps per stored message: {}",
            i + 1,
            parts
                .iter()
                .map(|(name, b)| format!("{name} {:.0} B", per(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    q.queen.procs.stop_all();
    Ok(Backlog {
        target: c.backlog,
        empty,
        full,
        stored_after_empty,
        disk,
        rss,
        fill_error,
    })
}

/// `--rounds` 100/request JSON push phases per system, alternating which goes first; adds the
/// messages pushed to `pushed` (queen, NATS).
pub(super) async fn batch_rounds(
    q: &QueenSide,
    nats: Option<&Nats>,
    args: &Args,
    c: &ClusterArgs,
    tag: &str,
    secs: u64,
    pushed: &mut [u64; 2],
) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    let stage = if tag.ends_with("empty") {
        "empty"
    } else {
        "full"
    };
    for round in 0..c.rounds.max(1) {
        let mut order = vec![System::Queen];
        if nats.is_some() {
            order.push(System::Nats);
        }
        let len = order.len();
        order.rotate_left(round % len);
        for system in order {
            let mut row = match (system, nats) {
                (System::Queen, _) => {
                    queen_phase(q, args, c, Mode::Batch, &format!("{tag}{round}-"), secs).await
                }
                (_, Some(n)) => nats_phase(n, args, c, Mode::Batch, secs).await,
                _ => continue,
            };
            pushed[usize::from(system != System::Queen)] += row.st.messages;
            row.round = round;
            print!("{stage:<5} ");
            print_row(&row, c);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Push `want` messages, 100 per request, `--batch-inflight` at a time, with `one(n)` pushing
/// request `n`; bounded by an hour.
pub(super) async fn fill<F, Fut>(c: &ClusterArgs, want: u64, one: F) -> Stats
where
    F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let requests = want.div_ceil(100);
    drain(c.batch_inflight, 3600, 1, move |n| {
        let one = one.clone();
        async move {
            if n < requests {
                one(n).await.map(Some)
            } else {
                Ok(None)
            }
        }
    })
    .await
}

/// Bytes of a node's data directory by part: the raft log (`log/`), the message segments
/// (`state/segments*`), the dedup index (`state/dedup*`) and the rest (the engine).
pub(super) fn store_parts(node: &Path) -> [(&'static str, u64); 4] {
    fn walk(p: &Path, part: usize, out: &mut [(&'static str, u64); 4]) {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let part = match name.as_str() {
                "log" => 0,
                n if n.starts_with("segments") => 1,
                n if n.starts_with("dedup") => 2,
                _ => part,
            };
            match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path(), part, out),
                Ok(m) => out[part].1 += m.len(),
                Err(_) => {}
            }
        }
    }
    let mut out = [
        ("raft log", 0),
        ("segments", 0),
        ("dedup", 0),
        ("engine", 0),
    ];
    walk(node, 3, &mut out);
    out
}

/// Free bytes on the file system that holds `dir` (from `df`), if it can tell.
pub(super) fn free_bytes(dir: &Path) -> Option<u64> {
    let out = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
}
