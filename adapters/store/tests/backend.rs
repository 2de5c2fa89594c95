//! The fjall backend against the domain: apply, reopen, snapshot and install.

use queen_domain::command::{Command, Entry, PushItem};
use queen_domain::names::{PartitionName, QueueName};
use queen_domain::{MemStore, StateRead, invariants, reads};
use queen_ports::{ApplyEntry, StateMachineBackend};
use queen_store::{FjallStore, StoreConfig};

fn push_entry(i: u64) -> Vec<u8> {
    Entry {
        proposed_at: 1_000_000 + i,
        command: Command::Push(vec![PushItem {
            queue: QueueName::new("q").unwrap(),
            partition: PartitionName::new(format!("p{}", i % 4)).unwrap(),
            transaction_id: format!("t{i}"),
            message_id: [1; 16],
            payload: vec![b'x'; 300],
            trace_id: None,
        }]),
    }
    .encode()
}

fn dump(s: &dyn StateRead) -> MemStore {
    let mut m = MemStore::new();
    let mut w = std::collections::BTreeMap::new();
    s.scan(&[], &[0xFF; 4], &mut |k, v| {
        w.insert(k.to_vec(), Some(v.to_vec()));
        true
    })
    .unwrap();
    m.commit(w);
    m
}

#[test]
fn applied_batches_survive_reopen_with_their_meta() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig::new(dir.path().to_path_buf());
    {
        let s = FjallStore::open(&cfg).unwrap();
        for b in 0..10u64 {
            let entries = (0..50).map(|i| ApplyEntry { index: b * 50 + i + 1, command: Some(push_entry(b * 50 + i)) }).collect();
            let r = s.apply(entries, format!("meta-{b}").into_bytes()).unwrap();
            assert_eq!(r.len(), 50);
        }
        // A blank entry gives an empty response and still stores the meta.
        let r = s.apply(vec![ApplyEntry { index: 501, command: None }], b"meta-last".to_vec()).unwrap();
        assert_eq!(r, vec![Vec::<u8>::new()]);
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
    let entries = (0..5000).map(|i| ApplyEntry { index: i + 1, command: Some(push_entry(i)) }).collect();
    a.apply(entries, b"m".to_vec()).unwrap();
    a.persist().unwrap();
    let mut snap = a.snapshot().unwrap();
    // Writes after the snapshot are not in it.
    a.apply(vec![ApplyEntry { index: 5001, command: Some(push_entry(9999)) }], b"m2".to_vec()).unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = snap.next_chunk().unwrap() {
        chunks.push(c);
    }
    assert!(chunks.len() > 1, "5000 messages of 300 bytes span several 1 MiB chunks");
    // A restarted cursor reads the same pinned view again, from its first chunk.
    let mut again = snap.restart().unwrap();
    for c in &chunks {
        assert_eq!(again.next_chunk().unwrap().as_ref(), Some(c));
    }
    assert!(again.next_chunk().unwrap().is_none());
    let b = FjallStore::open(&StoreConfig::new(b_dir.path().to_path_buf())).unwrap();
    b.apply(vec![ApplyEntry { index: 1, command: Some(push_entry(77_777)) }], b"old".to_vec()).unwrap();
    b.install_snapshot(&mut chunks.into_iter().map(Ok), snap.meta()).unwrap();
    assert_eq!(b.load_meta().unwrap().as_deref(), Some(&b"m"[..]));
    assert_eq!(reads::queue(&b, "q").unwrap().unwrap().messages, 5000);
    // The installed state equals the same entries applied by the domain on a map.
    let mut expected = MemStore::new();
    for i in 0..5000 {
        let mut txn = queen_domain::Txn::new(&expected);
        queen_domain::machine::apply_encoded(&mut txn, &push_entry(i), i + 1).unwrap();
        let w = txn.into_writes();
        expected.commit(w);
    }
    assert_eq!(dump(&b), expected);
    assert_ne!(dump(&a), expected, "a moved on after its snapshot");
}
