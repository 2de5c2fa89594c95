//! The window being filled for one queue: records read from the applied log go in, and the
//! window rules say when (and where) it closes. Pure; the runtime feeds it and uploads what it
//! hands back.
//!
//! The bounds are what makes a rebuild give the same bytes: a closed window is every record with
//! `ts` in `[start, end)`, and `end` is never later than what has been read of every partition,
//! so nothing that belongs to the window can still be unread when it closes.

use std::collections::BTreeMap;

use super::jsonl::SinkRecord;
use super::window::{CloseReason, WindowRules, decide, next_start};
use crate::time::Stamp;

/// Bytes a record counts for against the window size and the memory budget.
#[must_use]
pub fn record_size(r: &SinkRecord) -> u64 {
    (r.payload.len() + r.partition.len() + r.transaction_id.len() + 64) as u64
}

/// A window fixed for closing: its bounds and records, sorted by (partition, offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// Start (inclusive), µs.
    pub start: Stamp,
    /// End (exclusive), µs.
    pub end: Stamp,
    /// Why it closed.
    pub reason: CloseReason,
    /// The records.
    pub records: Vec<SinkRecord>,
}

/// The filling window of one queue.
#[derive(Debug, Clone)]
pub struct Builder {
    rules: WindowRules,
    /// End of the previous window: records stamped before it are already committed.
    prev_end: Stamp,
    /// Start of the filling window, once it has a record.
    start: Option<Stamp>,
    records: Vec<SinkRecord>,
    bytes: u64,
    /// Per partition with unread records: the stamp of the first unread record (everything
    /// stamped before it is read).
    partial: BTreeMap<String, Stamp>,
}

impl Builder {
    /// A builder continuing after a window that ended at `prev_end`.
    #[must_use]
    pub fn new(rules: WindowRules, prev_end: Stamp) -> Self {
        Self {
            rules,
            prev_end,
            start: None,
            records: Vec::new(),
            bytes: 0,
            partial: BTreeMap::new(),
        }
    }

    /// A builder that must rebuild exactly `[start, ..)` (redoing an intent).
    #[must_use]
    pub fn at(rules: WindowRules, start: Stamp) -> Self {
        Self {
            rules,
            prev_end: start,
            start: Some(start),
            records: Vec::new(),
            bytes: 0,
            partial: BTreeMap::new(),
        }
    }

    /// Take a record read from the log (in offset order per partition). Records stamped before
    /// the previous window's end are already in the lake and are skipped; answers whether it
    /// was kept.
    pub fn push(&mut self, r: SinkRecord) -> bool {
        if r.ts < self.prev_end {
            return false;
        }
        if self.start.is_none() {
            self.start = Some(next_start(self.prev_end, r.ts, self.rules.align));
        }
        self.bytes += record_size(&r);
        self.records.push(r);
        true
    }

    /// Say that `partition` still has unread records, the first of them stamped `first_unread`
    /// (or that it is read to its head, with `None`): no window may end above that stamp.
    pub fn set_partial(&mut self, partition: &str, first_unread: Option<Stamp>) {
        match first_unread {
            Some(t) => {
                self.partial.insert(partition.to_owned(), t);
            }
            None => {
                self.partial.remove(partition);
            }
        }
    }

    /// The stamp below which every partition is read (`None` when all are read to their head).
    #[must_use]
    pub fn read_through(&self) -> Option<Stamp> {
        self.partial.values().min().copied()
    }

    /// The first buffered offset of each partition: a checkpoint taken now must send a re-read
    /// back to them.
    #[must_use]
    pub fn first_offsets(&self) -> Vec<(String, u64)> {
        let mut first: BTreeMap<&str, u64> = BTreeMap::new();
        for r in &self.records {
            let e = first.entry(r.partition.as_str()).or_insert(r.offset);
            *e = (*e).min(r.offset);
        }
        first.into_iter().map(|(p, o)| (p.to_owned(), o)).collect()
    }

    /// The stamp of the oldest buffered record.
    #[must_use]
    pub fn oldest(&self) -> Option<Stamp> {
        self.records.iter().map(|r| r.ts).min()
    }

    /// The stamp of the newest buffered record.
    #[must_use]
    pub fn newest(&self) -> Option<Stamp> {
        self.records.iter().map(|r| r.ts).max()
    }

