//! Crash and reopen tests of the segmented raft log: torn tails, purge across restarts, vote,
//! committed and truncation durability, corruption detection, and group commit.

use std::path::Path;
use std::sync::atomic::Ordering;

use openraft::RaftLogReader;
use openraft::entry::RaftEntry;
use openraft::storage::RaftLogStorage;
use openraft::storage::RaftLogStorageExt;
use openraft::testing::log_id;
use openraft::type_config::TypeConfigExt;

use super::LogStore;
use super::LogStoreOptions;
use crate::type_config::Command;
use crate::type_config::Entry;
use crate::type_config::TypeConfig;
use crate::type_config::Vote;

fn entry(term: u64, index: u64) -> Entry {
    Entry::new_normal(
        log_id::<TypeConfig>(term, 1, index),
        Command(format!("cmd-{index}").into_bytes().into()),
    )
}

fn open(dir: &Path, segment_max_bytes: u64) -> LogStore {
    open_cached(
        dir,
        segment_max_bytes,
        LogStoreOptions::default().cache_max_bytes,
    )
}

fn open_cached(dir: &Path, segment_max_bytes: u64, cache_max_bytes: usize) -> LogStore {
    LogStore::open(
        dir,
        LogStoreOptions {
            segment_max_bytes,
            flush_batch_max: 4096,
            cache_max_bytes,
            inline_flush: false,
        },
    )
    .expect("open log store")
}

async fn append_range(store: &mut LogStore, term: u64, from: u64, to_inclusive: u64) {
    let entries: Vec<Entry> = (from..=to_inclusive).map(|i| entry(term, i)).collect();
    store.blocking_append(entries).await.expect("append");
}

async fn indexes(store: &mut LogStore) -> Vec<u64> {
    store
        .try_get_log_entries(0..u64::MAX)
        .await
        .expect("read")
        .iter()
        .map(|e| e.index())
        .collect()
}

fn segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|d| d.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn reopen_keeps_entries_vote_and_committed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    {
        let mut s = open(&dir, 1 << 20);
        append_range(&mut s, 1, 1, 100).await;
        s.save_vote(&Vote::new_committed(3, 1)).await.expect("vote");
        s.save_committed(Some(log_id::<TypeConfig>(1, 1, 90)))
            .await
            .expect("committed");
        // committed is not synced by itself: a later append's flush covers it.
        append_range(&mut s, 3, 101, 101).await;
    }
    let mut s = open(&dir, 1 << 20);
    assert_eq!(indexes(&mut s).await, (1..=101).collect::<Vec<_>>());
    assert_eq!(
        s.read_vote().await.expect("vote"),
        Some(Vote::new_committed(3, 1))
    );
    assert_eq!(
        s.read_committed().await.expect("committed"),
        Some(log_id::<TypeConfig>(1, 1, 90))
    );
    let e = s.try_get_log_entries(50..51).await.expect("read");
    assert_eq!(e, vec![entry(1, 50)]);
}

#[tokio::test]
async fn torn_tail_is_cut_and_earlier_entries_survive() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    let last_segment;
    {
        let mut s = open(&dir, 1 << 20);
        append_range(&mut s, 1, 1, 10).await;
        last_segment = segments(&dir).pop().expect("a segment");
    }
    // Cut the last record in half.
    let len = std::fs::metadata(&last_segment).expect("meta").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&last_segment)
        .expect("open");
    f.set_len(len - 5).expect("truncate");
    drop(f);

    let mut s = open(&dir, 1 << 20);
    assert_eq!(indexes(&mut s).await, (1..=9).collect::<Vec<_>>());
    let state = s.get_log_state().await.expect("state");
    assert_eq!(state.last_log_id, Some(log_id::<TypeConfig>(1, 1, 9)));
    // The log continues at the cut.
    append_range(&mut s, 1, 10, 12).await;
    drop(s);
    let mut s = open(&dir, 1 << 20);
    assert_eq!(indexes(&mut s).await, (1..=12).collect::<Vec<_>>());
}

#[tokio::test]
async fn garbage_tail_with_bad_checksum_is_cut() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    {
        let mut s = open(&dir, 1 << 20);
        append_range(&mut s, 1, 1, 5).await;
    }
    let last = segments(&dir).pop().expect("segment");
    let mut bytes = std::fs::read(&last).expect("read");
    let n = bytes.len();
    bytes[n - 1] ^= 0xff; // flip a bit inside the last record body
    std::fs::write(&last, &bytes).expect("write");
    let mut s = open(&dir, 1 << 20);
    assert_eq!(indexes(&mut s).await, vec![1, 2, 3, 4]);
}

