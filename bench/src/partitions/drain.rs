//! The drain of `queen-bench partitions`: consumers that pop and ack until every message the
//! fill stored is acked or the time is up, with the servers' CPU read at the same two moments.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use queen_bench::load::Procs;
use tokio::sync::{Notify, watch};

use crate::Target;
use crate::pop::pop_ack;

/// What the drain moved.
#[derive(Default)]
pub(super) struct Drained {
    pub(super) messages: u64,
    /// Pops that answered messages, and pops that answered none.
    pub(super) pops: u64,
    pub(super) empty: u64,
    pub(super) pop_lat: Vec<Duration>,
    pub(super) ack_lat: Vec<Duration>,
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
    /// The first `autopilot` echo seen.
    pub(super) echo: Option<String>,
    /// From the first pop to the last ack (or the cap).
    pub(super) seconds: f64,
    /// The servers' CPU seconds over `seconds`, every node summed.
    pub(super) cpu_s: f64,
}

impl Drained {
    fn add(&mut self, o: Drained) {
        self.messages += o.messages;
        self.pops += o.pops;
        self.empty += o.empty;
        self.pop_lat.extend(o.pop_lat);
        self.ack_lat.extend(o.ack_lat);
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        if self.echo.is_none() {
            self.echo = o.echo;
        }
    }
}

/// `consumers` loops of pop + ack (consumer `c` on node `c` of `t`) until `target` messages
/// are acked or `max` has passed; the servers' CPU is read at the same two moments. Prints the
/// progress every 30 s.
pub(super) async fn drain_queue(
    t: &Arc<Target>,
    procs: &Procs,
    path: &str,
    consumers: usize,
    target: u64,
    max: Duration,
) -> Drained {
    if target == 0 {
        return Drained::default();
    }
    let acked = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let path: Arc<str> = Arc::from(path);
    let (cpu0, started) = (procs.cpu_seconds(), Instant::now());
    let tasks: Vec<_> = (0..consumers as u64)
        .map(|c| {
            let (t, path, acked, done) = (t.clone(), path.clone(), acked.clone(), done.clone());
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                let mut d = Drained::default();
                while !*stop.borrow() {
                    let r = tokio::select! {
                        r = pop_ack(&t, c, &path) => r,
                        _ = stop.changed() => break,
                    };
                    match r {
                        Ok(Some(pa)) => {
                            d.messages += pa.messages;
                            d.pops += 1;
                            d.pop_lat.push(pa.pop);
                            d.ack_lat.push(pa.ack);
                            if d.echo.is_none() {
                                d.echo = pa.echo;
                            }
                            if acked.fetch_add(pa.messages, Ordering::Relaxed) + pa.messages
                                >= target
                            {
                                done.notify_one();
                            }
                        }
                        // With wait=true an empty answer comes after the long poll's timeout.
                        Ok(None) => d.empty += 1,
                        Err(e) => {
                            d.errors += 1;
                            d.first_error.get_or_insert(e);
                            if d.errors > 1000 {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                d
            })
        })
        .collect();
    loop {
        let left = max.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        tokio::select! {
            _ = done.notified() => break,
            _ = tokio::time::sleep(left.min(Duration::from_secs(30))) => {
                let a = acked.load(Ordering::Relaxed);
                println!(
                    "  {:.0} s: drained {a} of {target} ({:.0} msg/s so far)",
                    started.elapsed().as_secs_f64(),
                    a as f64 / started.elapsed().as_secs_f64()
                );
            }
        }
    }
    let (seconds, cpu_s) = (started.elapsed().as_secs_f64(), procs.cpu_seconds() - cpu0);
    let _ = stop_tx.send(true);
    let mut all = Drained::default();
    for task in tasks {
        if let Ok(d) = task.await {
            all.add(d);
        }
    }
    all.pop_lat.sort_unstable();
    all.ack_lat.sort_unstable();
    all.seconds = seconds;
    all.cpu_s = cpu_s;
    all
}
