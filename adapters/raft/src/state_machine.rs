//! The openraft state machine over a `StateMachineBackend` port: applying committed entries in
//! batches, the applied-state metadata stored atomically with them, and snapshots.
//!
//! Snapshots are logical and lazy. Building one pins a consistent view of the backend
//! (`StateMachineBackend::snapshot`) and makes everything applied durable (`persist`), so openraft
//! may purge the log up to it. Nothing is written for the snapshot itself: the current one's
//! metadata is kept in memory, and after a restart openraft finds none and builds a new one at
//! the durable last-applied point.
//!
//! Memory never grows with the snapshot. A sender reads the pinned view chunk by chunk, keeping
//! only the last few (`PINNED_WINDOW_CHUNKS`); a reader that goes back gets a fresh cursor on the
//! same view. The receiving raft port spools the streamed chunks to a file
//! (`snapshot_spool`), and the install reads them back one at a time into the backend.

use std::collections::VecDeque;
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

use crate::snapshot_spool::SpooledSnapshot;
use crate::type_config::LogId;
use crate::type_config::Reply;
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

/// How many of the chunks read last a pinned view keeps for its readers. A reader that asks
/// again for one of them (a chunk it just read, or a second reader close behind) is served from
/// here; one that asks for an earlier chunk gets a fresh cursor on the same pinned view. Chunks
/// are about 1 MiB, so a view costs this many MiB however large the snapshot.
const PINNED_WINDOW_CHUNKS: usize = 2;

/// A pinned backend view, shared by everyone who reads the current snapshot. Memory is bounded
/// by [`PINNED_WINDOW_CHUNKS`]: the view is re-read from its start (`SnapshotChunks::restart`)
/// rather than kept.
#[derive(Clone)]
pub(crate) struct PinnedSnapshot {
    /// The cursor and the window of chunks read last.
    inner: Arc<Mutex<PinnedInner>>,
    /// The meta bytes stored with the view's last applied batch.
    meta: Arc<Vec<u8>>,
}

/// The mutable part of a pinned view.
struct PinnedInner {
    /// The backend's cursor on the view; it yields chunk number `next` next.
    source: Box<dyn SnapshotChunks>,
    /// The number of the chunk `source` yields next.
    next: usize,
    /// The chunks just before `next`, oldest first, at most `PINNED_WINDOW_CHUNKS`.
    window: VecDeque<Arc<Vec<u8>>>,
    /// How many chunks the view has, once a cursor reached its end.
    total: Option<usize>,
    /// Cursors opened after the first (reported by tests).
    restarts: usize,
}

