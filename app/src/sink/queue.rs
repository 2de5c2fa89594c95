//! One queue's task: take the lease, restore from the KV documents and the bucket, read the
//! applied log into the filling window, and commit each closed window in its three fenced steps.
//!
//! The commit sequence, and where a crash can leave it:
//! 1. intent: the window's bounds fixed in KV (one batch, fenced by the lease row);
//! 2. the data objects, create-only;
//! 3. the manifest, create-only;
//! 4. the commit pointer (one batch, fenced by the lease row);
//! 5. (every `QUEEN_S3_CHECKPOINT_EVERY` windows) a checkpoint of the partitions' next offsets.
//!
//! `queen_domain::sink::commit::recover` decides what the next owner does with each state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use queen_domain::kv::{Expiry, KvOp, KvOutcome, KvResult, KvRowView};
use queen_domain::reads;
use queen_domain::sink::builder::{Builder, Closed, record_size};
use queen_domain::sink::commit::{
    Intent, LostRange, Manifest, ManifestObject, Pointer, Recovery, recover,
};
use queen_domain::sink::documents::{self, LeaseDoc, NS};
use queen_domain::sink::engine::{Action, Event, Put, Stage, Stop, WindowCommit};
use queen_domain::sink::jsonl::SinkRecord;
use queen_domain::sink::keys::WindowKeys;
use queen_domain::sink::window::{CloseReason, WindowRules};
use queen_domain::time::Stamp;
use queen_lake::PutOutcome;
use serde::{Deserialize, Serialize};

use super::config::{Format, Layout, Start};
use super::{QueueStatus, Shared};

/// How often a queue's task looks at the log.
const POLL: Duration = Duration::from_millis(200);
/// Most bytes read from one partition per look.
const READ_CHUNK: usize = 4 << 20;
/// Memory a buffered record takes beyond what `record_size` counts for the window's size: its
/// slot in the window's vector (which may be twice as long as it is full) and the allocator's
/// share of its three heap strings.
const RECORD_MEMORY_EXTRA: u64 = (2 * std::mem::size_of::<SinkRecord>() + 3 * 16) as u64 - 64;
/// A drain commits the filling window when it holds this much...
const DRAIN_MIN_BYTES: u64 = 1 << 20;
/// ... or has been open this long on the broker's clock.
const DRAIN_MIN_AGE_US: u64 = 10_000_000;
/// How long a lease release is retried.
const RELEASE_FOR: Duration = Duration::from_secs(10);

/// Test-only: `QUEEN_TEST_S3_CRASH_AT=<point>` aborts the process (as `kill -9` would) right
/// after that point of the commit sequence of the first window it reaches: `intent`, `objects`,
/// `manifest`, `pointer` or `checkpoint`. Unset (always, outside the crash tests) it does
/// nothing.
fn crash_point(point: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if AT
        .get_or_init(|| std::env::var("QUEEN_TEST_S3_CRASH_AT").ok())
        .as_deref()
        == Some(point)
    {
        tracing::error!(target: "queen-s3", point, "test crash point reached: aborting");
        std::process::abort();
    }
}

/// How a run of the queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Stopped by the node's shutdown, lease given back.
    Drained,
    /// Another node took the lease.
    Fenced,
    /// The queue is gone.
    Missing,
    /// Given back to even out placement (drained first).
    Released,
}

impl Ended {
    pub(super) fn state(self) -> &'static str {
        match self {
            Ended::Drained => "drained",
            Ended::Fenced => "fenced",
            Ended::Missing => "missing",
            Ended::Released => "released",
        }
    }
}

/// What a look at a queue's lease row found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Look {
    /// No live row: the queue is free.
    Free,
    /// A row under this instance's name, at this version.
    Mine(u64),
    /// Another instance holds it.
    Held(String),
}

/// The checkpoint document: the next offset of every partition after window `k`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Checkpoint {
    k: u64,
    t_end: u64,
    offsets: BTreeMap<String, u64>,
}

/// A window on its way through the commit sequence.
struct Pending {
    /// Where the window's commit stands, and its intent and objects.
    engine: WindowCommit,
    closed: Option<Closed>,
    lost: Vec<LostRange>,
}

/// Why a fenced batch did not land.
enum BatchError {
    /// The lease row was not ours any more.
    Fenced,
    /// Anything else (no leader, timeout, ...): retry.
    Retry(String),
}

pub(super) struct QueueTask {
    shared: Arc<Shared>,
    queue: String,
    lease_version: u64,
    lease_refreshed: Instant,
    /// Last committed window and its end.
    pointer: Pointer,
    builder: Builder,
    cursors: BTreeMap<String, u64>,
    lost: Vec<LostRange>,
    pending: Option<Pending>,
    since_checkpoint: u64,
    safe: Stamp,
    /// What failed last, while the row says `failing`.
    failure: Option<Failure>,
}

/// What kind of attempt failed, so that only a later attempt that proves the same thing (or a
/// committed window) turns the queue green again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// A restore or a step: any later successful step clears it.
    Step,
    /// A checkpoint: the next checkpoint or committed window clears it.
    Checkpoint,
    /// Only as a success: a window committed.
    Window,
}

fn rules(s: &super::config::SinkSettings) -> WindowRules {
    WindowRules {
        target_bytes: s.target_mb * 1024 * 1024,
        max_age_us: s.max_window_ms * 1000,
        align: s.align,
        guard_us: s.safe_guard_ms * 1000,
    }
}

