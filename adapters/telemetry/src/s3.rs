//! The S3 sink's instruments, with the names and labels of the sink's reference. Counters and
//! histograms are recorded as events happen; the per-queue gauges are observed from a table the
//! sink replaces as its queues change, so a node exports a queue's gauges only while it runs
//! the queue.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{AsyncInstrument, Counter, Histogram, Meter, ObservableGauge};

/// One queue's gauges, as the sink last computed them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct S3QueueGauges {
    /// `queen_s3_lag_seconds`: safeTime minus completeThrough.
    pub lag_seconds: f64,
    /// `queen_s3_safe_lag_seconds`: the lag plus how far the applied log trails the clock.
    pub safe_lag_seconds: f64,
    /// `queen_s3_buffer_bytes`: bytes buffered for the filling window.
    pub buffer_bytes: u64,
    /// `queen_s3_discovery_partitions`: partitions the queue has.
    pub discovery_partitions: u64,
    /// `queen_s3_checkpoint_age_windows`: windows committed since the last checkpoint.
    pub checkpoint_age_windows: u64,
    /// `queen_s3_window_seconds`: the longest a window stays open (`QUEEN_S3_MAX_WINDOW_MS`).
    pub window_seconds: f64,
}

type Table = Arc<Mutex<BTreeMap<QueueKey, S3QueueGauges>>>;

/// A queue as the sink's metrics name it: `queue` and, for every tenant but the default one,
/// `tenant="<id>"`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueKey {
    /// The tenant, `None` for the default tenant.
    pub tenant: Option<String>,
    /// The queue's name as its clients know it.
    pub queue: String,
}

impl QueueKey {
    /// The key of `queue` of `tenant` (`None`: the default tenant).
    #[must_use]
    pub fn new(tenant: Option<&str>, queue: &str) -> Self {
        Self {
            tenant: tenant.map(str::to_owned),
            queue: queue.to_owned(),
        }
    }

    fn labels(&self) -> Vec<KeyValue> {
        let mut l = vec![KeyValue::new("queue", self.queue.clone())];
        if let Some(t) = &self.tenant {
            l.push(KeyValue::new("tenant", t.clone()));
        }
        l
    }
}

/// The sink's instruments.
#[derive(Debug)]
pub struct S3Metrics {
    windows_committed: Counter<u64>,
    records_written: Counter<u64>,
    bytes_written: Counter<u64>,
    records_lost: Counter<u64>,
    window_records: Histogram<u64>,
    window_bytes: Histogram<u64>,
    fetch_calls: Counter<u64>,
    s3_requests: Counter<u64>,
    commit_precondition_lost: Counter<u64>,
    queues_given_back: Counter<u64>,
    table: Table,
    _gauges: Vec<ObservableGauge<f64>>,
    _int_gauges: Vec<ObservableGauge<u64>>,
}

/// A callback that reports `pick` of every running queue's gauges, labelled by queue.
fn per_queue<T: 'static>(
    table: &Table,
    pick: fn(&S3QueueGauges) -> T,
) -> impl Fn(&dyn AsyncInstrument<T>) + Send + Sync + 'static {
    let table = Arc::clone(table);
    move |o| {
        for (queue, g) in table.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            o.observe(pick(g), &queue.labels());
        }
    }
}

fn observed_f64(
    meter: &Meter,
    table: &Table,
    name: &'static str,
    help: &'static str,
    pick: fn(&S3QueueGauges) -> f64,
) -> ObservableGauge<f64> {
    meter
        .f64_observable_gauge(name)
        .with_description(help)
        .with_callback(per_queue(table, pick))
        .build()
}

fn observed_u64(
    meter: &Meter,
    table: &Table,
    name: &'static str,
    help: &'static str,
    pick: fn(&S3QueueGauges) -> u64,
) -> ObservableGauge<u64> {
    meter
        .u64_observable_gauge(name)
        .with_description(help)
        .with_callback(per_queue(table, pick))
        .build()
}

