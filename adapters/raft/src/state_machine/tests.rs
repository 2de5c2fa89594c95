//! Snapshot round trips (spooled and streamed from a pinned view), the pinned view's bounded
//! window, read errors that must fail an install, and meta decoding.

use std::sync::Arc;

use openraft::RaftSnapshotBuilder;
use openraft::entry::RaftEntry;
use openraft::storage::RaftStateMachine;
use openraft::testing::log_id;

use queen_ports::BackendError;
use queen_ports::SnapshotChunks;

use super::AppliedMeta;
use super::PINNED_WINDOW_CHUNKS;
use super::PinnedSnapshot;
use super::SnapshotData;
use super::StateMachineStore;
use crate::mem_backend::MemBackend;
use crate::snapshot_spool::SnapshotSpool;
use crate::snapshot_spool::SpooledSnapshot;
use crate::type_config::Command;
use crate::type_config::Entry;
use crate::type_config::TypeConfig;

/// A store with commands 1..=n applied, on its in-memory backend.
async fn applied_store(n: u64) -> (Arc<MemBackend>, StateMachineStore) {
    let backend = Arc::new(MemBackend::new());
    let mut store = StateMachineStore::open(backend.clone(), None)
        .await
        .expect("open");
    let entries: Vec<_> = (1..=n)
        .map(|i| {
            let e = Entry::new_normal(
                log_id::<TypeConfig>(1, 1, i),
                Command(format!("c{i}").into_bytes().into()),
            );
            Ok((e, None))
        })
        .collect();
    store
        .apply(futures::stream::iter(entries))
        .await
        .expect("apply");
    (backend, store)
}

/// A snapshot built now.
async fn built(store: &mut StateMachineStore) -> super::Snapshot {
    let mut builder = store.get_snapshot_builder().await;
    builder.build_snapshot().await.expect("build")
}

/// Every chunk of a view through `chunk(i)`, front to back.
fn read_all(view: &PinnedSnapshot) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(c) = view.chunk(out.len()).expect("chunk") {
        out.push(c.as_ref().clone());
    }
    out
}