    /// Buffered bytes.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Buffered records.
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing is buffered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Start of the filling window, if it has a record.
    #[must_use]
    pub fn start(&self) -> Option<Stamp> {
        self.start
    }

    /// End of the previous window.
    #[must_use]
    pub fn prev_end(&self) -> Stamp {
        self.prev_end
    }

    /// Whether the window should close now, and where. `memory` says the node's buffers are
    /// over budget and this queue holds the most.
    #[must_use]
    pub fn poll(&self, safe_time: Stamp, memory: bool) -> Option<(Stamp, CloseReason)> {
        let start = self.start?;
        let last = self.records.iter().map(|r| r.ts).max();
        let (end, reason) = decide(start, last, self.bytes, memory, safe_time, &self.rules)?;
        let end = if reason == CloseReason::Size {
            end.min(self.size_cut())
        } else {
            end
        };
        let end = self.partial.values().fold(end, |e, t| e.min(*t));
        (end > start && self.records.iter().any(|r| r.ts < end)).then_some((end, reason))
    }

    /// Just past the oldest stamp at which the records (oldest first) reach the target size, so a
    /// window closed by size holds about the target even when more is buffered.
    fn size_cut(&self) -> Stamp {
        let mut by_ts: Vec<(Stamp, u64)> = self
            .records
            .iter()
            .map(|r| (r.ts, record_size(r)))
            .collect();
        by_ts.sort_unstable_by_key(|(t, _)| *t);
        let mut sum = 0;
        for (t, size) in by_ts {
            sum += size;
            if sum >= self.rules.target_bytes {
                return Stamp(t.0.saturating_add(1));
            }
        }
        Stamp(u64::MAX)
    }

    /// Close the window at `end`: hand back its records sorted by (partition, offset) and keep
    /// the rest for the next one.
    pub fn close(&mut self, end: Stamp, reason: CloseReason) -> Option<Closed> {
        let start = self.start?;
        let (mut inside, rest): (Vec<SinkRecord>, Vec<SinkRecord>) =
            std::mem::take(&mut self.records)
                .into_iter()
                .partition(|r| r.ts < end);
        self.records = rest;
        self.bytes = self.records.iter().map(record_size).sum();
        self.prev_end = end;
        self.start = self
            .records
            .iter()
            .map(|r| r.ts)
            .min()
            .map(|t| next_start(end, t, self.rules.align));
        inside.sort_by(|a, b| a.partition.cmp(&b.partition).then(a.offset.cmp(&b.offset)));
        Some(Closed {
            start,
            end,
            reason,
            records: inside,
        })
    }