impl PinnedSnapshot {
    fn new(view: Box<dyn SnapshotChunks>) -> Self {
        let meta = Arc::new(view.meta());
        Self {
            inner: Arc::new(Mutex::new(PinnedInner {
                source: view,
                next: 0,
                window: VecDeque::with_capacity(PINNED_WINDOW_CHUNKS),
                total: None,
                restarts: 0,
            })),
            meta,
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, PinnedInner>, BackendError> {
        self.inner
            .lock()
            .map_err(|_| BackendError::Storage("snapshot view lock poisoned".into()))
    }

    /// Chunk number `i`, or `None` past the end (blocking: call off the async workers).
    pub(crate) fn chunk(&self, i: usize) -> Result<Option<Arc<Vec<u8>>>, BackendError> {
        let mut inner = self.lock()?;
        if inner.total.is_some_and(|total| i >= total) {
            return Ok(None);
        }
        let first_kept = inner.next - inner.window.len();
        if i < first_kept {
            // Behind the window: read the same pinned view again from its start.
            inner.source = inner.source.restart()?;
            inner.next = 0;
            inner.window.clear();
            inner.restarts += 1;
        }
        while inner.next <= i {
            match inner.source.next_chunk()? {
                Some(c) => {
                    if inner.window.len() == PINNED_WINDOW_CHUNKS {
                        inner.window.pop_front();
                    }
                    inner.window.push_back(Arc::new(c));
                    inner.next += 1;
                }
                None => {
                    inner.total = Some(inner.next);
                    return Ok(None);
                }
            }
        }
        let at = i + inner.window.len() - inner.next;
        Ok(inner.window.get(at).cloned())
    }

    /// A cursor of its own on the same view, from the first chunk, for one reader that goes
    /// front to back (an install of this node's own view); nothing is kept for others.
    pub(crate) fn cursor(&self) -> Result<ChunkCursor, BackendError> {
        Ok(ChunkCursor {
            source: Some(self.lock()?.source.restart()?),
        })
    }

    /// Cursors opened on the view after the first one.
    #[cfg(test)]
    fn restarts(&self) -> usize {
        self.lock().map(|i| i.restarts).unwrap_or(0)
    }
}

/// The chunks of one cursor on a pinned view as the iterator `install_snapshot` takes: a read
/// error is an `Err` item (then the end), never an early end.
pub(crate) struct ChunkCursor {
    /// The cursor; `None` after its end or an error.
    source: Option<Box<dyn SnapshotChunks>>,
}

impl Iterator for ChunkCursor {
    type Item = Result<Vec<u8>, BackendError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.source.as_mut()?.next_chunk().transpose();
        if !matches!(item, Some(Ok(_))) {
            self.source = None;
        }
        item
    }
}

/// The snapshot payload: a pinned view on the sending side, a spooled file on the receiving
/// side. Both sides share this type because openraft hands a snapshot from the state machine to
/// the network and from the network to the state machine.
pub(crate) enum SnapshotData {
    /// A consistent view of this node's state.
    Pinned(PinnedSnapshot),
    /// Chunks received from a leader, spooled to disk by the raft port's snapshot route (the
    /// file goes when this is dropped).
    Received(SpooledSnapshot),
}

/// A snapshot with our snapshot data.
pub(crate) type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;

/// The raft handle, generic over our state machine.
pub(crate) type Raft = openraft::Raft<TypeConfig, StateMachineStore>;

/// The current snapshot, kept in memory only.
#[derive(Clone)]
struct CurrentSnapshot {
    /// Its metadata.
    meta: SnapshotMeta,
}

/// Where the log wrote a live entry's command: (log index, command length) -> its span.
pub(crate) type CommandSpans =
    Arc<dyn Fn(u64, usize) -> Option<queen_ports::LogSpan> + Send + Sync>;

/// The log's files as the backend reads them, and where the log wrote each command.
pub(crate) struct LogHandles {
    pub(crate) files: Arc<dyn queen_ports::LogFiles>,
    pub(crate) spans: CommandSpans,
}

/// Apply batches whose commands add up to at most this many bytes run on the state machine's
/// own task instead of a blocking thread. Such a batch applies in well under a millisecond (a
/// push costs about 1 µs per message to apply, 256 KiB is 800-1,000 messages), while the two
/// thread hand-offs of `spawn_blocking` cost every entry its wake-ups: measured with
/// `queen-bench --seconds 5 cluster --rounds 1 --backlog 0`, four A/B pairs, server CPU per
/// message fell from 22.4 to 17.2 µs for pop + ack, 10.7 to 9.1 for QPB1 batches and 58.7 to 53.2
/// for single pushes (64 KiB kept the pop gain but not the batches'). Larger batches (a backlog
/// being caught up, a follower's long append) still go to a blocking thread.
const INLINE_APPLY_BYTES: usize = 256 * 1024;

/// openraft's state machine over the backend port.
pub(crate) struct StateMachineStore {
    /// Where entries are applied.
    backend: Arc<dyn StateMachineBackend>,
    /// The log's files and where it wrote each command, to tell the backend.
    files: Option<LogHandles>,
    /// The last applied membership, carried into every batch's meta.
    last_membership: StoredMembership,
    /// The latest snapshot, shared with snapshot builders (which run in their own task).
    current: Arc<Mutex<Option<CurrentSnapshot>>>,
    /// Call the backend on the caller's task instead of a blocking thread for every call (the
    /// deterministic simulation runs everything on one thread; never set in the product, where
    /// only small apply batches run inline, see `INLINE_APPLY_BYTES`).
    inline: bool,
}

impl StateMachineStore {
    /// Wrap `backend`, reading its stored meta; with `files`, hand the log's files to it first.
    pub(crate) async fn open(
        backend: Arc<dyn StateMachineBackend>,
        files: Option<LogHandles>,
    ) -> io::Result<Self> {
        Self::open_with(backend, files, false).await
    }