/// Spool `chunks` as the raft port does with a received stream.
async fn spooled(spool: &SnapshotSpool, chunks: &[Vec<u8>]) -> SpooledSnapshot {
    let mut w = spool.create().await.expect("create");
    for c in chunks {
        w.push(c).await.expect("push");
    }
    w.finish().await.expect("finish")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_received_as_spooled_chunks_installs_the_same_state() {
    let (leader_backend, mut leader) = applied_store(300).await;
    let snap = built(&mut leader).await;
    assert_eq!(snap.meta.last_log_id, Some(log_id::<TypeConfig>(1, 1, 300)));
    assert_eq!(
        leader_backend.persists(),
        1,
        "building must persist the backend"
    );
    let SnapshotData::Pinned(view) = snap.snapshot else {
        panic!("a built snapshot is a pinned view");
    };
    let chunks = read_all(&view);
    assert!(chunks.len() > 2, "expected several chunks");
    // A second reader of the same view sees the same chunks.
    assert_eq!(read_all(&view), chunks);

    let dir = tempfile::tempdir().expect("tempdir");
    let spool = SnapshotSpool::open(dir.path()).expect("spool");
    let received = spooled(&spool, &chunks).await;
    let follower_backend = Arc::new(MemBackend::new());
    let mut follower = StateMachineStore::open(follower_backend.clone(), None)
        .await
        .expect("open");
    follower
        .install_snapshot(&snap.meta, SnapshotData::Received(received))
        .await
        .expect("install");
    assert_eq!(
        follower_backend.state().applied,
        leader_backend.state().applied
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("snapshot-spool"))
            .expect("list")
            .count(),
        0,
        "the spool file is deleted after the install"
    );
    let (applied, _) = follower.applied_state().await.expect("applied state");
    assert_eq!(applied, Some(log_id::<TypeConfig>(1, 1, 300)));
    let current = follower
        .get_current_snapshot()
        .await
        .expect("current")
        .expect("some");
    assert_eq!(current.meta, snap.meta);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_view_keeps_a_bounded_window_and_restarts_for_earlier_chunks() {
    let (_, mut leader) = applied_store(2000).await;
    let snap = built(&mut leader).await;
    let SnapshotData::Pinned(view) = snap.snapshot else {
        panic!("a built snapshot is a pinned view");
    };
    let chunks = read_all(&view);
    assert!(
        chunks.len() > 10 * PINNED_WINDOW_CHUNKS,
        "{} chunks",
        chunks.len()
    );
    let window = || view.lock().expect("lock").window.len();
    assert!(
        window() <= PINNED_WINDOW_CHUNKS,
        "the view kept {} chunks",
        window()
    );
    assert_eq!(view.restarts(), 0);

    // The chunks just read are served again from the window, without a new cursor.
    let last = chunks.len() - 1;
    for (i, chunk) in chunks
        .iter()
        .enumerate()
        .skip(last + 1 - PINNED_WINDOW_CHUNKS)
    {
        assert_eq!(view.chunk(i).expect("chunk").as_deref(), Some(chunk));
    }
    assert!(view.chunk(last + 1).expect("past the end").is_none());
    assert_eq!(view.restarts(), 0);

    // An earlier chunk: a fresh cursor on the same pinned view gives the same bytes.
    assert_eq!(view.chunk(3).expect("chunk").as_deref(), Some(&chunks[3]));
    assert_eq!(view.restarts(), 1);
    assert!(window() <= PINNED_WINDOW_CHUNKS);
    // Two readers far apart take turns: each catch-up restarts, and the window stays small.
    for i in 4..chunks.len() {
        assert_eq!(view.chunk(i).expect("chunk").as_deref(), Some(&chunks[i]));
        assert_eq!(
            view.chunk(i / 4).expect("chunk").as_deref(),
            Some(&chunks[i / 4])
        );
        assert!(window() <= PINNED_WINDOW_CHUNKS);
    }
    // The view pinned before the writes below still reads as it was.
    leader
        .apply(futures::stream::iter(vec![Ok((
            Entry::new_normal(
                log_id::<TypeConfig>(1, 1, 2001),
                Command(bytes::Bytes::from_static(b"late")),
            ),
            None,
        ))]))
        .await
        .expect("apply");
    assert_eq!(read_all(&view), chunks);
    let cursor: Vec<Vec<u8>> = view
        .cursor()
        .expect("cursor")
        .collect::<Result<_, _>>()
        .expect("chunks");
    assert_eq!(cursor, chunks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_pinned_view_installs_by_streaming() {
    let (leader_backend, mut leader) = applied_store(500).await;
    let snap = built(&mut leader).await;
    let (other_backend, mut other) = applied_store(7).await;
    other
        .install_snapshot(&snap.meta, snap.snapshot)
        .await
        .expect("install");
    assert_eq!(
        other_backend.state().applied,
        leader_backend.state().applied
    );
}

/// A view whose reads fail at chunk `fail_at`.
struct FailingChunks {
    /// Chunks handed out so far.
    given: usize,
    /// The read that fails.
    fail_at: usize,
}

impl SnapshotChunks for FailingChunks {
    fn meta(&self) -> Vec<u8> {
        Vec::new()
    }

    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, BackendError> {
        if self.given == self.fail_at {
            return Err(BackendError::Storage("disk went away".into()));
        }
        self.given += 1;
        // The in-memory backend's header chunk (no index), then empty record chunks.
        Ok(Some(if self.given == 1 {
            vec![0; 9]
        } else {
            Vec::new()
        }))
    }

    fn restart(&self) -> Result<Box<dyn SnapshotChunks>, BackendError> {
        Ok(Box::new(FailingChunks {
            given: 0,
            fail_at: self.fail_at,
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_error_in_the_middle_fails_the_install_and_keeps_the_old_state() {
    let (backend, mut store) = applied_store(50).await;
    let before = backend.state();
    let meta = crate::type_config::SnapshotMeta {
        last_log_id: Some(log_id::<TypeConfig>(2, 1, 900)),
        ..Default::default()
    };

    // Our own view, failing at its fourth chunk.
    let view = PinnedSnapshot::new(Box::new(FailingChunks {
        given: 0,
        fail_at: 3,
    }));
    let err = store
        .install_snapshot(&meta, SnapshotData::Pinned(view))
        .await
        .expect_err("a failed read must fail the install");
    assert!(err.to_string().contains("disk went away"), "{err}");

    // A spooled file cut short.
    let dir = tempfile::tempdir().expect("tempdir");
    let spool = SnapshotSpool::open(dir.path()).expect("spool");
    let chunks: Vec<Vec<u8>> = std::iter::once(vec![0; 9])
        .chain((0..5).map(|i| {
            let mut c = (1000u64 + i).to_le_bytes().to_vec();
            c.extend_from_slice(&3u32.to_le_bytes());
            c.extend_from_slice(b"abc");
            c
        }))
        .collect();
    let received = spooled(&spool, &chunks).await;
    let file = std::fs::read_dir(dir.path().join("snapshot-spool"))
        .expect("list")
        .next()
        .expect("one file")
        .expect("entry")
        .path();
    let len = std::fs::metadata(&file).expect("stat").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open")
        .set_len(len - 5)
        .expect("cut");
    let err = store
        .install_snapshot(&meta, SnapshotData::Received(received))
        .await
        .expect_err("a short spool file must fail the install");
    assert!(err.to_string().contains("spooled snapshot"), "{err}");
    assert!(
        !file.exists(),
        "the spool file is deleted after a failed install too"
    );

    assert_eq!(backend.state(), before, "the old state stays in place");
    assert_eq!(backend.installs(), 0);
}

#[test]
fn meta_round_trips_and_rejects_unknown_versions() {
    let meta = AppliedMeta {
        last_applied: Some(log_id::<TypeConfig>(3, 2, 9)),
        ..Default::default()
    };
    let bytes = meta.encode().expect("encode");
    assert_eq!(AppliedMeta::decode(&bytes).expect("decode"), meta);
    assert_eq!(
        AppliedMeta::decode(&[]).expect("empty"),
        AppliedMeta::default()
    );
    assert!(AppliedMeta::decode(&[9, 0]).is_err());
}
