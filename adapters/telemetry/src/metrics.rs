//! Every instrument the node records, created once from one meter.
//!
//! Instrument names are the Prometheus names themselves (with `_total` on counters and no unit
//! suffix added by the exporter), so `/metrics/prometheus` and OTLP carry the same names.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, ObservableCounter};

/// Bucket bounds (seconds) for request and proposal latencies: 1 ms to the 30 s request deadline.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The ack statuses kept as label values; anything else is counted as `other` so a caller
/// cannot grow the label set without bound.
const ACK_STATUSES: [&str; 5] = ["completed", "failed", "dlq", "retry", "refused"];

/// All metric instruments of a node. Recording is lock-free and cheap; clone the owning
/// [`crate::Telemetry`] rather than this.
#[derive(Debug)]
pub struct Metrics {
    /// `queen_http_requests_total{route,status}`.
    http_requests: Counter<u64>,
    /// `queen_http_request_duration_seconds{route}`.
    http_request_duration: Histogram<f64>,
    /// `queen_raft_proposals_total{kind,result}`.
    raft_proposals: Counter<u64>,
    /// `queen_raft_proposal_duration_seconds{kind}`.
    raft_proposal_duration: Histogram<f64>,
    /// `queen_messages_pushed_total`.
    messages_pushed: Counter<u64>,
    /// `queen_messages_duplicate_total`.
    messages_duplicate: Counter<u64>,
    /// `queen_messages_delivered_total`.
    messages_delivered: Counter<u64>,
    /// `queen_acks_total{status}`.
    acks: Counter<u64>,
    /// `queen_raft_term`.
    raft_term: Gauge<u64>,
    /// `queen_raft_applied_index`.
    raft_applied_index: Gauge<u64>,
    /// `queen_raft_commit_index`.
    raft_commit_index: Gauge<u64>,
    /// `queen_raft_is_leader` (0 or 1).
    raft_is_leader: Gauge<u64>,
    /// The running fsync total the caller last reported; read by the observable counter below.
    /// By raft group (`u16::MAX`: a node of one group, exported without the label).
    log_fsyncs: Arc<std::sync::Mutex<std::collections::BTreeMap<u16, u64>>>,
    /// `queen_raft_log_fsyncs_total`: an observable counter, because the caller owns the count.
    _log_fsyncs_counter: ObservableCounter<u64>,
    /// `queen_store_disk_bytes`.
    store_disk_bytes: Gauge<u64>,
    /// `queen_pop_waiting`.
    pop_waiting: Gauge<u64>,
    /// `queen_disk_used_ratio`: the data directory's file system, used over total.
    disk_used_ratio: Gauge<f64>,
    /// `queen_disk_gate_ratio`: where the disk gate closes (`QUEEN_RAFT_DISK_HIGH_PCT` / 100).
    disk_gate_ratio: Gauge<f64>,
    /// The S3 sink's instruments.
    s3: crate::s3::S3Metrics,
    /// `queen_ephemeral_bytes`, `queen_ephemeral_messages`, `queen_ephemeral_queues`.
    ephemeral_held: [Gauge<u64>; 3],
    /// The ephemeral counters, as last set (observed at each export).
    ephemeral_totals: Arc<[AtomicU64; 7]>,
    _ephemeral_counters: Vec<ObservableCounter<u64>>,
}

/// The ephemeral queues' counters since the node started.
#[derive(Debug, Clone, Copy, Default)]
pub struct EphemeralTotals {
    /// Messages pushed.
    pub pushed: u64,
    /// Deliveries.
    pub delivered: u64,
    /// Acks that completed a message (and deliveries committed by `autoAck`).
    pub acked: u64,
    /// Messages dropped by a bound under the drop-oldest policy.
    pub dropped_bounds: u64,
    /// Messages dropped by `ttlSeconds`.
    pub dropped_ttl: u64,
    /// Messages dropped at their retry limit.
    pub dropped_retry: u64,
    /// Messages removed by `reset` and `delete`.
    pub wiped: u64,
}

