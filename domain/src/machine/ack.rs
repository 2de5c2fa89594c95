//! Ack, nack, dead letters and lease extension.

use crate::command::{AckItem, AckOutcome, AckStatus, Outcome};
use crate::ids::{LeaseId, PartitionRef};
use crate::keys;
use crate::model::{
    AckVerdict, CursorRec, DlqRec, LastAck, LeaseRec, MessageRec, PartitionRec, QueueRec,
};
use crate::names::GroupName;
use crate::store::{StoreError, Txn};
use crate::time::Stamp;

use super::{get_rec, next_counter, put_rec, text_for_answer, try_scan};

fn refused(error: impl Into<String>) -> AckVerdict {
    AckVerdict {
        success: false,
        error: Some(error.into()),
        ..AckVerdict::default()
    }
}

/// Apply acknowledgements in order; each is answered on its own. `found` holds, per item, the
/// offset the proposer found it at under the lease it names ([`resolve_offsets`]; empty when
/// the entry carries none, as `Command::Ack` does).
/// With `answered` false (nobody on this node waits) the answers do not copy the ids.
pub(crate) fn ack(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    group: &GroupName,
    items: &[AckItem],
    found: &[Option<u64>],
    answered: bool,
) -> Result<Vec<AckOutcome>, StoreError> {
    let mut out = Vec::with_capacity(items.len());
    let mut leased = LeasedOffsets::default();
    for (i, item) in items.iter().enumerate() {
        let hint = found.get(i).copied().flatten();
        let verdict = ack_one(txn, stamp, group.as_str(), item, hint, &mut leased)?;
        out.push(AckOutcome {
            transaction_id: text_for_answer(answered, item.transaction_id.as_str()),
            verdict,
        });
    }
    leased.write_cursors(txn, stamp)?;
    Ok(out)
}

/// Where the node that takes an ack finds each item's message under the lease the item names,
/// in its applied state: `Some(offset)` when the item's partition is held by that lease in
/// `group` and the lease's messages hold the transactionId, else `None`. Carried in
/// `Command::AckAt`, so that each replica's apply need not read the leased messages back
/// (each stored message's offset never changes; within one lease's range a transactionId
/// can only lose its message, never move, so the answer holds while the lease does).
///
/// `known(lease, pid, transactionId)` answers first, without reading: a node that served the
/// pop knows where it delivered each message ([`DeliveredOffsets`]).
///
/// # Errors
/// Only store failures.
pub fn resolve_offsets(
    s: &dyn crate::store::StateRead,
    group: &GroupName,
    items: &[AckItem],
    known: impl Fn(&LeaseId, u64, &str) -> Option<u64>,
) -> Result<Vec<Option<u64>>, StoreError> {
    let mut leased = LeasedOffsets::default();
    items
        .iter()
        .map(|item| {
            let (Some(lease), PartitionRef::Id(pid)) = (&item.lease_id, &item.partition_id) else {
                return Ok(None);
            };
            if let Some(o) = known(lease, *pid, item.transaction_id.as_str()) {
                return Ok(Some(o));
            }
            let slot = leased.cursor_slot(s, *pid, group.as_str())?;
            let c = &leased.cursors[slot].2;
            match &c.lease {
                Some(l) if l.id == *lease => {
                    let (from, end) = (c.next, l.end);
                    leased.find(s, *pid, lease, from, end, item.transaction_id.as_str())
                }
                _ => Ok(None),
            }
        })
        .collect()
}

/// The offsets of the transactionIds under a lease, read once per ack call from the leased
/// messages themselves: an ack batch names messages its pop just delivered, and reading the
/// record they share costs less than one dedup lookup per message.
///
/// It also keeps what every item of one entry reads alike: the lease clock (the same for the
/// whole entry: only a leader change moves the hold it reads) and each partition's queue
/// retry options (acks never change a partition's identity, and only a `Configure` entry
/// changes the options), each read once per entry instead of once per item; and the cursors the items move, read once and written once, by
/// [`LeasedOffsets::write_cursors`], which the caller runs before its writes are taken.
#[derive(Default)]
pub(crate) struct LeasedOffsets {
    /// (partition, lease id) -> transactionId -> offset.
    by_lease: Vec<((u64, LeaseId), LeaseIndex)>,
    /// `lease_now` of the entry's stamp, once read.
    lease_now: Option<Stamp>,
    /// Partitions read so far (a few per entry), with their queue's options when it exists.
    partitions: Vec<(u64, Option<RetryOptions>)>,
    /// Cursors read so far, by (partition, group), and whether an item changed them.
    cursors: Vec<(u64, String, CursorRec, bool)>,
}

