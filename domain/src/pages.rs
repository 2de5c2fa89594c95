//! Bounded reads for status pages. A queue may hold 100,000 partitions and a node many consumer
//! groups, so a status read never walks them all: it reads one page after a cursor (partitions
//! by id, group rows by key), and a total that needs a per-partition figure (pending, lag) sums
//! over at most a stated number of partitions and says when it stopped short. Nothing here writes.

use crate::keys;
use crate::machine::{get_rec, try_scan};
use crate::model::{GroupRec, PartitionRec, QueueRec, SubscriptionStart};
use crate::store::{StateRead, StoreError};

/// Most rows one page of a status listing carries.
pub const MAX_PAGE: usize = 1000;

/// Most partitions one read visits to sum a per-partition figure (pending, lag).
pub const WALK_BUDGET: usize = 10_000;

/// Where a bounded walk stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Walked {
    /// Partitions visited.
    pub visited: usize,
    /// The id of the last partition visited when more follow (the cursor to continue after).
    pub next: Option<u64>,
}

/// What a visit asks of the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Visit the next partition.
    Continue,
    /// Stop after this one (a page is full).
    Stop,
}

/// A queue's partition ids in creation order after `after` (exclusive), at most `limit + 1` (the
/// extra one tells whether more follow).
fn partition_ids_after(
    s: &dyn StateRead,
    qid: u64,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<u64>, StoreError> {
    let base = keys::pid_prefix(keys::table::QUEUE_PARTITION, qid);
    let mut start = base.clone();
    if let Some(a) = after {
        match a.checked_add(1) {
            Some(n) => start.extend_from_slice(&n.to_be_bytes()),
            None => return Ok(Vec::new()),
        }
    }
    let mut ids = Vec::new();
    try_scan(s, &start, &keys::prefix_end(&base), |k, _| {
        if let Some(pid) = keys::u64_at(k, 9) {
            ids.push(pid);
        }
        Ok(ids.len() <= limit)
    })?;
    Ok(ids)
}

/// Visit a queue's partitions in creation order after partition id `after`, at most `budget`
/// of them, until `visit` answers [`Flow::Stop`]. Answers how many were visited and, when more
/// follow, the id to continue after.
///
/// # Errors
/// Store failures, and those of `visit`.
pub fn walk_partitions(
    s: &dyn StateRead,
    qid: u64,
    after: Option<u64>,
    budget: usize,
    visit: &mut dyn FnMut(&PartitionRec) -> Result<Flow, StoreError>,
) -> Result<Walked, StoreError> {
    let ids = partition_ids_after(s, qid, after, budget)?;
    let mut walked = Walked::default();
    for (i, pid) in ids.iter().enumerate().take(budget) {
        walked.visited += 1;
        let flow = match get_rec::<PartitionRec>(s, &keys::partition(*pid))? {
            Some(p) => visit(&p)?,
            None => Flow::Continue,
        };
        if flow == Flow::Stop {
            walked.next = (i + 1 < ids.len()).then_some(*pid);
            return Ok(walked);
        }
    }
    if ids.len() > budget {
        walked.next = budget.checked_sub(1).and_then(|i| ids.get(i)).copied();
    }
    Ok(walked)
}

/// A page of a queue's partitions after partition id `after`: at most `limit`, and the id to
/// continue after when more follow.
///
/// # Errors
/// Store failures.
pub fn partitions_page(
    s: &dyn StateRead,
    qid: u64,
    after: Option<u64>,
    limit: usize,
) -> Result<(Vec<PartitionRec>, Option<u64>), StoreError> {
    let mut page = Vec::new();
    let walked = walk_partitions(s, qid, after, limit, &mut |p| {
        page.push(p.clone());
        Ok(Flow::Continue)
    })?;
    Ok((page, walked.next))
}

/// The offset a group reads next in a partition (its cursor, or where it starts).
///
/// # Errors
/// Store failures.
pub fn group_next(
    s: &dyn StateRead,
    p: &PartitionRec,
    group: &str,
    start: SubscriptionStart,
) -> Result<u64, StoreError> {
    Ok(match crate::reads::cursor(s, p.pid, group)? {
        Some(c) => c.next.max(p.log_start),
        None => match start {
            SubscriptionStart::All => p.log_start,
            SubscriptionStart::From(_) => crate::machine::start_offset_pub(s, p, start)?,
        },
    })
}

/// A sum over a queue's partitions that may have stopped short of the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Partial {
    /// The sum over the partitions counted.
    pub sum: u64,
    /// Partitions counted.
    pub counted: usize,
    /// Whether every partition was counted.
    pub complete: bool,
}

