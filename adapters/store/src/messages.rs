//! The domain's message table (`table::MESSAGE`, keys `(pid, offset)`) kept in the segment log
//! instead of the LSM engine. The domain reads and writes it as ordered key-value rows; this
//! module maps those rows onto records:
//!
//! - appends become one record per (partition, stamp) run, that is per log entry and partition,
//!   written in (stamp, partition) order so the log's bytes do not depend on how entries were
//!   batched;
//! - the engine keeps one index row per record, `SEGMENT_INDEX | pid | base` -> location, count
//!   and the number of leading messages already deleted (`skip`);
//! - deletes of message rows are always from a partition's front (retention, queue deletion):
//!   they raise `skip` or drop whole index rows; a file whose live record count reaches zero is
//!   deleted;
//! - `SEGMENT_FILE | file` counts live records per file, `SEGMENT_END` says where the log ends,
//!   both in the same atomic batch as everything else an apply writes.

mod stage;

use queen_domain::StoreError;
use queen_domain::keys::{self, table};

use crate::segments::{Loc, RAFT_BIT, Raft, Record, SegmentError, Segments};
pub(crate) use stage::{KeptEntry, stage};

/// A read error of the engine, as the domain sees it.
pub(crate) fn read_err(e: fjall::Error) -> StoreError {
    StoreError::Read(e.to_string())
}

/// An index row's value: 28 bytes for a record of the segment log, 44 for one kept in the
/// raft log (its location is the entry's command, `loc.file` has `RAFT_BIT`, and `raft` says
/// which of the entry's items are the record's messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexVal {
    pub loc: Loc,
    pub count: u32,
    pub skip: u32,
    pub raft: Option<Raft>,
}

impl IndexVal {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(44);
        b.extend_from_slice(&self.loc.file.to_le_bytes());
        b.extend_from_slice(&self.loc.pos.to_le_bytes());
        b.extend_from_slice(&self.loc.len.to_le_bytes());
        b.extend_from_slice(&self.count.to_le_bytes());
        b.extend_from_slice(&self.skip.to_le_bytes());
        if let Some(r) = self.raft {
            b.extend_from_slice(&r.stamp.to_le_bytes());
            b.extend_from_slice(&r.crc.to_le_bytes());
            b.extend_from_slice(&r.first_item.to_le_bytes());
        }
        b
    }

    pub(crate) fn decode(key: &[u8], b: &[u8]) -> Result<Self, StoreError> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        let file = if b.len() >= 8 { u64_at(0) } else { 0 };
        let raft = match b.len() {
            28 if file & RAFT_BIT == 0 => None,
            44 if file & RAFT_BIT != 0 => Some(Raft {
                stamp: u64_at(28),
                crc: u32_at(36),
                first_item: u32_at(40),
            }),
            n => {
                return Err(StoreError::Corrupt {
                    key: queen_domain::codec::escape(key),
                    detail: format!("segment index row of {n} bytes for file {file:#x}"),
                });
            }
        };
        Ok(Self {
            loc: Loc {
                file,
                pos: u64_at(8),
                len: u32_at(16),
            },
            count: u32_at(20),
            skip: u32_at(24),
            raft,
        })
    }

    /// The record this row indexes (`base` is its key's), from the segment log or the raft log.
    pub(crate) fn read(
        &self,
        seg: &Segments,
        pid: u64,
        base: u64,
    ) -> Result<std::sync::Arc<Record>, SegmentError> {
        match self.raft {
            None => seg.read(self.loc),
            Some(r) => seg.read_raft(self.loc, r, pid, base, self.count),
        }
    }

    fn first_live(&self, base: u64) -> u64 {
        base + u64::from(self.skip)
    }

    fn end(&self, base: u64) -> u64 {
        base + u64::from(self.count)
    }
}

pub(crate) fn index_key(pid: u64, base: u64) -> Vec<u8> {
    let mut k = keys::pid_prefix(table::SEGMENT_INDEX, pid);
    k.extend_from_slice(&base.to_be_bytes());
    k
}