impl Metrics {
    /// Creates every instrument on `meter`. Series without labels start at 0 so they are
    /// exported from the first scrape.
    pub(crate) fn new(meter: &Meter) -> Self {
        let counter = |name: &'static str, help: &'static str| {
            meter.u64_counter(name).with_description(help).build()
        };
        let gauge = |name: &'static str, help: &'static str| {
            meter.u64_gauge(name).with_description(help).build()
        };
        let latency = |name: &'static str, help: &'static str| {
            meter
                .f64_histogram(name)
                .with_description(help)
                .with_unit("s")
                .with_boundaries(LATENCY_BUCKETS.to_vec())
                .build()
        };
        let log_fsyncs: Arc<std::sync::Mutex<std::collections::BTreeMap<u16, u64>>> =
            Arc::default();
        let ephemeral_totals: Arc<[AtomicU64; 7]> = Arc::new(Default::default());
        let observed = Arc::clone(&log_fsyncs);
        let metrics = Self {
            http_requests: counter(
                "queen_http_requests_total",
                "Client HTTP requests answered, by route and status code.",
            ),
            http_request_duration: latency(
                "queen_http_request_duration_seconds",
                "Time to answer a client HTTP request, by route.",
            ),
            raft_proposals: counter(
                "queen_raft_proposals_total",
                "Commands proposed to the replicated log, by kind and result.",
            ),
            raft_proposal_duration: latency(
                "queen_raft_proposal_duration_seconds",
                "Time from proposing a command to its outcome on this node, by kind.",
            ),
            messages_pushed: counter(
                "queen_messages_pushed_total",
                "Messages accepted into a queue.",
            ),
            messages_duplicate: counter(
                "queen_messages_duplicate_total",
                "Pushed messages dropped as duplicates of an earlier transaction id.",
            ),
            messages_delivered: counter(
                "queen_messages_delivered_total",
                "Messages handed to consumers by pop.",
            ),
            acks: counter("queen_acks_total", "Acknowledgements, by status."),
            raft_term: gauge("queen_raft_term", "Current raft term seen by this node."),
            raft_applied_index: gauge(
                "queen_raft_applied_index",
                "Index of the last log entry applied on this node.",
            ),
            raft_commit_index: gauge(
                "queen_raft_commit_index",
                "Index of the last log entry known committed on this node.",
            ),
            raft_is_leader: gauge(
                "queen_raft_is_leader",
                "1 while this node is the raft leader, else 0.",
            ),
            _log_fsyncs_counter: meter
                .u64_observable_counter("queen_raft_log_fsyncs_total")
                .with_description("Fsyncs of the raft log since this process started.")
                .with_callback(move |observer| {
                    let totals = observed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone();
                    for (group, total) in totals {
                        observer.observe(total, &group_label(group));
                    }
                })
                .build(),
            log_fsyncs,
            store_disk_bytes: gauge(
                "queen_store_disk_bytes",
                "Bytes the state store occupies on disk.",
            ),
            pop_waiting: gauge("queen_pop_waiting", "Pop requests waiting for messages."),
            disk_used_ratio: meter
                .f64_gauge("queen_disk_used_ratio")
                .with_description("Used over total bytes of the data directory's file system.")
                .build(),
            disk_gate_ratio: meter
                .f64_gauge("queen_disk_gate_ratio")
                .with_description(
                    "The used ratio at which the disk gate refuses writes that add data (QUEEN_RAFT_DISK_HIGH_PCT / 100).",
                )
                .build(),
            s3: crate::s3::S3Metrics::new(meter),
            ephemeral_held: [
                gauge(
                    "queen_ephemeral_bytes",
                    "Bytes held by this node's ephemeral queues (payloads and per-message overhead).",
                ),
                gauge(
                    "queen_ephemeral_messages",
                    "Messages held by this node's ephemeral queues.",
                ),
                gauge(
                    "queen_ephemeral_queues",
                    "Ephemeral queues this node holds in memory.",
                ),
            ],
            ephemeral_totals: Arc::clone(&ephemeral_totals),
            _ephemeral_counters: ephemeral_counters(meter, &ephemeral_totals),
        };
        metrics.messages_pushed.add(0, &[]);
        metrics.messages_duplicate.add(0, &[]);
        metrics.messages_delivered.add(0, &[]);
        for status in ACK_STATUSES {
            metrics.acks.add(0, &[KeyValue::new("status", status)]);
        }
        metrics.set_raft(None, 0, 0, 0, false);
        metrics.set_log_fsyncs(None, 0);
        metrics.set_ephemeral(0, 0, 0, EphemeralTotals::default());
        metrics.set_store_disk_bytes(None, 0);
        metrics.set_waiting_pops(0);
        metrics
    }

