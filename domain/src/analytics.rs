//! Analytics: samples a node takes of its queues and of itself, and the time series read from
//! them (`/api/v1/status/analytics`, `/api/v1/analytics/{system,worker}-metrics`).
//!
//! A sample holds cumulative counters (messages pushed and consumed per queue, requests served)
//! and gauges (depth, lag, memory). A series cuts the samples into buckets of a minute, an hour
//! or a day: a counter's figure in a bucket is what it grew by between the sample before the
//! bucket's first and the bucket's last (a counter that went down, as when a queue was deleted
//! and made again, counts from zero); a gauge's figure is its last value in the bucket and its
//! highest.
//!
//! Queue figures come from the replicated state, so every node samples the same ones; node
//! figures are the sampling node's own. Samples are kept node-local, in a log bounded by a
//! retention time and a size (the store adapter's `SampleFiles`). This module has no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::reads;
use crate::store::{StateRead, StoreError};

/// Most queues one sample records (in name order; the rest are left out and the sample says
/// so).
pub const MAX_QUEUES: usize = 500;

/// Most partitions one sample reads the cursors of, over all its queues.
pub const MAX_PARTITIONS: usize = 20_000;

/// One queue in a sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSample {
    /// The stored name.
    pub queue: String,
    /// Messages pushed, ever (the partitions' high watermarks).
    pub pushed: u64,
    /// Messages consumed, ever, summed over groups (their cursors).
    pub consumed: u64,
    /// Messages stored now.
    pub depth: u64,
    /// Messages not yet consumed by the group furthest behind.
    pub lag: u64,
    /// Messages dead-lettered, ever.
    pub dead: u64,
    /// Partitions.
    pub partitions: u64,
}

/// One sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// When it was taken (epoch milliseconds).
    pub at: u64,
    /// The node's own figures: name -> value (counters end in `_total`).
    pub node: BTreeMap<String, f64>,
    /// The queues, in name order.
    pub queues: Vec<QueueSample>,
    /// Whether queues were left out (more than [`MAX_QUEUES`] or [`MAX_PARTITIONS`]).
    pub partial: bool,
}

/// The queues of a sample, read from the applied state.
///
/// # Errors
/// Store failures.
pub fn sample_queues(s: &dyn StateRead) -> Result<(Vec<QueueSample>, bool), StoreError> {
    let queues = reads::queues(s, MAX_QUEUES + 1)?;
    let mut partial = queues.len() > MAX_QUEUES;
    let mut budget = MAX_PARTITIONS;
    let mut out = Vec::with_capacity(queues.len().min(MAX_QUEUES));
    for q in queues.into_iter().take(MAX_QUEUES) {
        // The queue's counter is exact: a queue over the budget is not read at all (reading
        // its partitions first cost a drain of 50,000 partitions a quarter of its CPU).
        if usize::try_from(q.partitions).unwrap_or(usize::MAX) > budget {
            partial = true;
            break;
        }
        let Some(view) = reads::queue_view(s, &q.name)? else {
            continue;
        };
        if view.partitions.len() > budget {
            partial = true;
            break;
        }
        budget -= view.partitions.len();
        let (mut pushed, mut consumed) = (0u64, 0u64);
        // Per group: messages behind its cursor over all partitions.
        let mut behind: BTreeMap<String, u64> = BTreeMap::new();
        for p in &view.partitions {
            pushed += p.next_offset;
            for (g, c) in reads::cursors(s, p.pid)? {
                let next = c.next.max(p.log_start).min(p.next_offset);
                consumed += c.next.min(p.next_offset);
                *behind.entry(g).or_default() += p.next_offset - next;
            }
        }
        // A queue nobody consumed yet lags by everything it stores.
        let lag = behind.values().copied().max().unwrap_or(q.messages);
        out.push(QueueSample {
            queue: q.name,
            pushed,
            consumed,
            depth: q.messages,
            lag,
            dead: q.dead_lettered,
            partitions: q.partitions,
        });
    }
    Ok((out, partial))
}

/// A bucket width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    /// 60 seconds.
    Minute,
    /// 3600 seconds.
    Hour,
    /// 86400 seconds.
    Day,
}

impl Interval {
    /// The width a word names (`minute`, `hour`, `day`).
    #[must_use]
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "minute" => Some(Interval::Minute),
            "hour" => Some(Interval::Hour),
            "day" => Some(Interval::Day),
            _ => None,
        }
    }

    /// The word.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Interval::Minute => "minute",
            Interval::Hour => "hour",
            Interval::Day => "day",
        }
    }

    /// The width in milliseconds.
    #[must_use]
    pub fn millis(self) -> u64 {
        match self {
            Interval::Minute => 60_000,
            Interval::Hour => 3_600_000,
            Interval::Day => 86_400_000,
        }
    }
}

/// One bucket of a series: counters grown and gauges seen in it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Point {
    /// The bucket's start (epoch milliseconds).
    pub at: u64,
    /// Counter name -> growth in the bucket.
    pub counts: BTreeMap<String, f64>,
    /// Gauge name -> its last value in the bucket.
    pub last: BTreeMap<String, f64>,
    /// Gauge name -> its highest value in the bucket.
    pub max: BTreeMap<String, f64>,
}

