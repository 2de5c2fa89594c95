//! The fjall backend against the domain: apply, reopen, snapshot and install.

use queen_domain::command::{Command, Entry, PushItem};
use queen_domain::names::{PartitionName, QueueName};
use queen_domain::{MemStore, invariants, reads};
use queen_ports::{ApplyEntry, StateMachineBackend};
use queen_store::{FjallStore, StoreConfig};

mod common;
use common::{dump, same};

fn push_entry(i: u64) -> Vec<u8> {
    Entry {
        proposed_at: 1_000_000 + i,
        command: Command::Push(vec![PushItem {
            queue: QueueName::new("q").unwrap(),
            partition: PartitionName::new(format!("p{}", i % 4)).unwrap(),
            transaction_id: queen_domain::ids::TransactionId::new(format!("t{i}")).unwrap(),
            message_id: [1; 16],
            payload: vec![b'x'; 300],
            trace_id: None,
        }]),
    }
    .encode()
}

#[test]
fn applied_batches_survive_reopen_with_their_meta() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig::new(dir.path().to_path_buf());
    {
        let s = FjallStore::open(&cfg).unwrap();
        for b in 0..10u64 {
            let entries = (0..50)
                .map(|i| ApplyEntry {
                    index: b * 50 + i + 1,
                    command: Some(push_entry(b * 50 + i).into()),
                    answered: true,
                    span: None,
                })
                .collect();
            let r = s.apply(entries, format!("meta-{b}").into_bytes()).unwrap();
            assert_eq!(r.len(), 50);
        }
        // A blank entry gives an empty response and still stores the meta.
        let r = s
            .apply(
                vec![ApplyEntry {
                    index: 501,
                    command: None,
                    answered: true,
                    span: None,
                }],
                b"meta-last".to_vec(),
            )
            .unwrap();
        assert!(
            matches!(r.as_slice(), [queen_ports::Answer::Bytes(b)] if b.is_empty()),
            "{r:?}"
        );
    }
    let s = FjallStore::open(&cfg).unwrap();
    assert_eq!(s.load_meta().unwrap().as_deref(), Some(&b"meta-last"[..]));
    let q = reads::queue(&s, "q").unwrap().unwrap();
    assert_eq!(q.messages, 500);
    invariants::check(&s).unwrap();
}

#[test]
fn a_snapshot_installs_the_same_state_elsewhere() {
    let a_dir = tempfile::tempdir().unwrap();
    let b_dir = tempfile::tempdir().unwrap();
    let a = FjallStore::open(&StoreConfig::new(a_dir.path().to_path_buf())).unwrap();
    let entries = (0..5000)
        .map(|i| ApplyEntry {
            index: i + 1,
            command: Some(push_entry(i).into()),
            answered: true,
            span: None,
        })
        .collect();
    a.apply(entries, b"m".to_vec()).unwrap();
    a.persist().unwrap();
    let mut snap = a.snapshot().unwrap();
    // Writes after the snapshot are not in it.
    a.apply(
        vec![ApplyEntry {
            index: 5001,
            command: Some(push_entry(9999).into()),
            answered: true,
            span: None,
        }],
        b"m2".to_vec(),
    )
    .unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = snap.next_chunk().unwrap() {
        chunks.push(c);
    }
    assert!(
        chunks.len() > 1,
        "5000 messages of 300 bytes span several 1 MiB chunks"
    );
    // A restarted cursor reads the same pinned view again, from its first chunk.
    let mut again = snap.restart().unwrap();
    for c in &chunks {
        assert_eq!(again.next_chunk().unwrap().as_ref(), Some(c));
    }
    assert!(again.next_chunk().unwrap().is_none());
    let b = FjallStore::open(&StoreConfig::new(b_dir.path().to_path_buf())).unwrap();
    b.apply(
        vec![ApplyEntry {
            index: 1,
            command: Some(push_entry(77_777).into()),
            answered: true,
            span: None,
        }],
        b"old".to_vec(),
    )
    .unwrap();
    b.install_snapshot(&mut chunks.into_iter().map(Ok), snap.meta())
        .unwrap();
    assert_eq!(b.load_meta().unwrap().as_deref(), Some(&b"m"[..]));
    assert_eq!(reads::queue(&b, "q").unwrap().unwrap().messages, 5000);
    // The installed state equals the same entries applied by the domain on a map.
    let mut expected = MemStore::new();
    for i in 0..5000 {
        let entry = push_entry(i);
        let mut txn = queen_domain::Txn::new(&expected);
        queen_domain::machine::apply_encoded(&mut txn, &entry, i + 1, true).unwrap();
        let w = txn.into_writes();
        expected.commit(w);
    }
    assert!(
        same(&b, &expected),
        "the installed state, its dedup rows included, is the domain's"
    );
    assert_ne!(dump(&a), expected, "a moved on after its snapshot");
}

