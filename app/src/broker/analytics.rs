//! Analytics: the node samples its queues (from the applied state) and itself every
//! `QUEEN_ANALYTICS_INTERVAL_MS` into its node-local sample log, and the analytics routes read
//! time series back from that log (`queen_domain::analytics` makes the buckets).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use queen_domain::analytics::{self, Sample, Series};
use queen_ports::{
    AnalyticsAnswer, AnalyticsQuery, AnalyticsScope, BrokerError, ClientApi, QueueSeries, RaftRole,
    SampleLog,
};

use super::Broker;

/// Most queues one answer carries a series for.
const MAX_SERIES: usize = 1000;

/// Most buckets one answer carries per series.
const MAX_POINTS: u64 = 1500;

/// This process's resident memory and CPU time, from `/proc/self` (zero where unreadable).
fn process_figures() -> (f64, f64) {
    // statm: sizes in pages; the second is the resident set.
    let rss_pages: f64 = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0.0);
    // stat: utime and stime (fields 14 and 15) in clock ticks, after the command in brackets.
    let ticks: f64 = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(") ")?.1;
            let f: Vec<&str> = after.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .unwrap_or(0.0);
    let page = rustix::param::page_size() as f64;
    let hz = rustix::param::clock_ticks_per_second() as f64;
    (rss_pages * page, ticks / hz.max(1.0))
}

impl Broker {
    /// Keep analytics samples in `log`.
    #[must_use]
    pub fn with_samples(mut self, log: Arc<dyn SampleLog>) -> Self {
        self.samples = Some(log);
        self
    }

    /// Keep analytics samples in `log`, when there is one.
    #[must_use]
    pub fn with_samples_if(self, log: Option<Arc<dyn SampleLog>>) -> Self {
        match log {
            Some(l) => self.with_samples(l),
            None => self,
        }
    }

