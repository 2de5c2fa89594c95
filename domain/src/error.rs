//! The store's failure, as every rule that reads or writes state reports it.

/// A failure of the underlying store. Fatal for apply: replicas must not skip effects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The engine failed to read.
    #[error("state store read failed: {0}")]
    Read(String),
    /// A stored value could not be decoded (corruption or a format this build does not read).
    #[error("stored value under {key} is malformed: {detail}")]
    Corrupt {
        /// The key, escaped for display.
        key: String,
        /// What was wrong.
        detail: String,
    },
}
