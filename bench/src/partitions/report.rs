//! What `queen-bench partitions` prints: a few lines per run as it ends, then one table of
//! every run, topology by topology, with each drain rate against the smallest count's (the
//! issue's "flat" goal: at least 0.9x).

use std::fmt::Write as _;

use queen_bench::load::pct_ms;

use super::Outcome;

impl Outcome {
    fn rate(&self) -> f64 {
        self.drain.messages as f64 / self.drain.seconds.max(1e-9)
    }

    fn per_pop(&self) -> f64 {
        self.drain.messages as f64 / self.drain.pops.max(1) as f64
    }

    fn cpu_us(&self) -> f64 {
        self.drain.cpu_s * 1e6 / self.drain.messages.max(1) as f64
    }

    fn complete(&self) -> bool {
        self.filled == self.partitions && self.drain.messages >= self.filled
    }

    /// "all 1000" or "X of N" (of the partitions asked for).
    fn drained(&self) -> String {
        if self.complete() {
            format!("all {}", self.partitions)
        } else {
            format!("{} of {}", self.drain.messages, self.partitions)
        }
    }

    /// Bytes per partition of each node's store, as "a / b / c".
    fn per_partition(&self, disk: &[u64]) -> String {
        disk.iter()
            .map(|b| format!("{:.0}", *b as f64 / self.partitions.max(1) as f64))
            .collect::<Vec<_>>()
            .join(" / ")
    }

    fn rss(&self) -> String {
        self.rss_mib
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" / ")
    }
}

/// The run's figures, as soon as it ends.
pub(super) fn print_run(o: &Outcome) {
    let d = &o.drain;
    println!(
        "  drained {} in {:.1} s: {:.0} msg/s, {:.2} messages per pop ({} pops, {} empty), pop p50 {:.2} ms p99 {:.2} ms, ack p50 {:.2} ms p99 {:.2} ms, server CPU {:.1} µs/msg ({:.2} cores), {} errors",
        o.drained(),
        d.seconds,
        o.rate(),
        o.per_pop(),
        d.pops,
        d.empty,
        pct_ms(&d.pop_lat, 0.50),
        pct_ms(&d.pop_lat, 0.99),
        pct_ms(&d.ack_lat, 0.50),
        pct_ms(&d.ack_lat, 0.99),
        o.cpu_us(),
        d.cpu_s / d.seconds.max(1e-9),
        d.errors,
    );
    println!(
        "  peak RSS per node {} MiB; store on disk per partition per node: {} B after the fill, {} B after the drain; autopilot echo: {}",
        o.rss(),
        o.per_partition(&o.disk_filled),
        o.per_partition(&o.disk_drained),
        d.echo.as_deref().unwrap_or("none")
    );
    if let Some(r) = &o.restart {
        println!(
            "  restart on the filled store: /health after {:.2} s, first pop answered after {:.2} s",
            r.healthy_s, r.first_pop_s
        );
    }
    for e in [&o.fill_error, &d.first_error].into_iter().flatten() {
        println!("  first error: {e}");
    }
}

/// Every run, one line each, grouped by topology; "rate / first" is each drain rate over the
/// rate of the first count of the same topology.
pub(super) fn table(found: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| nodes | partitions | fill s | drained | drain msg/s | rate / first | msg/pop | pop p50 ms | pop p99 ms | server CPU µs/msg | peak RSS MiB per node | store B/partition per node |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for nodes in [1, 3] {
        let rows: Vec<&Outcome> = found.iter().filter(|o| o.nodes == nodes).collect();
        let first = rows.first().map_or(0.0, |o| o.rate());
        for o in rows {
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} | {} | {:.0} | {:.2}x | {:.2} | {:.2} | {:.2} | {:.1} | {} | {} |",
                o.nodes,
                o.partitions,
                o.fill_seconds,
                o.drained(),
                o.rate(),
                o.rate() / first.max(1e-9),
                o.per_pop(),
                pct_ms(&o.drain.pop_lat, 0.50),
                pct_ms(&o.drain.pop_lat, 0.99),
                o.cpu_us(),
                o.rss(),
                o.per_partition(&o.disk_filled),
            );
        }
    }
    out
}