    /// Take one sample and append it to the log (nothing without a log).
    pub fn sample_analytics(&self) {
        let Some(log) = &self.samples else { return };
        // This group's queues, and on a node of several raft groups every other group's.
        let mut queues = Vec::new();
        let mut partial = false;
        let others = self.sampled_groups.get().map_or(&[][..], Vec::as_slice);
        for state in std::iter::once(&self.state).chain(others) {
            match analytics::sample_queues(&*state.view()) {
                Ok((q, p)) => {
                    queues.extend(q);
                    partial |= p;
                }
                Err(e) => {
                    tracing::debug!(target: "queen-app", error = %e, "analytics: the queues could not be read");
                    return;
                }
            }
        }
        let progress = self.health().progress;
        let (rss, cpu) = process_figures();
        let (disk_total, disk_used) = self.proposer.disk.last_sample();
        let (eph_bytes, eph_messages, _) = self.ephemeral.figures();
        #[allow(clippy::cast_precision_loss)]
        let f = |v: u64| v as f64;
        let sum = |pick: fn(&analytics::QueueSample) -> u64| f(queues.iter().map(pick).sum());
        let node = BTreeMap::from([
            ("rss_bytes".to_owned(), rss),
            ("cpu_seconds_total".to_owned(), cpu),
            ("disk_used_bytes".to_owned(), f(disk_used)),
            ("disk_total_bytes".to_owned(), f(disk_total)),
            ("raft_term".to_owned(), f(progress.term)),
            ("raft_applied".to_owned(), f(progress.applied)),
            ("raft_commit".to_owned(), f(progress.commit)),
            (
                "leader".to_owned(),
                if progress.role == RaftRole::Leader {
                    1.0
                } else {
                    0.0
                },
            ),
            ("waiting_pops".to_owned(), f(self.wakeups.parked())),
            ("ephemeral_bytes".to_owned(), f(eph_bytes)),
            ("ephemeral_messages".to_owned(), f(eph_messages)),
            ("analytics_bytes".to_owned(), f(log.bytes())),
            (
                "requests_total".to_owned(),
                f(self.requests.0.load(Ordering::Relaxed)),
            ),
            (
                "errors_total".to_owned(),
                f(self.requests.1.load(Ordering::Relaxed)),
            ),
            ("pushed_total".to_owned(), sum(|q| q.pushed)),
            ("consumed_total".to_owned(), sum(|q| q.consumed)),
            ("depth".to_owned(), sum(|q| q.depth)),
            ("lag".to_owned(), sum(|q| q.lag)),
        ]);
        let at = self.clock.now_micros() / 1000;
        let sample = Sample {
            at,
            node,
            queues,
            partial,
        };
        let line = match serde_json::to_vec(&sample) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(target: "queen-app", error = %e, "analytics: a sample could not be encoded");
                return;
            }
        };
        if let Err(e) = log.append(at, &line) {
            tracing::warn!(target: "queen-app", error = %e, "analytics: a sample could not be written");
        }
    }

    /// Series from the sample log, read on a blocking thread (a wide range parses many
    /// samples; the runtime's workers go on serving meanwhile).
    pub(super) async fn analytics_read(
        &self,
        q: AnalyticsQuery,
    ) -> Result<AnalyticsAnswer, BrokerError> {
        let Some(log) = self.samples.clone() else {
            return Err(BrokerError::Unavailable(
                "analytics are off on this node (QUEEN_ANALYTICS_INTERVAL_MS=0)".to_owned(),
            ));
        };
        let node_id = self.health().progress.node_id;
        tokio::task::spawn_blocking(move || read_series(&*log, node_id, &q))
            .await
            .map_err(|e| BrokerError::Internal(format!("the analytics read stopped: {e}")))?
    }

    /// Count one served request (for the worker series).
    pub(super) fn count_request(&self, status: u16) {
        self.requests.0.fetch_add(1, Ordering::Relaxed);
        if status >= 500 {
            self.requests.1.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Series of `q` from `log`.
fn read_series(
    log: &dyn SampleLog,
    node_id: u64,
    q: &AnalyticsQuery,
) -> Result<AnalyticsAnswer, BrokerError> {
    if q.to_ms < q.from_ms {
        return Err(BrokerError::Invalid {
            field: "to".to_owned(),
            problem: "is before from".to_owned(),
        });
    }
    if (q.to_ms - q.from_ms) / q.interval.millis() > MAX_POINTS {
        return Err(BrokerError::Invalid {
            field: "interval".to_owned(),
            problem: format!(
                "gives more than {MAX_POINTS} buckets from 'from' to 'to': choose a wider interval or a shorter range"
            ),
        });
    }
    let mut out = AnalyticsAnswer {
        node_id,
        ..AnalyticsAnswer::default()
    };
    let mut per_queue: BTreeMap<String, Series> = BTreeMap::new();
    let mut totals = Series::new(q.interval).summed();
    let mut first = true;
    let mut bad = 0usize;
    log.read(q.from_ms, q.to_ms, &mut |line| {
        let Ok(sample) = serde_json::from_slice::<Sample>(line) else {
            bad += 1;
            return true;
        };
        if sample.at > q.to_ms {
            return false;
        }
        if sample.at < q.from_ms {
            return true;
        }
        out.samples += 1;
        out.partial |= sample.partial;
        match &q.scope {
            AnalyticsScope::Node => totals.add(sample.at, &sample.node),
            AnalyticsScope::Queues { tenant, queue } => {
                let mut sum: BTreeMap<String, f64> = BTreeMap::new();
                for qs in &sample.queues {
                    if !tenant.owns(&qs.queue) {
                        continue;
                    }
                    let local = tenant.local(&qs.queue);
                    if queue.as_deref().is_some_and(|w| w != local) {
                        continue;
                    }
                    let figures = analytics::queue_figures(qs);
                    for (k, v) in &figures {
                        *sum.entry(k.clone()).or_default() += v;
                    }
                    if per_queue.len() < MAX_SERIES || per_queue.contains_key(local) {
                        per_queue
                            .entry(local.to_owned())
                            .or_insert_with(|| {
                                let s = Series::new(q.interval);
                                if first { s } else { s.born_in_range() }
                            })
                            .add(sample.at, &figures);
                    }
                }
                totals.add(sample.at, &sum);
            }
        }
        first = false;
        true
    })
    .map_err(|e| {
        tracing::warn!(target: "queen-app", error = %e, "analytics: the samples could not be read");
        BrokerError::Internal("reading the analytics samples failed; see the node's log".to_owned())
    })?;
    if bad > 0 {
        tracing::debug!(target: "queen-app", lines = bad, "analytics: unreadable sample lines skipped");
    }
    out.totals = totals.points();
    out.queues = per_queue
        .into_iter()
        .map(|(queue, s)| QueueSeries {
            queue,
            points: s.points(),
        })
        .collect();
    Ok(out)
}

/// Run the sampler every `every` until `stop` turns true.
pub async fn run_sampler(
    broker: Arc<Broker>,
    every: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // Reading every queue's partitions is blocking work: off the runtime's workers.
                let b = broker.clone();
                let _ = tokio::task::spawn_blocking(move || b.sample_analytics()).await;
            }
            _ = stop.changed() => break,
        }
    }
}
