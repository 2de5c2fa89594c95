//! Message browsing: a queue's stored messages with where each stands for one consumer group
//! (`pending`, `processing`, `completed`, `dead_letter`), and one message by its partition and
//! transactionId. Read-only, bounded in what it reads.

use std::collections::BTreeSet;

use crate::keys;
use crate::model::{MessageRec, PartitionRec};
use crate::reads;
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

/// Most messages one listing reads to fill a filtered page (a status filter skips the rest).
pub const MAX_SCANNED: usize = 10_000;

/// Where a message stands for a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not delivered yet, or delivered and released.
    Pending,
    /// Under a live lease.
    Processing,
    /// Acknowledged (the group's cursor is past it).
    Completed,
    /// Failed past its retries into the dead letters.
    DeadLetter,
}

impl Status {
    /// The word answers use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Processing => "processing",
            Status::Completed => "completed",
            Status::DeadLetter => "dead_letter",
        }
    }

    /// The status a word names.
    #[must_use]
    pub fn parse(word: &str) -> Option<Self> {
        [
            Status::Pending,
            Status::Processing,
            Status::Completed,
            Status::DeadLetter,
        ]
        .into_iter()
        .find(|s| s.as_str() == word)
    }
}

/// One browsed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Browsed {
    /// Its partition.
    pub partition: PartitionRec,
    /// Its offset.
    pub offset: u64,
    /// The stored message.
    pub message: MessageRec,
    /// Where it stands for the group.
    pub status: Status,
}

/// How a partition's messages stand for a group.
struct Standing {
    /// Every offset below is done.
    next: u64,
    /// Offsets `next..leased_to` are under a live lease.
    leased_to: u64,
    /// Offsets in the dead letters.
    dead: BTreeSet<u64>,
    /// Marks on the partition (deleted messages, retried copies of other groups).
    marks: Vec<(u64, Option<String>)>,
    /// The group.
    group: String,
}

impl Standing {
    fn of(
        s: &dyn StateRead,
        p: &PartitionRec,
        group: &str,
        dead: &BTreeSet<(u64, u64)>,
        now: Stamp,
    ) -> Result<Self, StoreError> {
        let c = reads::cursor(s, p.pid, group)?;
        let next = c.as_ref().map_or(0, |c| c.next);
        let leased_to = c
            .as_ref()
            .and_then(|c| c.live_lease(now))
            .map_or(next, |l| l.end);
        Ok(Self {
            marks: crate::machine::marks::in_range(s, p.pid, p.log_start, p.next_offset)?,
            group: group.to_owned(),
            next,
            leased_to,
            dead: dead
                .range((p.pid, 0)..=(p.pid, u64::MAX))
                .map(|(_, o)| *o)
                .collect(),
        })
    }

    /// Whether the message is out of this group's sight (deleted, or another group's copy).
    fn hidden(&self, offset: u64) -> bool {
        crate::machine::marks::hidden(&self.marks, offset, &self.group)
    }

    fn status(&self, offset: u64) -> Status {
        if self.dead.contains(&offset) {
            Status::DeadLetter
        } else if offset < self.next {
            Status::Completed
        } else if offset < self.leased_to {
            Status::Processing
        } else {
            Status::Pending
        }
    }
}

/// The dead letters of a queue for a group, as (partition id, offset).
fn dead_letters(
    s: &dyn StateRead,
    qid: u64,
    group: &str,
) -> Result<BTreeSet<(u64, u64)>, StoreError> {
    let (rows, _) = reads::dead_letters(s, qid, &|d| d.group == group, 0, usize::MAX)?;
    Ok(rows.into_iter().map(|d| (d.pid, d.offset)).collect())
}

/// One page of a message listing.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The messages.
    pub page: Vec<Browsed>,
    /// Stored messages the page was cut from (the queue's or the partition's counter; `None`
    /// with a status filter).
    pub total: Option<u64>,
    /// Where the next page continues, (partition id, offset) exclusive, when the listing
    /// stopped before the end (a full page, or [`MAX_SCANNED`] messages or
    /// [`crate::pages::WALK_BUDGET`] partitions read).
    pub next: Option<(u64, u64)>,
}

