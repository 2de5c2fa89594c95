//! Pop: claim deliverable messages for a group under one lease.

use crate::command::{Claim, Command, Delivered, PopCommand, PopOutcome, Subscription};
use crate::keys;
use crate::model::{
    CursorLease, CursorRec, GroupRec, LeaseRec, PartitionRec, QueueRec, SubscriptionStart,
};
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::claim_read::{read_claim, start_offset};
use super::{get_rec, put_rec};

/// Claim up to `batch` messages over up to `max_partitions` partitions. A pop that names its
/// partition looks at that one only (an expired lease on it is simply replaced: redelivery
/// without counting a retry); one that does not takes the partitions at the front of the
/// group's ready index ([`super::ready`]), so its cost does not grow with the partitions of the
/// queue.
///
/// `declared` is whether the pop asked for conflation (`Command::PopConflating`): a group
/// this pop registers is stored with that policy; a registered group keeps its own
/// ([`super::conflation`]), and the answer echoes which applied.
///
/// `answered` is false when nobody on this node waits for the answer (a follower applying the
/// leader's pop): the state changes are the same, but without a delay the messages are not
/// read at all. Every offset from `log_start` to `next_offset` is stored (`invariants::check`),
/// so the claim's extent follows from the offsets alone, and the claims come back without their
/// messages.
pub(crate) fn pop(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    cmd: &PopCommand,
    declared: bool,
    answered: bool,
) -> Result<PopOutcome, StoreError> {
    let queue_mode = cmd.group.is_queue_mode();
    let mut out = PopOutcome {
        lease_id: String::new(),
        lease_expires: Stamp(0),
        claims: Vec::new(),
        conflation: super::conflation::echo(None, declared, queue_mode),
    };
    let Some(q) = get_rec::<QueueRec>(txn, &keys::queue(cmd.queue.as_str()))? else {
        return Ok(out);
    };
    let version = super::cluster::cluster_version(txn)?;
    // Lease ids are minted fresh for every proposal: one already on record means this entry
    // is a second copy of a pop already applied (a proposal sent again after its first copy
    // was committed). It claims nothing: writing its claim would replace the first claim's
    // lease record, and the partitions under the first claim would never be released.
    if version >= Command::BOUNDED_FILL_FORMAT
        && !cmd.auto_ack
        && get_rec::<LeaseRec>(txn, &keys::lease(cmd.lease_id.as_str()))?.is_some()
    {
        return Ok(out);
    }
    let group = cmd.group.as_str();
    let group_key = keys::group(q.qid, group);
    let stored = get_rec::<GroupRec>(txn, &group_key)?;
    let policy = match &stored {
        Some(_) => Some(super::conflation::stored(txn, q.qid, group)?),
        None => None,
    };
    out.conflation = super::conflation::echo(policy, declared, queue_mode);
    if stored.is_none() && out.conflation.conflating {
        super::conflation::register(txn, q.qid, group);
    }
    let mut g = match stored {
        Some(g) => g,
        None => GroupRec {
            start: if queue_mode {
                SubscriptionStart::All
            } else {
                match cmd.subscription {
                    Subscription::Default | Subscription::All => SubscriptionStart::All,
                    Subscription::New => SubscriptionStart::From(stamp),
                    Subscription::From(s) => SubscriptionStart::From(s),
                }
            },
            created: stamp,
            last_pid: 0,
        },
    };
    // Leases are judged live against this (behind `stamp` while a leader change holds them).
    let lease_now = super::cluster::lease_now(txn, stamp)?;
    let mut claimer = Claimer {
        indexed: version >= Command::READY_INDEX_FORMAT,
        cmd,
        stamp,
        answered,
        group,
        start: g.start,
        lease_now,
        lease_expires: stamp.plus_seconds(q.options.lease_time),
        delay: q.options.delayed_processing,
        budget: cmd.batch.max(1) as usize,
        max_parts: cmd.max_partitions.max(1) as usize,
        conflating: out.conflation.conflating,
        row_since: None,
    };
    match &cmd.partition {
        Some(name) => {
            if let Some(pid) = get_rec::<u64>(txn, &keys::partition_name(q.qid, name.as_str()))? {
                claimer.claim(txn, pid, &mut out)?;
            }
        }
        None if claimer.indexed => {
            // Leases that ran out are released first (a few a pop; ticks do the rest), so
            // their partitions are back in the index this pop reads.
            super::ready::release_expired(txn, stamp, lease_now, RELEASE_PER_POP, true)?;
            if version >= Command::BOUNDED_FILL_FORMAT {
                // The index's rows first. While it does not cover the queue yet, an empty
                // sweep proves nothing: the partitions past its fill mark are read only when
                // its rows run dry, a step at a time, at most `MAX_FILL_STEPS` steps a pop
                // (the next pop goes on where this one stopped: see `reads::index_covers`).
                claimer.sweep(txn, q.qid, &mut out)?;
                let mut steps = 0;
                while !claimer.full(&out)
                    && steps < MAX_FILL_STEPS
                    && super::ready::meta(txn, q.qid, group)?.fill != super::ready::FILLED
                {
                    super::ready::fill(txn, &q, group, stamp, lease_now)?;
                    claimer.sweep(txn, q.qid, &mut out)?;
                    steps += 1;
                }
            } else {
                // Format 5: fill on until the pop is full or the index covers every partition.
                loop {
                    super::ready::fill(txn, &q, group, stamp, lease_now)?;
                    claimer.sweep(txn, q.qid, &mut out)?;
                    if claimer.full(&out)
                        || super::ready::meta(txn, q.qid, group)?.fill == super::ready::FILLED
                    {
                        break;
                    }
                }
            }
        }
        None => {
            // Before the cluster reads the index: every partition, starting after the one
            // this group claimed last, so competing consumers spread over them.
            let mut all = super::queue::partition_ids(txn, q.qid)?;
            let split = all.partition_point(|pid| *pid <= g.last_pid);
            all.rotate_left(split);
            for pid in all {
                if claimer.full(&out) {
                    break;
                }
                claimer.claim(txn, pid, &mut out)?;
            }
        }
    }
    if let Some(last) = out.claims.last() {
        g.last_pid = last.pid;
    }
    put_rec(txn, group_key, &g);
    if !out.claims.is_empty() && !cmd.auto_ack {
        out.lease_id = cmd.lease_id.as_str().to_owned();
        out.lease_expires = claimer.lease_expires;
        put_rec(
            txn,
            keys::lease(cmd.lease_id.as_str()),
            &LeaseRec {
                qid: q.qid,
                group: group.to_owned(),
                parts: out.claims.iter().map(|c| c.pid).collect(),
                expires: claimer.lease_expires,
            },
        );
        put_rec(
            txn,
            keys::lease_expiry(claimer.lease_expires.0, cmd.lease_id.as_str()),
            &(),
        );
        super::cluster::note_lease_expiry(txn, claimer.lease_expires)?;
    }
    Ok(out)
}

