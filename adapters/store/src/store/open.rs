//! Opening the store: the database, its format and slot, the segment log and the dedup index
//! (loaded or rebuilt), and the raft log files the segments point into.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use queen_domain::StoreError;
use queen_domain::keys::dedup_key;
use queen_domain::keys::table;
use queen_domain::model::MessageHead;

use super::{
    FORMAT, FORMAT_DEDUP_FILES, FORMAT_KEY, FjallStore, INSTALLING_KEY, SLOT_KEY, Slot, SlotName,
    StoreConfig, StoreOpenError,
};
use crate::dedup::{DedupIndex, FirstLive, Key};
use crate::filter::DedupFilter;
use crate::messages::{self, read_err};
use crate::segments::{LogLink, RAFT_BIT, SegmentError, Segments};

impl FjallStore {
    /// Open (or create) the store.
    ///
    /// # Errors
    /// When the engine cannot open its directory.
    pub fn open(cfg: &StoreConfig) -> Result<Self, StoreOpenError> {
        let err = |source| StoreOpenError::Engine {
            dir: cfg.dir.display().to_string(),
            source,
        };
        let db = Database::builder(&cfg.dir)
            .cache_size(cfg.cache_bytes)
            .max_journaling_size(cfg.journal_bytes)
            .worker_threads(cfg.workers.max(1))
            .open()
            .map_err(err)?;
        // Filters and indexes of every table below L0 in partitions: a point read then brings
        // one small partition into the block cache, not a table's whole filter. With fjall's
        // default (whole blocks up to L2), a drain of 300,000 one-message partitions evicted
        // the filters it needed from the 16 MiB cache on every read and spent 60% of the
        // node's CPU checksumming them again (1,980 msg/s, against 18,558 at 200,000).
        let partitioned = || fjall::config::PartitioningPolicy::new([false, true]);
        let open_state = |name: SlotName| {
            db.keyspace(name.keyspace(), || {
                KeyspaceCreateOptions::default()
                    .max_memtable_size(cfg.memtable_bytes)
                    .filter_block_partitioning_policy(partitioned())
                    .index_block_partitioning_policy(partitioned())
            })
        };
        let keyspaces = [
            open_state(SlotName::A).map_err(err)?,
            open_state(SlotName::B).map_err(err)?,
        ];
        let raft = db
            .keyspace("raft", KeyspaceCreateOptions::default)
            .map_err(err)?;
        let name = SlotName::from_stored(raft.get(SLOT_KEY).map_err(err)?.as_deref());
        let state = keyspaces[name as usize].clone();
        // The inactive slot holds nothing worth keeping: an interrupted install's partial state,
        // or the old state of a finished install that was not yet cleared.
        let interrupted = raft.get(INSTALLING_KEY).map_err(err)?.is_some();
        if interrupted {
            tracing::warn!(target: "queen-store", "a snapshot install was interrupted: discarding its partial state and keeping the state from before it");
        }
        let spare = &keyspaces[name.other() as usize];
        if interrupted || !spare.is_empty().map_err(err)? {
            spare.clear().map_err(err)?;
        }
        for spare_dir in [
            cfg.dir.join(name.other().segment_dir()),
            cfg.dir.join(name.other().dedup_dir()),
        ] {
            match std::fs::remove_dir_all(&spare_dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    let source = SegmentError::Io {
                        path: spare_dir.display().to_string(),
                        source: e,
                    };
                    return Err(StoreOpenError::Segments {
                        dir: spare_dir.display().to_string(),
                        source,
                    });
                }
                _ => {}
            }
        }
        if interrupted {
            raft.remove(INSTALLING_KEY).map_err(err)?;
            db.persist(PersistMode::SyncAll).map_err(err)?;
        }
        let format = match raft.get(FORMAT_KEY).map_err(err)? {
            Some(v) => u32::from_le_bytes(v.as_ref().try_into().unwrap_or([0xFF; 4])),
            None if state.is_empty().map_err(err)? => FORMAT,
            None => 1,
        };
        if format > FORMAT {
            return Err(StoreOpenError::Format {
                dir: cfg.dir.display().to_string(),
                detail: format!(
                    "has layout version {format}, written by a newer build of queen (this one reads up to {FORMAT}): run that build, or move the directory away to start this node empty"
                ),
            });
        }
        let end = state
            .get(messages::END_KEY)
            .map_err(err)?
            .and_then(|v| messages::decode_end(&v));
        let seg_dir = cfg.dir.join(name.segment_dir());
        let live = |file: u64| state.get(messages::file_key(file)).ok().flatten().is_some();
        let mut segments =
            Segments::open(&seg_dir, cfg.segment_bytes, end, &live).map_err(|source| {
                StoreOpenError::Segments {
                    dir: seg_dir.display().to_string(),
                    source,
                }
            })?;
        let log = Arc::new(LogLink::default());
        segments.set_log(log.clone());
        let format_err = |detail: String| StoreOpenError::Format {
            dir: cfg.dir.display().to_string(),
            detail,
        };
        if format < FORMAT_DEDUP_FILES {
            // A dedup index left by an interrupted migration may not match what it migrates.
            let _ = std::fs::remove_dir_all(cfg.dir.join(name.dedup_dir()));
        }
        let dedup = open_dedup(&cfg.dir, name, &state, cfg.dedup_mem_entries)
            .map_err(|e| format_err(format!("could not open its dedup index: {e}")))?;
        let active = Arc::new(RwLock::new(Slot {
            name,
            state,
            segments: Arc::new(segments),
            dedup_filter: Arc::new(DedupFilter::new()),
            dedup,
            hot: Arc::default(),
        }));
        let store = Self {
            db,
            raft,
            active,
            keyspaces,
            dir: cfg.dir.clone(),
            segment_bytes: cfg.segment_bytes,
            dedup_mem_entries: cfg.dedup_mem_entries,
            rows_written: Arc::new(AtomicU64::new(0)),
            queue_epoch: Arc::new(AtomicU64::new(0)),
            log,
            observer: Arc::default(),
        };
        if format < FORMAT_DEDUP_FILES {
            store.migrate(&store.slot()).map_err(|e| StoreOpenError::Format {
                dir: cfg.dir.display().to_string(),
                detail: format!("has layout version {format} and could not be migrated to {FORMAT}: {e}; the migration resumes at the next start, or move the directory away to start this node empty"),
            })?;
        }
        store
            .raft
            .insert(FORMAT_KEY, FORMAT.to_le_bytes())
            .map_err(err)?;
        Self::load_dedup(&store.slot())
            .map_err(|e| format_err(format!("could not rebuild its dedup index: {e}")))?;
        Ok(store)
    }

    /// Bring the dedup index of `slot` up to the end of its segment log (the records after what
    /// its runs cover: about one in-memory table's worth after a restart, all of them after a
    /// migration or a snapshot install), then fill the bloom filter from it.
    pub(crate) fn load_dedup(slot: &Slot) -> Result<(), StoreError> {
        let mut failed: Option<StoreError> = None;
        slot.segments
            .scan_records(slot.dedup.covered(), &mut |rec, after| {
                match dedup_entries(rec, 0) {
                    Ok(entries) => slot.dedup.insert_all(entries),
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
                if slot.dedup.full()
                    && let Err(e) = slot.dedup.flush(after)
                {
                    failed.get_or_insert(StoreError::Read(e.to_string()));
                }
            })
            .map_err(|e| StoreError::Read(e.to_string()))?;
        if let Some(e) = failed {
            return Err(e);
        }
        slot.dedup_filter.clear();
        slot.dedup
            .for_each(&mut |k| slot.dedup_filter.insert_key(k))
            .map_err(|e| StoreError::Read(e.to_string()))
    }

    /// Tell the raft log which of its files records of the active slot point into (a file
    /// that none does may go), then bring the dedup index up to date with those records: the
    /// ones after what its runs cover (every one of them after a snapshot install).
    pub(crate) fn hold_raft_files(
        &self,
        log: &Arc<dyn queen_ports::LogFiles>,
    ) -> Result<(), StoreError> {
        let slot = self.slot();
        let lo = messages::file_key(RAFT_BIT);
        let hi = [table::SEGMENT_FILE + 1];
        let mut files = Vec::new();
        for g in slot.state.range(lo.as_slice()..hi.as_slice()) {
            let (k, _) = g.into_inner().map_err(read_err)?;
            if let Some(file) = queen_domain::keys::u64_at(&k, 1) {
                files.push(file & !RAFT_BIT);
            }
        }
        log.set_holds(&files)
            .map_err(|e| StoreError::Read(e.to_string()))?;

        // Records kept in the raft log after what the dedup runs cover, in log order, and the
        // last record kept there.
        let covered = slot.dedup.covered_raft();
        let mut replay: Vec<(u64, u64, u64, u64, messages::IndexVal)> = Vec::new();
        let mut last: Option<(u64, u64, u64, u64, messages::IndexVal)> = None;
        for g in slot
            .state
            .range([table::SEGMENT_INDEX].as_slice()..[table::SEGMENT_INDEX + 1].as_slice())
        {
            let (k, v) = g.into_inner().map_err(read_err)?;
            // A row of 28 bytes is a record of the segment log; any other decodes as one kept
            // in the raft log, or is an error.
            let Some((pid, base)) = messages::index_key_parts(&k).filter(|_| v.len() != 28) else {
                continue;
            };
            let val = messages::IndexVal::decode(&k, &v)?;
            let at = (val.loc.file & !RAFT_BIT, val.loc.pos);
            if last.is_none_or(|l| (l.0, l.1) < at) {
                last = Some((at.0, at.1, pid, base, val));
            }
            if at > covered {
                replay.push((at.0, at.1, pid, base, val));
            }
        }
        // The log is append-only: when its last record the state indexes is whole, so is every
        // earlier one. One that is gone or damaged means the log lost entries this state applied
        // (a machine that lost power before this node's own fsync of them): refuse to serve.
        if let Some((file, pos, pid, base, val)) = last {
            val.read(&slot.segments, pid, base).map_err(|e| {
                StoreError::Read(format!(
                    "the raft log lost entries this state applied (the last kept record, at position {pos} of log file {file}: {e}); move the data directory away and start the node empty, so that it receives a snapshot"
                ))
            })?;
        }
        replay.sort_unstable_by_key(|r| (r.0, r.1, r.2, r.3));
        for (file, pos, pid, base, val) in replay {
            let rec = val
                .read(&slot.segments, pid, base)
                .map_err(|e| StoreError::Read(e.to_string()))?;
            let entries = dedup_entries(&rec, val.skip as usize)?;
            for (key, _) in &entries {
                slot.dedup_filter.insert_key(key);
            }
            slot.dedup.insert_all(entries);
            slot.dedup.note_raft((file, pos));
            if slot.dedup.full() {
                slot.dedup
                    .flush(slot.segments.end())
                    .map_err(|e| StoreError::Read(e.to_string()))?;
            }
        }
        Ok(())
    }
}