    /// `open`, choosing whether backend calls run inline (see `inline`).
    pub(crate) async fn open_with(
        backend: Arc<dyn StateMachineBackend>,
        files: Option<LogHandles>,
        inline: bool,
    ) -> io::Result<Self> {
        if let Some(f) = &files {
            let (handle, b) = (f.files.clone(), backend.clone());
            blocking(inline, move || b.attach_log(handle)).await?;
        }
        let meta = load_meta(&backend, inline).await?;
        Ok(Self {
            inline,
            backend,
            files,
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
            let mut span = None;
            let command = match entry.payload {
                EntryPayload::Normal(cmd) => {
                    span = self
                        .files
                        .as_ref()
                        .and_then(|f| (f.spans)(entry.log_id.index, cmd.0.len()));
                    Some(cmd.0)
                }
                EntryPayload::Blank => None,
                EntryPayload::Membership(m) => {
                    self.last_membership = StoredMembership::new(Some(entry.log_id), m);
                    None
                }
            };
            entries.push(ApplyEntry {
                index: entry.log_id.index,
                command,
                answered: responder.is_some(),
                span,
            });
            responders.push(responder);
        }
        let meta = AppliedMeta {
            last_applied: Some(last),
            last_membership: self.last_membership.clone(),
        }
        .encode()?;

        let count = entries.len();
        // A batch of small commands (single pushes, pops, acks, KV writes) is applied on this
        // task: handing it to a blocking thread and back cost more than the apply itself.
        let bytes: usize = entries
            .iter()
            .map(|e| e.command.as_ref().map_or(0, bytes::Bytes::len))
            .sum();
        let inline = self.inline || bytes <= INLINE_APPLY_BYTES;
        let backend = self.backend.clone();
        let responses = blocking(inline, move || backend.apply(entries, meta)).await?;
        if responses.len() != count {
            return Err(io::Error::other(format!(
                "state machine returned {} responses for {count} entries",
                responses.len()
            )));
        }
        for (responder, response) in responders.into_iter().zip(responses) {
            if let Some(r) = responder {
                r.send(Reply(response));
            }
        }
        Ok(())
    }
}

/// Run a blocking backend call off the async workers (on this task when `inline`); map its
/// error to `io::Error`.
async fn blocking<T, F>(inline: bool, f: F) -> io::Result<T>
where
    F: FnOnce() -> Result<T, BackendError> + Send + 'static,
    T: Send + 'static,
{
    if inline {
        return f().map_err(io::Error::other);
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("state machine task failed: {e}")))?
        .map_err(io::Error::other)
}

async fn load_meta(
    backend: &Arc<dyn StateMachineBackend>,
    inline: bool,
) -> io::Result<AppliedMeta> {
    let backend = backend.clone();
    let bytes = blocking(inline, move || backend.load_meta()).await?;
    AppliedMeta::decode(bytes.as_deref().unwrap_or_default())
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let meta = load_meta(&self.backend, self.inline).await?;
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
        let view = blocking(self.inline, move || backend.snapshot()).await;
        SnapshotBuilder {
            inline: self.inline,
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
        let meta_bytes = AppliedMeta {
            last_applied: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
        }
        .encode()?;
        let backend = self.backend.clone();
        // The chunks are read one at a time as the backend takes them, from the spooled file or
        // a cursor of our own view; the spool file is deleted when `snapshot` drops, installed
        // or not.
        blocking(self.inline, move || match snapshot {
            SnapshotData::Received(spooled) => {
                let mut chunks = spooled
                    .reader()
                    .map_err(|e| BackendError::Storage(format!("open spooled snapshot: {e}")))?;
                backend.install_snapshot(&mut chunks, meta_bytes)
            }
            SnapshotData::Pinned(view) => backend.install_snapshot(&mut view.cursor()?, meta_bytes),
        })
        .await?;
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
        let view = blocking(self.inline, move || backend.snapshot()).await?;
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
    /// Call the backend inline (see `StateMachineStore::inline`).
    inline: bool,
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
        blocking(self.inline, move || backend.persist()).await?;

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
mod tests;