/// Most steps of [`super::ready::FILL_STEP`] partitions one wildcard pop adds to its group's
/// ready index (4,096 partitions): the bound on a pop's apply while the index is filled.
pub const MAX_FILL_STEPS: usize = 16;

/// Expired leases one wildcard pop releases before it reads the ready index.
const RELEASE_PER_POP: usize = 16;

/// Entries of the ready index one pop may look at without claiming from them (partitions whose
/// next message is still delayed, entries left stale by retention): the bound on a pop's
/// work when little is claimable.
const MAX_IDLE_LOOKS: usize = 256;

/// What one pop claims with, the same for each partition it looks at.
struct Claimer<'c> {
    /// The cluster reads the ready index ([`Command::READY_INDEX_FORMAT`]).
    indexed: bool,
    cmd: &'c PopCommand,
    stamp: Stamp,
    answered: bool,
    group: &'c str,
    start: SubscriptionStart,
    lease_now: Stamp,
    lease_expires: Stamp,
    /// The queue's `delayedProcessing` (seconds).
    delay: u64,
    /// Messages still to claim.
    budget: usize,
    max_parts: usize,
    /// The group conflates: each claim is its partition's newest visible message.
    conflating: bool,
    /// While the sweep claims from an entry of the ready index: the entry's `since` (its row
    /// key says it, so the claim takes it out without reading `READY_OF` back).
    row_since: Option<u64>,
}

