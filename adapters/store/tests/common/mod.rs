//! What the store tests share: reading a store's whole state back for comparisons.

#![allow(dead_code)] // each test crate uses part of it

use std::collections::BTreeMap;

use queen_domain::command::{Command, Outcome, PushItem, PushStatus, Response};
use queen_domain::keys;
use queen_domain::names::{PartitionName, QueueName};
use queen_domain::{MemStore, StateRead};

/// Every row a scan of `s` shows.
pub fn dump(s: &dyn StateRead) -> MemStore {
    let mut w = BTreeMap::new();
    s.scan(&[], &[0xFF; 4], &mut |k, v| {
        w.insert(k.to_vec(), Some(v.to_vec()));
        true
    })
    .unwrap();
    let mut m = MemStore::new();
    m.commit(w);
    m
}

/// Whether `s` holds exactly the state of `expected`: every row a scan shows, and every dedup
/// row (kept in the dedup index, which scans do not show) read back by its key.
pub fn same(s: &dyn StateRead, expected: &MemStore) -> bool {
    let mut rows = BTreeMap::new();
    let mut dedup = Vec::new();
    expected
        .scan(&[], &[0xFF; 4], &mut |k, v| {
            if k[0] == keys::table::DEDUP_HASH {
                dedup.push((k.to_vec(), v.to_vec()));
            } else {
                rows.insert(k.to_vec(), Some(v.to_vec()));
            }
            true
        })
        .unwrap();
    let mut m = MemStore::new();
    m.commit(rows);
    if dump(s) != m {
        return false;
    }
    dedup
        .iter()
        .all(|(k, v)| s.get(k).unwrap().as_deref() == Some(v.as_slice()))
}

/// The domain's state after `entries` (encoded, log indexes from 1), applied on a map.
pub fn reference(entries: &[Vec<u8>]) -> MemStore {
    let mut m = MemStore::new();
    for (i, e) in entries.iter().enumerate() {
        let mut txn = queen_domain::Txn::new(&m);
        queen_domain::machine::apply_encoded(&mut txn, e, i as u64 + 1, true).unwrap();
        let w = txn.into_writes();
        m.commit(w);
    }
    m
}

/// The status and offset of every pushed message in push answers, in order (other answers
/// are skipped).
pub fn statuses<A: AnswerBytes>(responses: &[A]) -> Vec<(PushStatus, u64)> {
    responses
        .iter()
        .flat_map(|r| match Response::decode(&r.bytes()).unwrap().outcome {
            Outcome::Push(items) => items
                .into_iter()
                .map(|o| (o.status, o.offset))
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect()
}

/// A push of `ids` (as transactionIds, payload `{}`) to `partition` of queue `d`.
pub fn push_ids<'a>(partition: &str, ids: impl IntoIterator<Item = &'a String>) -> Command {
    Command::Push(
        ids.into_iter()
            .map(|t| PushItem {
                queue: QueueName::new("d").unwrap(),
                partition: PartitionName::new(partition).unwrap(),
                transaction_id: queen_domain::ids::TransactionId::new(t.clone()).unwrap(),
                message_id: [1; 16],
                payload: b"{}".to_vec(),
                trace_id: None,
            })
            .collect(),
    )
}

/// A deterministic generator: `rnd(m)` is in `0..m`.
pub fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed | 1;
    move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    }
}

/// The entry that configures queue `r` with one-second retention, proposed at `at`.
pub fn retained_queue_r(at: u64) -> Vec<u8> {
    queen_domain::command::Entry {
        proposed_at: at,
        command: Command::Configure {
            queue: QueueName::new("r").unwrap(),
            namespace: None,
            task: None,
            options: queen_domain::model::QueueOptions {
                retention_enabled: true,
                retention_seconds: 1,
                ..queen_domain::model::QueueOptions::default()
            },
        },
    }
    .encode()
}

/// A state machine answer's bytes, from the backend's answers or from bytes.
pub trait AnswerBytes {
    fn bytes(&self) -> Vec<u8>;
}

impl AnswerBytes for Vec<u8> {
    fn bytes(&self) -> Vec<u8> {
        self.clone()
    }
}

impl AnswerBytes for queen_ports::Answer {
    fn bytes(&self) -> Vec<u8> {
        self.to_bytes().into_owned()
    }
}