/// A store in `dir` holding `n` messages pushed by entries `from..from + n`, with `meta`.
fn store_with(dir: &std::path::Path, from: u64, n: u64, meta: &[u8]) -> FjallStore {
    let s = FjallStore::open(&StoreConfig::new(dir.to_path_buf())).unwrap();
    let entries = (from..from + n)
        .map(|i| ApplyEntry {
            index: i + 1,
            command: Some(push_entry(i).into()),
            answered: true,
            span: None,
        })
        .collect();
    s.apply(entries, meta.to_vec()).unwrap();
    s
}

fn all_chunks(s: &FjallStore) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut snap = s.snapshot().unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = snap.next_chunk().unwrap() {
        chunks.push(c);
    }
    (chunks, snap.meta())
}

fn messages(s: &FjallStore) -> u64 {
    reads::queue(s, "q").unwrap().map_or(0, |q| q.messages)
}

/// An install that fails part way (a chunk that cannot be read), or one a `kill -9` stopped
/// (its marker and partial rows on disk), leaves the old state and meta, before and after a
/// reopen; the next install then succeeds.
#[test]
fn an_interrupted_install_leaves_the_old_state_and_meta() {
    let src_dir = tempfile::tempdir().unwrap();
    let src = store_with(src_dir.path(), 0, 5000, b"new");
    let (chunks, meta) = all_chunks(&src);
    assert!(chunks.len() > 2);
    let dir = tempfile::tempdir().unwrap();
    let old = store_with(dir.path(), 100_000, 300, b"old");
    let before = dump(&old);

    let mut failing =
        chunks
            .iter()
            .take(2)
            .cloned()
            .map(Ok)
            .chain([Err(queen_ports::BackendError::Storage(
                "spool read failed".into(),
            ))]);
    assert!(old.install_snapshot(&mut failing, meta.clone()).is_err());
    assert_eq!(old.load_meta().unwrap().as_deref(), Some(&b"old"[..]));
    assert_eq!(dump(&old), before);
    drop(old);
    let old = FjallStore::open(&StoreConfig::new(dir.path().to_path_buf())).unwrap();
    assert_eq!(old.load_meta().unwrap().as_deref(), Some(&b"old"[..]));
    assert_eq!(dump(&old), before);
    invariants::check(&old).unwrap();
    drop(old);

    // What a kill -9 during the install leaves: the marker, rows and a segment file of the
    // inactive slot (B, as this store never installed).
    {
        let db = fjall::Database::builder(dir.path()).open().unwrap();
        let raft = db
            .keyspace("raft", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        let spare = db
            .keyspace("state_b", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        raft.insert(b"installing", b"1").unwrap();
        spare.insert(b"\x01partial", b"row").unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
        std::fs::create_dir_all(dir.path().join("segments_b")).unwrap();
        std::fs::write(
            dir.path()
                .join("segments_b")
                .join(format!("{:020}.qseg", 1)),
            b"partial",
        )
        .unwrap();
    }
    let old = FjallStore::open(&StoreConfig::new(dir.path().to_path_buf())).unwrap();
    assert_eq!(old.load_meta().unwrap().as_deref(), Some(&b"old"[..]));
    assert_eq!(dump(&old), before);
    assert!(
        !dir.path().join("segments_b").exists(),
        "the partial slot's files are deleted at open"
    );

    old.install_snapshot(&mut chunks.into_iter().map(Ok), meta)
        .unwrap();
    assert_eq!(old.load_meta().unwrap().as_deref(), Some(&b"new"[..]));
    assert_eq!(messages(&old), 5000);
}

/// A finished install makes the other slot active: a reopen reads it, it takes new writes, and
/// the install after it goes back into the first slot.
#[test]
fn installs_alternate_between_the_two_slots_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig::new(dir.path().to_path_buf());
    let s = store_with(dir.path(), 100_000, 300, b"old");
    let first_dir = tempfile::tempdir().unwrap();
    let (chunks, meta) = all_chunks(&store_with(first_dir.path(), 0, 5000, b"first"));
    let view = s.view();
    s.install_snapshot(&mut chunks.into_iter().map(Ok), meta)
        .unwrap();
    assert_eq!(
        reads::queue(&view, "q").unwrap().unwrap().messages,
        300,
        "a view keeps the slot it started on"
    );
    drop(view);
    assert_eq!(messages(&s), 5000);
    assert!(dir.path().join("segments_b").exists());
    assert!(
        std::fs::read_dir(dir.path().join("segments"))
            .unwrap()
            .next()
            .is_none(),
        "the old slot's files are deleted"
    );
    drop(s);

    let s = FjallStore::open(&cfg).unwrap();
    assert_eq!(s.load_meta().unwrap().as_deref(), Some(&b"first"[..]));
    assert_eq!(messages(&s), 5000);
    s.apply(
        vec![ApplyEntry {
            index: 5001,
            command: Some(push_entry(5000).into()),
            answered: true,
            span: None,
        }],
        b"first+1".to_vec(),
    )
    .unwrap();
    assert_eq!(messages(&s), 5001);
    invariants::check(&s).unwrap();

    let second_dir = tempfile::tempdir().unwrap();
    let second = store_with(second_dir.path(), 200_000, 1200, b"second");
    let (chunks, meta) = all_chunks(&second);
    s.install_snapshot(&mut chunks.into_iter().map(Ok), meta)
        .unwrap();
    assert!(
        !dir.path()
            .join("segments_b")
            .read_dir()
            .unwrap()
            .any(|_| true),
        "slot B is emptied"
    );
    drop(s);
    let s = FjallStore::open(&cfg).unwrap();
    assert_eq!(s.load_meta().unwrap().as_deref(), Some(&b"second"[..]));
    assert_eq!(dump(&s), dump(&second));
    s.apply(
        vec![ApplyEntry {
            index: 1201,
            command: Some(push_entry(7).into()),
            answered: true,
            span: None,
        }],
        b"second+1".to_vec(),
    )
    .unwrap();
    drop(s);
    let s = FjallStore::open(&cfg).unwrap();
    assert_eq!(messages(&s), 1201);
    invariants::check(&s).unwrap();
}

/// A node that applies an entry nobody on it waits for (a follower) answers it empty, and ends
/// in exactly the state of the node that answered it in full.
#[test]
fn entries_nobody_waits_for_change_the_same_state_and_answer_nothing() {
    use queen_domain::command::{PopCommand, Response, Subscription};
    use queen_domain::names::GroupName;
    let pop = |i: u64| {
        Entry {
            proposed_at: 2_000_000 + i,
            command: Command::Pop(PopCommand {
                queue: QueueName::new("q").unwrap(),
                partition: None,
                group: GroupName::or_queue_mode(None).unwrap(),
                batch: 7,
                max_partitions: 2,
                lease_id: queen_domain::ids::LeaseId::new(format!("lease-{i}")).unwrap(),
                auto_ack: i.is_multiple_of(2),
                subscription: Subscription::Default,
            }),
        }
        .encode()
    };
    let commands: Vec<Vec<u8>> = (0..200).map(push_entry).chain((0..20).map(pop)).collect();
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = FjallStore::open(&StoreConfig::new(a_dir.path().to_path_buf())).unwrap();
    let b = FjallStore::open(&StoreConfig::new(b_dir.path().to_path_buf())).unwrap();
    let entries = |answered: bool| {
        commands
            .iter()
            .enumerate()
            .map(|(i, c)| ApplyEntry {
                index: i as u64 + 1,
                command: Some(c.clone().into()),
                answered,
                span: None,
            })
            .collect::<Vec<_>>()
    };
    let full = a.apply(entries(true), b"m".to_vec()).unwrap();
    let empty = b.apply(entries(false), b"m".to_vec()).unwrap();
    assert!(
        empty
            .iter()
            .all(|a| matches!(a, queen_ports::Answer::Bytes(b) if b.is_empty())),
        "nobody waits: nothing is built"
    );
    assert!(
        full.iter()
            .all(|a| matches!(a, queen_ports::Answer::Built(_))),
        "whoever waits gets the response as built"
    );
    let delivered: usize = full
        .into_iter()
        .skip(200)
        .map(
            |r| match Response::decode(&r.into_bytes()).unwrap().outcome {
                queen_domain::command::Outcome::Pop(p) => {
                    p.claims.iter().map(|c| c.messages.len()).sum::<usize>()
                }
                other => panic!("{other:?}"),
            },
        )
        .sum();
    assert!(
        delivered > 0,
        "the pops delivered messages to whoever waited"
    );
    assert!(same(&b, &dump(&a)), "the same state either way");
    invariants::check(&b).unwrap();
}