pub(super) fn wall_iso() -> String {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    Stamp(u64::try_from(micros).unwrap_or(u64::MAX)).iso_micros()
}

fn write_result(out: &KvOutcome, i: usize) -> Option<(bool, Option<KvRowView>)> {
    match out.results.get(i)? {
        KvResult::Write {
            applied, current, ..
        } => Some((*applied, current.clone())),
        _ => None,
    }
}

impl QueueTask {
    pub(super) fn new(shared: Arc<Shared>, queue: String) -> Self {
        let r = rules(&shared.settings);
        Self {
            shared,
            queue,
            lease_version: 0,
            lease_refreshed: Instant::now(),
            pointer: Pointer { k: 0, t_end: 0 },
            builder: Builder::new(r, Stamp(0)),
            cursors: BTreeMap::new(),
            lost: Vec::new(),
            pending: None,
            since_checkpoint: 0,
            safe: Stamp(0),
            failure: None,
        }
    }

    fn set(&self, f: impl FnOnce(&mut QueueStatus)) {
        self.shared.update_queue(&self.queue, f);
    }

    /// A failed attempt (restore, read, a commit step, the lease refresh): logged once, and the
    /// queue's row turns red at once (`failing`, `lastError`) until an attempt succeeds.
    fn error(&mut self, e: &str) {
        tracing::warn!(target: "queen-s3", queue = %self.queue, error = %e, "sink queue error");
        self.failure = Some(Failure::Step);
        let e = e.to_owned();
        self.set(|q| q.fail(e));
    }

    /// An attempt of `kind` succeeded: a failure of that kind is over. A committed window (which
    /// wrote the lake and the KV store) ends a failure of any kind.
    fn succeeded(&mut self, kind: Failure) {
        if self
            .failure
            .is_some_and(|f| f == kind || kind == Failure::Window)
        {
            self.failure = None;
            self.set(|q| q.failing = false);
        }
    }

    fn ttl_secs(&self) -> u64 {
        self.shared.settings.lease_ttl_ms.div_ceil(1000)
    }

    fn lease_doc(&self) -> Vec<u8> {
        serde_json::to_vec(&LeaseDoc {
            holder: self.shared.settings.instance.clone(),
            since: wall_iso(),
        })
        .unwrap_or_default()
    }

    fn lease_key(&self) -> String {
        documents::lease_key(&self.shared.settings.name, &self.queue)
    }

    fn writer(&self) -> String {
        let s = &self.shared.settings;
        let enc = match s.format {
            Format::Jsonl => format!("jsonl+{}", s.compression.as_str()),
            Format::Parquet => format!("parquet+{}", s.parquet_codec.as_str()),
        };
        let layout = if s.layout == Layout::PerPartition {
            " per-partition"
        } else {
            ""
        };
        format!(
            "queen-s3/{} {enc}/{}{layout}",
            env!("CARGO_PKG_VERSION"),
            queen_lake::encode::ENCODING
        )
    }

    /// Read the queue's lease row: free, written under this instance's name (a run of this
    /// node before a restart), or held by another instance.
    pub(super) async fn look(&self) -> Result<Look, String> {
        let got = self
            .shared
            .log
            .sink_kv(vec![KvOp::Get {
                ns: NS.into(),
                key: self.lease_key(),
            }])
            .await
            .map_err(|e| e.to_string())?;
        let current = match got.results.first() {
            Some(KvResult::Get(row)) => row.clone(),
            _ => None,
        };
        Ok(match current {
            None => Look::Free,
            Some(row) => {
                let holder = serde_json::from_slice::<LeaseDoc>(&row.value)
                    .map(|d| d.holder)
                    .unwrap_or_default();
                if holder == self.shared.settings.instance {
                    Look::Mine(row.version)
                } else {
                    Look::Held(holder)
                }
            }
        })
    }

    /// Write the lease row at version `expect` (0: put-if-absent): `Ok(None)` when it is ours,
    /// `Ok(Some(holder))` when another instance got there first.
    pub(super) async fn take(&mut self, expect: u64) -> Result<Option<String>, String> {
        let put = KvOp::Put {
            ns: NS.into(),
            key: self.lease_key(),
            value: self.lease_doc(),
            expiry: Expiry::Ttl(self.ttl_secs()),
            expect: Some(expect),
            required: true,
        };
        let out = self
            .shared
            .log
            .sink_kv(vec![put])
            .await
            .map_err(|e| e.to_string())?;
        match write_result(&out, 0) {
            Some((true, Some(row))) => {
                self.lease_version = row.version;
                self.lease_refreshed = Instant::now();
                Ok(None)
            }
            Some((false, Some(row))) => Ok(Some(
                serde_json::from_slice::<LeaseDoc>(&row.value)
                    .map(|d| d.holder)
                    .unwrap_or_default(),
            )),
            _ => Err("the lease write answered nothing".into()),
        }
    }

