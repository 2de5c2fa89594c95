//! The one error type of the crate, translated at the boundary: no caller matches on an
//! `object_store` error.

/// What went wrong talking to the lake or encoding its objects.
///
/// Never carries a secret: errors hold keys, bucket names, endpoints and the store's own message,
/// and the store signs requests in headers, not in URLs.
#[derive(Debug, thiserror::Error)]
pub enum LakeError {
    /// The target is not usable as configured (nothing was sent).
    #[error("invalid lake target: {0}")]
    Config(String),

    /// A key or prefix that is not a valid object path (empty segment, `.`/`..`, control
    /// character).
    #[error("invalid object key '{key}': {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// Why it was refused.
        reason: String,
    },

    /// A request to the store failed (after the store's own bounded retries).
    #[error("lake {operation} '{key}' failed: {source}")]
    Store {
        /// put, get, head, list or multipart.
        operation: &'static str,
        /// The key or prefix.
        key: String,
        /// Whether trying again later can help (a transport error or a 5xx, not a 403 or 404).
        retryable: bool,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },

    /// The bucket did not answer the probe sent before any queue starts.
    #[error("lake {target} did not answer: {reason}; {check}")]
    Probe {
        /// The target, as [`crate::Lake::describe`] shows it.
        target: String,
        /// The store's answer.
        reason: String,
        /// What a person should check.
        check: &'static str,
    },

    /// An object could not be encoded (a record out of range, a codec failure).
    #[error("cannot encode {what}: {reason}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// Why not.
        reason: String,
    },

    /// Stored bytes could not be decoded.
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// Why not.
        reason: String,
    },
}

impl LakeError {
    /// Whether the same call may succeed if tried again later.
    #[must_use]
    pub fn retryable(&self) -> bool {
        match self {
            LakeError::Store { retryable, .. } => *retryable,
            LakeError::Probe { .. } => true,
            LakeError::Config(_)
            | LakeError::InvalidKey { .. }
            | LakeError::Encode { .. }
            | LakeError::Decode { .. } => false,
        }
    }

    pub(crate) fn encode(what: &'static str, reason: impl std::fmt::Display) -> Self {
        LakeError::Encode {
            what,
            reason: reason.to_string(),
        }
    }

    pub(crate) fn decode(what: &'static str, reason: impl std::fmt::Display) -> Self {
        LakeError::Decode {
            what,
            reason: reason.to_string(),
        }
    }
}
