//! The message segment log against the domain: the same entries give the same files whatever
//! the apply batches, retention drops whole files, and a store of layout 1 is migrated.

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;
use queen_domain::command::{Command, Entry, PushItem, PushStatus};
use queen_domain::keys;
use queen_domain::model::{DedupRec, MessageRec};
use queen_domain::names::{PartitionName, QueueName};
use queen_domain::{StateRead, invariants, reads};
use queen_ports::{ApplyEntry, StateMachineBackend};
use queen_store::{FjallStore, StoreConfig};

mod common;
use common::{reference, retained_queue_r, same, statuses, xorshift};

const SECOND: u64 = 1_000_000;

/// A deterministic mix of pushes to a queue with one-second retention and to one without,
/// ticks that run retention, and a queue deletion.
fn entries(seed: u64, n: u64) -> Vec<Vec<u8>> {
    let mut rnd = xorshift(seed);
    let q = |s: &str| QueueName::new(s).unwrap();
    let mut out = vec![retained_queue_r(SECOND)];
    for i in 0..n {
        let at = SECOND + i * (SECOND / 20);
        let command = match i % 10 {
            9 => Command::Tick,
            _ if i == n / 2 => Command::DeleteQueue { queue: q("k") },
            _ => {
                let queue = if rnd(3) == 0 { "k" } else { "r" };
                Command::Push(
                    (0..1 + rnd(5))
                        .map(|j| PushItem {
                            queue: q(queue),
                            partition: PartitionName::new(format!("p{}", rnd(6))).unwrap(),
                            transaction_id: queen_domain::ids::TransactionId::new(format!(
                                "t{i}-{j}-{}",
                                rnd(3)
                            ))
                            .unwrap(),
                            message_id: [(i % 251) as u8; 16],
                            payload: vec![b'a' + (rnd(26) as u8); 10 + rnd(1500) as usize],
                            trace_id: None,
                        })
                        .collect(),
                )
            }
        };
        out.push(
            Entry {
                proposed_at: at,
                command,
            }
            .encode(),
        );
    }
    out
}

fn config(dir: &Path) -> StoreConfig {
    let mut cfg = StoreConfig::new(dir.to_path_buf());
    cfg.segment_bytes = 32 << 10;
    // Small dedup tables, so the runs, their merges and the replay after a reopen all happen.
    cfg.dedup_mem_entries = 97;
    cfg
}

/// Apply `entries` in batches of the given sizes (cycled).
fn apply_in(store: &FjallStore, entries: &[Vec<u8>], sizes: &[usize]) {
    let mut i = 0;
    let mut s = 0;
    while i < entries.len() {
        let n = sizes[s % sizes.len()].max(1).min(entries.len() - i);
        let batch = (i..i + n)
            .map(|k| ApplyEntry {
                index: k as u64 + 1,
                command: Some(entries[k].clone().into()),
                answered: true,
                span: None,
            })
            .collect();
        store
            .apply(batch, format!("m{}", i + n).into_bytes())
            .unwrap();
        i += n;
        s += 1;
    }
}

fn segment_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Invariant: two replicas applying the same entries in different batches hold the same
    /// segment files byte for byte, and the same state as the domain on a map.
    #[test]
    fn the_same_entries_give_the_same_segment_bytes(seed in 1u64..u64::MAX, sizes in proptest::collection::vec(1usize..60, 1..6)) {
        let list = entries(seed, 400);
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = FjallStore::open(&config(a_dir.path())).unwrap();
        let b = FjallStore::open(&config(b_dir.path())).unwrap();
        apply_in(&a, &list, &[1]);
        apply_in(&b, &list, &sizes);
        let (fa, fb) = (segment_files(a_dir.path()), segment_files(b_dir.path()));
        prop_assert!(fa.len() > 1, "the log rolled");
        prop_assert_eq!(fa.keys().collect::<Vec<_>>(), fb.keys().collect::<Vec<_>>());
        prop_assert!(fa == fb, "segment bytes differ");
        let expected = reference(&list);
        prop_assert!(same(&a, &expected), "store a differs from the domain on a map");
        prop_assert!(same(&b, &expected), "store b differs from the domain on a map");
        invariants::check(&b).unwrap();
    }
}

/// Retention drops whole files: after the retained queue has aged out, the first files are
/// gone and what stays readable is exactly what the domain keeps.
#[test]
fn retention_across_segment_boundaries_deletes_whole_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = FjallStore::open(&config(dir.path())).unwrap();
    let mut list = entries(7, 600);
    // Ticks long after the last push: everything in the retained queue ages out.
    let last = SECOND + 600 * (SECOND / 20);
    for t in 0..40 {
        list.push(
            Entry {
                proposed_at: last + 5 * SECOND + t,
                command: Command::Tick,
            }
            .encode(),
        );
    }
    apply_in(&store, &list, &[7]);
    let files = segment_files(dir.path());
    assert!(
        !files.contains_key(&format!("{:020}.qseg", 1)),
        "the first file went with the messages in it: {:?}",
        files.keys().collect::<Vec<_>>()
    );
    assert_eq!(reads::queue(&store, "r").unwrap().unwrap().messages, 0);
    assert!(same(&store, &reference(&list)));
    invariants::check(&store).unwrap();
    drop(store);
    // Reopened, the same.
    let store = FjallStore::open(&config(dir.path())).unwrap();
    assert!(same(&store, &reference(&list)));
}

