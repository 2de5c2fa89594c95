//! Conflation (last-value delivery, contract 2.0.8): a (queue, group) registered as conflating
//! is delivered only the newest visible message of each partition it claims, and the ones
//! behind it are retired (its cursor moves past them, as if consumed).
//!
//! The policy is a row of its own (`keys::table::GROUP_POLICY`), written by the pop that
//! registers the group (creates its `GroupRec`), so group records of earlier builds decode
//! unchanged and a group without the row keeps the default policy. The stored policy wins over
//! what a later pop declares; the answer says when they differ.

use crate::command::ConflationEcho;
use crate::keys;
use crate::model::{MessageRec, PartitionRec};
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::{get_rec, put_rec};

/// The flag of a conflating group in its policy row.
const CONFLATING: u8 = 1;

/// Whether `group`'s stored policy on queue `qid` conflates.
pub(crate) fn stored(s: &dyn StateRead, qid: u64, group: &str) -> Result<bool, StoreError> {
    Ok(get_rec::<u8>(s, &keys::group_policy(qid, group))?.is_some_and(|f| f & CONFLATING != 0))
}

/// Store `group` on queue `qid` as conflating (at its registration).
pub(crate) fn register(txn: &mut Txn<'_>, qid: u64, group: &str) {
    put_rec(txn, keys::group_policy(qid, group), &CONFLATING);
}

/// Forget `group`'s policy on queue `qid` (its record is deleted: it registers again).
pub(crate) fn forget(txn: &mut Txn<'_>, qid: u64, group: &str) {
    txn.delete(keys::group_policy(qid, group));
}

/// The echo of a pop that `declared` conflation or not, for a group whose policy is `stored`
/// (`None`: not registered yet, so this pop's declaration is what it registers with; a queue-mode
/// pop registers the default policy).
#[must_use]
pub(crate) fn echo(stored: Option<bool>, declared: bool, queue_mode: bool) -> ConflationEcho {
    let conflating = stored.unwrap_or(declared && !queue_mode);
    ConflationEcho {
        conflating,
        conflict: declared != conflating,
    }
}

/// The first offset of `p` from `from` whose message is still inside the queue's `delay`
/// (seconds) at `stamp` (`p.next_offset` when none is): stamps rise with offsets, so a binary
/// search over point reads finds it, and every message below it is visible.
pub(crate) fn first_delayed(
    s: &dyn StateRead,
    p: &PartitionRec,
    from: u64,
    delay: u64,
    stamp: Stamp,
) -> Result<u64, StoreError> {
    let (mut lo, mut hi) = (from.max(p.log_start), p.next_offset);
    if delay == 0 {
        return Ok(hi);
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match get_rec::<MessageRec>(s, &keys::message(p.pid, mid))? {
            Some(m) if m.stamp.plus_seconds(delay) > stamp => hi = mid,
            // Visible, or a hole (only below log_start, see `claim_read::start_offset`).
            _ => lo = mid + 1,
        }
    }
    Ok(lo)
}

/// The newest offset in `from..until` that `group` may see (`marks` as
/// `super::marks::in_range` reads them); `None` when every one is hidden. Marks are few, so
/// the walk down steps over at most as many offsets as there are marks.
#[must_use]
pub(crate) fn newest_seen(
    from: u64,
    until: u64,
    marks: &[(u64, Option<String>)],
    group: &str,
) -> Option<u64> {
    (from..until)
        .rev()
        .find(|o| !super::marks::hidden(marks, *o, group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registered_policy_wins_and_a_differing_declaration_is_a_conflict() {
        let e = |conflating, conflict| ConflationEcho {
            conflating,
            conflict,
        };
        assert_eq!(echo(None, true, false), e(true, false));
        assert_eq!(echo(None, false, false), e(false, false));
        assert_eq!(
            echo(None, true, true),
            e(false, true),
            "queue mode never conflates"
        );
        assert_eq!(echo(Some(false), true, false), e(false, true));
        assert_eq!(echo(Some(true), false, false), e(true, true));
        assert_eq!(echo(Some(true), true, false), e(true, false));
    }

    #[test]
    fn the_newest_seen_offset_steps_over_hidden_ones() {
        let marks = vec![
            (7, None),
            (8, Some("other".to_owned())),
            (9, Some("g".to_owned())),
        ];
        assert_eq!(newest_seen(3, 10, &marks, "g"), Some(9));
        assert_eq!(newest_seen(3, 9, &marks, "g"), Some(6));
        assert_eq!(newest_seen(7, 9, &marks, "g"), None);
        assert_eq!(newest_seen(5, 5, &marks, "g"), None);
    }
}