#[tokio::test]
async fn corruption_before_the_last_segment_is_an_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    {
        let mut s = open(&dir, 64);
        for i in 1..=20 {
            append_range(&mut s, 1, i, i).await;
        }
    }
    let segs = segments(&dir);
    let sizes: Vec<_> = segs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .collect();
    assert!(segs.len() > 3, "expected several segments, got {sizes:?}");
    let victim = &segs[1];
    let mut bytes = std::fs::read(victim).expect("read");
    let n = bytes.len();
    bytes[n - 2] ^= 0xff;
    std::fs::write(victim, &bytes).expect("write");
    let err = LogStore::open(&dir, LogStoreOptions::default())
        .err()
        .expect("corruption must fail the open");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
}

#[tokio::test]
async fn purge_survives_reopen_even_with_no_entries_left() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    {
        let mut s = open(&dir, 256);
        for i in 1..=30 {
            append_range(&mut s, 1, i, i).await;
        }
        let before = segments(&dir).len();
        s.purge(log_id::<TypeConfig>(1, 1, 20))
            .await
            .expect("purge");
        let after = segments(&dir).len();
        assert!(
            after < before,
            "purge must delete whole segments ({before} -> {after})"
        );
        assert_eq!(indexes(&mut s).await, (21..=30).collect::<Vec<_>>());
    }
    {
        let mut s = open(&dir, 256);
        let st = s.get_log_state().await.expect("state");
        assert_eq!(st.last_purged_log_id, Some(log_id::<TypeConfig>(1, 1, 20)));
        assert_eq!(st.last_log_id, Some(log_id::<TypeConfig>(1, 1, 30)));
        assert_eq!(indexes(&mut s).await, (21..=30).collect::<Vec<_>>());
        // Purge past the last entry (as after installing a snapshot).
        s.purge(log_id::<TypeConfig>(2, 1, 40))
            .await
            .expect("purge all");
    }
    let mut s = open(&dir, 256);
    let st = s.get_log_state().await.expect("state");
    assert_eq!(st.last_purged_log_id, Some(log_id::<TypeConfig>(2, 1, 40)));
    assert_eq!(st.last_log_id, Some(log_id::<TypeConfig>(2, 1, 40)));
    assert!(indexes(&mut s).await.is_empty());
    // The next entry continues after the purge point.
    append_range(&mut s, 2, 41, 42).await;
    assert!(
        s.blocking_append(vec![entry(2, 44)]).await.is_err(),
        "a hole must be refused"
    );
    drop(s);
    let mut s = open(&dir, 256);
    assert_eq!(indexes(&mut s).await, vec![41, 42]);
}

/// Found by the deterministic simulation (seed 1): a purge record written in a segment before
/// later entries, and a later purge that deletes the segments between them, made the next open
/// see "a hole" between the old purge point and the first entry left.
#[tokio::test]
async fn an_old_purge_record_before_entries_a_later_purge_freed_is_no_hole() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    {
        let mut s = open(&dir, 256);
        for i in 1..=20 {
            append_range(&mut s, 1, i, i).await;
        }
        // The record of this purge lands in the active segment, before entries 21..
        s.purge(log_id::<TypeConfig>(1, 1, 5)).await.expect("purge");
        for i in 21..=60 {
            append_range(&mut s, 1, i, i).await;
        }
        // This purge deletes the segments holding 6..=40 but not the one holding the old
        // purge record and the entries after it.
        s.purge(log_id::<TypeConfig>(1, 1, 40))
            .await
            .expect("purge");
        assert_eq!(indexes(&mut s).await, (41..=60).collect::<Vec<_>>());
    }
    let mut s = open(&dir, 256);
    let st = s.get_log_state().await.expect("state");
    assert_eq!(st.last_purged_log_id, Some(log_id::<TypeConfig>(1, 1, 40)));
    assert_eq!(indexes(&mut s).await, (41..=60).collect::<Vec<_>>());
}