/// What an ack reads of a partition and its queue.
#[derive(Clone, Copy)]
struct RetryOptions {
    qid: u64,
    retry_limit: u32,
    dlq_after_max_retries: bool,
    /// The partition's oldest stored offset (acks never move it).
    log_start: u64,
}

impl LeasedOffsets {
    fn lease_now(
        &mut self,
        s: &dyn crate::store::StateRead,
        stamp: Stamp,
    ) -> Result<Stamp, StoreError> {
        if let Some(t) = self.lease_now {
            return Ok(t);
        }
        let t = super::cluster::lease_now(s, stamp)?;
        self.lease_now = Some(t);
        Ok(t)
    }

    /// The retry options of partition `pid`'s queue (`None` when the partition is unknown or
    /// its queue is gone or was created again since).
    fn partition(
        &mut self,
        s: &dyn crate::store::StateRead,
        pid: u64,
    ) -> Result<Option<RetryOptions>, StoreError> {
        if let Some((_, opts)) = self.partitions.iter().find(|(p, _)| *p == pid) {
            return Ok(*opts);
        }
        let Some(p) = get_rec::<PartitionRec>(s, &keys::partition(pid))? else {
            return Ok(None);
        };
        let opts = get_rec::<QueueRec>(s, &keys::queue(&p.queue))?
            .filter(|q| q.qid == p.qid)
            .map(|q| RetryOptions {
                qid: q.qid,
                retry_limit: q.options.retry_limit,
                dlq_after_max_retries: q.options.dlq_after_max_retries,
                log_start: p.log_start,
            });
        if self.partitions.len() >= 64 {
            self.partitions.remove(0);
        }
        self.partitions.push((pid, opts));
        Ok(opts)
    }

    /// Where the cursor of (`pid`, `group`) is kept, read on first use.
    fn cursor_slot(
        &mut self,
        s: &dyn crate::store::StateRead,
        pid: u64,
        group: &str,
    ) -> Result<usize, StoreError> {
        if let Some(i) = self
            .cursors
            .iter()
            .position(|(p, g, _, _)| *p == pid && g == group)
        {
            return Ok(i);
        }
        let c = get_rec::<CursorRec>(s, &keys::cursor(pid, group))?.unwrap_or_default();
        self.cursors.push((pid, group.to_owned(), c, false));
        Ok(self.cursors.len() - 1)
    }

    /// Write every cursor an item changed, and keep the partition's entry in the group's ready
    /// index in step with it (as of `stamp`).
    pub(crate) fn write_cursors(
        &mut self,
        txn: &mut Txn<'_>,
        stamp: Stamp,
    ) -> Result<(), StoreError> {
        for (pid, group, c, dirty) in self.cursors.drain(..) {
            if dirty {
                put_rec(txn, keys::cursor(pid, &group), &c);
                // Read afresh: a transaction may have pushed to it since its ack was judged.
                if let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? {
                    super::ready::sync(txn, &group, &p, Some(&c), stamp)?;
                }
            }
        }
        Ok(())
    }

    const MAX_LEASED: u64 = 10_000;

    fn find(
        &mut self,
        s: &dyn crate::store::StateRead,
        pid: u64,
        lease: &LeaseId,
        from: u64,
        end: u64,
        transaction_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        if let Some((_, m)) = self
            .by_lease
            .iter()
            .find(|((p, l), _)| *p == pid && l == lease)
        {
            return Ok(m.get(transaction_id));
        }
        if end <= from || end - from > Self::MAX_LEASED {
            return Ok(None);
        }
        let mut m = LeaseIndex::with_capacity((end - from) as usize);
        try_scan(
            s,
            &keys::message(pid, from),
            &keys::message(pid, end),
            |k, v| {
                let h = crate::codec::decode_head_borrowed::<TransactionIdHead<'_>>(k, v)?;
                m.add(
                    h.transaction_id,
                    keys::offset_of_message_key(k).unwrap_or(from),
                );
                Ok(true)
            },
        )?;
        m.seal();
        let found = m.get(transaction_id);
        self.by_lease.push(((pid, lease.clone()), m));
        Ok(found)
    }
}

