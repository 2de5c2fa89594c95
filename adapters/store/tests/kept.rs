//! Messages kept in the raft log's files: a store attached to a log indexes a push entry's
//! messages where the log wrote the entry instead of writing them again. Against a log twin in
//! memory: reads, retention, restarts (dedup replay), snapshots and holds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use queen_domain::command::{Command, Entry, PushItem, PushStatus};
use queen_domain::invariants;
use queen_domain::names::{PartitionName, QueueName};
use queen_ports::{ApplyEntry, BackendError, LogFiles, LogSpan, StateMachineBackend};
use queen_store::{FjallStore, StoreConfig};

mod common;
use common::{push_ids, reference, retained_queue_r, same, statuses, xorshift};

const SECOND: u64 = 1_000_000;

/// The raft log's files as the store sees them: commands appended to files that roll every
/// `roll` bytes, holds, and a purge that deletes the unheld files before a given one.
#[derive(Default)]
struct TwinLog {
    inner: Mutex<Twin>,
}

#[derive(Default)]
struct Twin {
    files: BTreeMap<u64, Vec<u8>>,
    holds: BTreeSet<u64>,
}

impl TwinLog {
    const ROLL: usize = 16 << 10;

    /// Write a command (after a few bytes of frame, as the real log does) and say where.
    fn append(&self, command: &[u8]) -> LogSpan {
        let mut t = self.inner.lock().unwrap();
        let last = t.files.keys().next_back().copied().unwrap_or(1);
        let file = if t.files.get(&last).is_some_and(|f| f.len() >= Self::ROLL) {
            last + 1
        } else {
            last
        };
        let f = t.files.entry(file).or_default();
        f.extend_from_slice(b"frame");
        let pos = f.len() as u64;
        f.extend_from_slice(command);
        LogSpan {
            file,
            pos,
            len: command.len() as u32,
        }
    }

    /// Delete every unheld file before `file`, as a purge does.
    fn purge_before(&self, file: u64) {
        let mut t = self.inner.lock().unwrap();
        let holds = t.holds.clone();
        t.files.retain(|f, _| *f >= file || holds.contains(f));
    }

    /// Lose the last `bytes` of the newest file.
    fn cut_tail(&self, bytes: usize) {
        let mut t = self.inner.lock().unwrap();
        if let Some((_, f)) = t.files.iter_mut().next_back() {
            f.truncate(f.len().saturating_sub(bytes));
        }
    }

    fn holds(&self) -> BTreeSet<u64> {
        self.inner.lock().unwrap().holds.clone()
    }

    fn last_file(&self) -> u64 {
        self.inner
            .lock()
            .unwrap()
            .files
            .keys()
            .next_back()
            .copied()
            .unwrap_or(1)
    }
}

impl LogFiles for TwinLog {
    fn read(&self, span: LogSpan) -> Result<Vec<u8>, BackendError> {
        let t = self.inner.lock().unwrap();
        let f = t
            .files
            .get(&span.file)
            .ok_or_else(|| BackendError::Storage(format!("file {} is gone", span.file)))?;
        let at = span.pos as usize;
        f.get(at..at + span.len as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| BackendError::Storage("short read".to_owned()))
    }

    fn hold(&self, file: u64) {
        self.inner.lock().unwrap().holds.insert(file);
    }

    fn release(&self, file: u64) -> Result<(), BackendError> {
        self.inner.lock().unwrap().holds.remove(&file);
        Ok(())
    }

    fn set_holds(&self, files: &[u64]) -> Result<(), BackendError> {
        self.inner.lock().unwrap().holds = files.iter().copied().collect();
        Ok(())
    }
}

fn config(dir: &Path) -> StoreConfig {
    let mut cfg = StoreConfig::new(dir.to_path_buf());
    cfg.segment_bytes = 32 << 10;
    cfg.dedup_mem_entries = 97;
    cfg
}

fn open(dir: &Path, log: &Arc<TwinLog>) -> FjallStore {
    let store = FjallStore::open(&config(dir)).unwrap();
    store.attach_log(log.clone()).unwrap();
    store
}

/// Pushes to a queue with one-second retention and to one without, several partitions, some
/// items of one entry interleaved across partitions and some resent (duplicates inside an
/// entry), with ticks that run retention.
fn entries(seed: u64, n: u64) -> Vec<Vec<u8>> {
    let mut rnd = xorshift(seed);
    let q = |s: &str| QueueName::new(s).unwrap();
    let mut out = vec![retained_queue_r(SECOND)];
    for i in 0..n {
        let command = if i % 10 == 9 {
            Command::Tick
        } else {
            let queue = if rnd(3) == 0 { "k" } else { "r" };
            let spread = rnd(4) == 0;
            let fixed = rnd(6);
            // Most entries have no resends; some resend their first items at their end.
            let distinct = 1 + rnd(40) + if rnd(5) == 0 { 0 } else { 1000 };
            Command::Push(
                (0..1 + rnd(40))
                    .map(|j| PushItem {
                        queue: q(queue),
                        partition: PartitionName::new(format!(
                            "p{}",
                            if spread { rnd(3) } else { fixed }
                        ))
                        .unwrap(),
                        transaction_id: queen_domain::ids::TransactionId::new(format!(
                            "t{i}-{}",
                            j % distinct
                        ))
                        .unwrap(),
                        message_id: [(i % 251) as u8; 16],
                        payload: vec![b'a' + (rnd(26) as u8); 10 + rnd(700) as usize],
                        trace_id: (rnd(5) == 0).then(|| format!("trace-{i}")),
                    })
                    .collect(),
            )
        };
        out.push(
            Entry {
                proposed_at: SECOND + i * (SECOND / 20),
                command,
            }
            .encode(),
        );
    }
    out
}