#[tokio::test]
async fn truncate_after_survives_reopen_and_is_overwritten() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    {
        let mut s = open(&dir, 512);
        append_range(&mut s, 1, 1, 20).await;
        s.truncate_after(Some(log_id::<TypeConfig>(1, 1, 12)))
            .await
            .expect("truncate");
        assert_eq!(indexes(&mut s).await, (1..=12).collect::<Vec<_>>());
        append_range(&mut s, 2, 13, 15).await;
    }
    let mut s = open(&dir, 512);
    let entries = s.try_get_log_entries(10..100).await.expect("read");
    let ids: Vec<_> = entries.iter().map(|e| e.log_id).collect();
    assert_eq!(
        ids,
        vec![
            log_id::<TypeConfig>(1, 1, 10),
            log_id::<TypeConfig>(1, 1, 11),
            log_id::<TypeConfig>(1, 1, 12),
            log_id::<TypeConfig>(2, 1, 13),
            log_id::<TypeConfig>(2, 1, 14),
            log_id::<TypeConfig>(2, 1, 15),
        ]
    );
    s.truncate_after(None).await.expect("truncate all");
    assert!(indexes(&mut s).await.is_empty());
}

#[tokio::test]
async fn headerless_new_segment_is_dropped_on_open() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    {
        let mut s = open(&dir, 1 << 20);
        append_range(&mut s, 1, 1, 3).await;
        s.save_vote(&Vote::new_committed(2, 1)).await.expect("vote");
    }
    // A crash right after creating a segment file, before its header reached the disk.
    let next = segments(&dir).len() as u64 + 1;
    std::fs::write(dir.join(format!("{next:020}.seg")), [1u8, 2, 3]).expect("write");
    let mut s = open(&dir, 1 << 20);
    assert_eq!(indexes(&mut s).await, vec![1, 2, 3]);
    assert_eq!(
        s.read_vote().await.expect("vote"),
        Some(Vote::new_committed(2, 1))
    );
}

#[tokio::test]
async fn second_open_of_the_same_dir_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    let _s = open(&dir, 1 << 20);
    let err = LogStore::open(&dir, LogStoreOptions::default())
        .err()
        .expect("second open must fail");
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_complete_in_order_with_few_fsyncs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    let mut s = open(&dir, 1 << 30);
    let fsyncs = s.fsync_counter();
    let before = fsyncs.load(Ordering::Relaxed);

    // Submit 500 single-entry appends without waiting, as openraft 0.10 does.
    let mut receivers = Vec::new();
    for i in 1..=500u64 {
        let (tx, rx) = TypeConfig::oneshot();
        s.append(vec![entry(1, i)], crate::type_config::IOFlushed::signal(tx))
            .await
            .expect("append");
        receivers.push((i, rx));
    }
    // Completions are in submission order: once the newest is flushed, every older one must
    // already have been completed.
    let (_, last) = receivers.pop().expect("receivers");
    last.await.expect("callback").expect("flushed");
    for (i, mut rx) in receivers {
        match rx.try_recv() {
            Ok(r) => r.expect("flushed"),
            Err(e) => panic!("append {i} not completed before a newer one: {e}"),
        }
    }
    let syncs = fsyncs.load(Ordering::Relaxed) - before;
    assert!(syncs >= 1, "appends must be synced");
    assert!(
        syncs < 500,
        "group commit expected, got {syncs} fsyncs for 500 appends"
    );
    assert_eq!(indexes(&mut s).await.len(), 500);
}