pub(crate) fn file_key(file: u64) -> Vec<u8> {
    let mut k = vec![table::SEGMENT_FILE];
    k.extend_from_slice(&file.to_be_bytes());
    k
}

pub(crate) const END_KEY: &[u8] = &[table::SEGMENT_END];

pub(crate) fn encode_end((file, len): (u64, u64)) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&file.to_le_bytes());
    b[8..16].copy_from_slice(&len.to_le_bytes());
    b
}

pub(crate) fn decode_end(b: &[u8]) -> Option<(u64, u64)> {
    (b.len() == 16).then(|| {
        (
            u64::from_le_bytes(b[0..8].try_into().unwrap_or_default()),
            u64::from_le_bytes(b[8..16].try_into().unwrap_or_default()),
        )
    })
}

fn u64_be(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().unwrap_or_default())
}

/// (pid, base offset) of an index row's key.
pub(crate) fn index_key_parts(key: &[u8]) -> Option<(u64, u64)> {
    (key.len() == 17 && key[0] == table::SEGMENT_INDEX)
        .then(|| (u64_be(&key[1..9]), u64_be(&key[9..17])))
}

fn segment_err(e: SegmentError) -> StoreError {
    StoreError::Read(e.to_string())
}

/// Read access to a slot's engine rows (the index among them): its current state or a pinned
/// view of it.
pub(crate) trait EngineRead {
    fn range(&self, lo: &[u8], hi: &[u8]) -> fjall::Iter;
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
}

impl EngineRead for fjall::Keyspace {
    fn range(&self, lo: &[u8], hi: &[u8]) -> fjall::Iter {
        fjall::Keyspace::range(self, lo..hi)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(fjall::Keyspace::get(self, key)
            .map_err(read_err)?
            .map(|v| v.to_vec()))
    }
}

/// A pinned view of a slot's keyspace.
pub(crate) struct View<'a>(pub &'a fjall::Snapshot, pub &'a fjall::Keyspace);

impl EngineRead for View<'_> {
    fn range(&self, lo: &[u8], hi: &[u8]) -> fjall::Iter {
        use fjall::Readable;
        self.0.range(self.1, lo..hi)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        use fjall::Readable;
        Ok(self
            .0
            .get(self.1, key)
            .map_err(read_err)?
            .map(|v| v.to_vec()))
    }
}

/// The record of `pid` that holds `offset`, if any: (base, index value).
fn record_at(
    idx: &dyn EngineRead,
    pid: u64,
    offset: u64,
) -> Result<Option<(u64, IndexVal)>, StoreError> {
    let lo = index_key(pid, 0);
    let hi = match offset.checked_add(1) {
        Some(n) => index_key(pid, n),
        None => keys::prefix_end(&keys::pid_prefix(table::SEGMENT_INDEX, pid)),
    };
    match idx.range(&lo, &hi).next_back() {
        None => Ok(None),
        Some(g) => {
            let (k, v) = g.into_inner().map_err(read_err)?;
            Ok(Some((u64_be(&k[9..17]), IndexVal::decode(&k, &v)?)))
        }
    }
}

/// Whether message `offset` of `pid` is stored (not yet deleted).
pub(crate) fn is_live(idx: &dyn EngineRead, pid: u64, offset: u64) -> Result<bool, StoreError> {
    Ok(record_at(idx, pid, offset)?
        .is_some_and(|(base, v)| offset >= v.first_live(base) && offset < v.end(base)))
}

