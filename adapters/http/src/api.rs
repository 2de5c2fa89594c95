//! The HTTP adapter's error: a status, a stable code, a sentence and `retry-after`; and the one
//! table that maps the application's typed [`BrokerError`] onto it.

use queen_domain::ephemeral::PushRefusal;
use queen_ports::{BrokerError, MembershipError};

/// A failure the client should see as an HTTP error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Stable snake_case code.
    pub code: &'static str,
    /// A human sentence; never carries a secret.
    pub message: String,
    /// Seconds for a `retry-after` header.
    pub retry_after: Option<u32>,
    /// A finer code under `code` (`"reason"` in the envelope), when there is one.
    pub reason: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming the field.
    #[must_use]
    pub fn bad_request(field: &str, problem: &str) -> Self {
        Self {
            status: 400,
            code: "bad_request",
            message: format!("{field} {problem}"),
            retry_after: None,
            reason: None,
        }
    }

    /// A 503 after the request deadline passed.
    #[must_use]
    pub fn timeout() -> Self {
        Self {
            status: 503,
            code: "timeout",
            message: "the request deadline elapsed".to_owned(),
            retry_after: Some(1),
            reason: None,
        }
    }

    /// The same error with a finer code under `code`.
    #[must_use]
    pub fn with_reason(mut self, reason: &'static str) -> Self {
        self.reason = Some(reason);
        self
    }

    /// Any other status.
    #[must_use]
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            reason: None,
        }
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        let message = e.to_string();
        let (status, code) = match &e {
            BrokerError::NotLeader { .. } => (503, "not_leader"),
            BrokerError::OutcomeUnknown => (503, "outcome_unknown"),
            BrokerError::Timeout => (503, "timeout"),
            BrokerError::Unavailable(_) => (503, "unavailable"),
            BrokerError::DiskFull(_) => (507, "disk_full"),
            BrokerError::Invalid { .. } => (400, "bad_request"),
            BrokerError::TooLarge { .. } => (413, "payload_too_large"),
            BrokerError::Internal(_) => (500, "internal"),
            BrokerError::EncryptionRequired { .. } => (409, "encryption_required"),
            BrokerError::EphemeralRefused(r) => match r {
                PushRefusal::QueueFull { .. } => (429, "queue_full"),
                PushRefusal::NodeFull { .. } => (503, "ephemeral_unavailable"),
                PushRefusal::TooLarge { .. } => (400, "ephemeral_bad_request"),
                PushRefusal::TooManyQueues { .. } => (429, "too_many_queues"),
            },
            BrokerError::EphemeralQueueNotFound { .. } => (404, "ephemeral_queue_not_found"),
            BrokerError::Membership(m) => match m {
                MembershipError::NotLeader { .. } => (503, "not_leader"),
                MembershipError::NoQuorum(_) => (409, "no_quorum"),
                MembershipError::LearnerBehind { .. } => (409, "learner_behind"),
                MembershipError::LastVoter(_) => (409, "last_voter"),
                MembershipError::Unknown(_) => (404, "unknown_member"),
                MembershipError::Failed(_) => (409, "membership_change_failed"),
                MembershipError::FormatTooOld { .. } => (409, "format_too_old"),
                MembershipError::Unavailable(_) => (503, "unavailable"),
            },
        };
        // Every 503 is worth a retry a second later: another node leads, or this one recovers.
        // A full ephemeral queue too: its consumers drain it.
        let retry_after = (status == 503 || status == 429).then_some(1);
        ApiError {
            status,
            code,
            message,
            retry_after,
            reason: None,
        }
    }
}

/// A failed read of the node's state: logged here, answered without its detail.
pub(crate) fn store_error(e: &queen_domain::StoreError) -> ApiError {
    tracing::error!(target: "queen-http", error = %e, "state read failed");
    ApiError::new(
        500,
        "internal",
        "reading the node's state failed; see its log",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use queen_ports::DiskRefusal;

    fn wire(e: BrokerError) -> (u16, &'static str, String, Option<u32>) {
        let a = ApiError::from(e);
        (a.status, a.code, a.message, a.retry_after)
    }

    #[test]
    fn every_typed_error_has_its_status_code_and_sentence() {
        assert_eq!(
            wire(BrokerError::NotLeader {
                leader: Some(2),
                forwards: true
            }),
            (
                503,
                "not_leader",
                "this node does not lead (leader: Some(2))".to_owned(),
                Some(1)
            )
        );
        let (status, code, message, retry) = wire(BrokerError::NotLeader {
            leader: None,
            forwards: false,
        });
        assert_eq!((status, code, retry), (503, "not_leader", Some(1)));
        assert!(
            message.contains("QUEEN_RAFT_CLIENT_OFFLOAD=false"),
            "{message}"
        );
        assert_eq!(
            wire(BrokerError::Timeout),
            (
                503,
                "timeout",
                "the request deadline elapsed".to_owned(),
                Some(1)
            )
        );
        assert_eq!(wire(BrokerError::OutcomeUnknown).1, "outcome_unknown");
        let (status, code, message, retry) = wire(BrokerError::DiskFull(DiskRefusal::Gate {
            used_pct: 86,
            projected_pct: 87,
            in_flight: 10,
            high_pct: 85,
        }));
        assert_eq!((status, code, retry), (507, "disk_full", None));
        assert!(
            message.contains("QUEEN_RAFT_DISK_HIGH_PCT is 85%"),
            "{message}"
        );
        assert_eq!(
            wire(BrokerError::Invalid {
                field: "items[0].queue".into(),
                problem: "is required".into()
            }),
            (
                400,
                "bad_request",
                "items[0].queue is required".to_owned(),
                None
            )
        );
        assert_eq!(
            wire(BrokerError::TooLarge {
                field: "items[1].payload".into(),
                len: 101,
                max: 100
            })
            .0,
            413
        );
        assert_eq!(
            wire(BrokerError::Internal("see the log".into())),
            (500, "internal", "see the log".to_owned(), None)
        );
        assert_eq!(
            wire(BrokerError::Unavailable("the node is stopping".into())).3,
            Some(1)
        );
    }

    #[test]
    fn membership_refusals_keep_their_codes() {
        let cases = [
            (MembershipError::NoQuorum("no".into()), 409, "no_quorum"),
            (
                MembershipError::LearnerBehind {
                    id: 4,
                    lag: 5000,
                    limit: 1000,
                },
                409,
                "learner_behind",
            ),
            (MembershipError::LastVoter(1), 409, "last_voter"),
            (MembershipError::Unknown(9), 404, "unknown_member"),
            (
                MembershipError::Failed("x".into()),
                409,
                "membership_change_failed",
            ),
            (
                MembershipError::FormatTooOld {
                    id: 4,
                    kinds: 1,
                    version: 2,
                },
                409,
                "format_too_old",
            ),
            (MembershipError::Unavailable("x".into()), 503, "unavailable"),
            (
                MembershipError::NotLeader {
                    leader: None,
                    leader_http: None,
                },
                503,
                "not_leader",
            ),
        ];
        for (e, status, code) in cases {
            let sentence = e.to_string();
            let (s, c, m, _) = wire(BrokerError::Membership(e));
            assert_eq!((s, c), (status, code));
            assert_eq!(m, sentence, "the refusal's own sentence reaches the client");
        }
    }
}