/// The cache of the latest entries answers exactly what the segments hold: every range read
/// through a small cache (a few entries, so reads cross from disk to cache) equals the same
/// range read from disk alone, after appends, an overwrite of the tail, a truncation and a
/// purge.
#[tokio::test]
async fn cached_reads_equal_disk_reads() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cached_dir = tmp.path().join("cached");
    let disk_dir = tmp.path().join("disk");
    // Each entry counts 64 bytes of overhead and about 7 of command: four fit in 300 bytes.
    let mut cached = open_cached(&cached_dir, 1 << 10, 300);
    let mut disk = open_cached(&disk_dir, 1 << 10, 0);
    async fn both(a: &mut LogStore, b: &mut LogStore, step: u8) {
        match step {
            0 => {
                append_range(a, 1, 1, 40).await;
                append_range(b, 1, 1, 40).await;
            }
            // A new leader overwrites the tail from 38 on.
            1 => {
                let at = Some(log_id::<TypeConfig>(1, 1, 37));
                a.truncate_after(at).await.expect("truncate");
                b.truncate_after(at).await.expect("truncate");
                append_range(a, 2, 38, 45).await;
                append_range(b, 2, 38, 45).await;
            }
            2 => {
                let at = Some(log_id::<TypeConfig>(2, 1, 43));
                a.truncate_after(at).await.expect("truncate");
                b.truncate_after(at).await.expect("truncate");
            }
            _ => {
                let at = log_id::<TypeConfig>(2, 1, 41);
                a.purge(at).await.expect("purge");
                b.purge(at).await.expect("purge");
            }
        }
    }
    for step in 0..4u8 {
        both(&mut cached, &mut disk, step).await;
        for start in 0..48u64 {
            for end in [start, start + 1, start + 3, start + 9, 50] {
                let got = cached.try_get_log_entries(start..end).await.expect("read");
                let want = disk.try_get_log_entries(start..end).await.expect("read");
                assert_eq!(got, want, "step {step}, range {start}..{end}");
            }
        }
    }
    let last = cached.try_get_log_entries(0..100).await.expect("read");
    assert_eq!(last.first().map(RaftEntry::index), Some(42));
    assert_eq!(last.last(), Some(&entry(2, 43)));
}

/// A range that is empty, or starts past its end, reads as nothing (it used to underflow when
/// the range ended inside the cache).
#[tokio::test]
async fn an_empty_or_inverted_range_reads_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    let mut s = open(&dir, 1 << 20);
    append_range(&mut s, 1, 1, 10).await;
    for (a, b) in [(5, 5), (8, 3), (20, 30), (11, 2)] {
        let got = s.try_get_log_entries(a..b).await.expect("read");
        assert!(got.is_empty(), "{a}..{b}: {got:?}");
    }
}

/// Every entry's command bytes are where `command_span` says, in a live segment or, for a
/// held segment past its purge, in the archive; a release or a start that no longer holds it
/// deletes an archived segment, and a purge deletes unheld segments as before.
#[tokio::test]
async fn held_segments_outlive_their_purge_and_go_when_released() {
    use queen_ports::LogFiles as _;

    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    let archive = dir.join(super::ARCHIVE_DIR);
    let mut s = open(&dir, 1024);
    for from in (1..=300).step_by(10) {
        append_range(&mut s, 1, from, from + 9).await;
    }
    let files = s.files();
    let cmd = |i: u64| format!("cmd-{i}").into_bytes();
    let spans: Vec<_> = (1..=300)
        .map(|i| files.command_span(i, cmd(i).len()).expect("a live entry"))
        .collect();
    for (i, span) in (1..=300).zip(&spans) {
        assert_eq!(files.read(*span).expect("read"), cmd(i), "entry {i}");
    }
    assert!(files.command_span(301, 5).is_none(), "no such entry");
    let first_file = spans[0].file;
    let later_file = spans[150].file;
    assert!(
        later_file > first_file + 1,
        "the entries span several segments"
    );
    files.hold(first_file);
    files.hold(later_file);

    s.purge(log_id::<TypeConfig>(1, 1, 250))
        .await
        .expect("purge");
    let live = segments(&dir);
    let kept = segments(&archive);
    assert_eq!(
        kept.iter()
            .map(|p| p
                .file_stem()
                .unwrap()
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap())
            .collect::<Vec<_>>(),
        vec![first_file, later_file],
        "only the held segments are kept"
    );
    assert!(live.len() < 10, "the rest was deleted: {live:?}");
    assert_eq!(files.read(spans[0]).expect("archived read"), cmd(1));
    assert_eq!(files.read(spans[150]).expect("archived read"), cmd(151));

    files.release(first_file).expect("release");
    assert_eq!(segments(&archive).len(), 1);
    assert!(files.read(spans[0]).is_err(), "a released segment is gone");
    drop(files);
    drop(s);

    // After a restart the archive is not part of the log; holds are stated again.
    let s = open(&dir, 1024);
    let files = s.files();
    assert_eq!(files.read(spans[150]).expect("read after reopen"), cmd(151));
    files.set_holds(&[later_file]).expect("holds");
    assert_eq!(segments(&archive).len(), 1);
    files.set_holds(&[]).expect("no holds");
    assert!(segments(&archive).is_empty());
    drop(s);
    assert!(
        files.read(spans[299]).is_err(),
        "a closed log answers no reads"
    );
}