/// The first stored offset of `pid`, if any message of it is stored. Messages are deleted from
/// a partition's front only, so every offset below it is gone.
pub(crate) fn first_live(idx: &dyn EngineRead, pid: u64) -> Result<Option<u64>, StoreError> {
    let prefix = keys::pid_prefix(table::SEGMENT_INDEX, pid);
    let hi = keys::prefix_end(&prefix);
    for g in idx.range(&prefix, &hi) {
        let (k, v) = g.into_inner().map_err(read_err)?;
        let Some((_, base)) = index_key_parts(&k) else {
            continue;
        };
        let v = IndexVal::decode(&k, &v)?;
        if v.first_live(base) < v.end(base) {
            return Ok(Some(v.first_live(base)));
        }
    }
    Ok(None)
}

/// The bytes `pid`'s stored messages take in their records: each record's length, in
/// proportion to the messages of it not yet deleted. One index row is read per record.
///
/// # Errors
/// The engine failed.
pub(crate) fn stored_bytes(idx: &dyn EngineRead, pid: u64) -> Result<u64, StoreError> {
    let prefix = keys::pid_prefix(table::SEGMENT_INDEX, pid);
    let hi = keys::prefix_end(&prefix);
    let mut total = 0u64;
    for g in idx.range(&prefix, &hi) {
        let (k, v) = g.into_inner().map_err(read_err)?;
        let v = IndexVal::decode(&k, &v)?;
        if v.count == 0 || v.skip >= v.count {
            continue;
        }
        let live = u64::from(v.count - v.skip);
        total += u64::from(v.loc.len) * live / u64::from(v.count);
    }
    Ok(total)
}

/// The stored value of a message key.
pub(crate) fn get(
    idx: &dyn EngineRead,
    seg: &Segments,
    key: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some((pid, offset)) = queen_domain::keys::message_parts(key) else {
        return Ok(None);
    };
    let Some((base, v)) = record_at(idx, pid, offset)? else {
        return Ok(None);
    };
    if offset < v.first_live(base) || offset >= v.end(base) {
        return Ok(None);
    }
    let r = v.read(seg, pid, base).map_err(segment_err)?;
    Ok(r.values()
        .nth((offset - base) as usize)
        .map(|(_, v)| v.to_vec()))
}

/// Visit the message rows in `[start, end)`, both inside the message table, in key order.
pub(crate) fn scan(
    idx: &dyn EngineRead,
    seg: &Segments,
    start: &[u8],
    end: &[u8],
    visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
) -> Result<(), StoreError> {
    let to_index = |k: &[u8]| {
        let mut i = vec![table::SEGMENT_INDEX];
        i.extend_from_slice(&k[1..]);
        i
    };
    let ihi = if end.len() == 1 && end[0] > table::MESSAGE {
        vec![table::SEGMENT_INDEX + 1]
    } else {
        to_index(end)
    };
    // The record holding `start` begins before it.
    let mut ilo = to_index(start);
    if let Some((pid, offset)) = queen_domain::keys::message_parts(start)
        && let Some((base, _)) = record_at(idx, pid, offset)?
    {
        ilo = index_key(pid, base);
    }
    if ilo >= ihi {
        return Ok(());
    }
    let mut key = vec![table::MESSAGE; 17];
    for g in idx.range(&ilo, &ihi) {
        let (k, v) = g.into_inner().map_err(read_err)?;
        let Some((pid, base)) = index_key_parts(&k) else {
            continue;
        };
        let val = IndexVal::decode(&k, &v)?;
        let r = val.read(seg, pid, base).map_err(segment_err)?;
        if r.pid != pid || r.base != base {
            return Err(StoreError::Corrupt {
                key: queen_domain::codec::escape(&k),
                detail: format!(
                    "the record at {:?} is partition {} base {}",
                    val.loc, r.pid, r.base
                ),
            });
        }
        key[1..9].copy_from_slice(&pid.to_be_bytes());
        for (offset, value) in r.values().skip(val.skip as usize) {
            key[9..17].copy_from_slice(&offset.to_be_bytes());
            if key.as_slice() < start {
                continue;
            }
            if key.as_slice() >= end {
                return Ok(());
            }
            if !visit(&key, value) {
                return Ok(());
            }
        }
    }
    Ok(())
}
