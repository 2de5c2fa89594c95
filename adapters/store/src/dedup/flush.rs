//! The index's files over time: the manifest (decoding and writing it), flushing the memtable
//! to a new run, and merging runs.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::merge::Losers;
use super::{
    DedupError, DedupIndex, Ent, FANOUT, MANIFEST, MANIFEST_MAGIC, MANIFEST_MAGIC_1, Manifest,
    MemTable, Run, RunCursor, io_err, owners, read, write,
};

/// A table handed over to be written out.
#[derive(Clone)]
struct Frozen {
    table: Arc<MemTable>,
    /// The id of the run it becomes.
    id: u64,
    /// The raft position its entries cover.
    raft: (u64, u64),
    /// The index's epoch when it was handed over.
    epoch: u64,
}

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

    fn owns(owners: &[super::Owner], dir: &std::path::Path, generation: u64) -> bool {
        owners.iter().any(|(p, g, _)| p == dir && *g == generation)
    }

    /// Whether this is still the opening of its directory that writes there.
    fn owned(&self) -> bool {
        Self::owns(&owners(), &self.dir, self.generation)
    }

    fn not_owned(&self) -> DedupError {
        DedupError::Damaged {
            path: self.dir.display().to_string(),
            detail: "opened again elsewhere in this process; this handle no longer writes"
                .to_owned(),
        }
    }

    /// Write the manifest for `runs` and `covered` (atomically: a temporary file renamed over).
    pub(super) fn write_manifest(
        &self,
        covered: (u64, u64),
        raft: (u64, u64),
        runs: &[Arc<Run>],
    ) -> Result<(), DedupError> {
        let owners = owners();
        if !Self::owns(&owners, &self.dir, self.generation) {
            return Err(self.not_owned());
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

    /// Write the table in memory out as a run, now; `covered` is where the segment log ends
    /// after the last message the table holds (its records must be durable first). Starts a
    /// merge in the background when runs of similar size pile up.
    pub(crate) fn flush(self: &Arc<Self>, covered: (u64, u64)) -> Result<(), DedupError> {
        self.flushing.wait(true);
        let frozen = self.freeze();
        let r = self.write_out(&frozen, covered);
        self.flushing.end();
        r
    }

    /// The same as [`Self::flush`], in a thread of its own: the table is handed over at once
    /// (lookups still search it), and the apply path goes on with an empty one. Waits for the
    /// previous table to be written out first, so at most two tables are ever in memory. A
    /// failure puts the entries back in memory (no lookup misses them); the next flush tries
    /// again.
    pub(crate) fn flush_behind(self: &Arc<Self>, covered: (u64, u64)) {
        self.flushing.wait(true);
        let frozen = self.freeze();
        let me = self.clone();
        let job = frozen.clone();
        let spawned = std::thread::Builder::new()
            .name("queen-dedup-flush".into())
            .spawn(move || me.write_out_logged(&job, covered));
        if spawned.is_err() {
            self.write_out_logged(&frozen, covered);
        }
    }

    /// [`Self::write_out`] for a flush nobody waits on: a failure is logged (the entries are
    /// back in memory by then), and the flush ends either way.
    fn write_out_logged(self: &Arc<Self>, f: &Frozen, covered: (u64, u64)) {
        if let Err(e) = self.write_out(f, covered) {
            tracing::warn!(target: "queen-store", error = %e, "writing out the dedup table failed; its entries stay in memory and are written out with the next");
        }
        self.flushing.end();
    }

    /// Hand the table in memory over to be written out: what it holds, the run id it gets,
    /// the raft position it covers and the index's epoch.
    fn freeze(&self) -> Frozen {
        let mut g = write(&self.inner);
        let table = Arc::new(std::mem::take(&mut g.mem));
        g.frozen = Some(table.clone());
        let id = g.next_id;
        g.next_id += 1;
        Frozen {
            table,
            id,
            raft: g.raft_seen,
            epoch: g.epoch,
        }
    }

    /// Write a table handed over as a run, then the manifest that names it, then swap it in
    /// for the table. Nothing of the apply path waits on the files: the index's lock is taken
    /// only to read the runs and to swap.
    fn write_out(self: &Arc<Self>, f: &Frozen, covered: (u64, u64)) -> Result<(), DedupError> {
        if !self.owned() {
            // Opened again in this process: the new opening may use this run's id.
            self.unfreeze(f);
            return Err(self.not_owned());
        }
        let run = if f.table.len == 0 {
            None
        } else {
            match Run::write(&self.dir, f.id, &mut f.table.sorted()) {
                Ok(run) => Some(Arc::new(run)),
                Err(e) => {
                    self.unfreeze(f);
                    return Err(e);
                }
            }
        };
        let _m = self
            .manifest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Runs change only under the manifest's lock, held from here to the swap.
        let mut runs = {
            let g = read(&self.inner);
            if g.epoch != f.epoch {
                // Cleared meanwhile: the table belongs to an index that is gone.
                if let Some(r) = run {
                    let _ = std::fs::remove_file(&r.path);
                }
                return Ok(());
            }
            g.runs.clone()
        };
        let added = run.is_some();
        runs.extend(run);
        if let Err(e) = self.write_manifest(covered, f.raft, &runs) {
            if added {
                let _ = std::fs::remove_file(self.dir.join(Run::name(f.id)));
            }
            self.unfreeze(f);
            return Err(e);
        }
        let start = {
            let mut g = write(&self.inner);
            g.runs = runs;
            g.frozen = None;
            g.covered = Some(covered);
            g.covered_raft = f.raft;
            let start = !g.merging && Self::pick(&g.runs, self.mem_cap).is_some();
            g.merging |= start;
            start
        };
        drop(_m);
        if start {
            self.start_merging();
        }
        Ok(())
    }

    /// A table could not be written out: its entries go back into the table in memory.
    fn unfreeze(&self, f: &Frozen) {
        let mut g = write(&self.inner);
        if g.epoch == f.epoch {
            g.mem.restore(f.table.sorted().collect());
            g.frozen = None;
        }
    }

    /// Merge tiers in a thread of its own until none is due (`merging` already set).
    fn start_merging(self: &Arc<Self>) {
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("queen-dedup-merge".into()).spawn(move || {
            // Nobody waits for a merge (lookups read the runs as they are): it should take the
            // CPU time the node leaves idle rather than time from the apply path, unless it has
            // fallen behind (see `behind`).
            loop {
                set_priority(!me.behind());
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

    /// Whether merges have fallen behind the flushes: the tier due holds twice [`FANOUT`] runs
    /// or more, which an idle-class merge thread on a node that never leaves a core idle lets
    /// happen. It then merges at an ordinary (if lower) priority until it has caught up, so the
    /// runs a lookup reads stay bounded.
    fn behind(&self) -> bool {
        let g = read(&self.inner);
        Self::behind_in(&g.runs, self.mem_cap)
    }

    pub(super) fn behind_in(runs: &[Arc<Run>], mem_cap: usize) -> bool {
        Self::pick(runs, mem_cap).is_some_and(|(from, to)| to - from >= 2 * FANOUT)
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
        // Runs change only under the manifest's lock: they stay as read here until the swap.
        let g = read(&self.inner);
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
        let (covered, covered_raft) = (g.covered, g.covered_raft);
        drop(g);
        if let Some(covered) = covered
            && let Err(e) = self.write_manifest(covered, covered_raft, &runs)
        {
            let _ = std::fs::remove_file(&merged_path);
            return Err(e);
        }
        write(&self.inner).runs = runs;
        for r in picked {
            let _ = std::fs::remove_file(&r.path);
        }
        Ok(true)
    }

    /// A k-way merge of `runs` into run `id`, without the entries of deleted messages.
    pub(super) fn merge(&self, runs: &[Arc<Run>], id: u64) -> Result<Run, DedupError> {
        let mut losers = Losers::new(runs.iter().map(|r| RunCursor::new(r)).collect());
        let mut live_pid: Option<(u64, Option<u64>)> = None;
        let mut last: Option<Ent> = None;
        let first_live = self.first_live.clone();
        let mut seen = 0u32;
        let mut kept = losers.by_ref().filter(|e| {
            // A long merge in the idle class looks now and then whether the flushes have
            // outrun it, and leaves the class if so.
            seen = seen.wrapping_add(1);
            if seen.is_multiple_of(1 << 16) && IDLE.get() && self.behind() {
                set_priority(false);
            }
            if last.replace(*e) == Some(*e) {
                return false;
            }
            let (pid, offset) = (e[0], e[3]);
            let first = match live_pid {
                Some((p, f)) if p == pid => f,
                _ => {
                    let f = first_live(pid);
                    live_pid = Some((pid, f));
                    f
                }
            };
            first.is_some_and(|f| offset >= f)
        });
        let run = Run::write(&self.dir, id, &mut kept)?;
        match losers.lists_mut().iter_mut().find_map(|c| c.error.take()) {
            Some(e) => {
                let _ = std::fs::remove_file(&run.path);
                Err(e)
            }
            None => Ok(run),
        }
    }
}

thread_local! {
    /// Whether this thread is in the idle class (set by [`set_priority`]).
    static IDLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Set the calling thread's priority: with `idle`, `SCHED_IDLE`, so that it runs when the
/// node's other threads leave a core idle and any of them that wakes takes the core back at
/// once (at nice 10 a woken runtime worker could wait behind the merge for the rest of its
/// slice, and every request in flight with it: during the merge of eight 1M-entry runs, batch
/// pushes ran 8% slower at nice 10, their p99 25% higher); else the ordinary policy at nice 10.
/// The idle class is used only where a thread may also leave it again (root, or `RLIMIT_NICE`
/// of 10 or more), since a merge that falls behind must be able to; elsewhere nice 10 always.
#[cfg(target_os = "linux")]
pub(super) fn set_priority(idle: bool) {
    let idle = idle && idle_class_allowed();
    if IDLE.get() == idle && idle {
        return;
    }
    let ok = class(idle) && nice_ten();
    IDLE.set(idle && ok);
    if !ok {
        tracing::debug!(target: "queen-store", error = %std::io::Error::last_os_error(), "could not lower the merge thread's priority");
    }
}

/// Move the calling thread into the idle class or back to the ordinary one.
#[cfg(target_os = "linux")]
fn class(idle: bool) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: gettid and sched_setscheduler take numbers and a pointer to a parameter that
    // lives across the call; the thread id is the calling thread's own.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::sched_setscheduler(libc::gettid(), policy, &param) };
    rc == 0
}

/// Nice 10 for the calling thread (ignored in the idle class, kept for leaving it).
#[cfg(target_os = "linux")]
fn nice_ten() -> bool {
    // SAFETY: gettid and setpriority take and return numbers only, for the calling thread.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
    rc == 0
}

/// Whether a thread of this process can enter the idle class and leave it again: tried once,
/// in a thread of its own.
#[cfg(target_os = "linux")]
pub(super) fn idle_class_allowed() -> bool {
    static ALLOWED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOWED.get_or_init(|| {
        std::thread::spawn(|| nice_ten() && class(true) && class(false))
            .join()
            .unwrap_or(false)
    })
}

#[cfg(not(target_os = "linux"))]
pub(super) fn set_priority(_idle: bool) {}