/// Where one claim of a pop delivered its messages, by transactionId: what [`resolve_offsets`]
/// finds under the claim's lease (the latest offset of each transactionId in the lease's
/// range), known to the node that served the pop without reading the messages back.
pub struct DeliveredOffsets(LeaseIndex);

impl DeliveredOffsets {
    /// `None` when the claim stepped over offsets (messages deleted or hidden from the group
    /// inside it): its lease then covers messages it did not deliver, which only a read of the
    /// range sees.
    #[must_use]
    pub fn of_claim(claim: &crate::command::Claim) -> Option<Self> {
        let (first, last) = (claim.messages.first()?, claim.messages.last()?);
        if last.offset.checked_sub(first.offset)? != claim.messages.len() as u64 - 1 {
            return None;
        }
        let mut m = LeaseIndex::with_capacity(claim.messages.len());
        for d in &claim.messages {
            m.add(&d.transaction_id, d.offset);
        }
        m.seal();
        Some(Self(m))
    }

    /// The offset of `transaction_id` in the claim.
    #[must_use]
    pub fn get(&self, transaction_id: &str) -> Option<u64> {
        self.0.get(transaction_id)
    }

    /// How many messages it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.entries.len()
    }

    /// Whether it holds none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.entries.is_empty()
    }
}

/// A stored message's first field, borrowed.
#[derive(serde::Deserialize)]
struct TransactionIdHead<'a> {
    #[serde(borrow)]
    transaction_id: &'a str,
}

/// The transactionIds of one lease's messages and their offsets: the ids back to back in one
/// string, and (hash, start, length, offset) sorted by hash and offset. Building it allocates
/// twice, not once per message; a lookup is a binary search and a comparison of the bytes, so
/// the hash only orders the entries and never decides an answer. Of two messages with the
/// same id (one deleted by retention before the other was pushed), the later one is found.
struct LeaseIndex {
    text: String,
    entries: Vec<(u64, u32, u32, u64)>,
}

impl LeaseIndex {
    fn with_capacity(messages: usize) -> Self {
        Self {
            text: String::with_capacity(messages * 40),
            entries: Vec::with_capacity(messages),
        }
    }

