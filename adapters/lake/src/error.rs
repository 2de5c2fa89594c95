//! The one error type of the crate, translated at the boundary: no caller matches on an
//! `object_store` error.

/// What went wrong talking to the lake or encoding its objects.
///
/// Never carries a secret nor a peer's words: errors hold keys, bucket names, endpoints and a
/// [`Failure`] (a status and a class), never the body or the message a store answered, because
/// a tenant chooses its endpoint and these errors reach `/status`, the dashboard and the log.
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
    #[error("lake {operation} '{key}' failed: {failure}")]
    Store {
        /// put, get, head, list or multipart.
        operation: &'static str,
        /// The key or prefix.
        key: String,
        /// Whether trying again later can help (a transport error or a 5xx, not a 403 or 404).
        retryable: bool,
        /// What the store answered, classified.
        failure: Failure,
    },

    /// The bucket did not answer the probe sent before any queue starts.
    #[error("lake {target} did not answer: {failure}; {check}")]
    Probe {
        /// The target, as [`crate::Lake::describe`] shows it.
        target: String,
        /// What the store answered, classified.
        failure: Failure,
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

/// Why a request to the store failed, as far as it may be shown: the HTTP status (0 when none
/// was received) and a class. The peer's body and message are dropped where the error is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// The HTTP status the store answered, 0 when no answer came.
    pub status: u16,
    /// The class of the failure.
    pub reason: FailureReason,
}

/// The class of a [`Failure`]; [`FailureReason::as_str`] is its stable snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// 404: no such bucket or key.
    NotFound,
    /// 403.
    AccessDenied,
    /// 401.
    Unauthenticated,
    /// 409 or 412: a condition did not hold.
    Conflict,
    /// 429 (S3's own 503 SlowDown counts as a server error: its status does not tell it apart).
    Throttled,
    /// Another 4xx.
    Rejected,
    /// A 3xx (redirects are not followed).
    Redirected,
    /// A 5xx.
    ServerError,
    /// No answer in time.
    Timeout,
    /// No connection (refused, reset, name not found, TLS).
    Unreachable,
    /// The endpoint resolves to an address this sink may not reach (see
    /// [`crate::AddressPolicy`]); no connection was made.
    RefusedAddress,
    /// Anything else.
    Other,
}

impl FailureReason {
    /// The stable snake_case name shown in `/status`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::NotFound => "not_found",
            FailureReason::AccessDenied => "access_denied",
            FailureReason::Unauthenticated => "unauthenticated",
            FailureReason::Conflict => "conflict",
            FailureReason::Throttled => "throttled",
            FailureReason::Rejected => "rejected",
            FailureReason::Redirected => "redirected",
            FailureReason::ServerError => "server_error",
            FailureReason::Timeout => "timeout",
            FailureReason::Unreachable => "unreachable",
            FailureReason::RefusedAddress => "refused_address",
            FailureReason::Other => "other",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.status == 0 {
            f.write_str(self.reason.as_str())
        } else {
            write!(f, "status {} ({})", self.status, self.reason.as_str())
        }
    }
}

impl LakeError {
    /// The classified failure of a request, when this error is one.
    #[must_use]
    pub fn failure(&self) -> Option<Failure> {
        match self {
            LakeError::Store { failure, .. } | LakeError::Probe { failure, .. } => Some(*failure),
            _ => None,
        }
    }

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
