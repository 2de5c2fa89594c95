//! Staging an apply's message rows: the index rows, records and released files a batch of
//! appends turns into, and which pushed messages can stay where the raft log wrote them.

use std::collections::{BTreeMap, HashMap};

use queen_domain::keys::table;
use queen_domain::{Appended, Appends, StoreError, WriteSet};

use super::{
    END_KEY, EngineRead, IndexVal, encode_end, file_key, index_key, read_err, segment_err, u64_be,
};
use crate::segments::{ITEMS_ONLY, Loc, NewRecord, RAFT_BIT, Raft, Segments};

/// Everything an apply's message rows turn into, ready to go into the engine's batch.
pub(crate) struct Staged {
    /// Engine rows to put (`Some`) or remove (`None`).
    pub rows: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Files to delete once the batch is committed.
    pub released: Vec<u64>,
    /// Raft log files that records now point into for the first time (`RAFT_BIT` clear).
    pub held: Vec<u64>,
}

/// A push entry of the batch whose messages can stay where the raft log wrote them: its
/// stamp, its command's span in the log's files and those bytes, and where each message it
/// appended came from.
pub(crate) struct KeptEntry<'a> {
    pub stamp: u64,
    pub span: queen_ports::LogSpan,
    pub bytes: &'a [u8],
    pub origins: &'a [queen_domain::Origin],
}

/// The messages one kept entry appended to one partition: the entry (its position in the
/// kept entries), the first offset and item, how many, and whether the items are consecutive
/// (only then is the record kept in the raft log).
pub(super) struct KeptRun {
    entry: usize,
    first_offset: u64,
    first_item: u32,
    count: u32,
    consecutive: bool,
}

