//! Named invariants of the broker state, checked by property tests (and usable by cluster
//! tests on every node's state).

use crate::keys;
use crate::machine::scan_recs;
use crate::model::{CursorRec, LeaseRec, MessageRec, PartitionRec, QueueRec};
use crate::store::StateRead;

/// The first invariant found broken, described (or the state read that failed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub String);

/// "Each partition stores exactly the offsets `log_start..next_offset`, every stored message
/// is found through its dedup row, no cursor or lease points past the high watermark, and a
/// queue's message count equals what its partitions store."
///
/// # Errors
/// The first violation, described.
pub fn check(s: &dyn StateRead) -> Result<(), Violation> {
    let err = |e: crate::store::StoreError| Violation(e.to_string());
    let parts: Vec<(Vec<u8>, PartitionRec)> = scan_recs(
        s,
        &keys::table_start(keys::table::PARTITION),
        &keys::table_end(keys::table::PARTITION),
        usize::MAX,
    )
    .map_err(err)?;
    let queues: Vec<(Vec<u8>, QueueRec)> = scan_recs(
        s,
        &keys::table_start(keys::table::QUEUE),
        &keys::table_end(keys::table::QUEUE),
        usize::MAX,
    )
    .map_err(err)?;
    let live: std::collections::BTreeSet<u64> = queues.iter().map(|(_, q)| q.qid).collect();
    let mut per_queue: std::collections::BTreeMap<u64, u64> = Default::default();
    // From the ready index's format on, an expired lease releases its cursors.
    let releases = crate::machine::cluster::cluster_version(s).map_err(err)?
        >= crate::command::Command::READY_INDEX_FORMAT;
    for (_, p) in parts.iter().filter(|(_, p)| live.contains(&p.qid)) {
        let msgs: Vec<(Vec<u8>, MessageRec)> = scan_recs(
            s,
            &keys::pid_prefix(keys::table::MESSAGE, p.pid),
            &keys::prefix_end(&keys::pid_prefix(keys::table::MESSAGE, p.pid)),
            usize::MAX,
        )
        .map_err(err)?;
        let offsets: Vec<u64> = msgs
            .iter()
            .filter_map(|(k, _)| keys::offset_of_message_key(k))
            .collect();
        let expected: Vec<u64> = (p.log_start..p.next_offset).collect();
        if offsets != expected {
            return Err(Violation(format!(
                "partition {} stores {offsets:?}, expected {expected:?}",
                p.pid
            )));
        }
        for (k, m) in &msgs {
            let d: Option<Vec<u64>> =
                crate::machine::get_rec(s, &keys::dedup(p.pid, &m.transaction_id)).map_err(err)?;
            let offset = keys::offset_of_message_key(k).unwrap_or(u64::MAX);
            if !d.is_some_and(|d| d.contains(&offset)) {
                return Err(Violation(format!(
                    "message {} of partition {} has no dedup row",
                    m.transaction_id, p.pid
                )));
            }
        }
        let prefix = keys::pid_prefix(keys::table::CURSOR, p.pid);
        let cursors: Vec<(Vec<u8>, CursorRec)> =
            scan_recs(s, &prefix, &keys::prefix_end(&prefix), usize::MAX).map_err(err)?;
        for (k, c) in cursors {
            if c.next > p.next_offset || c.lease.as_ref().is_some_and(|l| l.end > p.next_offset) {
                return Err(Violation(format!(
                    "a cursor of partition {} points past its end",
                    p.pid
                )));
            }
            if releases {
                let group = String::from_utf8_lossy(&k[prefix.len()..]);
                check_lease_kept(s, p.pid, &group, &c)?;
            }
        }
        *per_queue.entry(p.qid).or_default() += p.next_offset - p.log_start;
    }
    for (_, q) in &queues {
        check_ready(s, q.qid)?;
    }
    for (_, q) in queues {
        let stored = per_queue.get(&q.qid).copied().unwrap_or(0);
        if stored != q.messages {
            return Err(Violation(format!(
                "queue {} counts {} messages, stores {stored}",
                q.name, q.messages
            )));
        }
    }
    Ok(())
}

/// "A cursor's lease is one the broker will release": its lease record names the cursor's
/// partition and group and expires when the cursor's lease does, and its expiry row is there
/// (else the partition stays out of the group's ready index for good once the lease runs out).
fn check_lease_kept(
    s: &dyn StateRead,
    pid: u64,
    group: &str,
    c: &CursorRec,
) -> Result<(), Violation> {
    let err = |e: crate::store::StoreError| Violation(e.to_string());
    let Some(cl) = &c.lease else {
        return Ok(());
    };
    let id = cl.id.as_str();
    let l: Option<LeaseRec> = crate::machine::get_rec(s, &keys::lease(id)).map_err(err)?;
    let kept = match &l {
        Some(l) => {
            l.group == group
                && l.parts.contains(&pid)
                && l.expires == cl.expires
                && crate::machine::get_rec::<()>(s, &keys::lease_expiry(l.expires.0, id))
                    .map_err(err)?
                    .is_some()
        }
        None => false,
    };
    if kept {
        return Ok(());
    }
    Err(Violation(format!(
        "partition {pid}'s cursor of group {group} holds lease {id} (expires {:?}), whose record {l:?} will not release it",
        cl.expires
    )))
}

/// "Every partition a group could claim from is in that group's ready index (where the index
/// covers it), no entry is under a lease, and the index's two tables agree": what a pop that
/// names no partition reads instead of scanning the queue (`machine::ready`).
fn check_ready(s: &dyn StateRead, qid: u64) -> Result<(), Violation> {
    use crate::machine::ready;
    let err = |e: crate::store::StoreError| Violation(e.to_string());
    let pids = crate::machine::partition_ids_pub(s, qid).map_err(err)?;
    for (group, meta) in ready::groups(s, qid).map_err(err)? {
        let mark = meta.fill;
        for &pid in pids.iter().filter(|pid| **pid < mark) {
            let Some(p) =
                crate::machine::get_rec::<PartitionRec>(s, &keys::partition(pid)).map_err(err)?
            else {
                continue;
            };
            let c: Option<CursorRec> =
                crate::machine::get_rec(s, &keys::cursor(pid, &group)).map_err(err)?;
            let since: Option<u64> =
                crate::machine::get_rec(s, &keys::ready_of(pid, &group)).map_err(err)?;
            if ready::wanted(&p, c.as_ref()) && since.is_none() {
                return Err(Violation(format!(
                    "partition {pid} is claimable by group {group} but not in its ready index"
                )));
            }
            if since.is_some() && c.as_ref().is_some_and(|c| c.lease.is_some()) {
                return Err(Violation(format!(
                    "partition {pid} is in group {group}'s ready index under a lease"
                )));
            }
        }
        let prefix = keys::ready_prefix(qid, &group);
        let rows: Vec<(Vec<u8>, ())> =
            scan_recs(s, &prefix, &keys::prefix_end(&prefix), usize::MAX).map_err(err)?;
        for (k, ()) in rows {
            let pid = keys::pid_of_ready_key(&k).unwrap_or(u64::MAX);
            let since = keys::u64_at(&k, k.len().saturating_sub(16));
            let of: Option<u64> =
                crate::machine::get_rec(s, &keys::ready_of(pid, &group)).map_err(err)?;
            if of != since || pid >= mark || since.is_some_and(|t| t < meta.front) {
                return Err(Violation(format!(
                    "group {group}'s ready row for partition {pid} disagrees with its place ({of:?} vs {since:?}) or lies past the fill mark {mark} or before the front {}",
                    meta.front
                )));
            }
        }
    }
    Ok(())
}