    /// Records one answered client request: `queen_http_requests_total{route,status}` and
    /// `queen_http_request_duration_seconds{route}`. `route` is the route pattern, never the
    /// raw path, so the label set stays bounded.
    pub fn http_request(&self, route: &'static str, status: u16, seconds: f64) {
        self.http_requests.add(
            1,
            &[
                KeyValue::new("route", route),
                KeyValue::new("status", i64::from(status)),
            ],
        );
        self.http_request_duration
            .record(seconds, &[KeyValue::new("route", route)]);
    }

    /// Records one proposal to the replicated log: `queen_raft_proposals_total{kind,result}`
    /// (`result` is `ok` or `error`) and `queen_raft_proposal_duration_seconds{kind}`.
    pub fn proposal(&self, kind: &'static str, ok: bool, seconds: f64) {
        let result = if ok { "ok" } else { "error" };
        self.raft_proposals.add(
            1,
            &[KeyValue::new("kind", kind), KeyValue::new("result", result)],
        );
        self.raft_proposal_duration
            .record(seconds, &[KeyValue::new("kind", kind)]);
    }

    /// Adds `n` to `queen_messages_pushed_total`.
    pub fn messages_pushed(&self, n: u64) {
        self.messages_pushed.add(n, &[]);
    }

    /// Adds `n` to `queen_messages_duplicate_total`.
    pub fn messages_duplicate(&self, n: u64) {
        self.messages_duplicate.add(n, &[]);
    }

    /// Adds `n` to `queen_messages_delivered_total`.
    pub fn messages_delivered(&self, n: u64) {
        self.messages_delivered.add(n, &[]);
    }

    /// Adds `n` to `queen_acks_total{status}`; a status other than `completed`, `failed`, `dlq`,
    /// `retry` or `refused` is counted as `other`.
    pub fn acks(&self, status: &str, n: u64) {
        let status = ACK_STATUSES
            .iter()
            .copied()
            .find(|known| *known == status)
            .unwrap_or("other");
        self.acks.add(n, &[KeyValue::new("status", status)]);
    }

    /// Sets the raft gauges `queen_raft_term`, `queen_raft_applied_index`,
    /// `queen_raft_commit_index` and `queen_raft_is_leader`.
    /// With several raft groups (`QUEEN_RAFT_GROUPS`), `group` labels them; `None` on a node of
    /// one group (no label).
    pub fn set_raft(
        &self,
        group: Option<u16>,
        term: u64,
        applied: u64,
        commit: u64,
        is_leader: bool,
    ) {
        let label = group_label(group.unwrap_or(u16::MAX));
        self.raft_term.record(term, &label);
        self.raft_applied_index.record(applied, &label);
        self.raft_commit_index.record(commit, &label);
        self.raft_is_leader.record(u64::from(is_leader), &label);
    }

