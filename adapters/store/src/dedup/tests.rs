use super::*;

/// The key of transactionId `t<i>` in partition `pid`, hashed as the store hashes it (the
/// filters take their probes from the hash bytes).
fn key(pid: u64, i: u64) -> Key {
    queen_domain::keys::dedup_key(pid, &format!("t{i}"))
}

fn all_live() -> FirstLive {
    Arc::new(|_| Some(0))
}

/// A run holds exactly the header and the entries, whatever its size against a page, and
/// reads back in order through a merge's cursor and through lookups after a reopen.
#[test]
fn runs_of_any_size_are_written_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for (id, n) in [0u64, 1, 127, 128, 129, 32_767, 70_001]
        .into_iter()
        .enumerate()
    {
        let mut entries: Vec<(Key, u64)> = (0..n).map(|i| (key(i % 3, i), i)).collect();
        entries.sort_unstable();
        let run = Run::write(
            dir.path(),
            id as u64,
            &mut entries.iter().map(|(k, o)| ent(k, *o)),
        )
        .unwrap();
        let bytes = std::fs::read(&run.path).unwrap();
        let mut want = RUN_MAGIC.to_vec();
        want.extend_from_slice(&n.to_le_bytes());
        for (k, o) in &entries {
            want.extend_from_slice(k);
            want.extend_from_slice(&o.to_be_bytes());
        }
        assert!(
            bytes == want,
            "run of {n} entries: {} bytes, want {}",
            bytes.len(),
            want.len()
        );
        let mut back = Vec::new();
        run.scan(&mut |k, o| back.push((k, o))).unwrap();
        assert_eq!(back, entries, "run of {n} entries scanned");
        let again = Run::open(dir.path(), id as u64).unwrap();
        for (k, o) in entries.iter().step_by(997) {
            let mut out = Vec::new();
            again.lookup(k, &mut out).unwrap();
            assert_eq!(out, vec![*o]);
        }
    }
}

/// The table in memory finds every offset of a key, in its sorted chunks and in its
/// unsorted tail, and hands everything back sorted without repeats.
#[test]
fn the_table_in_memory_finds_keys_in_chunks_and_tail() {
    let mut m = MemTable::default();
    let n = MemTable::CHUNK as u64 * 3 + 100;
    // Each key hashed once (a debug build hashes slowly, and other tests wait on merges).
    let keys: Vec<Key> = (0..n).map(|i| key(i % 5, i / 3)).collect();
    for (i, k) in (0..n).zip(&keys) {
        m.insert(k, i);
        // A row's offsets are inserted again with each new one.
        if i % 7 == 0 {
            m.insert(k, i);
        }
    }
    let inserted = n + n.div_ceil(7);
    let whole = inserted / MemTable::CHUNK as u64;
    let small = (inserted % MemTable::CHUNK as u64) / MemTable::SMALL as u64;
    assert_eq!((whole, small), (3, 3));
    assert_eq!(m.small as u64, small);
    assert_eq!(m.chunks.len() as u64, whole + small);
    assert!(m.chunks[..3].iter().all(|c| c.len() == MemTable::CHUNK));
    assert!(m.chunks.iter().all(|c| c.is_sorted()));
    assert_eq!(m.tail.len() as u64, inserted % MemTable::SMALL as u64);
    let c = MemTable::CHUNK as u64;
    for i in [0, 1, c - 1, c, 2 * c + 4, n - 1] {
        let mut out = Vec::new();
        let k = keys[i as usize];
        m.lookup(&k, &mut out);
        out.sort_unstable();
        out.dedup();
        let want: Vec<u64> = (0..n).filter(|j| keys[*j as usize] == k).collect();
        assert_eq!(out, want, "offsets of entry {i}");
    }
    let mut none = Vec::new();
    m.lookup(&key(9, 9), &mut none);
    assert!(none.is_empty());
    let all: Vec<_> = m.sorted().collect();
    assert_eq!(all.len() as u64, n, "every entry once");
    assert!(all.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
    assert_eq!(m.keys().count(), n as usize + (n as usize).div_ceil(7));
}

#[test]
fn entries_are_found_in_memory_in_runs_and_after_merges_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let idx = Arc::new(DedupIndex::open(dir.path(), MEM_ENTRIES, all_live()).unwrap());
    let n = (MEM_ENTRIES * (FANOUT + 1) + 77) as u64;
    for i in 0..n {
        idx.insert(key(i % 3, i), i);
        if idx.full() {
            idx.flush((1, i)).unwrap();
        }
    }
    idx.insert(key(1, 1), 999_999);
    idx.settle();
    for i in (0..n).step_by(997) {
        let want: Vec<u64> = if i == 1 { vec![1, 999_999] } else { vec![i] };
        assert_eq!(idx.lookup(&key(i % 3, i)).unwrap(), want, "entry {i}");
    }
    assert!(idx.lookup(&key(0, n + 5)).unwrap().is_empty());
    let (runs, _, _) = idx.stats();
    assert!(runs < FANOUT, "{runs} runs after merges");
    let covered = idx.covered();
    drop(idx);
    let again = DedupIndex::open(dir.path(), MEM_ENTRIES, all_live()).unwrap();
    assert_eq!(again.covered(), covered);
    assert_eq!(again.lookup(&key(2, 5)).unwrap(), vec![5]);
    // What was only in memory is gone: the store replays it from the segment log.
    assert!(again.lookup(&key((n - 1) % 3, n - 1)).unwrap().is_empty());
}