    /// One KV batch whose first operation rewrites the lease row at the version this node last
    /// wrote: the fence.
    async fn fenced(&mut self, mut rest: Vec<KvOp>) -> Result<(), BatchError> {
        let mut ops = vec![KvOp::Put {
            ns: NS.into(),
            key: self.lease_key(),
            value: self.lease_doc(),
            expiry: Expiry::Ttl(self.ttl_secs()),
            expect: Some(self.lease_version),
            required: true,
        }];
        ops.append(&mut rest);
        let out = self
            .shared
            .log
            .sink_kv(ops)
            .await
            .map_err(|e| BatchError::Retry(e.to_string()))?;
        if out.failed == Some(0) {
            self.shared
                .telemetry
                .metrics()
                .s3()
                .precondition_lost(&self.queue);
            return Err(BatchError::Fenced);
        }
        if let Some(i) = out.failed {
            return Err(BatchError::Retry(format!(
                "operation {i} of the batch was refused"
            )));
        }
        match write_result(&out, 0) {
            Some((true, Some(row))) => {
                self.lease_version = row.version;
                self.lease_refreshed = Instant::now();
                Ok(())
            }
            _ => Err(BatchError::Retry("the lease write answered nothing".into())),
        }
    }

    async fn put_doc(&mut self, key: String, value: Vec<u8>) -> Result<(), BatchError> {
        self.fenced(vec![KvOp::Put {
            ns: NS.into(),
            key,
            value,
            expiry: Expiry::Forever,
            expect: None,
            required: true,
        }])
        .await
    }

    fn keys(&self, k: u64, start: u64, end: u64) -> WindowKeysOwned {
        let s = &self.shared.settings;
        WindowKeysOwned {
            prefix: s.prefix.clone(),
            tenant: s.tenant.clone(),
            queue: self.queue.clone(),
            k,
            start,
            end,
            align: s.align,
        }
    }