/// Builds a series from samples in time order, one named figure set per sample.
#[derive(Debug, Default)]
pub struct Series {
    width: u64,
    points: Vec<Point>,
    /// The counters of the sample before, for growth.
    before: BTreeMap<String, f64>,
    /// A counter first seen counts all of its value (its subject was born in the range).
    first_full: bool,
    /// A counter that went down grew by nothing (a sum whose part went away), instead of
    /// counting from zero (a subject made again).
    drop_is_loss: bool,
}

impl Series {
    /// An empty series of `interval` buckets.
    #[must_use]
    pub fn new(interval: Interval) -> Self {
        Self {
            width: interval.millis(),
            ..Self::default()
        }
    }

    /// The series of a subject first seen after the range's first sample: its counters count
    /// from zero at their first sample.
    #[must_use]
    pub fn born_in_range(mut self) -> Self {
        self.first_full = true;
        self
    }

    /// The series of a sum over subjects that come and go: a counter that goes down (a part
    /// went away) grew by nothing in that sample.
    #[must_use]
    pub fn summed(mut self) -> Self {
        self.drop_is_loss = true;
        self
    }

    /// Add one sample's figures, taken at `at`: names ending in `_total` are counters, the
    /// rest gauges.
    pub fn add(&mut self, at: u64, figures: &BTreeMap<String, f64>) {
        let start = at - at % self.width;
        if self.points.last().is_none_or(|p| p.at != start) {
            self.points.push(Point {
                at: start,
                ..Point::default()
            });
        }
        let Some(point) = self.points.last_mut() else {
            return;
        };
        for (name, &v) in figures {
            if name.ends_with("_total") {
                let grown = match self.before.get(name) {
                    Some(&b) if v >= b => v - b,
                    Some(_) if self.drop_is_loss => 0.0,
                    // It went down: its subject was made again.
                    Some(_) => v,
                    None if self.first_full => v,
                    // First seen in the range's first sample: nothing to compare with.
                    None => 0.0,
                };
                *point.counts.entry(name.clone()).or_default() += grown;
                self.before.insert(name.clone(), v);
            } else {
                point.last.insert(name.clone(), v);
                let m = point.max.entry(name.clone()).or_insert(v);
                if v > *m {
                    *m = v;
                }
            }
        }
    }

    /// The buckets, oldest first.
    #[must_use]
    pub fn points(self) -> Vec<Point> {
        self.points
    }
}

/// A queue's figures as a series takes them.
#[must_use]
pub fn queue_figures(q: &QueueSample) -> BTreeMap<String, f64> {
    #[allow(clippy::cast_precision_loss)]
    let f = |v: u64| v as f64;
    BTreeMap::from([
        ("pushed_total".to_owned(), f(q.pushed)),
        ("consumed_total".to_owned(), f(q.consumed)),
        ("dead_lettered_total".to_owned(), f(q.dead)),
        ("depth".to_owned(), f(q.depth)),
        ("lag".to_owned(), f(q.lag)),
        ("partitions".to_owned(), f(q.partitions)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn counters_grow_by_bucket_and_gauges_keep_last_and_max() {
        let mut s = Series::new(Interval::Minute);
        s.add(59_000, &figures(&[("pushed_total", 10.0), ("depth", 3.0)]));
        s.add(61_000, &figures(&[("pushed_total", 15.0), ("depth", 9.0)]));
        s.add(90_000, &figures(&[("pushed_total", 22.0), ("depth", 4.0)]));
        s.add(125_000, &figures(&[("pushed_total", 2.0), ("depth", 1.0)]));
        let p = s.points();
        assert_eq!(p.len(), 3);
        // The first sample has nothing before it in this read.
        assert_eq!(p[0].counts["pushed_total"], 0.0);
        assert_eq!(p[1].at, 60_000);
        assert_eq!(p[1].counts["pushed_total"], 12.0);
        assert_eq!(p[1].last["depth"], 4.0);
        assert_eq!(p[1].max["depth"], 9.0);
        // It went down (the queue was made again): counted from zero.
        assert_eq!(p[2].counts["pushed_total"], 2.0);
    }

    #[test]
    fn subjects_born_in_range_and_sums_that_lose_a_part() {
        let mut born = Series::new(Interval::Minute).born_in_range();
        born.add(1_000, &figures(&[("pushed_total", 4.0)]));
        assert_eq!(born.points()[0].counts["pushed_total"], 4.0);
        let mut sum = Series::new(Interval::Minute).summed();
        sum.add(1_000, &figures(&[("pushed_total", 10.0)]));
        sum.add(2_000, &figures(&[("pushed_total", 3.0)]));
        sum.add(3_000, &figures(&[("pushed_total", 5.0)]));
        assert_eq!(sum.points()[0].counts["pushed_total"], 2.0);
    }

    #[test]
    fn intervals_read_their_words() {
        for i in [Interval::Minute, Interval::Hour, Interval::Day] {
            assert_eq!(Interval::parse(i.as_str()), Some(i));
        }
        assert_eq!(Interval::parse("week"), None);
    }
}
