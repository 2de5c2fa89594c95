//! The index's files over time: the manifest (decoding and writing it), flushing the memtable
//! to a new run, and merging runs.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{
    DedupError, DedupIndex, Ent, FANOUT, Key, MANIFEST, MANIFEST_MAGIC, MANIFEST_MAGIC_1, Manifest,
    Run, RunCursor, ent, io_err, key_of, owners, write,
};

impl DedupIndex {
    /// (covered, covered in the raft log, run ids) of a manifest's bytes (version 1 has no raft
    /// position: its store kept nothing there).
    pub(super) fn decode_manifest(b: &[u8]) -> Option<Manifest> {
        let u64_at = |i: usize| {
            b.get(i..i + 8)
                .map(|s| u64::from_le_bytes(s.try_into().unwrap_or_default()))
        };
        let (raft, at) = match b.get(..8)? {
            m if m == MANIFEST_MAGIC => ((u64_at(8)?, u64_at(16)?), 24),
            m if m == MANIFEST_MAGIC_1 => ((0, 0), 8),
            _ => return None,
        };
        let covered = (u64_at(at)?, u64_at(at + 8)?);
        let n = u64_at(at + 16)? as usize;
        let ids_at = at + 24;
        let ids = (0..n)
            .map(|i| u64_at(ids_at + 8 * i))
            .collect::<Option<Vec<_>>>()?;
        let end = ids_at + 8 * n;
        let crc = u32::from_le_bytes(b.get(end..end + 4)?.try_into().ok()?);
        (crc32fast::hash(&b[..end]) == crc && b.len() == end + 4).then_some((
            Some(covered),
            raft,
            ids,
        ))
    }

    /// Write the manifest for `runs` and `covered` (atomically: a temporary file renamed over).
    pub(super) fn write_manifest(
        &self,
        covered: (u64, u64),
        raft: (u64, u64),
        runs: &[Arc<Run>],
    ) -> Result<(), DedupError> {
        let owners = owners();
        if !owners
            .iter()
            .any(|(p, g)| *p == self.dir && *g == self.generation)
        {
            return Err(DedupError::Damaged {
                path: self.dir.display().to_string(),
                detail: "opened again elsewhere in this process; this handle no longer writes"
                    .to_owned(),
            });
        }
        let mut b = Vec::with_capacity(52 + 8 * runs.len());
        b.extend_from_slice(MANIFEST_MAGIC);
        b.extend_from_slice(&raft.0.to_le_bytes());
        b.extend_from_slice(&raft.1.to_le_bytes());
        b.extend_from_slice(&covered.0.to_le_bytes());
        b.extend_from_slice(&covered.1.to_le_bytes());
        b.extend_from_slice(&(runs.len() as u64).to_le_bytes());
        for r in runs {
            b.extend_from_slice(&r.id.to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        let tmp = self.dir.join("MANIFEST.tmp");
        let f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all_at(&b, 0).map_err(io_err(&tmp))?;
        f.sync_data().map_err(io_err(&tmp))?;
        let path = self.dir.join(MANIFEST);
        std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))
    }

