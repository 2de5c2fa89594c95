//! Runs openraft's storage conformance suite (`openraft::testing::log::Suite`) against our log
//! store and our state machine adapter over the in-memory backend.

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::log::StoreBuilder;
use openraft::testing::log::Suite;

use crate::log_store::LogStore;
use crate::log_store::LogStoreOptions;
use crate::mem_backend::MemBackend;
use crate::state_machine::StateMachineStore;
use crate::type_config::TypeConfig;

/// Builds a fresh log store in a temp dir and a state machine over an empty in-memory backend.
struct Builder {
    /// Log store tuning; a tiny segment size exercises rolling and whole-segment purge.
    opts: LogStoreOptions,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().map_err(|e| sto_err(&e))?;
        let store =
            LogStore::open(&dir.path().join("log"), self.opts.clone()).map_err(|e| sto_err(&e))?;
        let sm = StateMachineStore::open(Arc::new(MemBackend::new()), None)
            .await
            .map_err(|e| sto_err(&e))?;
        Ok((dir, store, sm))
    }
}

fn sto_err(e: &std::io::Error) -> StorageError<TypeConfig> {
    StorageError::read(
        <openraft::impls::BoxedErrorSource as openraft::errors::ErrorSource>::from_error(e),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_default_segments() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder {
        opts: LogStoreOptions::default(),
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_tiny_segments() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder {
        opts: LogStoreOptions {
            segment_max_bytes: 64,
            flush_batch_max: 2,
            // A cache of about one entry: reads cross from the segments to the cache.
            cache_max_bytes: 100,
            inline_flush: false,
        },
    })
    .await
}

/// The inline flush the deterministic simulation uses keeps every guarantee of the flusher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_inline_flush() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder {
        opts: LogStoreOptions {
            segment_max_bytes: 256,
            inline_flush: true,
            ..LogStoreOptions::default()
        },
    })
    .await
}
