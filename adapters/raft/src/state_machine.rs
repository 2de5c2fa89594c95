//! The openraft state machine over a `StateMachineBackend` port: applying committed entries in
//! batches, the applied-state metadata stored atomically with them, and snapshots.
//!
//! Snapshots are logical and lazy. Building one pins a consistent view of the backend
//! (`StateMachineBackend::snapshot`) and makes everything applied durable (`persist`), so openraft
//! may purge the log up to it. Nothing is written for the snapshot itself: the current one is
//! kept in memory, and after a restart openraft finds none and builds a new one at the durable
//! last-applied point. On the receiving side the raft port collects the streamed chunks in memory
//! and they are installed through the backend.

use std::io;
use std::sync::Arc;
use std::sync::Mutex;

use futures::Stream;
use futures::TryStreamExt;
use openraft::EntryPayload;
use openraft::OptionalSend;
use openraft::RaftSnapshotBuilder;
use openraft::storage::EntryResponder;
use openraft::storage::RaftStateMachine;
use queen_ports::ApplyEntry;
use queen_ports::BackendError;
use queen_ports::SnapshotChunks;
use queen_ports::StateMachineBackend;
use serde::Deserialize;
use serde::Serialize;

use crate::type_config::LogId;
use crate::type_config::Snapshot;
use crate::type_config::SnapshotMeta;
use crate::type_config::StoredMembership;
use crate::type_config::TypeConfig;

/// Most entries handed to the backend in one `apply` call (one atomic batch).
const MAX_APPLY_BATCH: usize = 4096;

/// An apply batch is also cut at this many command bytes: the backend stages every write of a
/// batch in memory before it commits, so the batch size bounds the node's peak memory.
const MAX_APPLY_BATCH_BYTES: usize = 4 << 20;

/// Version byte in front of the encoded `AppliedMeta`.
const META_VERSION: u8 = 1;

/// What this adapter stores with every applied batch, through the backend's meta bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AppliedMeta {
    /// The last log id applied to the state.
    pub(crate) last_applied: Option<LogId>,
    /// The last membership applied to the state (membership lives in the state machine).
    pub(crate) last_membership: StoredMembership,
}

impl AppliedMeta {
    /// Encode as the opaque meta bytes the backend stores.
    pub(crate) fn encode(&self) -> io::Result<Vec<u8>> {
        let mut out = vec![META_VERSION];
        postcard::to_io(self, &mut out)
            .map_err(|e| io::Error::other(format!("encode applied meta: {e}")))?;
        Ok(out)
    }

    /// Decode meta bytes; empty bytes mean nothing was applied yet.
    pub(crate) fn decode(bytes: &[u8]) -> io::Result<AppliedMeta> {
        match bytes.split_first() {
            None => Ok(AppliedMeta::default()),
            Some((&META_VERSION, rest)) => postcard::from_bytes(rest).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("decode applied meta: {e}"),
                )
            }),
            Some((v, _)) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("applied meta version {v} is not supported"),
            )),
        }
    }
}

/// A pinned backend view, shared by everyone who reads the current snapshot. The port's view is
/// read once, front to back, so the chunks read so far are kept to serve later readers; this
/// costs memory only when a snapshot is actually read (sent to a follower).
#[derive(Clone)]
pub(crate) struct PinnedSnapshot {
    /// The view and the chunks read from it so far.
    inner: Arc<Mutex<PinnedInner>>,
    /// The meta bytes stored with the view's last applied batch.
    meta: Arc<Vec<u8>>,
}

/// The mutable part of a pinned view.
struct PinnedInner {
    /// The backend's view; `None` once it reported its end.
    source: Option<Box<dyn SnapshotChunks>>,
    /// Chunks read so far, in order.
    read: Vec<Arc<Vec<u8>>>,
}

impl PinnedSnapshot {
    fn new(view: Box<dyn SnapshotChunks>) -> Self {
        let meta = Arc::new(view.meta());
        Self {
            inner: Arc::new(Mutex::new(PinnedInner {
                source: Some(view),
                read: Vec::new(),
            })),
            meta,
        }
    }

    /// Chunk number `i`, or `None` past the end.
    pub(crate) fn chunk(&self, i: usize) -> Result<Option<Arc<Vec<u8>>>, BackendError> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| BackendError::Storage("snapshot view lock poisoned".into()))?;
        while inner.read.len() <= i {
            let Some(source) = inner.source.as_mut() else {
                return Ok(None);
            };
            match source.next_chunk()? {
                Some(c) => inner.read.push(Arc::new(c)),
                None => inner.source = None,
            }
        }
        Ok(inner.read.get(i).cloned())
    }

    /// All chunks, in order.
    pub(crate) fn collect_chunks(&self) -> Result<Vec<Vec<u8>>, BackendError> {
        let mut out = Vec::new();
        let mut i = 0;
        while let Some(c) = self.chunk(i)? {
            out.push(c.as_ref().clone());
            i += 1;
        }
        Ok(out)
    }
}

