//! Queue and partition lifecycle: created by first use, configured, deleted.

use crate::keys;
use crate::model::{PartitionRec, QueueOptions, QueueRec};
use crate::names::{PartitionName, QueueName};
use crate::store::{StoreError, Txn};
use crate::time::Stamp;

use super::{get_rec, next_counter, put_rec, scan_recs};

/// The queue, created with default options when unknown.
pub(crate) fn ensure_queue(
    txn: &mut Txn<'_>,
    name: &str,
    stamp: Stamp,
) -> Result<QueueRec, StoreError> {
    if let Some(q) = get_rec::<QueueRec>(txn, &keys::queue(name))? {
        return Ok(q);
    }
    let q = QueueRec {
        qid: next_counter(txn, "next_qid")?,
        name: name.to_owned(),
        namespace: None,
        task: None,
        options: QueueOptions::default(),
        created: stamp,
        messages: 0,
        partitions: 0,
        dead_lettered: 0,
    };
    put_rec(txn, keys::queue(name), &q);
    txn.note_queue_options();
    if super::cluster::cluster_version(txn)? >= crate::command::Command::READY_INDEX_FORMAT {
        // Most consumers pop in queue mode: its index is kept from the first push, so a queue
        // filled before anyone pops has nothing left to fill at its first pop.
        super::ready::start_queue_mode(txn, q.qid, crate::names::GroupName::queue_mode().as_str());
    }
    Ok(q)
}

/// The partition, created when unknown (the queue record's count is updated in `q`).
pub(crate) fn ensure_partition(
    txn: &mut Txn<'_>,
    q: &mut QueueRec,
    name: &str,
    stamp: Stamp,
) -> Result<PartitionRec, StoreError> {
    let name_key = keys::partition_name(q.qid, name);
    if let Some(pid) = get_rec::<u64>(txn, &name_key)?
        && let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))?
    {
        return Ok(p);
    }
    let pid = next_counter(txn, "next_pid")?;
    let p = PartitionRec {
        pid,
        qid: q.qid,
        queue: q.name.clone(),
        name: name.to_owned(),
        next_offset: 0,
        log_start: 0,
        created: stamp,
        last_write: Stamp(0),
    };
    put_rec(txn, name_key, &pid);
    put_rec(txn, keys::partition(pid), &p);
    put_rec(txn, keys::queue_partition(q.qid, pid), &());
    q.partitions += 1;
    put_rec(txn, keys::queue(&q.name), q);
    Ok(p)
}

/// Create or replace a queue's configuration; makes sure `Default` exists.
pub(crate) fn configure(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    name: &QueueName,
    namespace: &Option<String>,
    task: &Option<String>,
    options: &QueueOptions,
) -> Result<QueueOptions, StoreError> {
    let mut q = ensure_queue(txn, name.as_str(), stamp)?;
    q.options = options.clone();
    q.namespace = namespace.clone();
    q.task = task.clone();
    put_rec(txn, keys::queue(name.as_str()), &q);
    txn.note_queue_options();
    ensure_partition(
        txn,
        &mut q,
        PartitionName::default_partition().as_str(),
        stamp,
    )?;
    Ok(q.options)
}

/// Delete a queue: its record goes at once, its rows are collected by later ticks. Once the
/// cluster reads the ready index's format, its partitions are also detached by those ticks, in
/// bounded steps (`housekeeping`), so deleting a queue of a million partitions costs one entry
/// little; before, they are detached here, all in this entry, as the build before did.
pub(crate) fn delete(txn: &mut Txn<'_>, name: &QueueName) -> Result<bool, StoreError> {
    let Some(q) = get_rec::<QueueRec>(txn, &keys::queue(name.as_str()))? else {
        return Ok(false);
    };
    txn.delete(keys::queue(name.as_str()));
    txn.note_queue_options();
    if super::cluster::cluster_version(txn)? >= crate::command::Command::READY_INDEX_FORMAT {
        put_rec(txn, keys::grave(1, q.qid), &());
        return Ok(true);
    }
    let start = keys::pid_prefix(keys::table::QUEUE_PARTITION, q.qid);
    let parts: Vec<(Vec<u8>, ())> = scan_recs(txn, &start, &keys::prefix_end(&start), usize::MAX)?;
    for (k, ()) in parts {
        let Some(pid) = keys::u64_at(&k, 9) else {
            continue;
        };
        if let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? {
            txn.delete(keys::partition_name(q.qid, &p.name));
        }
        txn.delete(k);
        put_rec(txn, keys::grave(0, pid), &());
    }
    put_rec(txn, keys::grave(1, q.qid), &());
    Ok(true)
}

/// The partitions of a queue in creation order.
pub(crate) fn partition_ids(
    s: &dyn crate::store::StateRead,
    qid: u64,
) -> Result<Vec<u64>, StoreError> {
    let start = keys::pid_prefix(keys::table::QUEUE_PARTITION, qid);
    let mut pids = Vec::new();
    s.scan(&start, &keys::prefix_end(&start), &mut |k, _| {
        if let Some(pid) = keys::u64_at(k, 9) {
            pids.push(pid);
        }
        true
    })?;
    Ok(pids)
}
