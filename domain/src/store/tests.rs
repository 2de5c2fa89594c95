use super::*;
use proptest::prelude::*;

fn collect(s: &dyn StateRead, a: &[u8], b: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    s.scan(a, b, &mut |k, v| {
        out.push((k.to_vec(), v.to_vec()));
        out.len() < limit
    })
    .unwrap();
    out
}

proptest! {
    // Invariant: a scan (and a read of any key) through an overlay equals the same on the
    // store after the commit.
    #[test]
    fn overlay_scan_equals_committed_scan(
        base in proptest::collection::btree_map(proptest::collection::vec(0u8..4, 1..3), any::<u8>(), 0..20),
        ops in proptest::collection::vec((0u8..11, 0u8..7, proptest::option::of(any::<u8>())), 0..20),
        appends in proptest::collection::btree_map((0u64..2, 0u64..3), (any::<u8>(), any::<bool>()), 0..6),
        lo in 0usize..70,
        hi in 0usize..70,
        limit in 1usize..30,
    ) {
        // Keys: short ones of other tables (first byte 0-6, the message table's byte among
        // them) and message rows of two partitions.
        let mut probe: Vec<Vec<u8>> = (0u8..7)
            .map(|a| vec![a])
            .chain((0u8..7).flat_map(|a| (0u8..7).map(move |b| vec![a, b])))
            .collect();
        probe.extend((0u64..2).flat_map(|p| (0u64..3).map(move |o| keys::message(p, o))));
        let dedup: Vec<DedupKey> = (0..2).map(|i| keys::dedup_key(i, "id")).collect();
        probe.extend(dedup.iter().map(keys::dedup_row));
        probe.sort();
        let mut store = MemStore::new();
        store.commit(base.into_iter().map(|(k, v)| (k, Some(vec![v]))).collect());
        let mut txn = Txn::new(&store);
        // Appends go to message rows the base never had, encoded or as pushed (the
        // pushed ones borrow their transactionId from `ids`); later ops may delete them.
        let ids: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
        for (i, ((pid, offset), (v, pushed))) in appends.into_iter().enumerate() {
            let m = MessageRecRef {
                transaction_id: &ids[i],
                id: [v; 16],
                trace_id: None,
                stamp: Stamp(u64::from(v)),
                payload: b"{}",
                producer: None,
            };
            txn.append(pid, offset, if pushed { Appended::Pushed(m) } else { Appended::Encoded(m.encode()) });
        }
        // Dedup rows (first byte 9 or 10) are set typed, put as offsets, put as bytes that
        // are not offsets, or deleted.
        for (a, b, v) in ops {
            match (a, v) {
                (9.., Some(v)) if v % 3 == 0 => txn.set_dedup(dedup[usize::from(a - 9)], vec![u64::from(v)]),
                (9.., Some(v)) if v % 3 == 1 => txn.put(keys::dedup_row(&dedup[usize::from(a - 9)]), crate::codec::encode(&vec![u64::from(b)])),
                (9.., Some(_)) => txn.put(keys::dedup_row(&dedup[usize::from(a - 9)]), vec![5]),
                (9.., None) => txn.delete(keys::dedup_row(&dedup[usize::from(a - 9)])),
                (7.., v) => {
                    let k = keys::message(u64::from(a - 7), u64::from(b % 3));
                    match v { Some(v) => txn.put(k, vec![v]), None => txn.delete(k) }
                }
                (_, Some(v)) => txn.put(vec![a, b], vec![v]),
                (_, None) => txn.delete(vec![a, b]),
            }
        }
        let (lo, hi) = (probe[lo % probe.len()].clone(), probe[hi % probe.len()].clone());
        let via_overlay = collect(&txn, &lo, &hi, limit);
        let got: Vec<Option<Vec<u8>>> = probe.iter().map(|k| txn.get(k).unwrap()).collect();
        let writes = txn.into_writes();
        let mut after = store.clone();
        after.commit(writes);
        prop_assert_eq!(via_overlay, collect(&after, &lo, &hi, limit));
        let want: Vec<Option<Vec<u8>>> = probe.iter().map(|k| after.get(k).unwrap()).collect();
        prop_assert_eq!(got, want);
    }
}