/// The snapshot payload: a pinned view on the sending side, received chunks on the receiving
/// side. Both sides share this type because openraft hands a snapshot from the state machine to
/// the network and from the network to the state machine.
pub(crate) enum SnapshotData {
    /// A consistent view of this node's state.
    Pinned(PinnedSnapshot),
    /// Chunks received from a leader, in order, collected by the raft port's snapshot route.
    Received(Vec<Vec<u8>>),
}

/// The current snapshot, kept in memory only.
#[derive(Clone)]
struct CurrentSnapshot {
    /// Its metadata.
    meta: SnapshotMeta,
}

/// openraft's state machine over the backend port.
pub(crate) struct StateMachineStore {
    /// Where entries are applied.
    backend: Arc<dyn StateMachineBackend>,
    /// The last applied membership, carried into every batch's meta.
    last_membership: StoredMembership,
    /// The latest snapshot, shared with snapshot builders (which run in their own task).
    current: Arc<Mutex<Option<CurrentSnapshot>>>,
}

impl StateMachineStore {
    /// Wrap `backend`, reading its stored meta.
    pub(crate) async fn open(backend: Arc<dyn StateMachineBackend>) -> io::Result<Self> {
        let meta = load_meta(&backend).await?;
        Ok(Self {
            backend,
            last_membership: meta.last_membership,
            current: Arc::new(Mutex::new(None)),
        })
    }

    /// Apply one batch through the backend and answer its responders.
    async fn apply_batch(&mut self, batch: Vec<EntryResponder<TypeConfig>>) -> io::Result<()> {
        let Some(last) = batch.last().map(|(e, _)| e.log_id) else {
            return Ok(());
        };
        let mut entries = Vec::with_capacity(batch.len());
        let mut responders = Vec::with_capacity(batch.len());
        for (entry, responder) in batch {
            let command = match entry.payload {
                EntryPayload::Normal(cmd) => Some(cmd.0),
                EntryPayload::Blank => None,
                EntryPayload::Membership(m) => {
                    self.last_membership = StoredMembership::new(Some(entry.log_id), m);
                    None
                }
            };
            entries.push(ApplyEntry {
                index: entry.log_id.index,
                command,
            });
            responders.push(responder);
        }
        let meta = AppliedMeta {
            last_applied: Some(last),
            last_membership: self.last_membership.clone(),
        }
        .encode()?;

        let count = entries.len();
        let backend = self.backend.clone();
        let responses = blocking(move || backend.apply(entries, meta)).await?;
        if responses.len() != count {
            return Err(io::Error::other(format!(
                "state machine returned {} responses for {count} entries",
                responses.len()
            )));
        }
        for (responder, response) in responders.into_iter().zip(responses) {
            if let Some(r) = responder {
                r.send(response);
            }
        }
        Ok(())
    }
}

/// Run a blocking backend call off the async workers; map its error to `io::Error`.
async fn blocking<T, F>(f: F) -> io::Result<T>
where
    F: FnOnce() -> Result<T, BackendError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("state machine task failed: {e}")))?
        .map_err(io::Error::other)
}

async fn load_meta(backend: &Arc<dyn StateMachineBackend>) -> io::Result<AppliedMeta> {
    let backend = backend.clone();
    let bytes = blocking(move || backend.load_meta()).await?;
    AppliedMeta::decode(bytes.as_deref().unwrap_or_default())
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let meta = load_meta(&self.backend).await?;
        self.last_membership = meta.last_membership.clone();
        Ok((meta.last_applied, meta.last_membership))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        loop {
            match entries.try_next().await {
                Ok(Some(item)) => {
                    if let EntryPayload::Normal(cmd) = &item.0.payload {
                        bytes += cmd.0.len();
                    }
                    batch.push(item);
                    if batch.len() >= MAX_APPLY_BATCH || bytes >= MAX_APPLY_BATCH_BYTES {
                        self.apply_batch(std::mem::take(&mut batch)).await?;
                        bytes = 0;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // The entries gathered so far are committed and valid: apply them (answering
                    // their responders) before reporting the read failure.
                    self.apply_batch(batch).await?;
                    return Err(e);
                }
            }
        }
        self.apply_batch(batch).await
    }

    async fn try_create_snapshot_builder(&mut self, _force: bool) -> Option<SnapshotBuilder> {
        Some(self.get_snapshot_builder().await)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        // Called by the state-machine worker between batches, so the view matches the meta.
        let backend = self.backend.clone();
        let view = blocking(move || backend.snapshot()).await;
        SnapshotBuilder {
            backend: self.backend.clone(),
            view: view.map(PinnedSnapshot::new),
            current: self.current.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let chunks = match snapshot {
            SnapshotData::Received(chunks) => chunks,
            SnapshotData::Pinned(view) => {
                let view = view.clone();
                blocking(move || view.collect_chunks()).await?
            }
        };
        let meta_bytes = AppliedMeta {
            last_applied: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
        }
        .encode()?;
        let backend = self.backend.clone();
        blocking(move || backend.install_snapshot(&mut chunks.into_iter(), meta_bytes)).await?;
        self.last_membership = meta.last_membership.clone();
        let mut current = lock_current(&self.current)?;
        *current = Some(CurrentSnapshot { meta: meta.clone() });
        tracing::info!(last_log_id = ?meta.last_log_id, "snapshot installed");
        Ok(())
    }

    /// The current snapshot is served from a view pinned now, not kept pinned since it was
    /// built: a long-lived pinned view makes the engine hold every version written after it
    /// (measured: memory grew with every write after the first snapshot). A view at a later
    /// applied point is as valid a snapshot as the built one; its meta is the view's own.
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        if lock_current(&self.current)?.is_none() {
            return Ok(None);
        }
        let backend = self.backend.clone();
        let view = blocking(move || backend.snapshot()).await?;
        let view = PinnedSnapshot::new(view);
        let applied = AppliedMeta::decode(&view.meta)?;
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.last_membership,
        };
        Ok(Some(Snapshot {
            meta,
            snapshot: SnapshotData::Pinned(view),
        }))
    }
}