/// The messages of a queue behind a group, summed over at most `budget` partitions (the first
/// ones in creation order).
///
/// # Errors
/// Store failures.
pub fn pending(
    s: &dyn StateRead,
    q: &QueueRec,
    group: &str,
    start: SubscriptionStart,
    budget: usize,
) -> Result<Partial, StoreError> {
    let mut sum = 0u64;
    let walked = walk_partitions(s, q.qid, None, budget, &mut |p| {
        sum += p
            .next_offset
            .saturating_sub(group_next(s, p, group, start)?);
        Ok(Flow::Continue)
    })?;
    Ok(Partial {
        sum,
        counted: walked.visited,
        complete: walked.next.is_none() && (walked.visited > 0 || q.partitions == 0),
    })
}

/// A group's record on a queue.
///
/// # Errors
/// Store failures.
pub fn group(s: &dyn StateRead, qid: u64, name: &str) -> Result<Option<GroupRec>, StoreError> {
    get_rec(s, &keys::group(qid, name))
}

/// One consumer group row: the group's record on one queue.
#[derive(Debug, Clone)]
pub struct GroupRow {
    /// The row's key after its table byte (queue id ‖ group name): the cursor of a page.
    pub key: Vec<u8>,
    /// The queue.
    pub queue: QueueRec,
    /// The group's name.
    pub group: String,
    /// The group's record.
    pub rec: GroupRec,
}

/// Group rows in key order from `from` (a [`GroupRow::key`]; the row itself included when
/// `inclusive`, else the rows after it) that `keep` accepts,
/// reading at most `scan` rows and keeping at most `limit`. Answers the rows and, when rows
/// remain unread, the key to continue after.
///
/// # Errors
/// Store failures.
pub fn group_rows(
    s: &dyn StateRead,
    from: Option<&[u8]>,
    inclusive: bool,
    limit: usize,
    scan: usize,
    keep: &dyn Fn(&QueueRec, &str) -> bool,
) -> Result<(Vec<GroupRow>, Option<Vec<u8>>), StoreError> {
    let mut start = vec![keys::table::GROUP];
    if let Some(a) = from {
        start.extend_from_slice(a);
        if !inclusive {
            start.push(0);
        }
    }
    let mut raw: Vec<(Vec<u8>, GroupRec)> = Vec::new();
    let mut more = false;
    try_scan(s, &start, &keys::table_end(keys::table::GROUP), |k, v| {
        if raw.len() == scan {
            more = true;
            return Ok(false);
        }
        raw.push((k.to_vec(), crate::codec::decode::<GroupRec>(k, v)?));
        Ok(true)
    })?;
    let mut queue: Option<QueueRec> = None;
    let mut out = Vec::new();
    let mut last: Option<Vec<u8>> = None;
    let count = raw.len();
    for (i, (k, rec)) in raw.into_iter().enumerate() {
        let key = k.get(1..).unwrap_or_default().to_vec();
        last = Some(key.clone());
        let Some(qid) = keys::u64_at(&k, 1) else {
            continue;
        };
        if queue.as_ref().is_none_or(|q| q.qid != qid) {
            queue = queue_by_id(s, qid)?;
        }
        let Some(q) = &queue else { continue };
        let name = String::from_utf8_lossy(k.get(9..).unwrap_or_default()).into_owned();
        if !keep(q, &name) {
            continue;
        }
        out.push(GroupRow {
            key,
            queue: q.clone(),
            group: name,
            rec,
        });
        if out.len() == limit {
            let next = (i + 1 < count || more).then_some(last).flatten();
            return Ok((out, next));
        }
    }
    Ok((out, if more { last } else { None }))
}

/// A queue by its id: the name comes from one of its partitions, or from a scan of the queue
/// table when it has none yet.
fn queue_by_id(s: &dyn StateRead, qid: u64) -> Result<Option<QueueRec>, StoreError> {
    if let Some(pid) = partition_ids_after(s, qid, None, 0)?.first()
        && let Some(p) = get_rec::<PartitionRec>(s, &keys::partition(*pid))?
    {
        return crate::reads::queue(s, &p.queue);
    }
    let mut found = None;
    try_scan(
        s,
        &keys::table_start(keys::table::QUEUE),
        &keys::table_end(keys::table::QUEUE),
        |k, v| {
            let q = crate::codec::decode::<QueueRec>(k, v)?;
            if q.qid == qid {
                found = Some(q);
                return Ok(false);
            }
            Ok(true)
        },
    )?;
    Ok(found)
}