/// The dedup entries of a record's messages from its `skip`th on: the key of each message's
/// transactionId and its offset.
pub(super) fn dedup_entries(
    rec: &crate::segments::Record,
    skip: usize,
) -> Result<Vec<(Key, u64)>, StoreError> {
    rec.values()
        .skip(skip)
        .map(|(offset, v)| {
            let h = queen_domain::codec::decode_head::<MessageHead>(&[], v)?;
            Ok((dedup_key(rec.pid, &h.transaction_id), offset))
        })
        .collect()
}

/// Open the dedup index of slot `name`; one that cannot be read is rebuilt from the segment
/// log (it is derived data), with a warning.
pub(crate) fn open_dedup(
    dir: &Path,
    name: SlotName,
    state: &Keyspace,
    mem_cap: usize,
) -> Result<Arc<DedupIndex>, crate::dedup::DedupError> {
    let path = dir.join(name.dedup_dir());
    let ks = state.clone();
    // On a read error a merge keeps the entries: a dead entry only costs a needless check.
    let first_live: FirstLive =
        Arc::new(move |pid| messages::first_live(&ks, pid).unwrap_or(Some(0)));
    match DedupIndex::open(&path, mem_cap, first_live.clone()) {
        Ok(i) => Ok(Arc::new(i)),
        Err(e) => {
            tracing::warn!(target: "queen-store", error = %e, "the dedup index cannot be read; rebuilding it from the message segments");
            let _ = std::fs::remove_dir_all(&path);
            DedupIndex::open(&path, mem_cap, first_live).map(Arc::new)
        }
    }
}