/// Apply `entries` from log index `first` in batches of `batch`, each command written to
/// `log` first (with `None`, as a store without a log).
fn apply_in(
    store: &FjallStore,
    log: Option<&TwinLog>,
    entries: &[Vec<u8>],
    first: u64,
    batch: usize,
) -> Vec<Vec<u8>> {
    let mut responses = Vec::new();
    for (c, chunk) in entries.chunks(batch).enumerate() {
        let batch: Vec<ApplyEntry> = chunk
            .iter()
            .enumerate()
            .map(|(i, e)| ApplyEntry {
                index: first + (c * batch + i) as u64,
                command: Some(e.clone().into()),
                answered: true,
                span: log.map(|l| l.append(e)),
            })
            .collect();
        responses.extend(
            store
                .apply(batch, b"meta".to_vec())
                .unwrap()
                .into_iter()
                .map(queen_ports::Answer::into_bytes),
        );
    }
    responses
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().metadata().unwrap().len()).sum::<u64>())
        .unwrap_or(0)
}

/// A store attached to a log holds the same state as one without (and as the domain on a map),
/// writes far fewer segment bytes, and keeps it across a restart and through a snapshot that a
/// store without the sender's log installs.
#[test]
fn kept_messages_read_as_written_after_restarts_and_through_a_snapshot() {
    let list = entries(5, 500);
    let expected = reference(&list);
    let (plain_dir, kept_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let plain = FjallStore::open(&config(plain_dir.path())).unwrap();
    apply_in(&plain, None, &list, 1, 7);
    let log = Arc::new(TwinLog::default());
    let kept = open(kept_dir.path(), &log);
    apply_in(&kept, Some(&log), &list, 1, 7);
    assert!(same(&plain, &expected), "the store without a log");
    assert!(same(&kept, &expected), "the store with a log");
    invariants::check(&kept).unwrap();
    let (plain_bytes, kept_bytes) = (
        dir_bytes(&plain_dir.path().join("segments")),
        dir_bytes(&kept_dir.path().join("segments")),
    );
    assert!(
        kept_bytes * 2 < plain_bytes,
        "kept messages are not written again: {kept_bytes} against {plain_bytes} segment bytes"
    );
    assert!(!log.holds().is_empty(), "the store holds log files");

    drop(kept);
    let kept = open(kept_dir.path(), &log);
    assert!(same(&kept, &expected), "after a restart");

    // A snapshot carries the kept messages as segment records.
    let mut snap = kept.snapshot().unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = snap.next_chunk().unwrap() {
        chunks.push(c);
    }
    let other_dir = tempfile::tempdir().unwrap();
    let other_log = Arc::new(TwinLog::default());
    let other = open(other_dir.path(), &other_log);
    other
        .install_snapshot(&mut chunks.into_iter().map(Ok), snap.meta())
        .unwrap();
    drop(snap);
    assert!(same(&other, &expected), "the installed snapshot");
    invariants::check(&other).unwrap();
    assert!(
        other_log.holds().is_empty(),
        "the installed state holds nothing"
    );
    // It goes on from there, keeping what it applies next in its own log.
    let more = entries(6, 60);
    let mut all = list.clone();
    all.extend(more.iter().cloned());
    apply_in(&other, Some(&other_log), &more, list.len() as u64 + 1, 5);
    apply_in(&kept, Some(&log), &more, list.len() as u64 + 1, 5);
    let expected = reference(&all);
    assert!(
        same(&other, &expected),
        "the installed store after more entries"
    );
    assert!(same(&kept, &expected), "the sender after more entries");
}

/// Entries of ten pushes each, one partition per entry (so each entry's messages are kept).
fn pushes(ids: &[String]) -> Vec<Vec<u8>> {
    ids.chunks(10)
        .enumerate()
        .map(|(e, chunk)| {
            Entry {
                proposed_at: SECOND,
                command: push_ids(&format!("p{}", e % 3), chunk),
            }
            .encode()
        })
        .collect()
}

/// After a restart (the table in memory lost) and with the dedup index's files gone (rebuilt),
/// a resend of kept messages is a duplicate with the original's offset: the index replays the
/// records kept in the log as it replays the segment log.
#[test]
fn duplicates_of_kept_messages_are_found_after_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(TwinLog::default());
    let ids: Vec<String> = (0..1_500)
        .map(|i| format!("txn-{i}-{}", "x".repeat(i % 5)))
        .collect();
    let first = {
        let store = open(dir.path(), &log);
        let r = statuses(&apply_in(&store, Some(&log), &pushes(&ids), 1, 13));
        let (_, _, in_memory) = store.dedup_stats();
        assert!(in_memory > 0, "a restart loses the table in memory");
        assert_eq!(
            store.segment_stats().1,
            16,
            "every message is kept in the log: the segment log is its header"
        );
        r
    };
    assert!(first.iter().all(|(s, _)| *s == PushStatus::Queued));
    let mut index = 1_000;
    for round in 0..2 {
        if round == 1 {
            std::fs::remove_dir_all(dir.path().join("dedup")).unwrap();
        }
        let store = open(dir.path(), &log);
        let again = statuses(&apply_in(&store, Some(&log), &pushes(&ids), index, 13));
        index += 1_000;
        let want: Vec<(PushStatus, u64)> = first
            .iter()
            .map(|(_, o)| (PushStatus::Duplicate, *o))
            .collect();
        let wrong = again.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert!(
            again.len() == want.len() && wrong == 0,
            "round {round}: {wrong} of {} resends not answered as duplicates of the original",
            want.len()
        );
        invariants::check(&store).unwrap();
    }
}

