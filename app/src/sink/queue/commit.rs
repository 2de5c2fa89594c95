//! Committing a window: the interpreter of the domain's commit engine
//! (`queen_domain::sink::engine`), the objects, the manifest and the checkpoints.

use super::*;
use crate::config::S3CrashPoint;

impl QueueTask {
    /// Move the pending window one stage on (each stage retried by the caller on failure).
    pub(super) async fn advance(&mut self) -> Result<(), BatchError> {
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
    pub(super) async fn advance_pending(&mut self, p: &mut Pending) -> Result<(), BatchError> {
        let r = self.run_engine(p).await;
        if r.is_err() {
            p.engine.interrupted();
        }
        r
    }

    pub(super) async fn run_engine(&mut self, p: &mut Pending) -> Result<(), BatchError> {
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
                    self.crash_point(S3CrashPoint::Intent);
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
                    self.crash_point(S3CrashPoint::Objects);
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
                        self.crash_point(S3CrashPoint::Manifest);
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
                        self.crash_point(S3CrashPoint::Manifest);
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
                    self.crash_point(S3CrashPoint::Pointer);
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
    pub(super) fn manifest_key(&self, intent: &Intent) -> String {
        self.keys(intent.k, intent.t_start, intent.t_end)
            .get()
            .manifest()
    }

    /// Count, log and checkpoint a committed window.
    pub(super) async fn committed(&mut self, p: &Pending, k: u64) {
        let s = self.shared.settings.clone();
        let intent = p.engine.intent();
        let objects = p.engine.objects();
        let records: u64 = objects.iter().map(|o| o.records).sum();
        let bytes: u64 = objects.iter().map(|o| o.bytes).sum();
        let lost: u64 = p.lost.iter().map(|l| l.to - l.from + 1).sum();
        let metrics = self.shared.telemetry.metrics();
        metrics.s3().window_committed(&self.metric, records, bytes);
        if lost > 0 {
            metrics.s3().records_lost(&self.metric, lost);
            tracing::warn!(target: "queen-s3", queue = %self.shown, k, lost, ranges = ?p.lost, "window committed with lost records");
        }
        tracing::info!(target: "queen-s3", queue = %self.shown, k, records, bytes, t_start = intent.t_start, t_end = intent.t_end, "window committed");
        let t_end = intent.t_end;
        self.set(|q| {
            q.k = k;
            q.t_end = t_end;
            q.windows_committed += 1;
            q.records += records;
            q.bytes += bytes;
            q.records_lost += lost;
            q.lost_ranges.extend(p.lost.iter().map(|l| (k, l.clone())));
            let over = q.lost_ranges.len().saturating_sub(super::super::LOST_KEPT);
            q.lost_ranges.drain(..over);
        });
        self.since_checkpoint += 1;
        self.succeeded(Failure::Window);
        if k.is_multiple_of(s.checkpoint_every) {
            self.checkpoint(k, t_end).await;
        }
    }

    /// The engine stopped the queue: say why, in the log and as the batch's error.
    pub(super) async fn stopped(&mut self, stop: Stop) -> BatchError {
        match stop {
            // Another node committed this window under our own lease row: rewrite the lease at
            // our version to make sure, which fails, rolls back and counts the lost
            // precondition like any other fenced batch; the queue stops here either way and
            // uploads nothing.
            Stop::Passed { k, .. } => {
                if let Err(e) = self.fenced(Vec::new()).await {
                    return e;
                }
                tracing::warn!(target: "queen-s3", queue = %self.shown, k, "the commit pointer passed this window under our own lease row; stopping");
                BatchError::Fenced
            }
            other => BatchError::Retry(other.to_string()),
        }
    }

    /// The commit pointer's window number as the applied state holds it (0: none).
    pub(super) async fn committed_k(&mut self) -> Result<u64, BatchError> {
        let state = self.shared.log.applied();
        let now = self.shared.log.wall_clock();
        let p = documents::pointer(&*state, &self.shared.settings.name, &self.queue, now)
            .map_err(|e| BatchError::Retry(e.to_string()))?;
        Ok(p.map_or(0, |p| p.k))
    }

    /// Encode and upload a window's objects, create-only.
    pub(super) async fn upload(
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
                    let (tenant, queue) = self.lake_names();
                    queen_lake::encode::parquet(records, s.parquet_codec, queue, tenant)
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

    pub(super) fn manifest(
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
        let (tenant, queue) = self.lake_names();
        Manifest {
            sink: s.name.clone(),
            tenant: tenant.to_owned(),
            queue: queue.to_owned(),
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
    pub(super) async fn checkpoint(&mut self, k: u64, t_end: u64) {
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
                self.crash_point(S3CrashPoint::Checkpoint);
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

    /// The tenant and the queue name the lake writes for this queue: a tenant's queue under
    /// its own `tenant=` with the name its clients use, the default tenant's under the sink's
    /// tenant.
    fn lake_names(&self) -> (&str, &str) {
        match queen_domain::tenant::split(&self.queue) {
            (Some(tenant), queue) => (tenant, queue),
            (None, queue) => (&self.shared.settings.tenant, queue),
        }
    }

    pub(super) fn keys(&self, k: u64, start: u64, end: u64) -> WindowKeysOwned {
        let s = &self.shared.settings;
        let (tenant, queue) = self.lake_names();
        WindowKeysOwned {
            prefix: s.prefix.clone(),
            tenant: tenant.to_owned(),
            queue: queue.to_owned(),
            k,
            start,
            end,
            align: s.align,
        }
    }

    pub(super) fn writer(&self) -> String {
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

    /// Test-only: with the hook `QUEEN_TEST_S3_CRASH_AT=<point>` (handed in at the sink's
    /// start) the process aborts, as `kill -9` would, right after that point of the commit
    /// sequence of the first window that reaches it. Without the hook (always, outside the
    /// crash tests) it does nothing.
    fn crash_point(&self, point: S3CrashPoint) {
        if self.shared.crash_at == Some(point) {
            tracing::error!(target: "queen-s3", point = point.as_str(), "test crash point reached: aborting");
            std::process::abort();
        }
    }
}

/// The first and last record of each partition: enough for the manifest's partition count and
/// stamp bounds once the window's objects are uploaded.
pub(super) fn summary_records(records: &[SinkRecord]) -> Vec<SinkRecord> {
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

/// Owned parts of a window's keys.
pub(super) struct WindowKeysOwned {
    prefix: String,
    tenant: String,
    queue: String,
    k: u64,
    start: u64,
    end: u64,
    align: queen_domain::sink::keys::Align,
}

impl WindowKeysOwned {
    pub(super) fn get(&self) -> WindowKeys<'_> {
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