#[test]
fn merges_drop_entries_of_deleted_messages() {
    let dir = tempfile::tempdir().unwrap();
    // Partition 7 keeps offsets from 1000 on; partition 8 is gone.
    let first: FirstLive = Arc::new(|pid| match pid {
        7 => Some(1000),
        8 => None,
        _ => Some(0),
    });
    let idx = Arc::new(DedupIndex::open(dir.path(), MEM_ENTRIES, first).unwrap());
    let mut i = 0u64;
    for _ in 0..FANOUT {
        for _ in 0..MEM_ENTRIES {
            idx.insert(key(7 + i % 3, i), i);
            i += 1;
        }
        idx.flush((1, i)).unwrap();
    }
    idx.settle();
    assert_eq!(idx.stats().0, 1);
    assert!(idx.lookup(&key(7, 999)).unwrap().is_empty());
    assert_eq!(idx.lookup(&key(7, 1002)).unwrap(), vec![1002]);
    assert!(idx.lookup(&key(8, 1000)).unwrap().is_empty());
    assert_eq!(idx.lookup(&key(9, 2)).unwrap(), vec![2]);
}

/// A merge yields every live entry of its runs once, in key order: the same key under two
/// offsets stays twice, an entry written to two runs (a replay after a restart) once.
#[test]
fn a_merge_keeps_each_live_entry_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let first: FirstLive = Arc::new(|pid| (pid != 5).then_some(0));
    let cap = 64;
    let idx = Arc::new(DedupIndex::open(dir.path(), cap, first).unwrap());
    let mut want = std::collections::BTreeSet::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for run in 0..FANOUT as u64 {
        for j in 0..cap as u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Partitions 1 to 6 (5 is deleted), keys that repeat across runs, and some
            // entries written again under the same offset.
            let pid = 1 + x % 6;
            let k = key(pid, x % 97);
            let offset = if j % 5 == 0 { x % 97 } else { run * 1000 + j };
            idx.insert(k, offset);
            if pid != 5 {
                want.insert((k, offset));
            }
        }
        idx.flush((1, run)).unwrap();
    }
    idx.settle();
    assert_eq!(idx.stats().0, 1, "the FANOUT runs merged into one");
    let mut got = Vec::new();
    let runs = read(&idx.inner).runs.clone();
    runs[0].scan(&mut |k, o| got.push((k, o))).unwrap();
    assert_eq!(got, want.into_iter().collect::<Vec<_>>());
}

#[test]
fn a_damaged_manifest_or_run_is_an_error_not_a_silent_empty_index() {
    let dir = tempfile::tempdir().unwrap();
    let idx = Arc::new(DedupIndex::open(dir.path(), MEM_ENTRIES, all_live()).unwrap());
    idx.insert(key(1, 1), 1);
    idx.flush((1, 100)).unwrap();
    drop(idx);
    std::fs::write(dir.path().join(MANIFEST), b"garbage").unwrap();
    assert!(DedupIndex::open(dir.path(), MEM_ENTRIES, all_live()).is_err());
}