/// Retention releases the log files whose messages all aged out, and a purge may then delete
/// them; what the store still reads stays held.
#[test]
fn retention_releases_log_files() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(TwinLog::default());
    let store = open(dir.path(), &log);
    let mut list = entries(9, 400);
    apply_in(&store, Some(&log), &list, 1, 9);
    let held_before = log.holds();
    assert!(held_before.len() > 2, "{held_before:?}");
    let last = SECOND + 400 * (SECOND / 20);
    let ticks: Vec<Vec<u8>> = (0..60)
        .map(|t| {
            Entry {
                proposed_at: last + 5 * SECOND + t,
                command: Command::Tick,
            }
            .encode()
        })
        .collect();
    apply_in(&store, Some(&log), &ticks, 401, 3);
    list.extend(ticks);
    let held_after = log.holds();
    assert!(
        held_after.len() < held_before.len(),
        "retention released files: {held_before:?} then {held_after:?}"
    );
    log.purge_before(log.last_file());
    assert!(
        same(&store, &reference(&list)),
        "nothing still read was purged"
    );
    invariants::check(&store).unwrap();
}

/// A log that lost the tail this state indexes (a power loss before the node's own fsync of
/// entries it applied) is found at start: attaching it fails with what to do.
#[test]
fn a_log_that_lost_indexed_entries_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(TwinLog::default());
    let store = open(dir.path(), &log);
    let ids: Vec<String> = (0..300).map(|i| format!("t{i}")).collect();
    apply_in(&store, Some(&log), &pushes(&ids), 1, 4);
    drop(store);
    log.cut_tail(100);
    let store = FjallStore::open(&config(dir.path())).unwrap();
    let e = store.attach_log(log.clone()).expect_err("refused");
    let line = e.to_string();
    assert!(
        line.contains("lost entries") && line.contains("start the node empty"),
        "{line}"
    );
}

/// The store's queue-options epoch rises after an apply that creates, configures or deletes a
/// queue (so a reader drops what it kept of queues' options), and not after pushes to a queue
/// that exists.
#[test]
fn the_queue_options_epoch_rises_with_queue_changes_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = FjallStore::open(&config(dir.path())).unwrap();
    let epoch = || queen_ports::StateReader::queue_options_epoch(&store).unwrap();
    let entry = |command: Command| {
        Entry {
            proposed_at: SECOND,
            command,
        }
        .encode()
    };
    let ids = |n: usize| -> Vec<String> { (0..n).map(|i| format!("x{i}")).collect() };
    let e0 = epoch();
    // The first push creates queue "d".
    apply_in(&store, None, &[entry(push_ids("p", &ids(2)))], 1, 1);
    let e1 = epoch();
    assert!(e1 > e0, "creating a queue by its first push");
    apply_in(&store, None, &[entry(push_ids("q", &ids(3)))], 2, 1);
    assert_eq!(epoch(), e1, "a push to a queue that exists");
    apply_in(&store, None, &[retained_queue_r(SECOND)], 3, 1);
    let e2 = epoch();
    assert!(e2 > e1, "configuring a queue");
    apply_in(&store, None, &[entry(Command::Tick)], 4, 1);
    assert_eq!(epoch(), e2, "a tick");
    apply_in(
        &store,
        None,
        &[entry(Command::DeleteQueue {
            queue: QueueName::new("d").unwrap(),
        })],
        5,
        1,
    );
    assert!(epoch() > e2, "deleting a queue");
}
