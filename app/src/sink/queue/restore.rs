//! Starting a run: the KV documents and the bucket decide what a crash left (`recover`).

use super::*;

impl QueueTask {
    /// Read the documents, decide what a crash left, and set up the window to fill.
    pub(super) async fn restore(&mut self) -> Result<(), BatchError> {
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
                tracing::info!(target: "queen-s3", queue = %self.shown, k = i.k, "redoing a window from its intent");
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
                tracing::info!(target: "queen-s3", queue = %self.shown, k = i.k, "committing a window another run uploaded");
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
    pub(super) async fn load_checkpoint(&self, k: u64) -> BTreeMap<String, u64> {
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
                tracing::info!(target: "queen-s3", queue = %self.shown, error = %e, "no checkpoint; reading the queue from its start");
                BTreeMap::new()
            }
        }
    }
}