/// A data directory of layout 1 (messages and text-keyed dedup rows in the engine) is migrated
/// at the first start; afterwards it reads exactly as if written by this build.
#[test]
fn a_store_of_layout_1_is_migrated_at_open() {
    let list = entries(11, 300);
    let expected = reference(&list);
    let dir = tempfile::tempdir().unwrap();
    {
        // Write what a layout-1 node had: the same rows, with dedup by text and no format key.
        let db = fjall::Database::builder(dir.path()).open().unwrap();
        let state = db
            .keyspace("state", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        let raft = db
            .keyspace("raft", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        let mut n = 0;
        expected
            .scan(&[], &[0xFF], &mut |k, v| {
                if k[0] == keys::table::DEDUP_HASH {
                    return true;
                }
                if k[0] == keys::table::MESSAGE {
                    let m: MessageRec = queen_domain::codec::decode(k, v).unwrap();
                    let pid = keys::u64_at(k, 1).unwrap();
                    let offset = keys::offset_of_message_key(k).unwrap();
                    state
                        .insert(
                            keys::dedup_v1(pid, &m.transaction_id),
                            queen_domain::codec::encode(&DedupRec { offset, id: m.id }),
                        )
                        .unwrap();
                    n += 1;
                }
                state.insert(k, v).unwrap();
                true
            })
            .unwrap();
        assert!(n > 100);
        raft.insert(b"meta", b"old-meta").unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    let store = FjallStore::open(&config(dir.path())).unwrap();
    assert_eq!(
        store.load_meta().unwrap().as_deref(),
        Some(&b"old-meta"[..])
    );
    assert!(
        same(&store, &expected),
        "the migrated store reads as this build writes"
    );
    invariants::check(&store).unwrap();
    drop(store);
    let store = FjallStore::open(&config(dir.path())).unwrap();
    assert!(same(&store, &expected));
}

/// A store whose format key names a newer layout is refused with one line saying what to do.
#[test]
fn a_newer_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = fjall::Database::builder(dir.path()).open().unwrap();
        let raft = db
            .keyspace("raft", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        raft.insert(b"format", 9u32.to_le_bytes()).unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    let e = FjallStore::open(&config(dir.path()))
        .err()
        .expect("refused");
    let line = e.to_string();
    assert!(
        line.contains("layout version 9") && line.contains("newer build"),
        "{line}"
    );
}

/// Pushes of `ids` to queue `d` (no retention) as one entry each of ten items, from `index`.
fn pushes(ids: &[String], index: u64) -> Vec<ApplyEntry> {
    ids.chunks(10)
        .enumerate()
        .map(|(i, chunk)| ApplyEntry {
            index: index + i as u64,
            command: Some(
                Entry {
                    proposed_at: SECOND * (index + i as u64),
                    command: Command::Push(
                        chunk
                            .iter()
                            .map(|t| PushItem {
                                queue: QueueName::new("d").unwrap(),
                                partition: PartitionName::new(format!("p{}", t.len() % 3)).unwrap(),
                                transaction_id: queen_domain::ids::TransactionId::new(t.clone())
                                    .unwrap(),
                                message_id: [1; 16],
                                payload: b"{}".to_vec(),
                                trace_id: None,
                            })
                            .collect(),
                    ),
                }
                .encode()
                .into(),
            ),
            answered: true,
            span: None,
        })
        .collect()
}

/// The dedup index answers from memory, from its runs and after merges, and again after a
/// reopen that lost its table in memory (replayed from the segment log) or all of its files
/// (rebuilt): every resend is a duplicate with the original's offset, every new id is queued.
#[test]
fn duplicates_are_found_through_runs_merges_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..2_000)
        .map(|i| format!("txn-{i}-{}", "x".repeat(i % 7)))
        .collect();
    let first = {
        let store = FjallStore::open(&config(dir.path())).unwrap();
        let r = store.apply(pushes(&ids, 1), b"m".to_vec()).unwrap();
        let first = statuses(&r);
        assert!(first.iter().all(|(s, _)| *s == PushStatus::Queued));
        let again = statuses(
            &store
                .apply(pushes(&ids[..500], 1_000), b"m".to_vec())
                .unwrap(),
        );
        assert_eq!(
            again,
            first[..500]
                .iter()
                .map(|(_, o)| (PushStatus::Duplicate, *o))
                .collect::<Vec<_>>()
        );
        first
    };
    let dedup_dir = dir.path().join("dedup");
    // A full table is written out by a thread of its own, which may outlive the dropped store
    // on a loaded machine: wait for it (bounded) before counting its files.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let runs = loop {
        let runs = std::fs::read_dir(&dedup_dir).unwrap().count();
        let named = dedup_dir.join("MANIFEST").exists();
        if (named && runs >= 2) || std::time::Instant::now() > deadline {
            break runs;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(runs >= 2, "runs were written: {runs} files");
    for round in 0..2 {
        if round == 1 {
            // Derived data: without any of its files, the index is rebuilt from the segments.
            std::fs::remove_dir_all(&dedup_dir).unwrap();
        }
        let store = FjallStore::open(&config(dir.path())).unwrap();
        let again = statuses(
            &store
                .apply(pushes(&ids, 2_000 + round * 1_000), b"m".to_vec())
                .unwrap(),
        );
        assert_eq!(
            again,
            first
                .iter()
                .map(|(_, o)| (PushStatus::Duplicate, *o))
                .collect::<Vec<_>>(),
            "round {round}"
        );
        let fresh: Vec<String> = (0..30).map(|i| format!("new-{round}-{i}")).collect();
        let r = statuses(
            &store
                .apply(pushes(&fresh, 2_500 + round * 1_000), b"m".to_vec())
                .unwrap(),
        );
        assert!(
            r.iter().all(|(s, _)| *s == PushStatus::Queued),
            "round {round}: {r:?}"
        );
        invariants::check(&store).unwrap();
    }
}
