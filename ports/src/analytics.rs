//! The node-local log of analytics samples: appended by the node's sampler, read by the
//! analytics routes. Bounded by its adapter (a retention time and a size); not replicated.

/// Why the sample log failed.
#[derive(Debug, thiserror::Error)]
#[error("analytics samples: {0}")]
pub struct SampleLogError(pub String);

/// A node-local, bounded log of samples (each one line of JSON), in time order.
pub trait SampleLog: Send + Sync + 'static {
    /// Append one sample taken at `at_ms` (epoch milliseconds); drops what fell out of the
    /// retention or the size bound.
    ///
    /// # Errors
    /// The log could not be written.
    fn append(&self, at_ms: u64, line: &[u8]) -> Result<(), SampleLogError>;

    /// Visit the samples taken from `from_ms` to `to_ms` (inclusive; some before `from_ms`
    /// may be visited too), oldest first, until `f` answers false.
    ///
    /// # Errors
    /// The log could not be read.
    fn read(
        &self,
        from_ms: u64,
        to_ms: u64,
        f: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(), SampleLogError>;

    /// Bytes the log holds on disk now.
    fn bytes(&self) -> u64;
}

/// What an analytics read covers.
#[derive(Debug, Clone)]
pub enum AnalyticsScope {
    /// One tenant's queues (all of them, or one by its client name).
    Queues {
        /// The tenant.
        tenant: queen_domain::tenant::Tenant,
        /// Only this queue (the client's name).
        queue: Option<String>,
    },
    /// This node's own figures.
    Node,
}

/// An analytics read.
#[derive(Debug, Clone)]
pub struct AnalyticsQuery {
    /// What it covers.
    pub scope: AnalyticsScope,
    /// From (epoch milliseconds).
    pub from_ms: u64,
    /// To (epoch milliseconds, inclusive).
    pub to_ms: u64,
    /// The bucket width.
    pub interval: queen_domain::analytics::Interval,
}

/// One queue's series.
#[derive(Debug, Clone)]
pub struct QueueSeries {
    /// The client's name.
    pub queue: String,
    /// Its buckets, oldest first.
    pub points: Vec<queen_domain::analytics::Point>,
}

/// An analytics answer.
#[derive(Debug, Clone, Default)]
pub struct AnalyticsAnswer {
    /// The node that sampled it.
    pub node_id: u64,
    /// Per queue (queue scope).
    pub queues: Vec<QueueSeries>,
    /// The queues' figures summed per sample (queue scope), or the node's (node scope).
    pub totals: Vec<queen_domain::analytics::Point>,
    /// Samples read.
    pub samples: usize,
    /// Whether a sample in range left queues out.
    pub partial: bool,
}
