//! What the store tests share: reading a store's whole state back for comparisons.

#![allow(dead_code)] // each test crate uses part of it

use std::collections::BTreeMap;

use queen_domain::keys;
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