impl Claimer<'_> {
    fn full(&self, out: &PopOutcome) -> bool {
        self.budget == 0 || out.claims.len() >= self.max_parts
    }

    /// Take the partitions at the front of the group's ready index of queue `qid`, oldest
    /// first, until the pop is full or has looked at [`MAX_IDLE_LOOKS`] entries in vain.
    fn sweep(
        &mut self,
        txn: &mut Txn<'_>,
        qid: u64,
        out: &mut PopOutcome,
    ) -> Result<(), StoreError> {
        let prefix = keys::ready_prefix(qid, self.group);
        let end = keys::prefix_end(&prefix);
        let start = super::ready::meta(txn, qid, self.group)?;
        let first = keys::ready(qid, self.group, start.front, 0);
        let mut from = first.clone();
        let mut idle = 0;
        while !self.full(out) && idle < MAX_IDLE_LOOKS {
            // A few more than still wanted, read before any is claimed (claims rewrite rows).
            let want = (self.max_parts - out.claims.len() + 8).min(MAX_IDLE_LOOKS);
            let mut rows: Vec<Vec<u8>> = Vec::with_capacity(want);
            StateRead::scan(&*txn, &from, &end, &mut |k, _| {
                rows.push(k.to_vec());
                rows.len() < want
            })?;
            let Some(last) = rows.last() else {
                break;
            };
            from = last.clone();
            from.push(0);
            for k in rows {
                if self.full(out) || idle >= MAX_IDLE_LOOKS {
                    break;
                }
                let Some(pid) = keys::pid_of_ready_key(&k) else {
                    txn.delete(k);
                    continue;
                };
                self.row_since = keys::u64_at(&k, k.len() - 16);
                let claimed = self.claim(txn, pid, out);
                self.row_since = None;
                if !claimed? {
                    idle += 1;
                }
            }
        }
        // The front moves up to the first row left (the rows this pop took out are behind it
        // now), unless an entry went in before it meanwhile.
        let mut front = self.stamp.0;
        StateRead::scan(&*txn, &first, &end, &mut |k, _| {
            front = keys::u64_at(k, k.len() - 16).unwrap_or(front);
            false
        })?;
        let mut now = super::ready::meta(txn, qid, self.group)?;
        if now.front >= start.front && now.front != front {
            now.front = front;
            super::ready::put_meta(txn, qid, self.group, now);
        }
        Ok(())
    }

    /// Claim from partition `pid` into `out` when it has messages this group may take now;
    /// answers whether it did. The partition's entry in the ready index follows the claim (it
    /// goes to the back when the partition stays claimable, out when it does not).
    fn claim(
        &mut self,
        txn: &mut Txn<'_>,
        pid: u64,
        out: &mut PopOutcome,
    ) -> Result<bool, StoreError> {
        let group = self.group;
        let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? else {
            // Its queue was deleted: only the ready rows of a collected partition are left.
            txn.delete(keys::ready_of(pid, group));
            return Ok(false);
        };
        let cursor_key = keys::cursor(pid, group);
        let stored = get_rec::<CursorRec>(txn, &cursor_key)?;
        let mut c = match stored.clone() {
            Some(c) => c,
            None => CursorRec {
                next: start_offset(txn, &p, self.start)?,
                ..CursorRec::default()
            },
        };
        if c.live_lease(self.lease_now).is_some() {
            super::ready::sync(txn, group, &p, stored.as_ref(), self.stamp)?;
            return Ok(false);
        }
        let from = c.next.max(p.log_start);
        if from >= p.next_offset {
            if stored.is_none() && self.indexed {
                // Where the group starts here is written down, so that the next push finds
                // the partition newly ready for it (see `ready::pushed`).
                put_rec(txn, cursor_key, &c);
            }
            super::ready::sync(txn, group, &p, Some(&c), self.stamp)?;
            return Ok(false);
        }
        if self.conflating {
            return self.claim_newest(txn, &p, c, from, out);
        }
        let budget = self.budget;
        let mut until = p.next_offset.min(from.saturating_add(budget as u64));
        // Deleted messages, and retried dead letters of other groups, are stepped over: the
        // claim starts at its first message this group may see and ends after its last, and
        // counts only those (decided from the marks alone, the same with or without reading
        // the messages).
        let marks = super::marks::in_range(txn, pid, from, p.next_offset)?;
        let mut from = from;
        let mut live = until - from;
        if !marks.is_empty() {
            // Walk past hidden offsets until the claim holds `budget` messages this group sees
            // (marks are few: operators' deletions and retries).
            let mut seen: Vec<u64> = Vec::new();
            let mut at = from;
            while at < p.next_offset && seen.len() < budget {
                if !super::marks::hidden(&marks, at, group) {
                    seen.push(at);
                }
                at += 1;
            }
            let (Some(&first), Some(&last)) = (seen.first(), seen.last()) else {
                c.next = at;
                put_rec(txn, cursor_key, &c);
                super::ready::sync(txn, group, &p, Some(&c), self.stamp)?;
                return Ok(false);
            };
            (from, until, live) = (first, last + 1, seen.len() as u64);
        }
        let (count, last, delivered) = if !self.answered && self.delay == 0 {
            (live, until - 1, Vec::new())
        } else {
            let d = read_claim(
                txn, pid, from, until, budget, self.delay, self.stamp, &c, &marks, group,
            )?;
            let Some(last) = d.last().map(|d| d.offset) else {
                // Still delayed: it stays where it is in the index.
                return Ok(false);
            };
            (d.len() as u64, last, d)
        };
        self.budget -= count as usize;
        self.take(txn, &p, c, from, last, delivered, out)?;
        Ok(true)
    }

    /// Claim partition `p` for a conflating group, its cursor `c` there at `from` (something
    /// is beyond it): the newest message the group may see now is the claim, and every offset
    /// behind it is retired (the cursor moves to it). Answers whether it claimed.
    fn claim_newest(
        &mut self,
        txn: &mut Txn<'_>,
        p: &PartitionRec,
        mut c: CursorRec,
        from: u64,
        out: &mut PopOutcome,
    ) -> Result<bool, StoreError> {
        let group = self.group;
        let marks = super::marks::in_range(txn, p.pid, from, p.next_offset)?;
        let until = super::conflation::first_delayed(txn, p, from, self.delay, self.stamp)?;
        let Some(newest) = super::conflation::newest_seen(from, until, &marks, group) else {
            if until == p.next_offset {
                // Everything left is hidden from this group: nothing to deliver here.
                c.next = p.next_offset;
                put_rec(txn, keys::cursor(p.pid, group), &c);
                super::ready::sync(txn, group, p, Some(&c), self.stamp)?;
            }
            // Otherwise still delayed: it stays where it is in the index.
            return Ok(false);
        };
        // The message is read only for an answer: which one it is follows from the offsets.
        let delivered = if self.answered {
            read_claim(
                txn,
                p.pid,
                newest,
                newest + 1,
                1,
                self.delay,
                self.stamp,
                &c,
                &marks,
                group,
            )?
        } else {
            Vec::new()
        };
        self.budget -= 1;
        self.take(txn, p, c, newest, newest, delivered, out)?;
        Ok(true)
    }

    /// Record a claim of `p` from `from` to `last` (inclusive) with cursor `c`: under the pop's
    /// lease, or consumed at once with `autoAck`; the partition leaves the group's ready index
    /// (and goes back at its end when something is left to claim now).
    #[allow(clippy::too_many_arguments)]
    fn take(
        &self,
        txn: &mut Txn<'_>,
        p: &PartitionRec,
        mut c: CursorRec,
        from: u64,
        last: u64,
        delivered: Vec<Delivered>,
        out: &mut PopOutcome,
    ) -> Result<(), StoreError> {
        let group = self.group;
        c.next = from;
        if self.cmd.auto_ack {
            c.next = last + 1;
            c.lease = None;
            c.last_consumed = self.stamp;
        } else {
            c.lease = Some(CursorLease {
                id: self.cmd.lease_id.clone(),
                expires: self.lease_expires,
                end: last + 1,
            });
        }
        put_rec(txn, keys::cursor(p.pid, group), &c);
        // Out of the index (the sweep knows where its entry is), and back at its end when
        // something is left to claim now (never under a lease).
        match self.row_since {
            Some(since) => {
                txn.delete(keys::ready(p.qid, group, since, p.pid));
                txn.delete(keys::ready_of(p.pid, group));
            }
            None => super::ready::remove(txn, p.qid, group, p.pid)?,
        }
        if c.lease.is_none() {
            super::ready::sync(txn, group, p, Some(&c), self.stamp)?;
        }
        out.claims.push(Claim {
            pid: p.pid,
            partition: p.name.clone(),
            messages: delivered,
        });
        Ok(())
    }
}