/// A page of a queue's messages, oldest first within each partition and partitions in creation
/// order: `limit` messages that pass `only` after skipping `skip` of them, from the start or
/// after `after` (a [`Listing::next`]). Reads at most [`MAX_SCANNED`] messages and
/// [`crate::pages::WALK_BUDGET`] partitions per call, whatever the filter, and says where it
/// stopped.
///
/// # Errors
/// Store failures.
#[allow(clippy::too_many_arguments)]
pub fn list(
    s: &dyn StateRead,
    queue: &str,
    partition: Option<&str>,
    group: &str,
    only: Option<Status>,
    skip: usize,
    limit: usize,
    after: Option<(u64, u64)>,
    now: Stamp,
) -> Result<Listing, StoreError> {
    use crate::pages::{Flow, WALK_BUDGET, walk_partitions};
    let Some(q) = reads::queue(s, queue)? else {
        return Ok(Listing {
            total: Some(0),
            ..Listing::default()
        });
    };
    let one = match partition {
        Some(n) => match reads::partition_by_name(s, queue, n)? {
            Some(p) => Some(p),
            None => {
                return Ok(Listing {
                    total: Some(0),
                    ..Listing::default()
                });
            }
        },
        None => None,
    };
    let total = only.is_none().then(|| {
        one.as_ref()
            .map_or(q.messages, |p| p.next_offset - p.log_start)
    });
    let dead = dead_letters(s, q.qid, group)?;
    let (mut out, mut skipped, mut scanned) = (Vec::new(), 0usize, 0usize);
    // Where the listing stopped early, and whether anything follows it in that partition.
    let mut stopped: Option<(u64, u64, bool)> = None;
    let mut visit = |p: &PartitionRec| -> Result<Flow, StoreError> {
        let mut from = match after {
            Some((pid, offset)) if pid == p.pid => offset.saturating_add(1),
            _ => p.log_start,
        }
        .max(p.log_start);
        // Without a filter whole partitions are skipped by their counts, unread.
        if only.is_none() {
            let stored = usize::try_from(p.next_offset.saturating_sub(from)).unwrap_or(usize::MAX);
            if skipped + stored <= skip {
                skipped += stored;
                return Ok(Flow::Continue);
            }
            from += (skip - skipped) as u64;
            skipped = skip;
        }
        if from >= p.next_offset {
            return Ok(Flow::Continue);
        }
        let standing = Standing::of(s, p, group, &dead, now)?;
        let mut at = from;
        while at < p.next_offset {
            let count = (MAX_SCANNED - scanned).min(1000);
            let batch = reads::messages(s, p, at, 4 << 20, count)?;
            let Some((last, _)) = batch.last() else { break };
            at = last + 1;
            for (offset, message) in batch {
                scanned += 1;
                let full = scanned == MAX_SCANNED;
                let keep =
                    !standing.hidden(offset) && only.is_none_or(|o| o == standing.status(offset));
                if keep && skipped < skip {
                    skipped += 1;
                } else if keep {
                    let status = standing.status(offset);
                    out.push(Browsed {
                        partition: p.clone(),
                        offset,
                        message,
                        status,
                    });
                }
                if out.len() == limit || full {
                    stopped = Some((p.pid, offset, offset + 1 < p.next_offset));
                    return Ok(Flow::Stop);
                }
            }
        }
        Ok(Flow::Continue)
    };
    let next = match one {
        Some(p) => {
            visit(&p)?;
            stopped.and_then(|(pid, offset, more)| more.then_some((pid, offset)))
        }
        None => {
            let start = after.and_then(|(pid, _)| pid.checked_sub(1));
            let walked = walk_partitions(s, q.qid, start, WALK_BUDGET, &mut visit)?;
            match (stopped, walked.next) {
                (Some((pid, offset, more)), rest) => {
                    (more || rest.is_some()).then_some((pid, offset))
                }
                // The partition budget ran out: continue after the last one walked.
                (None, Some(pid)) => Some((pid, u64::MAX)),
                (None, None) => None,
            }
        }
    };
    Ok(Listing {
        page: out,
        total,
        next,
    })
}

/// One message by its partition and transactionId, with where it stands for `group`.
///
/// # Errors
/// Store failures.
pub fn one(
    s: &dyn StateRead,
    pid: u64,
    transaction_id: &str,
    group: &str,
    now: Stamp,
) -> Result<Option<Browsed>, StoreError> {
    let Some(p) = crate::machine::get_rec::<PartitionRec>(s, &keys::partition(pid))? else {
        return Ok(None);
    };
    let txn = Txn::new(s);
    let Some(o) = crate::machine::dedup::lookup(&txn, pid, transaction_id)?.original(
        s,
        pid,
        transaction_id,
    )?
    else {
        return Ok(None);
    };
    let Some(message) = crate::machine::get_rec::<MessageRec>(s, &keys::message(pid, o.offset))?
    else {
        return Ok(None);
    };
    let dead = dead_letters(s, p.qid, group)?;
    let standing = Standing::of(s, &p, group, &dead, now)?;
    if standing.hidden(o.offset) {
        return Ok(None);
    }
    let status = standing.status(o.offset);
    Ok(Some(Browsed {
        partition: p,
        offset: o.offset,
        message,
        status,
    }))
}