    /// Reports the running total of raft log fsyncs of `group` (as in [`Self::set_raft`]),
    /// exported as the counter `queen_raft_log_fsyncs_total`. A total lower than one already
    /// reported is ignored, so the counter never goes backwards.
    pub fn set_log_fsyncs(&self, group: Option<u16>, total: u64) {
        let mut totals = self
            .log_fsyncs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if group.is_some() && totals.get(&u16::MAX) == Some(&0) {
            // The unlabelled zero a new registry starts with, on a node of several groups.
            totals.remove(&u16::MAX);
        }
        let t = totals.entry(group.unwrap_or(u16::MAX)).or_default();
        *t = (*t).max(total);
    }

    /// Sets `queen_store_disk_bytes` (of `group`, as in [`Self::set_raft`]).
    pub fn set_store_disk_bytes(&self, group: Option<u16>, bytes: u64) {
        self.store_disk_bytes
            .record(bytes, &group_label(group.unwrap_or(u16::MAX)));
    }

    /// The S3 sink's instruments.
    pub fn s3(&self) -> &crate::s3::S3Metrics {
        &self.s3
    }

    /// Sets `queen_disk_used_ratio` and `queen_disk_gate_ratio` from a sample of the data
    /// directory's file system.
    pub fn set_disk(&self, total_bytes: u64, used_bytes: u64, gate_pct: u8) {
        if total_bytes > 0 {
            let ratio = used_bytes as f64 / total_bytes as f64;
            self.disk_used_ratio.record(ratio, &[]);
        }
        self.disk_gate_ratio
            .record(f64::from(gate_pct) / 100.0, &[]);
    }

    /// Sets the ephemeral queues' gauges and counters.
    pub fn set_ephemeral(&self, bytes: u64, messages: u64, queues: u64, t: EphemeralTotals) {
        for (g, v) in self.ephemeral_held.iter().zip([bytes, messages, queues]) {
            g.record(v, &[]);
        }
        let values = [
            t.pushed,
            t.delivered,
            t.acked,
            t.dropped_bounds,
            t.dropped_ttl,
            t.dropped_retry,
            t.wiped,
        ];
        for (a, v) in self.ephemeral_totals.iter().zip(values) {
            a.store(v, Ordering::Relaxed);
        }
    }

    /// Sets `queen_pop_waiting`, the number of pops parked waiting for messages.
    pub fn set_waiting_pops(&self, n: u64) {
        self.pop_waiting.record(n, &[]);
    }
}

/// The `group` label of a raft group's figures (none for `u16::MAX`, a node of one group).
fn group_label(group: u16) -> Vec<KeyValue> {
    if group == u16::MAX {
        Vec::new()
    } else {
        vec![KeyValue::new("group", i64::from(group))]
    }
}

/// The ephemeral queues' counters, observed from `totals` at each export.
fn ephemeral_counters(meter: &Meter, totals: &Arc<[AtomicU64; 7]>) -> Vec<ObservableCounter<u64>> {
    let one = |name: &'static str, help: &'static str, i: usize| {
        let t = Arc::clone(totals);
        meter
            .u64_observable_counter(name)
            .with_description(help)
            .with_callback(move |o| o.observe(t[i].load(Ordering::Relaxed), &[]))
            .build()
    };
    let t = Arc::clone(totals);
    vec![
        one(
            "queen_ephemeral_pushed_total",
            "Messages pushed to this node's ephemeral queues.",
            0,
        ),
        one(
            "queen_ephemeral_delivered_total",
            "Ephemeral deliveries by this node.",
            1,
        ),
        one(
            "queen_ephemeral_acked_total",
            "Ephemeral messages completed (acked or committed at delivery).",
            2,
        ),
        one(
            "queen_ephemeral_wipes_total",
            "Ephemeral messages removed by reset or delete.",
            6,
        ),
        meter
            .u64_observable_counter("queen_ephemeral_dropped_total")
            .with_description("Ephemeral messages dropped, by cause (bounds, ttl, retry).")
            .with_callback(move |o| {
                for (cause, i) in [("bounds", 3), ("ttl", 4), ("retry", 5)] {
                    o.observe(
                        t[i].load(Ordering::Relaxed),
                        &[KeyValue::new("cause", cause)],
                    );
                }
            })
            .build(),
    ]
}