    /// FNV-1a: fixed, so the order is the same on every node (not that any answer depends on it).
    fn hash(id: &str) -> u64 {
        id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    fn add(&mut self, id: &str, offset: u64) {
        self.add_hashed(id, Self::hash(id), offset);
    }

    fn add_hashed(&mut self, id: &str, hash: u64, offset: u64) {
        let start = u32::try_from(self.text.len()).unwrap_or(u32::MAX);
        let len = u32::try_from(id.len()).unwrap_or(u32::MAX);
        self.text.push_str(id);
        self.entries.push((hash, start, len, offset));
    }

    fn seal(&mut self) {
        self.entries
            .sort_unstable_by_key(|&(h, _, _, offset)| (h, offset));
    }

    fn get(&self, id: &str) -> Option<u64> {
        self.get_hashed(id, Self::hash(id))
    }

    fn get_hashed(&self, id: &str, h: u64) -> Option<u64> {
        let from = self.entries.partition_point(|e| e.0 < h);
        self.entries[from..]
            .iter()
            .take_while(|e| e.0 == h)
            .filter(|e| {
                let (start, len) = (e.1 as usize, e.2 as usize);
                self.text.get(start..start + len) == Some(id)
            })
            .last()
            .map(|e| e.3)
    }
}

pub(crate) fn ack_one(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    group: &str,
    item: &AckItem,
    hint: Option<u64>,
    leased: &mut LeasedOffsets,
) -> Result<AckVerdict, StoreError> {
    if let AckStatus::Unknown(word) = &item.status {
        return Ok(refused(format!("unknown status '{word}'")));
    }
    let pid = match &item.partition_id {
        PartitionRef::Id(pid) => *pid,
        PartitionRef::Unknown(text) => {
            return Ok(refused(format!("unknown partitionId '{text}'")));
        }
        PartitionRef::Foreign(pid) => {
            return Ok(refused(format!("unknown partitionId '{pid}'")));
        }
    };
    let Some(opts) = leased.partition(txn, pid)? else {
        return Ok(refused(format!("unknown partitionId '{pid}'")));
    };
    // The cursor is taken out of its slot while the item is judged and put back after,
    // marked changed when the item moved it.
    let slot = leased.cursor_slot(txn, pid, group)?;
    let mut c = std::mem::take(&mut leased.cursors[slot].2);
    let judged = judge(txn, stamp, group, item, hint, pid, opts, &mut c, leased);
    let entry = &mut leased.cursors[slot];
    entry.2 = c;
    let (verdict, changed) = judged?;
    entry.3 |= changed;
    Ok(verdict)
}

/// Judge one ack against the cursor `c` of its partition and group; answers the verdict and
/// whether `c` changed. `hint` is where the proposer found the message under the item's lease.
#[allow(clippy::too_many_arguments)]
fn judge(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    group: &str,
    item: &AckItem,
    hint: Option<u64>,
    pid: u64,
    opts: RetryOptions,
    c: &mut CursorRec,
    leased: &mut LeasedOffsets,
) -> Result<(AckVerdict, bool), StoreError> {
    let status = &item.status;
    // Under the named live lease the leased messages say where the transactionId is; else (an
    // unfenced ack, an expired lease, a message outside it) the dedup index does.
    //
    // The proposer's `hint` is taken instead of reading them when it lies in what this lease
    // still covers: the same lease id means the same range, an offset names one message for
    // good, and every offset from `log_start` up is stored. The proposer found the latest
    // occurrence of the transactionId in a range that reached up to the lease's end, so no
    // later one lies in this range either: the answer is the one reading them would give.
    // Outside (acknowledged since, or deleted by retention since) the messages are read.
    let under_lease = match (&item.lease_id, &c.lease) {
        (Some(id), Some(l)) if *id == l.id && l.expires > stamp => match hint {
            Some(o) if o >= c.next && o >= opts.log_start && o < l.end => Some(o),
            _ => leased.find(txn, pid, id, c.next, l.end, item.transaction_id.as_str())?,
        },
        _ => None,
    };
    let offset = match under_lease {
        Some(o) => o,
        None => match super::dedup::lookup(txn, pid, item.transaction_id.as_str())?.offset(
            txn,
            pid,
            item.transaction_id.as_str(),
        )? {
            Some(o) => o,
            None => {
                return Ok((
                    refused(format!(
                        "no message '{}' in partition {pid}",
                        item.transaction_id
                    )),
                    false,
                ));
            }
        },
    };

    // A repeat of the last ack is answered as the first one was.
    if let Some(last) = &c.last_ack
        && last.offset == offset
        && last.status == status.as_str()
        && last.lease_id == item.lease_id
    {
        let mut v = last.outcome.clone();
        v.noop = true;
        return Ok((v, false));
    }
    let live = c.live_lease(leased.lease_now(txn, stamp)?).cloned();
    let completes = *status == AckStatus::Completed;
    if offset < c.next {
        // Already behind the cursor: acknowledged before (or redelivered past).
        if completes {
            return Ok((
                AckVerdict {
                    success: true,
                    noop: true,
                    ..AckVerdict::default()
                },
                false,
            ));
        }
        return Ok((refused("message was already acknowledged"), false));
    }
    let refusal = match (&item.lease_id, &live) {
        (Some(id), Some(l)) if *id == l.id && offset < l.end => None,
        (Some(_), _) => Some("lease expired or not held for this message"),
        (None, Some(l)) if offset < l.end => None,
        (None, Some(_)) => Some("message is not under the partition's lease"),
        (None, None) if completes => None,
        (None, None) => Some("no live lease covers this message"),
    };
    if let Some(why) = refusal {
        return Ok((refused(why), false));
    }

    let mut v = AckVerdict {
        success: true,
        ..AckVerdict::default()
    };
    let release;
    match status {
        AckStatus::Completed => {
            c.next = offset + 1;
            c.last_consumed = stamp;
            release = live.as_ref().is_some_and(|l| c.next >= l.end);
        }
        AckStatus::Retry => {
            release = true;
        }
        AckStatus::Failed | AckStatus::Dlq | AckStatus::Unknown(_) => {
            let dead = if *status == AckStatus::Dlq {
                true
            } else {
                c.retries = if c.retry_offset == offset {
                    c.retries + 1
                } else {
                    1
                };
                c.retry_offset = offset;
                c.retries > opts.retry_limit
            };
            if dead {
                if opts.dlq_after_max_retries || *status == AckStatus::Dlq {
                    dead_letter(txn, stamp, opts.qid, pid, group, offset, item, c.retries)?;
                    v.dlq = true;
                }
                c.next = offset + 1;
                c.retries = 0;
                c.last_consumed = stamp;
                release =
                    live.as_ref().is_some_and(|l| c.next >= l.end) || *status != AckStatus::Dlq;
            } else {
                release = true;
            }
        }
    }
    if release {
        if let Some(l) = &live {
            release_partition(txn, l.id.as_str(), pid)?;
            v.lease_released = true;
        }
        c.lease = None;
    }
    if c.retry_offset < c.next {
        c.retries = 0;
    }
    c.last_ack = Some(LastAck {
        offset,
        status: status.as_str().to_owned(),
        lease_id: item.lease_id.clone(),
        outcome: v.clone(),
    });
    Ok((v, true))
}

/// Move message `offset` of `pid` to the dead letters of its queue (`qid`), reading the
/// partition and queue records afresh: this is the rare path, and it counts on the queue.
#[allow(clippy::too_many_arguments)]
fn dead_letter(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    qid: u64,
    pid: u64,
    group: &str,
    offset: u64,
    item: &AckItem,
    retries: u32,
) -> Result<(), StoreError> {
    let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? else {
        return Ok(());
    };
    let Some(mut q) = get_rec::<QueueRec>(txn, &keys::queue(&p.queue))?.filter(|q| q.qid == qid)
    else {
        return Ok(());
    };
    let Some(m) = get_rec::<MessageRec>(txn, &keys::message(pid, offset))? else {
        return Ok(());
    };
    let seq = next_counter(txn, "dlq_seq")?;
    put_rec(
        txn,
        keys::dlq(q.qid, seq),
        &DlqRec {
            pid,
            partition: p.name.clone(),
            group: group.to_owned(),
            offset,
            transaction_id: m.transaction_id,
            id: m.id,
            error: item.error.clone(),
            retries,
            payload: m.payload,
            created: m.stamp,
            failed: stamp,
        },
    );
    q.dead_lettered += 1;
    put_rec(txn, keys::queue(&q.name), &q);
    Ok(())
}

/// Drop one partition from a lease; the lease record goes when none is left.
fn release_partition(txn: &mut Txn<'_>, lease_id: &str, pid: u64) -> Result<(), StoreError> {
    let key = keys::lease(lease_id);
    let Some(mut l) = get_rec::<LeaseRec>(txn, &key)? else {
        return Ok(());
    };
    l.parts.retain(|p| *p != pid);
    if l.parts.is_empty() {
        txn.delete(key);
        txn.delete(keys::lease_expiry(l.expires.0, lease_id));
    } else {
        put_rec(txn, key, &l);
    }
    Ok(())
}

/// Prolong a live lease to `max(current expiry, now + leaseTime)`; an expired lease is never
/// revived.
pub(crate) fn extend(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    lease_id: &LeaseId,
) -> Result<Outcome, StoreError> {
    let fail = Outcome::Extend {
        success: false,
        renewed: 0,
        expires: None,
    };
    let key = keys::lease(lease_id.as_str());
    let Some(mut l) = get_rec::<LeaseRec>(txn, &key)? else {
        return Ok(fail);
    };
    if l.expires <= super::cluster::lease_now(txn, stamp)? {
        return Ok(fail);
    }
    let lease_time = l
        .parts
        .first()
        .and_then(|pid| {
            get_rec::<PartitionRec>(txn, &keys::partition(*pid))
                .ok()
                .flatten()
        })
        .and_then(|p| {
            get_rec::<QueueRec>(txn, &keys::queue(&p.queue))
                .ok()
                .flatten()
        })
        .map_or(300, |q| q.options.lease_time);
    let expires = l.expires.max(stamp.plus_seconds(lease_time));
    let mut renewed = 0;
    for pid in &l.parts {
        let ck = keys::cursor(*pid, &l.group);
        if let Some(mut c) = get_rec::<CursorRec>(txn, &ck)?
            && let Some(cl) = c.lease.as_mut().filter(|cl| cl.id == *lease_id)
        {
            cl.expires = expires;
            renewed += 1;
            put_rec(txn, ck, &c);
        }
    }
    txn.delete(keys::lease_expiry(l.expires.0, lease_id.as_str()));
    l.expires = expires;
    put_rec(txn, keys::lease_expiry(expires.0, lease_id.as_str()), &());
    super::cluster::note_lease_expiry(txn, expires)?;
    put_rec(txn, key, &l);
    Ok(Outcome::Extend {
        success: true,
        renewed,
        expires: Some(expires),
    })
}

#[cfg(test)]
mod tests;
