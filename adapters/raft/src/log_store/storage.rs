//! openraft's `RaftLogStorage` for `LogStore`: log state, vote, append, truncate and purge.

use std::io;

use openraft::OptionalSend;
use openraft::storage::RaftLogStorage;

use super::flusher::Completion;
use super::record::Record;
use super::segment_name;
use super::{ARCHIVE_DIR, LogReader, LogStore};
use crate::type_config::Entry;
use crate::type_config::IOFlushed;
use crate::type_config::LogId;
use crate::type_config::LogState;
use crate::type_config::TypeConfig;
use crate::type_config::Vote;

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState, io::Error> {
        let inner = self.shared.lock()?;
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: inner.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            shared: self.shared.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.write_durable(vec![Record::Vote(*vote)]).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        let mut inner = self.shared.lock()?;
        self.shared.check_poison()?;
        inner.write(&self.shared, &[Record::Committed(committed)])
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.shared.lock()?.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let records: Vec<Record> = entries.into_iter().map(Record::Entry).collect();
        self.write_and_flush(records, Completion::Log(callback))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        tracing::debug!(after = ?last_log_id, "raft log truncate");
        let mut inner = self.shared.lock()?;
        self.shared.check_poison()?;
        inner.write(&self.shared, &[Record::TruncateAfter(last_log_id)])
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        tracing::debug!(upto = %log_id, "raft log purge");
        // last_purged must be durable before any file goes away.
        self.write_durable(vec![Record::Purged(log_id)]).await?;
        // Under the lock, so that a hold or release cannot fall between the decision and the
        // move: a held segment goes to the archive, any other is deleted.
        let mut inner = self.shared.lock()?;
        let victims = inner.take_purgeable_segments();
        if victims.is_empty() {
            return Ok(());
        }
        let archive = self.shared.dir.join(ARCHIVE_DIR);
        let mut archived = 0;
        for (seq, path) in &victims {
            if inner.holds.contains(seq) {
                std::fs::rename(path, archive.join(segment_name(*seq)))?;
                inner.archived.insert(*seq, None);
                archived += 1;
            } else {
                std::fs::remove_file(path)?;
            }
        }
        drop(inner);
        if archived > 0 {
            self.shared.stats.sync_dir(&archive)?;
        }
        self.shared.stats.sync_dir(&self.shared.dir)?;
        tracing::debug!(
            segments = victims.len(),
            archived,
            "raft log segments purged"
        );
        Ok(())
    }
}
