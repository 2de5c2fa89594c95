//! Reading the applied log beyond each partition's cursor into the filling window.

use super::*;

impl QueueTask {
    /// Read what the applied log holds beyond each partition's cursor into the builder. Answers
    /// false when the queue is gone.
    pub(super) fn read(&mut self) -> Result<bool, BatchError> {
        let shared = self.shared.clone();
        let state = shared.log.applied();
        let err = |e: queen_domain::StoreError| BatchError::Retry(e.to_string());
        self.safe = reads::safe_time(&*state).map_err(err)?;
        let Some(view) = reads::queue_view(&*state, &self.queue).map_err(err)? else {
            return Ok(false);
        };
        shared.telemetry.metrics().s3().fetch_call(&self.metric);
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
                    tracing::warn!(target: "queen-s3", queue = %self.shown, partition = %p.name, from = range.from, to = range.to, "records deleted by retention before the sink read them");
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
                let payload = lake_payload(&*shared.log, m.payload);
                self.builder.push(SinkRecord {
                    partition: p.name.clone(),
                    offset,
                    transaction_id: m.transaction_id,
                    ts: m.stamp,
                    payload,
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
}

/// What the lake gets for a stored payload: the plaintext of a sealed one (encrypted queues),
/// a JSON string of the stored bytes when this node cannot open it (no key, another key), and
/// otherwise the stored text itself.
fn lake_payload(log: &dyn queen_ports::SinkLog, stored: Vec<u8>) -> Vec<u8> {
    match log.open_stored(&stored) {
        queen_ports::Opened::NotSealed => stored,
        queen_ports::Opened::Plain(p) => p,
        queen_ports::Opened::Undecryptable => {
            serde_json::to_vec(&String::from_utf8_lossy(&stored)).unwrap_or(stored)
        }
    }
}

/// The stamp of a partition's record at `offset`, if it has one (the first unread record).
pub(super) fn peek(
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
