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

mod commit;
mod lease;
mod read;
mod restore;

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
    /// Another instance holds it, until `expires` unless it rewrites the row.
    Held {
        holder: String,
        expires: Option<queen_domain::time::Stamp>,
    },
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
    /// The queue's stored name (its tenant's scope in front of a tenant's queue).
    queue: String,
    /// The name logs show (`<tenant id>/<queue>` for a tenant's queue).
    shown: String,
    /// The queue as metrics label it (`tenant` for every tenant but the default one).
    metric: queen_telemetry::QueueKey,
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

/// The wall clock's time now, as the sink's documents write it.
pub(super) fn wall_iso() -> String {
    use queen_ports::Clock as _;
    Stamp(queen_ports::SystemClock.now_micros()).iso_micros()
}

/// The metrics' key of a stored queue name.
pub(super) fn metric_key(stored: &str) -> queen_telemetry::QueueKey {
    let (tenant, local) = queen_domain::tenant::split(stored);
    queen_telemetry::QueueKey::new(tenant, local)
}

impl QueueTask {
    pub(super) fn new(shared: Arc<Shared>, queue: String) -> Self {
        let r = rules(&shared.settings);
        Self {
            shared,
            shown: queen_domain::tenant::display(&queue).into_owned(),
            metric: metric_key(&queue),
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
        tracing::warn!(target: "queen-s3", queue = %self.shown, error = %e, "sink queue error");
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

    /// Run the queue while this node holds its lease.
    pub(super) async fn run(&mut self) -> Ended {
        self.set(|q| q.state = "restoring");
        // A restore that keeps failing (a bucket that went away) is tried again after a wait
        // that doubles up to a third of the lease TTL, so the lease is still refreshed in time.
        let mut wait = Duration::from_secs(1);
        let most = Duration::from_millis(self.shared.settings.lease_ttl_ms / 3).max(wait);
        loop {
            match self.restore().await {
                Ok(()) => {
                    self.succeeded(Failure::Step);
                    break;
                }
                Err(BatchError::Fenced) => return Ended::Fenced,
                Err(BatchError::Retry(e)) => {
                    self.error(&e);
                    if self.pause(wait).await {
                        return self.release().await;
                    }
                    wait = (wait * 2).min(most);
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
                tracing::info!(target: "queen-s3", queue = %self.shown, "giving the queue back to even out placement");
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
            tracing::debug!(target: "queen-s3", queue = %self.shown, k = intent.k, records = closed.records.len(), ?reason, "window closed");
            self.pending = Some(Pending {
                engine: WindowCommit::new(intent),
                closed: Some(closed),
                lost: std::mem::take(&mut self.lost),
            });
            return self.advance().await.map(|()| None);
        }
        Ok(None)
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
        loop {
            let op = KvOp::Delete {
                ns: NS.into(),
                key: self.lease_key(),
                expect: Some(self.lease_version),
                required: true,
            };
            let left = until.saturating_duration_since(Instant::now());
            let Some(out) = self
                .shared
                .kv_write_retrying(&[op], "lease release", left)
                .await
            else {
                break;
            };
            // Not applied: the row is at a version this node did not see (a refresh whose
            // answer was lost while leadership moved, say). While it still names this instance
            // it is ours to delete, at the version it has now; otherwise it is gone or another
            // node's.
            if !matches!(
                out.results.first(),
                Some(KvResult::Write { applied: false, .. })
            ) {
                break;
            }
            match self.look().await {
                Ok(Look::Mine(version))
                    if version != self.lease_version && Instant::now() < until =>
                {
                    self.lease_version = version;
                }
                _ => break,
            }
        }
        self.shared.set_buffered(&self.queue, 0);
        Ended::Drained
    }
}
