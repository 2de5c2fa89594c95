//! The apply's report to whoever waits on the state (the broker's waiting pops): which
//! partitions a batch changed and which became claimable for a group, read off the batch's own
//! writes, so every node (leader or follower) learns it when it applies the entry, at the cost
//! of two range reads of a map the batch holds anyway, and nothing when nobody waits.

use std::sync::Arc;

use queen_domain::keys;
use queen_domain::store::WriteSet;
use queen_ports::{AppliedChanges, ApplyObserver};

use crate::store::FjallStore;

impl FjallStore {
    /// Report every applied batch to `observer` from now on (a second call is ignored).
    pub fn observe(&self, observer: Arc<dyn ApplyObserver>) {
        let _ = self.observer.set(observer);
    }

    /// The observer, when one is set and wants this batch's changes.
    pub(crate) fn observer_wanting(&self) -> Option<&Arc<dyn ApplyObserver>> {
        self.observer.get().filter(|o| o.wants())
    }
}

/// What `writes` changed that a waiting pop cares about: partition records written, ready rows
/// put (a delete is a claim or a cleanup: nothing became claimable). Public for the broker's
/// test twin of the log, which reports its applies the same way.
pub fn changes_of(writes: &WriteSet) -> AppliedChanges {
    let mut out = AppliedChanges::default();
    for (k, v) in table_rows(writes, keys::table::PARTITION) {
        if v.is_some()
            && k.len() == 9
            && let Some(pid) = keys::u64_at(k, 1)
        {
            out.partitions.push(pid);
        }
    }
    for (k, v) in table_rows(writes, keys::table::READY) {
        if v.is_some()
            && let (Some(pid), Some(group)) =
                (keys::pid_of_ready_key(k), keys::group_of_ready_key(k))
        {
            out.ready
                .push((pid, String::from_utf8_lossy(group).into_owned()));
        }
    }
    out
}

/// The rows of table `t` among `writes`.
fn table_rows(writes: &WriteSet, t: u8) -> impl Iterator<Item = (&Vec<u8>, &Option<Vec<u8>>)> {
    writes.range(vec![t]..vec![t.saturating_add(1)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_records_and_put_ready_rows_are_reported_deletes_are_not() {
        let mut w = WriteSet::new();
        w.insert(keys::partition(7), Some(vec![1]));
        w.insert(keys::partition(8), None);
        w.insert(keys::ready(3, "g1", 100, 7), Some(vec![]));
        w.insert(keys::ready(3, "g2", 100, 9), None);
        w.insert(keys::ready_of(7, "g1"), Some(vec![1]));
        w.insert(keys::cursor(7, "g1"), Some(vec![1]));
        let c = changes_of(&w);
        assert_eq!(c.partitions, [7]);
        assert_eq!(c.ready, [(7, "g1".to_owned())]);
    }
}