impl S3Metrics {
    pub(crate) fn new(meter: &Meter) -> Self {
        let counter = |name: &'static str, help: &'static str| {
            meter.u64_counter(name).with_description(help).build()
        };
        let sizes = |name: &'static str, help: &'static str, bounds: Vec<f64>| {
            meter
                .u64_histogram(name)
                .with_description(help)
                .with_boundaries(bounds)
                .build()
        };
        let table: Table = Arc::default();
        let pow = |base: f64, n: i32| (0..n).map(|i| base * 4f64.powi(i)).collect::<Vec<_>>();
        Self {
            windows_committed: counter(
                "queen_s3_windows_committed_total",
                "Windows this node committed, by queue.",
            ),
            records_written: counter(
                "queen_s3_records_written_total",
                "Records in windows this node committed, by queue.",
            ),
            bytes_written: counter(
                "queen_s3_bytes_written_total",
                "Object bytes this node uploaded for committed windows, by queue.",
            ),
            records_lost: counter(
                "queen_s3_records_lost_total",
                "Records retention deleted before the sink read them, by queue.",
            ),
            window_records: sizes(
                "queen_s3_window_records",
                "Records per committed window.",
                pow(1.0, 12),
            ),
            window_bytes: sizes(
                "queen_s3_window_bytes",
                "Object bytes per committed window.",
                pow(1024.0, 12),
            ),
            fetch_calls: counter(
                "queen_s3_fetch_calls_total",
                "Reads of the applied log by the sink, by queue.",
            ),
            s3_requests: counter(
                "queen_s3_s3_requests_total",
                "Requests to the object store, by operation and status code.",
            ),
            commit_precondition_lost: counter(
                "queen_s3_commit_precondition_lost_total",
                "Intent or pointer batches refused because another node took the lease, by queue.",
            ),
            queues_given_back: counter(
                "queen_s3_queues_given_back_total",
                "Queues this node gave back to even out placement.",
            ),
            _gauges: vec![
                observed_f64(
                    meter,
                    &table,
                    "queen_s3_lag_seconds",
                    "safeTime minus the stamp below which every record is committed, by queue.",
                    |g| g.lag_seconds,
                ),
                observed_f64(
                    meter,
                    &table,
                    "queen_s3_safe_lag_seconds",
                    "The lag plus how far this node's applied log trails its clock, by queue.",
                    |g| g.safe_lag_seconds,
                ),
                observed_f64(
                    meter,
                    &table,
                    "queen_s3_window_seconds",
                    "The longest a window of the queue stays open (QUEEN_S3_MAX_WINDOW_MS), by queue.",
                    |g| g.window_seconds,
                ),
            ],
            _int_gauges: vec![
                observed_u64(
                    meter,
                    &table,
                    "queen_s3_buffer_bytes",
                    "Bytes buffered for the filling window, by queue.",
                    |g| g.buffer_bytes,
                ),
                observed_u64(
                    meter,
                    &table,
                    "queen_s3_discovery_partitions",
                    "Partitions discovery reports, by queue.",
                    |g| g.discovery_partitions,
                ),
                observed_u64(
                    meter,
                    &table,
                    "queen_s3_checkpoint_age_windows",
                    "Windows committed since the last checkpoint, by queue.",
                    |g| g.checkpoint_age_windows,
                ),
            ],
            table,
        }
    }

    /// A committed window: `queen_s3_windows_committed_total`, `..._records_written_total`,
    /// `..._bytes_written_total` and the two window histograms.
    pub fn window_committed(&self, queue: &QueueKey, records: u64, bytes: u64) {
        let l = queue.labels();
        self.windows_committed.add(1, &l);
        self.records_written.add(records, &l);
        self.bytes_written.add(bytes, &l);
        self.window_records.record(records, &[]);
        self.window_bytes.record(bytes, &[]);
    }

    /// `queen_s3_records_lost_total`.
    pub fn records_lost(&self, queue: &QueueKey, n: u64) {
        self.records_lost.add(n, &queue.labels());
    }

    /// `queen_s3_fetch_calls_total`.
    pub fn fetch_call(&self, queue: &QueueKey) {
        self.fetch_calls.add(1, &queue.labels());
    }

    /// `queen_s3_s3_requests_total{operation,status}`.
    pub fn s3_request(&self, operation: &'static str, status: u16) {
        self.s3_requests.add(
            1,
            &[
                KeyValue::new("operation", operation),
                KeyValue::new("status", i64::from(status)),
            ],
        );
    }

    /// `queen_s3_commit_precondition_lost_total`.
    pub fn precondition_lost(&self, queue: &QueueKey) {
        self.commit_precondition_lost.add(1, &queue.labels());
    }

    /// `queen_s3_queues_given_back_total`.
    pub fn queue_given_back(&self) {
        self.queues_given_back.add(1, &[]);
    }

    /// Replace one queue's gauges (`None` stops exporting them).
    pub fn set_queue(&self, queue: &QueueKey, gauges: Option<S3QueueGauges>) {
        let mut t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        match gauges {
            Some(g) => {
                if t.insert(queue.clone(), g).is_none() {
                    // A queue's counters exist from the moment its sink runs, at zero, so that
                    // rates and `increase()` in alert rules see them before the first event.
                    let l = queue.labels();
                    for c in [
                        &self.windows_committed,
                        &self.records_written,
                        &self.bytes_written,
                        &self.records_lost,
                        &self.commit_precondition_lost,
                    ] {
                        c.add(0, &l);
                    }
                }
            }
            None => {
                t.remove(queue);
            }
        }
    }
}