    /// The stamp below which every record of the queue has left this builder (the previous
    /// window's end, or the end limit when nothing is buffered and nothing is unread).
    #[must_use]
    pub fn complete_through(&self, safe_time: Stamp) -> Stamp {
        if self.records.is_empty() && self.partial.is_empty() {
            self.prev_end
                .max(super::window::end_limit(safe_time, &self.rules))
        } else {
            self.prev_end
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::Align;
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000;
    const T0: u64 = 1_791_007_200_000_000;

    fn rules(target: u64) -> WindowRules {
        WindowRules {
            target_bytes: target,
            max_age_us: 10 * S,
            align: Align::Hour,
            guard_us: 5 * S,
        }
    }

    fn rec(p: &str, o: u64, ts: u64) -> SinkRecord {
        SinkRecord {
            partition: p.into(),
            offset: o,
            transaction_id: format!("{p}-{o}"),
            ts: Stamp(ts),
            payload: b"{}".to_vec(),
        }
    }

    #[test]
    fn the_walkthrough_window_starts_at_the_hour_and_closes_by_age() {
        let mut b = Builder::new(rules(1 << 30), Stamp(0));
        let t = T0 + 2_257_501_942;
        for r in [
            rec("cust-1", 0, t),
            rec("cust-2", 0, t),
            rec("cust-1", 1, t),
        ] {
            assert!(b.push(r));
        }
        assert_eq!(b.start(), Some(Stamp(T0)));
        // Age is counted from the window's start (the hour), so it is due at once.
        let (end, reason) = b.poll(Stamp(t + 6 * S), false).unwrap();
        assert_eq!(reason, CloseReason::Age);
        assert_eq!(end, Stamp(t + S));
        let c = b.close(end, reason).unwrap();
        let order: Vec<(String, u64)> = c
            .records
            .iter()
            .map(|r| (r.partition.clone(), r.offset))
            .collect();
        assert_eq!(
            order,
            vec![
                ("cust-1".into(), 0),
                ("cust-1".into(), 1),
                ("cust-2".into(), 0)
            ]
        );
        assert!(b.is_empty());
        assert_eq!(b.start(), None);
    }

    #[test]
    fn an_unread_partition_holds_the_end_back() {
        let mut b = Builder::new(rules(1000), Stamp(T0));
        b.push(rec("a", 0, T0 + S));
        b.push(rec("a", 1, T0 + 3 * S));
        b.push(rec("b", 0, T0 + 2 * S));
        b.set_partial("b", Some(Stamp(T0 + 2 * S)));
        let (end, _) = b.poll(Stamp(T0 + 100 * S), false).unwrap();
        assert_eq!(
            end,
            Stamp(T0 + 2 * S),
            "b may hold more records stamped at 2 s"
        );
        b.set_partial("b", None);
        assert!(b.poll(Stamp(T0 + 100 * S), false).unwrap().0 > Stamp(T0 + 3 * S));
    }

    #[test]
    fn a_size_close_cuts_at_the_target_not_at_the_newest_record() {
        let mut b = Builder::new(rules(200), Stamp(T0));
        for i in 0..10 {
            b.push(rec("a", i, T0 + i * S));
        }
        let (end, reason) = b.poll(Stamp(T0 + 100 * S), false).unwrap();
        assert_eq!(reason, CloseReason::Size);
        let c = b.close(end, reason).unwrap();
        assert_eq!(c.records.len(), 3, "three 67-byte records reach 200 bytes");
        assert_eq!(b.len(), 7);
    }

    #[test]
    fn committed_records_are_skipped() {
        let mut b = Builder::new(rules(100), Stamp(T0 + 5 * S));
        assert!(!b.push(rec("a", 0, T0 + S)));
        assert!(b.push(rec("a", 1, T0 + 5 * S)));
        assert_eq!(b.start(), Some(Stamp(T0 + 5 * S)));
    }

    proptest! {
        /// Feeding the same records in any interleaving of partitions and polling at any safe
        /// times gives windows that hold every record once; rebuilding each window from its
        /// bounds gives the same records.
        #[test]
        fn every_record_lands_in_one_window_and_rebuilds_the_same(
            gaps in proptest::collection::vec((0u8..3, 0u64..4_000_000), 1..80),
            target in 100u64..2000,
            steps in proptest::collection::vec(1u64..20_000_000, 1..40),
        ) {
            let r = rules(target);
            let mut all = Vec::new();
            let mut t = T0 + 3_000 * S;
            let mut next = [0u64; 3];
            for (p, g) in &gaps {
                t += g;
                let name = ["a", "b", "c"][*p as usize];
                all.push(rec(name, next[*p as usize], t));
                next[*p as usize] += 1;
            }
            let mut b = Builder::new(r, Stamp(0));
            let mut windows: Vec<Closed> = Vec::new();
            let mut safe = Stamp(all[0].ts.0);
            let mut fed = 0;
            for step in steps.iter().cycle().take(400) {
                safe = Stamp(safe.0 + step);
                while fed < all.len() && all[fed].ts <= safe { b.push(all[fed].clone()); fed += 1; }
                while let Some((end, reason)) = b.poll(safe, false) {
                    prop_assert!(end.0 + r.guard_us <= safe.0 || reason == CloseReason::Size);
                    windows.push(b.close(end, reason).unwrap());
                }
                if fed == all.len() && b.is_empty() { break; }
            }
            let mut seen = std::collections::BTreeSet::new();
            for w in &windows {
                prop_assert!(w.start < w.end);
                for rec in &w.records {
                    prop_assert!(rec.ts >= w.start && rec.ts < w.end);
                    prop_assert!(seen.insert((rec.partition.clone(), rec.offset)), "twice");
                }
                let mut rebuilt = Builder::at(r, w.start);
                for rec in &all { rebuilt.push(rec.clone()); }
                let again = rebuilt.close(w.end, w.reason).unwrap();
                prop_assert_eq!(&again.records, &w.records);
            }
            for w in windows.windows(2) { prop_assert!(w[0].end <= w[1].start); }
            let committed = windows.last().map_or(0, |w| w.records.len());
            prop_assert!(committed == 0 || !seen.is_empty());
            prop_assert_eq!(seen.len() + b.len(), fed);
        }
    }
}