/// A key with many offsets spans pages: a lookup finds every one of them, whichever page its
/// search starts on, and keys around it keep their own.
#[test]
fn a_key_repeated_across_pages_is_found_whole() {
    let dir = tempfile::tempdir().unwrap();
    let busy = key(4, 5000);
    let mut entries: Vec<(Key, u64)> = (0..1000).map(|i| (key(i % 7, i), i)).collect();
    entries.extend((0..300).map(|o| (busy, 10_000 + o)));
    entries.sort_unstable();
    entries.dedup();
    let run = Run::write(dir.path(), 1, &mut entries.iter().map(|(k, o)| ent(k, *o))).unwrap();
    let again = Run::open(dir.path(), 1).unwrap();
    for r in [&run, &again] {
        let mut out = Vec::new();
        r.lookup(&busy, &mut out).unwrap();
        assert_eq!(out, (10_000..10_300).collect::<Vec<u64>>());
        for i in [0, 3, 500, 999] {
            let mut one = Vec::new();
            r.lookup(&key(i % 7, i), &mut one).unwrap();
            assert_eq!(one, vec![i], "entry {i}");
        }
        let mut none = Vec::new();
        r.lookup(&key(4, 6000), &mut none).unwrap();
        assert!(none.is_empty());
    }
}

/// Lookups that read only the part of a page where the key should sit find exactly what a
/// whole-page read finds: every offset of every key (single ones, keys held twice, a key held
/// hundreds of times across pages, keys on the run's last page and at page borders) and nothing
/// for keys not held.
#[test]
fn lookups_by_window_find_exactly_the_offsets_held() {
    let dir = tempfile::tempdir().unwrap();
    let busy = key(1, 777_777);
    let mut entries: Vec<(Key, u64)> = (0..20_000).map(|i| (key(1, i), i)).collect();
    // Some keys twice, a neighbouring partition on each side, and a busy key.
    entries.extend((0..20_000).step_by(13).map(|i| (key(1, i), 100_000 + i)));
    entries.extend((0..300).map(|i| (key(0, i), i)));
    entries.extend((0..300).map(|i| (key(2, i), i)));
    entries.extend((0..400).map(|o| (busy, 50_000 + o)));
    entries.sort_unstable();
    let mut want: std::collections::BTreeMap<Key, Vec<u64>> = std::collections::BTreeMap::new();
    for (k, o) in &entries {
        want.entry(*k).or_default().push(*o);
    }
    let run = Run::write(dir.path(), 1, &mut entries.iter().map(|(k, o)| ent(k, *o))).unwrap();
    for (k, offsets) in &want {
        let mut out = Vec::new();
        run.lookup(k, &mut out).unwrap();
        out.sort_unstable();
        assert_eq!(&out, offsets);
    }
    for i in 0..3_000 {
        let mut none = Vec::new();
        run.lookup(&key(1, 1_000_000 + i), &mut none).unwrap();
        run.lookup(&key(3, i), &mut none).unwrap();
        assert!(none.is_empty(), "absent key {i}");
    }
}

/// The table's own filter: every key held is found (also after a failed flush puts the
/// entries back), nothing is found once the table is handed over, and a full table lets
/// through few lookups of keys it does not hold.
#[test]
fn the_table_filter_never_hides_a_held_key_and_skips_most_others() {
    let mut m = MemTable::default();
    let n = MEM_ENTRIES as u64;
    for i in 0..n {
        m.insert(&key(i % 11, i), i);
    }
    let found = |m: &MemTable, i: u64| {
        let mut out = Vec::new();
        m.lookup(&key(i % 11, i), &mut out);
        out
    };
    assert!(
        (0..n).all(|i| found(&m, i) == vec![i]),
        "every held key found"
    );
    let passed = (n..n + 100_000)
        .filter(|&i| m.may_hold(&key(i % 11, i)))
        .count();
    assert!(
        passed < 2_000,
        "{passed} of 100000 absent keys passed the filter"
    );
    let handed = std::mem::take(&mut m);
    let all: Vec<_> = handed.sorted().collect();
    assert!(found(&m, 5).is_empty(), "an empty table holds nothing");
    assert_eq!(
        found(&handed, 5),
        vec![5],
        "the table handed over still finds its keys"
    );
    m.restore(all);
    assert!(
        (0..n).step_by(101).all(|i| found(&m, i) == vec![i]),
        "found after restore"
    );
}