    /// Run the queue while this node holds its lease.
    pub(super) async fn run(&mut self) -> Ended {
        self.set(|q| q.state = "restoring");
        loop {
            match self.restore().await {
                Ok(()) => {
                    self.succeeded(Failure::Step);
                    break;
                }
                Err(BatchError::Fenced) => return Ended::Fenced,
                Err(BatchError::Retry(e)) => {
                    self.error(&e);
                    if self.pause(Duration::from_secs(1)).await {
                        return self.release().await;
                    }
                    // Keep the lease while the restore waits (a bucket that is down, say), so
                    // that a slow restore does not hand the queue to another node.
                    if self.lease_refreshed.elapsed()
                        >= Duration::from_millis(self.shared.settings.lease_ttl_ms / 3)
                        && let Err(BatchError::Fenced) = self.fenced(Vec::new()).await
                    {
                        return Ended::Fenced;
                    }
                    if self.lease_refreshed.elapsed()
                        > Duration::from_millis(self.shared.settings.lease_ttl_ms)
                    {
                        return Ended::Fenced;
                    }
                }
            }
        }
        let mut backoff = POLL;
        loop {
            if *self.shared.stop.borrow() {
                return self.drain().await;
            }
            if self.shared.giving_back(&self.queue) {
                tracing::info!(target: "queen-s3", queue = %self.queue, "giving the queue back to even out placement");
                return match self.drain().await {
                    Ended::Drained => Ended::Released,
                    other => other,
                };
            }
            match self.step(false).await {
                Ok(Some(end)) => return end,
                Ok(None) => {
                    self.succeeded(Failure::Step);
                    backoff = POLL;
                }
                Err(BatchError::Fenced) => return Ended::Fenced,
                Err(BatchError::Retry(e)) => {
                    self.error(&e);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
            self.publish();
            if self.pause(backoff).await {
                continue;
            }
        }
    }

    /// Sleep, waking early on shutdown; answers whether shutdown began.
    async fn pause(&self, d: Duration) -> bool {
        let mut stop = self.shared.stop.clone();
        if *stop.borrow() {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(d) => false,
            _ = stop.changed() => true,
        }
    }

    /// Read the documents, decide what a crash left, and set up the window to fill.
    async fn restore(&mut self) -> Result<(), BatchError> {
        let s = self.shared.settings.clone();
        self.shared
            .log
            .sink_barrier()
            .await
            .map_err(|e| BatchError::Retry(e.to_string()))?;
        let (pointer, intent, safe) = {
            let state = self.shared.log.applied();
            let now = self.shared.log.wall_clock();
            let pointer = documents::pointer(&*state, &s.name, &self.queue, now)
                .map_err(|e| BatchError::Retry(e.to_string()))?;
            let intent = documents::intent(&*state, &s.name, &self.queue, now)
                .map_err(|e| BatchError::Retry(e.to_string()))?;
            let safe = reads::safe_time(&*state).map_err(|e| BatchError::Retry(e.to_string()))?;
            (pointer, intent, safe)
        };
        let manifest = match intent
            .as_ref()
            .filter(|i| i.k > pointer.as_ref().map_or(0, |p| p.k))
        {
            Some(i) => {
                let key = self.keys(i.k, i.t_start, i.t_end).get().manifest();
                match self
                    .shared
                    .lake
                    .get(&key)
                    .await
                    .map_err(|e| BatchError::Retry(e.to_string()))?
                {
                    Some(b) => serde_json::from_slice::<Manifest>(&b).ok(),
                    None => None,
                }
            }
            None => None,
        };
        let decision = recover(
            pointer.as_ref(),
            intent.as_ref(),
            manifest.as_ref(),
            &self.writer(),
        )
        .map_err(|e| BatchError::Retry(e.to_string()))?;
        let r = rules(&s);
        let base = match &pointer {
            Some(p) => p.clone(),
            None if s.start == Start::Latest => {
                // First sight of the queue with `latest`: the lake starts now, and the pointer
                // says so, so that every later owner starts at the same place.
                let p = Pointer {
                    k: 0,
                    t_end: safe.0 + 1,
                };
                self.put_doc(
                    documents::pointer_key(&s.name, &self.queue),
                    serde_json::to_vec(&p).unwrap_or_default(),
                )
                .await?;
                p
            }
            None => Pointer { k: 0, t_end: 0 },
        };
        self.pointer = base.clone();
        self.cursors = self.load_checkpoint(base.k).await;
        match decision {
            Recovery::Continue { .. } => {
                self.builder = Builder::new(r, Stamp(base.t_end));
            }
            Recovery::Redo(i) => {
                tracing::info!(target: "queen-s3", queue = %self.queue, k = i.k, "redoing a window from its intent");
                self.builder = Builder::at(r, Stamp(i.t_start));
                self.pending = Some(Pending {
                    engine: WindowCommit::redo(i),
                    closed: None,
                    lost: Vec::new(),
                });
            }
            Recovery::CommitUploaded {
                intent: i,
                manifest: m,
            } => {
                tracing::info!(target: "queen-s3", queue = %self.queue, k = i.k, "committing a window another run uploaded");
                self.builder = Builder::new(r, Stamp(i.t_end));
                self.pending = Some(Pending {
                    engine: WindowCommit::commit_uploaded(i, m.objects),
                    closed: None,
                    lost: m.lost,
                });
            }
        }
        self.set(|q| {
            q.k = base.k;
            q.t_end = base.t_end;
        });
        Ok(())
    }

    /// The partitions' next offsets from the newest checkpoint at or before window `k`.
    async fn load_checkpoint(&self, k: u64) -> BTreeMap<String, u64> {
        let every = self.shared.settings.checkpoint_every;
        let kc = k - k % every;
        if kc == 0 {
            return BTreeMap::new();
        }
        let key = self.keys(kc, 0, 0).get().checkpoint();
        match self.shared.lake.get(&key).await {
            Ok(Some(b)) => queen_lake::encode::decompress(&b, queen_lake::Compression::Zstd)
                .ok()
                .and_then(|raw| serde_json::from_slice::<Checkpoint>(&raw).ok())
                .map(|c| c.offsets)
                .unwrap_or_default(),
            Ok(None) => BTreeMap::new(),
            Err(e) => {
                tracing::info!(target: "queen-s3", queue = %self.queue, error = %e, "no checkpoint; reading the queue from its start");
                BTreeMap::new()
            }
        }
    }

    /// What this queue holds in memory against the node's budget: the filling window and a
    /// closed one until its objects are uploaded.
    fn buffered(&self) -> u64 {
        let closed = self.pending.as_ref().and_then(|p| p.closed.as_ref());
        self.filling_memory()
            + closed.map_or(0, |c| {
                c.records
                    .iter()
                    .map(|r| record_size(r) + RECORD_MEMORY_EXTRA)
                    .sum()
            })
    }

    /// What the filling window holds in memory.
    fn filling_memory(&self) -> u64 {
        self.builder.bytes() + self.builder.len() as u64 * RECORD_MEMORY_EXTRA
    }

    /// One look: refresh the lease when due, move a pending window on, or read and maybe close.
    async fn step(&mut self, draining: bool) -> Result<Option<Ended>, BatchError> {
        let r = self.look_once(draining).await;
        self.shared.set_buffered(&self.queue, self.buffered());
        r
    }

    async fn look_once(&mut self, draining: bool) -> Result<Option<Ended>, BatchError> {
        if self.lease_refreshed.elapsed()
            >= Duration::from_millis(self.shared.settings.lease_ttl_ms / 3)
        {
            self.fenced(Vec::new()).await?;
        }
        let shared = self.shared.clone();
        let permit = shared.fetch.acquire().await;
        let present = self.read();
        drop(permit);
        if !present? {
            return Ok(Some(Ended::Missing));
        }
        if self.pending.is_some() {
            return self.advance().await.map(|()| None);
        }
        let pressure = !draining
            && self
                .shared
                .memory_pressure(&self.queue, self.filling_memory());
        let close = if draining {
            self.drain_close()
        } else {
            self.builder.poll(self.safe, pressure)
        };
        if let Some((end, reason)) = close
            && let Some(closed) = self.builder.close(end, reason)
        {
            let intent = Intent {
                k: self.pointer.k + 1,
                t_start: closed.start.0,
                t_end: closed.end.0,
                writer: self.writer(),
            };
            tracing::debug!(target: "queen-s3", queue = %self.queue, k = intent.k, records = closed.records.len(), ?reason, "window closed");
            self.pending = Some(Pending {
                engine: WindowCommit::new(intent),
                closed: Some(closed),
                lost: std::mem::take(&mut self.lost),
            });
            return self.advance().await.map(|()| None);
        }
        Ok(None)
    }

    /// Read what the applied log holds beyond each partition's cursor into the builder. Answers
    /// false when the queue is gone.
    fn read(&mut self) -> Result<bool, BatchError> {
        let shared = self.shared.clone();
        let state = shared.log.applied();
        let err = |e: queen_domain::StoreError| BatchError::Retry(e.to_string());
        self.safe = reads::safe_time(&*state).map_err(err)?;
        let Some(view) = reads::queue_view(&*state, &self.queue).map_err(err)? else {
            return Ok(false);
        };
        shared.telemetry.metrics().s3().fetch_call(&self.queue);
        // A window being redone must be read whole, whatever the budget says now (it closed
        // within the budget of its first run), and nothing past its end is needed yet.
        let redo_end = self
            .pending
            .as_ref()
            .filter(|p| p.engine.stage() == Stage::Rebuild)
            .map(|p| Stamp(p.engine.intent().t_end));
        let pending_bytes = self.buffered() - self.filling_memory();
        let budget_full = |b: &Builder| {
            redo_end.is_none()
                && (b.bytes() >= rules(&shared.settings).target_bytes || shared.over_budget())
        };
        // Each partition's cursor and the stamp of its first unread record (None at its head).
        let mut heads: Vec<(usize, u64, Option<Stamp>)> = Vec::with_capacity(view.partitions.len());
        for (i, p) in view.partitions.iter().enumerate() {
            let mut cursor = self.cursors.get(&p.name).copied().unwrap_or(0);
            if p.log_start > cursor {
                let purged = reads::purged_stamp(&*state, p.pid).map_err(err)?;
                if purged.is_some_and(|t| t >= self.builder.prev_end()) {
                    let range = LostRange {
                        partition: p.name.clone(),
                        from: cursor,
                        to: p.log_start - 1,
                    };
                    tracing::warn!(target: "queen-s3", queue = %self.queue, partition = %p.name, from = range.from, to = range.to, "records deleted by retention before the sink read them");
                    self.lost.push(range);
                }
                cursor = p.log_start;
            }
            let next = peek(&*state, p, cursor).map_err(err)?;
            heads.push((i, cursor, next));
        }
        // Read in stamp order: always from the partition whose first unread record is oldest, so
        // what is buffered is the oldest part of the log across partitions and a window can
        // close with what it holds once the buffer is full (when its records are older than the
        // guard; until then reading waits, and the budget holds). Stop when every partition is
        // at its head, or when the buffer is full. A full buffer still takes the unread records
        // stamped like its newest one (the rest of one log entry, at most a request's worth):
        // a window ends between stamps, so without them it could never close.
        let mut newest = self.builder.newest();
        // Once full: read nothing stamped after the newest record buffered at that moment.
        let mut limit: Option<Option<Stamp>> = None;
        while let Some(at) = heads
            .iter()
            .enumerate()
            .filter(|(_, h)| h.2.is_some())
            .min_by_key(|(_, h)| h.2)
            .map(|(j, _)| j)
        {
            let next = heads[at].2;
            if limit.is_none() && budget_full(&self.builder) {
                limit = Some(newest);
            }
            if limit.is_some_and(|l| next > l)
                || redo_end.is_some_and(|end| next.is_some_and(|t| t >= end))
            {
                break;
            }
            let h = &mut heads[at];
            let p = &view.partitions[h.0];
            let msgs = reads::messages(&*state, p, h.1, READ_CHUNK / 4, 2_000).map_err(err)?;
            let Some((last, _)) = msgs.last() else {
                h.2 = None;
                continue;
            };
            h.1 = last + 1;
            for (offset, m) in msgs {
                newest = newest.max(Some(m.stamp));
                self.builder.push(SinkRecord {
                    partition: p.name.clone(),
                    offset,
                    transaction_id: m.transaction_id,
                    ts: m.stamp,
                    payload: m.payload,
                });
            }
            h.2 = peek(&*state, p, h.1).map_err(err)?;
            // The node-wide total the other queues look at, as this queue reads.
            shared.set_buffered(&self.queue, pending_bytes + self.filling_memory());
        }
        for (i, cursor, next) in heads {
            let name = &view.partitions[i].name;
            self.cursors.insert(name.clone(), cursor);
            self.builder.set_partial(name, next);
        }
        shared.set_buffered(&self.queue, self.buffered());
        let partitions = view.partitions.len() as u64;
        self.set(|q| q.partitions = partitions);
        Ok(true)
    }

    /// Move the pending window one stage on (each stage retried by the caller on failure).
    async fn advance(&mut self) -> Result<(), BatchError> {
        let Some(mut p) = self.pending.take() else {
            return Ok(());
        };
        let r = self.advance_pending(&mut p).await;
        if p.engine.stage() != Stage::Done {
            self.pending = Some(p);
        }
        r
    }

    /// Run the window's commit engine (`queen_domain::sink::engine`) until the window is
    /// committed or an action has to wait: this is the interpreter of its actions.
    async fn advance_pending(&mut self, p: &mut Pending) -> Result<(), BatchError> {
        let r = self.run_engine(p).await;
        if r.is_err() {
            p.engine.interrupted();
        }
        r
    }

    async fn run_engine(&mut self, p: &mut Pending) -> Result<(), BatchError> {
        let s = self.shared.settings.clone();
        let intent = p.engine.intent().clone();
        let k = intent.k;
        loop {
            let event = match p.engine.next() {
                Action::WriteIntent(i) => {
                    self.set(|q| q.state = "intent");
                    self.put_doc(
                        documents::intent_key(&s.name, &self.queue),
                        serde_json::to_vec(&i).unwrap_or_default(),
                    )
                    .await?;
                    crash_point("intent");
                    Event::IntentWritten
                }
                Action::CloseAt(end) => {
                    self.set(|q| q.state = "restoring");
                    let end = Stamp(end);
                    // Every record below the end must be applied and read before it closes.
                    if self.safe < end || self.builder.read_through().is_some_and(|t| t < end) {
                        return Ok(());
                    }
                    let Some(closed) = self.builder.close(end, CloseReason::Age) else {
                        return Ok(());
                    };
                    p.lost.append(&mut self.lost);
                    p.closed = Some(closed);
                    Event::Closed
                }
                Action::CheckPointer => {
                    self.set(|q| q.state = "upload");
                    Event::Pointer(self.committed_k().await?)
                }
                Action::Upload => {
                    let closed = p
                        .closed
                        .as_ref()
                        .ok_or_else(|| BatchError::Retry("window records missing".into()))?;
                    let objects = self.upload(&intent, closed).await?;
                    // The records are in the bucket now: keep only what the manifest needs.
                    if let Some(c) = p.closed.as_mut() {
                        c.records = summary_records(&c.records);
                    }
                    crash_point("objects");
                    Event::Uploaded(objects)
                }
                Action::PutManifest => {
                    let closed = p
                        .closed
                        .as_ref()
                        .ok_or_else(|| BatchError::Retry("window records missing".into()))?;
                    let m = self.manifest(&intent, closed, p.engine.objects(), &p.lost);
                    let body = serde_json::to_vec_pretty(&m).unwrap_or_default();
                    let put = match self
                        .shared
                        .lake
                        .put_create(&self.manifest_key(&intent), Bytes::from(body))
                        .await
                        .map_err(|e| BatchError::Retry(e.to_string()))?
                    {
                        PutOutcome::Created => Put::Created,
                        PutOutcome::Identical => Put::Identical,
                        PutOutcome::Different { .. } => Put::Different,
                    };
                    if put != Put::Different {
                        crash_point("manifest");
                    }
                    Event::ManifestPut(put)
                }
                Action::ReadManifest => {
                    let found = self
                        .shared
                        .lake
                        .get(&self.manifest_key(&intent))
                        .await
                        .map_err(|e| BatchError::Retry(e.to_string()))?;
                    let same = found
                        .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
                        .is_some_and(|f| f.names(&intent) && f.objects == p.engine.objects());
                    if same {
                        crash_point("manifest");
                    }
                    Event::ManifestFound(same)
                }
                Action::MovePointer(ptr) => {
                    self.set(|q| q.state = "commit");
                    self.put_doc(
                        documents::pointer_key(&s.name, &self.queue),
                        serde_json::to_vec(&ptr).unwrap_or_default(),
                    )
                    .await?;
                    self.pointer = ptr;
                    crash_point("pointer");
                    Event::PointerMoved
                }
                Action::Nothing => {
                    self.committed(p, k).await;
                    return Ok(());
                }
            };
            if let Err(stop) = p.engine.on(event) {
                return Err(self.stopped(stop).await);
            }
        }
    }

    /// The manifest key of `intent`'s window.
    fn manifest_key(&self, intent: &Intent) -> String {
        self.keys(intent.k, intent.t_start, intent.t_end)
            .get()
            .manifest()
    }

    /// Count, log and checkpoint a committed window.
    async fn committed(&mut self, p: &Pending, k: u64) {
        let s = self.shared.settings.clone();
        let intent = p.engine.intent();
        let objects = p.engine.objects();
        let records: u64 = objects.iter().map(|o| o.records).sum();
        let bytes: u64 = objects.iter().map(|o| o.bytes).sum();
        let lost: u64 = p.lost.iter().map(|l| l.to - l.from + 1).sum();
        let metrics = self.shared.telemetry.metrics();
        metrics.s3().window_committed(&self.queue, records, bytes);
        if lost > 0 {
            metrics.s3().records_lost(&self.queue, lost);
            tracing::warn!(target: "queen-s3", queue = %self.queue, k, lost, ranges = ?p.lost, "window committed with lost records");
        }
        tracing::info!(target: "queen-s3", queue = %self.queue, k, records, bytes, t_start = intent.t_start, t_end = intent.t_end, "window committed");
        let t_end = intent.t_end;
        self.set(|q| {
            q.k = k;
            q.t_end = t_end;
            q.windows_committed += 1;
            q.records += records;
            q.bytes += bytes;
        });
        self.since_checkpoint += 1;
        self.succeeded(Failure::Window);
        if k.is_multiple_of(s.checkpoint_every) {
            self.checkpoint(k, t_end).await;
        }
    }

    /// The engine stopped the queue: say why, in the log and as the batch's error.
    async fn stopped(&mut self, stop: Stop) -> BatchError {
        match stop {
            // Another node committed this window under our own lease row: rewrite the lease at
            // our version to make sure, which fails, rolls back and counts the lost
            // precondition like any other fenced batch; the queue stops here either way and
            // uploads nothing.
            Stop::Passed { k, .. } => {
                if let Err(e) = self.fenced(Vec::new()).await {
                    return e;
                }
                tracing::warn!(target: "queen-s3", queue = %self.queue, k, "the commit pointer passed this window under our own lease row; stopping");
                BatchError::Fenced
            }
            other => BatchError::Retry(other.to_string()),
        }
    }

    /// The commit pointer's window number as the applied state holds it (0: none).
    async fn committed_k(&mut self) -> Result<u64, BatchError> {
        let state = self.shared.log.applied();
        let now = self.shared.log.wall_clock();
        let p = documents::pointer(&*state, &self.shared.settings.name, &self.queue, now)
            .map_err(|e| BatchError::Retry(e.to_string()))?;
        Ok(p.map_or(0, |p| p.k))
    }

    /// Encode and upload a window's objects, create-only.
    async fn upload(
        &self,
        intent: &Intent,
        closed: &Closed,
    ) -> Result<Vec<ManifestObject>, BatchError> {
        let s = self.shared.settings.clone();
        let keys = self.keys(intent.k, intent.t_start, intent.t_end);
        let ext = queen_lake::encode::ext(s.format, s.compression);
        // The records are sorted by (partition, offset): a partition's records are one slice.
        let all = &closed.records[..];
        let groups: Vec<(String, &[SinkRecord])> = match s.layout {
            Layout::Merged => vec![(keys.get().data(ext), all)],
            Layout::PerPartition => all
                .chunk_by(|a, b| a.partition == b.partition)
                .map(|rs| {
                    let first = rs.first().map_or(0, |r| r.offset);
                    let last = rs.last().map_or(0, |r| r.offset);
                    (
                        keys.get()
                            .partition_data(&rs[0].partition, first, last, ext),
                        rs,
                    )
                })
                .collect(),
        };
        let mut out = Vec::new();
        for (key, records) in groups {
            let n = records.len() as u64;
            // Encoding is CPU work on the sink's own threads; block_in_place keeps the window's
            // records borrowed instead of copying them into a blocking task.
            // One window is encoded at a time on this node: the budget covers the buffered
            // records, and this is the one window being built beside them.
            let turn = self.shared.encode.acquire().await;
            let body = tokio::task::block_in_place(|| match s.format {
                Format::Jsonl => queen_lake::encode::jsonl(records, s.compression),
                Format::Parquet => {
                    queen_lake::encode::parquet(records, s.parquet_codec, &self.queue, &s.tenant)
                }
            })
            .map_err(|e| BatchError::Retry(e.to_string()))?;
            drop(turn);
            let sha = queen_lake::encode::sha256_hex(&body);
            let bytes = body.len() as u64;
            match self
                .shared
                .lake
                .put_create(&key, Bytes::from(body))
                .await
                .map_err(|e| BatchError::Retry(e.to_string()))?
            {
                PutOutcome::Created | PutOutcome::Identical => {}
                PutOutcome::Different { existing_sha256 } => {
                    return Err(BatchError::Retry(format!(
                        "{key} already holds other bytes (sha256 {existing_sha256}, ours {sha}); the log no longer holds what was uploaded (retention?) and the object is left as it is"
                    )));
                }
            }
            out.push(ManifestObject {
                key,
                bytes,
                records: n,
                sha256: sha,
            });
        }
        Ok(out)
    }

    fn manifest(
        &self,
        intent: &Intent,
        closed: &Closed,
        objects: &[ManifestObject],
        lost: &[LostRange],
    ) -> Manifest {
        let s = &self.shared.settings;
        let parts: std::collections::BTreeSet<&str> = closed
            .records
            .iter()
            .map(|r| r.partition.as_str())
            .collect();
        Manifest {
            sink: s.name.clone(),
            tenant: s.tenant.clone(),
            queue: self.queue.clone(),
            k: intent.k,
            t_start: intent.t_start,
            t_end: intent.t_end,
            format: s.format.as_str().to_owned(),
            compression: match s.format {
                Format::Jsonl => s.compression.as_str().to_owned(),
                Format::Parquet => s.parquet_codec.as_str().to_owned(),
            },
            layout: if s.layout == Layout::Merged {
                "merged".into()
            } else {
                "per-partition".into()
            },
            objects: objects.to_vec(),
            records: objects.iter().map(|o| o.records).sum(),
            bytes: objects.iter().map(|o| o.bytes).sum(),
            partitions: parts.len() as u64,
            min_ts: closed.records.iter().map(|r| r.ts.0).min().unwrap_or(0),
            max_ts: closed.records.iter().map(|r| r.ts.0).max().unwrap_or(0),
            lost: lost.to_vec(),
            writer: intent.writer.clone(),
            committed_at: wall_iso(),
        }
    }

    /// Write the partitions' next offsets after window `k` (losing it costs only a longer
    /// re-read, so a failure is logged and forgotten).
    async fn checkpoint(&mut self, k: u64, t_end: u64) {
        let mut offsets = self.cursors.clone();
        for (partition, first) in self.builder.first_offsets() {
            offsets.insert(partition, first);
        }
        let c = Checkpoint { k, t_end, offsets };
        let key = self.keys(k, 0, 0).get().checkpoint();
        let body = serde_json::to_vec(&c).unwrap_or_default();
        let written = match queen_lake::encode::compress(&body, queen_lake::Compression::Zstd) {
            Ok(z) => self
                .shared
                .lake
                .put_create(&key, Bytes::from(z))
                .await
                .map_err(|e| format!("checkpoint of window {k} not written: {e}")),
            Err(e) => Err(format!("checkpoint of window {k} not encoded: {e}")),
        };
        match written {
            Ok(_) => {
                self.since_checkpoint = 0;
                self.succeeded(Failure::Checkpoint);
                crash_point("checkpoint");
            }
            // The window is committed either way; the queue shows the failure until the next
            // checkpoint or window lands, since a lake that refuses a checkpoint will likely
            // refuse the next window too.
            Err(e) => {
                self.error(&e);
                self.failure = Some(Failure::Checkpoint);
            }
        }
    }

    /// Publish the gauges and status numbers.
    fn publish(&self) {
        let now = self.shared.log.wall_clock();
        // Everything below the pointer is committed; above it, nothing is committed below the
        // oldest record still on its way (in the window being committed, the filling one, or
        // the first unread). With none of those the queue is complete up to the window limit.
        // Records' own stamps, not window bounds: a first window starts at the hour.
        let pending = self
            .pending
            .as_ref()
            .and_then(|p| p.closed.as_ref())
            .and_then(|c| c.records.iter().map(|r| r.ts).min());
        let on_its_way = [pending, self.builder.oldest(), self.builder.read_through()]
            .into_iter()
            .flatten()
            .min();
        let through = match on_its_way {
            Some(t) => t.max(Stamp(self.pointer.t_end)),
            None => self.builder.complete_through(self.safe),
        };
        let lag = self.safe.0.saturating_sub(through.0) as f64 / 1e6;
        let safe_lag = lag + now.0.saturating_sub(self.safe.0) as f64 / 1e6;
        let state = if self.pending.is_some() {
            None
        } else {
            Some("filling")
        };
        let (safe, buffered, since) = (self.safe.0, self.builder.bytes(), self.since_checkpoint);
        self.set(|q| {
            if let Some(s) = state {
                q.state = s;
            }
            q.complete_through = through.0;
            q.safe_time = safe;
            q.lag_seconds = lag;
            q.safe_lag_seconds = safe_lag;
            q.buffered = buffered;
            q.checkpoint_age = since;
        });
    }

    /// Where the drain closes the filling window, when it is worth closing (1 MiB buffered or
    /// open for ten seconds on the broker's clock), up to safeTime minus the guard as always.
    fn drain_close(&self) -> Option<(Stamp, CloseReason)> {
        let worth = self.builder.bytes() >= DRAIN_MIN_BYTES
            || self
                .builder
                .start()
                .is_some_and(|st| self.safe.0.saturating_sub(st.0) >= DRAIN_MIN_AGE_US);
        if worth {
            self.builder.poll(self.safe, true)
        } else {
            None
        }
    }

    /// Shutdown: finish a window already in its commit sequence, commit the filling one when
    /// worth it, give the lease back.
    async fn drain(&mut self) -> Ended {
        let deadline =
            Instant::now() + Duration::from_millis(self.shared.settings.shutdown_grace_ms);
        self.set(|q| q.state = "draining");
        while Instant::now() < deadline {
            match self.step(true).await {
                Ok(Some(e)) => return e,
                Ok(None) => self.succeeded(Failure::Step),
                Err(BatchError::Fenced) => return Ended::Fenced,
                Err(BatchError::Retry(e)) => self.error(&e),
            }
            if self.pending.is_none() && self.drain_close().is_none() {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        self.release().await
    }

    /// Give the lease back (retrying for a while) so another node can take the queue at once.
    async fn release(&mut self) -> Ended {
        let until = Instant::now() + RELEASE_FOR;
        while Instant::now() < until {
            let op = KvOp::Delete {
                ns: NS.into(),
                key: self.lease_key(),
                expect: Some(self.lease_version),
                required: true,
            };
            match self.shared.log.sink_kv(vec![op]).await {
                Ok(_) => break,
                Err(e) => {
                    tracing::info!(target: "queen-s3", queue = %self.queue, error = %e.to_string(), "lease release failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        self.shared.set_buffered(&self.queue, 0);
        Ended::Drained
    }
}

/// The first and last record of each partition: enough for the manifest's partition count and
/// stamp bounds once the window's objects are uploaded.
fn summary_records(records: &[SinkRecord]) -> Vec<SinkRecord> {
    let mut out = Vec::new();
    for part in records.chunk_by(|a, b| a.partition == b.partition) {
        let min = part.iter().min_by_key(|r| r.ts);
        let max = part.iter().max_by_key(|r| r.ts);
        for r in [min, max].into_iter().flatten() {
            out.push(SinkRecord {
                payload: Vec::new(),
                ..r.clone()
            });
        }
    }
    out
}

/// The stamp of a partition's record at `offset`, if it has one (the first unread record).
fn peek(
    s: &dyn queen_domain::StateRead,
    p: &queen_domain::model::PartitionRec,
    offset: u64,
) -> Result<Option<Stamp>, queen_domain::StoreError> {
    if offset >= p.next_offset {
        return Ok(None);
    }
    Ok(reads::messages(s, p, offset, 1, 1)?
        .first()
        .map(|(_, m)| m.stamp))
}

/// Owned parts of a window's keys.
struct WindowKeysOwned {
    prefix: String,
    tenant: String,
    queue: String,
    k: u64,
    start: u64,
    end: u64,
    align: queen_domain::sink::keys::Align,
}

impl WindowKeysOwned {
    fn get(&self) -> WindowKeys<'_> {
        WindowKeys {
            prefix: &self.prefix,
            tenant: &self.tenant,
            queue: &self.queue,
            k: self.k,
            t_start: Stamp(self.start),
            t_end: Stamp(self.end),
            align: self.align,
        }
    }
}