pub(super) fn kept_runs(kept: &[KeptEntry<'_>]) -> HashMap<(u64, u64), KeptRun> {
    let mut out: HashMap<(u64, u64), KeptRun> = HashMap::new();
    for (entry, e) in kept.iter().enumerate() {
        for o in e.origins {
            match out.get_mut(&(e.stamp, o.pid)) {
                Some(r) => {
                    r.consecutive &= o.offset == r.first_offset + u64::from(r.count)
                        && o.item == r.first_item + r.count;
                    r.count += 1;
                }
                None => {
                    out.insert(
                        (e.stamp, o.pid),
                        KeptRun {
                            entry,
                            first_offset: o.offset,
                            first_item: o.item,
                            count: 1,
                            consecutive: true,
                        },
                    );
                }
            }
        }
    }
    out
}

/// Split the message rows out of `writes` (the other rows stay), append `appends` to the
/// segment log and turn the deletes into index changes. `idx` is the committed index. The
/// messages a `kept` entry appended to a partition from consecutive items are not written
/// again: their index row points at the entry in the raft log.
pub(crate) fn stage(
    idx: &dyn EngineRead,
    seg: &Segments,
    writes: &mut WriteSet,
    appends: Appends<'_>,
    kept: &[KeptEntry<'_>],
) -> Result<Staged, StoreError> {
    // Deletes of message rows: the new first live offset per partition.
    let mut cuts: BTreeMap<u64, u64> = BTreeMap::new();
    let msg_lo = vec![table::MESSAGE];
    let msg_hi = vec![table::MESSAGE + 1];
    let doomed: Vec<Vec<u8>> = writes
        .range(msg_lo..msg_hi)
        .map(|(k, _)| k.clone())
        .collect();
    for k in doomed {
        match writes.remove(&k) {
            Some(None) => {
                if let Some((pid, offset)) = queen_domain::keys::message_parts(&k) {
                    let e = cuts.entry(pid).or_insert(0);
                    *e = (*e).max(offset + 1);
                }
            }
            Some(Some(_)) => {
                return Err(StoreError::Corrupt {
                    key: queen_domain::codec::escape(&k),
                    detail: "message rows are appended, never put".to_owned(),
                });
            }
            None => {}
        }
    }
    if appends.is_empty() && cuts.is_empty() {
        return Ok(Staged {
            rows: Vec::new(),
            released: Vec::new(),
            held: Vec::new(),
        });
    }

    // Appends: runs of consecutive offsets of one partition with one stamp.
    struct Run<'a, 'm> {
        pid: u64,
        base: u64,
        stamp: u64,
        values: Vec<&'a Appended<'m>>,
    }
    let mut runs: Vec<Run<'_, '_>> = Vec::new();
    for (&(pid, offset), v) in &appends {
        let stamp = v
            .stamp()
            .ok_or_else(|| StoreError::Corrupt {
                key: queen_domain::codec::escape(&queen_domain::keys::message(pid, offset)),
                detail: "an appended message without a stamp".to_owned(),
            })?
            .0;
        match runs.last_mut() {
            Some(r)
                if r.pid == pid && r.stamp == stamp && r.base + r.values.len() as u64 == offset =>
            {
                r.values.push(v)
            }
            _ => runs.push(Run {
                pid,
                base: offset,
                stamp,
                values: vec![v],
            }),
        }
    }
    runs.sort_by_key(|r| (r.stamp, r.pid, r.base));
    // Runs that stay in the raft log: every message of the run is one of a kept entry's
    // consecutive items for the partition.
    let runs_kept = kept_runs(kept);
    // Where each kept entry's items start, worked out once per entry that has a run to keep.
    let mut bounds: Vec<Option<Option<Vec<u32>>>> = Vec::new();
    bounds.resize_with(kept.len(), || None);
    let mut index: BTreeMap<Vec<u8>, Option<IndexVal>> = BTreeMap::new();
    let mut files: HashMap<u64, i64> = HashMap::new();
    runs.retain(|r| {
        let count = u32::try_from(r.values.len()).unwrap_or(u32::MAX);
        match runs_kept.get(&(r.stamp, r.pid)) {
            Some(k) if k.consecutive && k.first_offset == r.base && k.count == count => {
                let entry = &kept[k.entry];
                let at = bounds[k.entry]
                    .get_or_insert_with(|| queen_domain::pushed::item_bounds(entry.bytes));
                // The run's items alone: their bytes in the entry, where the log wrote them.
                let Some((from, to)) = at.as_ref().and_then(|b| {
                    let from = *b.get(k.first_item as usize)?;
                    let to = *b.get(k.first_item as usize + count as usize)?;
                    Some((from, to))
                }) else {
                    return true;
                };
                let loc = Loc {
                    file: entry.span.file | RAFT_BIT,
                    pos: entry.span.pos + u64::from(from),
                    len: to - from,
                };
                index.insert(
                    index_key(r.pid, r.base),
                    Some(IndexVal {
                        loc,
                        count,
                        skip: 0,
                        raft: Some(Raft {
                            stamp: r.stamp,
                            crc: crc32fast::hash(&entry.bytes[from as usize..to as usize]),
                            first_item: ITEMS_ONLY,
                        }),
                    }),
                );
                *files.entry(loc.file).or_default() += 1;
                false
            }
            _ => true,
        }
    });
    // The rest are written to the segment log: only these messages are encoded (those pushed
    // in place are still the pushed fields).
    let bytes: Vec<Vec<std::borrow::Cow<'_, [u8]>>> = runs
        .iter()
        .map(|r| r.values.iter().map(|v| v.bytes()).collect())
        .collect();
    let records: Vec<NewRecord<'_>> = runs
        .iter()
        .zip(&bytes)
        .map(|(r, b)| NewRecord {
            pid: r.pid,
            base: r.base,
            stamp: r.stamp,
            values: b.iter().map(AsRef::as_ref).collect(),
        })
        .collect();
    let (locs, sealed) = seg.append(&records).map_err(segment_err)?;

    // The index after this apply, for the partitions it touches: new records, then cuts.
    for (r, loc) in records.iter().zip(&locs) {
        let count = u32::try_from(r.values.len()).unwrap_or(u32::MAX);
        index.insert(
            index_key(r.pid, r.base),
            Some(IndexVal {
                loc: *loc,
                count,
                skip: 0,
                raft: None,
            }),
        );
        *files.entry(loc.file).or_default() += 1;
    }
    for (&pid, &start) in &cuts {
        let lo = index_key(pid, 0);
        let hi = index_key(pid, start);
        let mut touched: Vec<(Vec<u8>, IndexVal)> = Vec::new();
        for g in idx.range(&lo, &hi) {
            let (k, v) = g.into_inner().map_err(read_err)?;
            touched.push((k.to_vec(), IndexVal::decode(&k, &v)?));
        }
        for (k, v) in index.range(lo.clone()..hi.clone()) {
            if let Some(v) = v {
                touched.push((k.clone(), *v));
            }
        }
        for (k, mut v) in touched {
            let base = u64_be(&k[9..17]);
            if v.end(base) <= start {
                *files.entry(v.loc.file).or_default() -= 1;
                index.insert(k, None);
            } else if v.first_live(base) < start {
                v.skip = u32::try_from(start - base).unwrap_or(u32::MAX);
                index.insert(k, Some(v));
            }
        }
    }

    let end = seg.end();
    let mut rows: Vec<(Vec<u8>, Option<Vec<u8>>)> = index
        .into_iter()
        .map(|(k, v)| (k, v.map(|v| v.encode().to_vec())))
        .collect();
    let mut released = Vec::new();
    let mut held = Vec::new();
    let mut counted: Vec<u64> = files.keys().copied().collect();
    counted.extend(sealed.iter().copied().filter(|f| !files.contains_key(f)));
    counted.sort_unstable();
    for file in counted {
        let key = file_key(file);
        let before = match idx.get(&key)? {
            Some(b) => u64::from_le_bytes(b.as_slice().try_into().unwrap_or_default()),
            None => 0,
        };
        let after =
            i64::try_from(before).unwrap_or(i64::MAX) + files.get(&file).copied().unwrap_or(0);
        if after > 0 {
            if before == 0 && file & RAFT_BIT != 0 {
                held.push(file & !RAFT_BIT);
            }
            rows.push((key, Some((after as u64).to_le_bytes().to_vec())));
        } else {
            rows.push((key, None));
            if file != end.0 {
                released.push(file);
            }
        }
    }
    rows.push((END_KEY.to_vec(), Some(encode_end(end).to_vec())));
    Ok(Staged {
        rows,
        released,
        held,
    })
}