fn lock_current(
    current: &Mutex<Option<CurrentSnapshot>>,
) -> io::Result<std::sync::MutexGuard<'_, Option<CurrentSnapshot>>> {
    current
        .lock()
        .map_err(|_| io::Error::other("current snapshot lock poisoned"))
}

/// Builds one snapshot from a view pinned when openraft asked for the builder.
pub(crate) struct SnapshotBuilder {
    /// To make the state durable before the snapshot is reported built.
    backend: Arc<dyn StateMachineBackend>,
    /// The pinned view, or why pinning failed.
    view: io::Result<PinnedSnapshot>,
    /// Where the built snapshot becomes the current one.
    current: Arc<Mutex<Option<CurrentSnapshot>>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let view = match &self.view {
            Ok(v) => v.clone(),
            Err(e) => return Err(io::Error::new(e.kind(), format!("pin snapshot view: {e}"))),
        };
        // Everything up to (and past) the view must be durable before openraft may purge the
        // log below it.
        let backend = self.backend.clone();
        blocking(move || backend.persist()).await?;

        let applied = AppliedMeta::decode(&view.meta)?;
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.last_membership,
        };
        {
            let mut current = lock_current(&self.current)?;
            let newer = current
                .as_ref()
                .is_none_or(|c| c.meta.last_log_id <= meta.last_log_id);
            if newer {
                *current = Some(CurrentSnapshot { meta: meta.clone() });
            }
        }
        tracing::info!(last_log_id = ?meta.last_log_id, "snapshot built");
        Ok(Snapshot {
            meta,
            snapshot: SnapshotData::Pinned(view),
        })
    }
}

#[cfg(test)]
mod tests {
    //! Snapshot round trip through the receive-side representation, and meta decoding.

    use std::sync::Arc;

    use openraft::RaftSnapshotBuilder;
    use openraft::entry::RaftEntry;
    use openraft::storage::RaftStateMachine;
    use openraft::testing::log_id;

    use super::AppliedMeta;
    use super::SnapshotData;
    use super::StateMachineStore;
    use crate::mem_backend::MemBackend;
    use crate::type_config::Command;
    use crate::type_config::Entry;
    use crate::type_config::TypeConfig;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn snapshot_received_as_chunks_installs_the_same_state() {
        let leader_backend = Arc::new(MemBackend::new());
        let mut leader = StateMachineStore::open(leader_backend.clone())
            .await
            .expect("open");
        let entries: Vec<_> = (1..=300u64)
            .map(|i| {
                let e = Entry::new_normal(
                    log_id::<TypeConfig>(1, 1, i),
                    Command(format!("c{i}").into_bytes()),
                );
                Ok((e, None))
            })
            .collect();
        leader
            .apply(futures::stream::iter(entries))
            .await
            .expect("apply");

        let mut builder = leader.get_snapshot_builder().await;
        let snap = builder.build_snapshot().await.expect("build");
        assert_eq!(snap.meta.last_log_id, Some(log_id::<TypeConfig>(1, 1, 300)));
        assert_eq!(
            leader_backend.persists(),
            1,
            "building must persist the backend"
        );
        let SnapshotData::Pinned(view) = snap.snapshot else {
            panic!("a built snapshot is a pinned view");
        };
        let chunks = view.collect_chunks().expect("chunks");
        assert!(chunks.len() > 2, "expected several chunks");
        // A second reader of the same view sees the same chunks.
        assert_eq!(view.collect_chunks().expect("chunks again"), chunks);

        let follower_backend = Arc::new(MemBackend::new());
        let mut follower = StateMachineStore::open(follower_backend.clone())
            .await
            .expect("open");
        follower
            .install_snapshot(&snap.meta, SnapshotData::Received(chunks))
            .await
            .expect("install");
        assert_eq!(
            follower_backend.state().applied,
            leader_backend.state().applied
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
}