/// A table written out behind the apply path: its keys are found while it is being written
/// and after, the next table waits for it, and the manifest ends up covering both.
#[test]
fn a_table_written_out_behind_is_found_throughout() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 5_000;
    let idx = Arc::new(DedupIndex::open(dir.path(), cap, all_live()).unwrap());
    let n = (cap * 3) as u64;
    for i in 0..n {
        idx.insert(key(i % 4, i), i);
        if idx.full() {
            idx.flush_behind((1, i));
            // Found at once, whether the table is still being written or already a run.
            assert_eq!(idx.lookup(&key(i % 4, i)).unwrap(), vec![i], "entry {i}");
            assert_eq!(idx.lookup(&key(0, 0)).unwrap(), vec![0]);
        }
    }
    idx.settle();
    let (runs, in_runs, in_memory) = idx.stats();
    assert_eq!((runs, in_runs, in_memory), (3, n, 0));
    assert_eq!(idx.covered(), Some((1, n - 1)));
    assert!(
        (0..n)
            .step_by(37)
            .all(|i| idx.lookup(&key(i % 4, i)).unwrap() == vec![i])
    );
    drop(idx);
    let again = DedupIndex::open(dir.path(), cap, all_live()).unwrap();
    assert_eq!(again.covered(), Some((1, n - 1)));
    assert_eq!(again.lookup(&key(3, 7)).unwrap(), vec![7]);
}

/// A table being written out when the index is cleared (a snapshot install) leaves no file
/// behind, and one whose directory was opened again keeps its entries in memory.
#[test]
fn a_table_written_out_behind_respects_clear_and_a_new_opening() {
    let dir = tempfile::tempdir().unwrap();
    let idx = Arc::new(DedupIndex::open(dir.path(), 1_000, all_live()).unwrap());
    for i in 0..1_000 {
        idx.insert(key(1, i), i);
    }
    idx.flush_behind((1, 999));
    idx.clear().unwrap();
    idx.settle();
    idx.flush_behind((1, 0));
    idx.settle();
    assert!(idx.lookup(&key(1, 5)).unwrap().is_empty());
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        files,
        vec!["MANIFEST".to_owned()],
        "only the empty manifest"
    );
    assert_eq!(idx.stats(), (0, 0, 0));

    for i in 0..1_000 {
        idx.insert(key(2, i), i);
    }
    let other = DedupIndex::open(dir.path(), 1_000, all_live()).unwrap();
    idx.flush_behind((1, 999));
    idx.settle();
    assert_eq!(idx.lookup(&key(2, 5)).unwrap(), vec![5], "kept in memory");
    assert_eq!(idx.stats(), (0, 0, 1_000));
    assert_eq!(other.stats(), (0, 0, 0));
    assert!(other.lookup(&key(2, 5)).unwrap().is_empty());
}

/// Merges fall back from the idle class to an ordinary priority once the tier due holds twice
/// the fan-out: an idle-class thread on a core that is never idle must not let runs pile up.
#[test]
fn merges_that_fell_behind_are_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let runs: Vec<Arc<Run>> = (0..2 * FANOUT as u64)
        .map(|id| {
            let mut e = (0..4u64).map(|i| ent(&key(1, id * 4 + i), i));
            Arc::new(Run::write(dir.path(), id + 1, &mut e).unwrap())
        })
        .collect();
    assert!(!DedupIndex::behind_in(&runs[..FANOUT - 1], 4));
    assert!(!DedupIndex::behind_in(&runs[..FANOUT], 4));
    assert!(!DedupIndex::behind_in(&runs[..2 * FANOUT - 1], 4));
    assert!(DedupIndex::behind_in(&runs, 4));
}

/// The merge thread's priority: the idle class, and back to the ordinary one at nice 10.
#[cfg(target_os = "linux")]
#[test]
fn the_merge_priority_is_the_idle_class_or_nice_ten() {
    std::thread::spawn(|| {
        // SAFETY: these calls take and return numbers for the calling thread only.
        #[allow(unsafe_code)]
        let now = || unsafe {
            (
                libc::sched_getscheduler(0),
                libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t),
            )
        };
        // Root (as in CI) may leave the idle class again, so it is used.
        // SAFETY: geteuid takes nothing and returns a number.
        #[allow(unsafe_code)]
        let root = unsafe { libc::geteuid() } == 0;
        let allowed = super::flush::idle_class_allowed();
        assert!(allowed || !root);
        super::flush::set_priority(true);
        let want = if allowed {
            libc::SCHED_IDLE
        } else {
            libc::SCHED_OTHER
        };
        assert_eq!(now().0, want);
        super::flush::set_priority(false);
        assert_eq!(now(), (libc::SCHED_OTHER, 10));
    })
    .join()
    .unwrap();
}