    /// Write the table in memory out as a run; `covered` is where the segment log ends after
    /// the last message the table holds (its records must be durable first). Starts a merge in
    /// the background when runs of similar size pile up.
    pub(crate) fn flush(self: &Arc<Self>, covered: (u64, u64)) -> Result<(), DedupError> {
        let _m = self
            .manifest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut g = write(&self.inner);
        let entries = g.mem.take_sorted();
        let id = g.next_id;
        let mut runs = g.runs.clone();
        // On a failure the entries stay in memory, so that no lookup misses them.
        if !entries.is_empty() {
            match Run::write(
                &self.dir,
                id,
                &mut entries.iter().map(|e| (key_of(e), e[3])),
            ) {
                Ok(run) => runs.push(Arc::new(run)),
                Err(e) => {
                    g.mem.restore(entries);
                    return Err(e);
                }
            }
        }
        let raft = g.raft_seen;
        if let Err(e) = self.write_manifest(covered, raft, &runs) {
            if runs.len() > g.runs.len() {
                let _ = std::fs::remove_file(self.dir.join(Run::name(id)));
            }
            g.mem.restore(entries);
            return Err(e);
        }
        g.next_id = id + 1;
        g.runs = runs;
        g.covered = Some(covered);
        g.covered_raft = raft;
        let start = !g.merging && Self::pick(&g.runs, self.mem_cap).is_some();
        if start {
            g.merging = true;
            drop(g);
            let me = self.clone();
            let spawned = std::thread::Builder::new().name("queen-dedup-merge".into()).spawn(move || {
                loop {
                    match me.merge_once() {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) => {
                            tracing::warn!(target: "queen-store", error = %e, "merging dedup runs failed; they stay as they are and are merged later");
                            break;
                        }
                    }
                }
                write(&me.inner).merging = false;
            });
            if spawned.is_err() {
                write(&self.inner).merging = false;
            }
        }
        Ok(())
    }

    /// The runs to merge next: the newest `FANOUT` or more runs whose sizes are within 4x of
    /// the smallest of them, as positions `[from, to)` of the run list.
    pub(super) fn pick(runs: &[Arc<Run>], mem_cap: usize) -> Option<(usize, usize)> {
        if runs.len() < FANOUT {
            return None;
        }
        // Walk from the newest while sizes stay within a tier.
        let to = runs.len();
        let mut from = to;
        let smallest = runs[to - 1].entries.max(1);
        while from > 0
            && runs[from - 1].entries <= smallest.saturating_mul(4).max(mem_cap as u64 * 2)
        {
            from -= 1;
        }
        (to - from >= FANOUT).then_some((from, to))
    }

    /// Merge one tier; true when another may be due.
    pub(super) fn merge_once(&self) -> Result<bool, DedupError> {
        let (from, to, picked, id) = {
            let mut g = write(&self.inner);
            let Some((from, to)) = Self::pick(&g.runs, self.mem_cap) else {
                return Ok(false);
            };
            let id = g.next_id;
            g.next_id += 1;
            (from, to, g.runs[from..to].to_vec(), id)
        };
        let merged = self.merge(&picked, id)?;
        let _m = self
            .manifest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut g = write(&self.inner);
        // Flushes only append runs, so the picked ones are still at [from, to).
        let still = g
            .runs
            .get(from..to)
            .is_some_and(|now| now.iter().zip(&picked).all(|(a, b)| a.id == b.id));
        if !still {
            let _ = std::fs::remove_file(&merged.path);
            return Ok(false);
        }
        let merged_path = merged.path.clone();
        let mut runs = g.runs[..from].to_vec();
        if merged.entries > 0 {
            runs.push(Arc::new(merged));
        } else {
            let _ = std::fs::remove_file(&merged.path);
        }
        runs.extend_from_slice(&g.runs[to..]);
        if let Some(covered) = g.covered
            && let Err(e) = self.write_manifest(covered, g.covered_raft, &runs)
        {
            let _ = std::fs::remove_file(&merged_path);
            return Err(e);
        }
        g.runs = runs;
        drop(g);
        for r in picked {
            let _ = std::fs::remove_file(&r.path);
        }
        Ok(true)
    }

    /// A k-way merge of `runs` into run `id`, without the entries of deleted messages.
    ///
    /// The cursors' next entries sit in a heap as [`Ent`]s (the key read as integers, in the
    /// bytes' order), so each entry costs a few integer comparisons instead of a byte
    /// comparison against every run.
    pub(super) fn merge(&self, runs: &[Arc<Run>], id: u64) -> Result<Run, DedupError> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut cursors: Vec<RunCursor<'_>> = runs.iter().map(|r| RunCursor::new(r)).collect();
        let mut error = None;
        let mut heap: BinaryHeap<Reverse<(Ent, usize)>> = BinaryHeap::with_capacity(cursors.len());
        let ordered = |(k, offset): (Key, u64), i: usize| Reverse((ent(&k, offset), i));
        for (i, c) in cursors.iter_mut().enumerate() {
            match c.peek() {
                Ok(Some(e)) => heap.push(ordered(e, i)),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }
        let mut live_pid: Option<(u64, Option<u64>)> = None;
        let mut last: Option<Ent> = None;
        let first_live = self.first_live.clone();
        let mut next = || -> Option<(Key, u64)> {
            loop {
                let Reverse((e, i)) = heap.pop()?;
                cursors[i].advance();
                match cursors[i].peek() {
                    Ok(Some(e)) => heap.push(ordered(e, i)),
                    Ok(None) => {}
                    Err(e) => {
                        error = Some(e);
                        return None;
                    }
                }
                if last == Some(e) {
                    continue;
                }
                last = Some(e);
                let (pid, offset) = (e[0], e[3]);
                let first = match live_pid {
                    Some((p, f)) if p == pid => f,
                    _ => {
                        let f = first_live(pid);
                        live_pid = Some((pid, f));
                        f
                    }
                };
                if first.is_some_and(|f| offset >= f) {
                    return Some((key_of(&e), offset));
                }
            }
        };
        let run = Run::write(&self.dir, id, &mut std::iter::from_fn(&mut next))?;
        match error {
            Some(e) => {
                let _ = std::fs::remove_file(&run.path);
                Err(e)
            }
            None => Ok(run),
        }
    }
}
