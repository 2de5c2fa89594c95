//! Proposing: the disk gate, the request deadline, holding a proposal while no leader is known,
//! and turning the log's answer into an outcome or a typed error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use queen_domain::command::{Command, Entry, Outcome, Response};
use queen_ports::{Answer, BrokerError, Clock, ProposeError, RaftRole, ReplicatedLog, StateReader};
use queen_telemetry::Telemetry;

use crate::disk_gate::{Admission, Admitted, DiskGate, Limits};

/// How long a proposal waits before it asks again while no leader is known.
const NO_LEADER_RETRY: Duration = Duration::from_millis(50);

/// What a proposal's failure means to the caller.
pub(super) fn not_committed(e: &ProposeError) -> BrokerError {
    match e {
        ProposeError::NotLeader { leader } => BrokerError::NotLeader {
            leader: *leader,
            forwards: true,
        },
        ProposeError::OutcomeUnknown => BrokerError::OutcomeUnknown,
        ProposeError::Unavailable(m) => {
            BrokerError::Unavailable(format!("the replicated log is unavailable: {m}"))
        }
        ProposeError::Fatal(_) => {
            BrokerError::Internal("the node's storage failed; see its log".to_owned())
        }
    }
}

/// The response in a state machine's answer: as built on this node, or decoded from the bytes
/// another node sent.
fn response_of(answer: Answer) -> Result<Response, BrokerError> {
    let unknown =
        || BrokerError::Internal("the state machine answered in an unknown format".to_owned());
    match answer {
        Answer::Built(v) => v.into_any().downcast::<Response>().map(|r| *r).map_err(|_| {
            tracing::error!(target: "queen-app", "the state machine answered a value of another type");
            unknown()
        }),
        Answer::Bytes(b) => Response::decode(&b).map_err(|e| {
            tracing::error!(target: "queen-app", error = %e, "undecodable state machine response");
            unknown()
        }),
    }
}

/// The metric label of a command.
fn kind(c: &Command) -> &'static str {
    match c {
        Command::Tick => "tick",
        Command::Push(_) => "push",
        Command::Pop(_) | Command::PopConflating(_) => "pop",
        Command::Ack { .. } | Command::AckAt { .. } => "ack",
        Command::ExtendLease { .. } => "extend",
        Command::Configure { .. } => "configure",
        Command::DeleteQueue { .. } => "delete_queue",
        Command::Transaction { .. } => "transaction",
        Command::Kv(_) => "kv",
        Command::Timers(_) => "timers",
        Command::DeleteGroup { .. } => "delete_group",
        Command::Seek { .. } => "seek",
        Command::Resubscribe { .. } => "resubscribe",
        Command::Locks(_) => "locks",
        Command::ClusterSettings { .. } => "cluster_settings",
        Command::DeleteMessage { .. } => "delete_message",
        Command::RetryDeadLetter { .. } => "retry_dead_letter",
        Command::AsProducer { command, .. } => kind(command),
    }
}

/// Proposes commands to the replicated log, each within the request deadline and past the
/// disk gate.
pub(crate) struct Proposer {
    log: Arc<dyn ReplicatedLog>,
    clock: Arc<dyn Clock>,
    state: Arc<dyn StateReader>,
    telemetry: Telemetry,
    /// The disk gate: the data directory's last sample and the bytes admitted since.
    pub(super) disk: DiskGate,
    request_timeout: Duration,
    /// Followers forward writes to the leader; when off they answer not-leader.
    client_offload: bool,
}

impl Proposer {
    pub(super) fn new(
        log: Arc<dyn ReplicatedLog>,
        clock: Arc<dyn Clock>,
        state: Arc<dyn StateReader>,
        telemetry: Telemetry,
        request_timeout: Duration,
    ) -> Self {
        Self {
            log,
            clock,
            state,
            telemetry,
            disk: DiskGate::new(Limits {
                high_pct: 85,
                reserve_bytes: crate::disk_gate::DEFAULT_RESERVE_BYTES,
            }),
            request_timeout,
            client_offload: true,
        }
    }

    pub(super) fn set_disk_gate(&mut self, high_pct: u8, reserve_bytes: u64) {
        self.disk = DiskGate::new(Limits {
            high_pct,
            reserve_bytes,
        });
    }

    pub(super) fn set_client_offload(&mut self, on: bool) {
        self.client_offload = on;
    }

    pub(super) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The disk gate (see `disk_gate`): a client command that adds data is refused when what it
    /// and everything admitted since the last sample will write would pass the threshold; every
    /// command is refused when it would take the reserve. Pops, acks, lease extensions, ticks,
    /// deletions and the sink's own writes (`internal`) pass a closed gate so consumers drain.
    fn gate(
        &self,
        admission: Admission,
        kind: &'static str,
        bytes: usize,
    ) -> Result<Admitted<'_>, BrokerError> {
        let memtable = self.state.memtable_bytes();
        self.disk
            .admit(u64::try_from(bytes).unwrap_or(u64::MAX), admission, memtable)
            .map_err(|refusal| {
                tracing::debug!(target: "queen-app", kind, error = %refusal, "refused at the disk gate");
                BrokerError::DiskFull(refusal)
            })
    }

    /// Propose a client's command and wait for its outcome, up to the request deadline. While
    /// no leader is known the proposal is held and retried (nothing was appended), not failed
    /// at once.
    pub(crate) async fn propose(&self, command: Command) -> Result<Response, BrokerError> {
        self.propose_as(command, false).await
    }

    /// `propose`, for the node's own writes (the S3 sink's), which pass a closed disk gate.
    pub(crate) async fn propose_internal(&self, command: Command) -> Result<Response, BrokerError> {
        self.propose_as(command, true).await
    }

    async fn propose_as(&self, command: Command, internal: bool) -> Result<Response, BrokerError> {
        let kind = kind(&command);
        let is_tick = matches!(command, Command::Tick);
        let admission = Admission::of(&command, internal);
        let bytes = Entry {
            proposed_at: self.clock.now_micros(),
            command,
        }
        .encode();
        // After encoding, so the gate counts what the log will hold.
        let _admitted = self.gate(admission, kind, bytes.len())?;
        if !self.client_offload && !is_tick {
            let p = self.log.progress();
            if p.role != RaftRole::Leader {
                return Err(BrokerError::NotLeader {
                    leader: p.leader,
                    forwards: false,
                });
            }
        }
        let started = Instant::now();
        let deadline = started + self.request_timeout;
        let result = loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(remaining, self.log.propose(bytes.clone())).await {
                Err(_) => break Err(BrokerError::Timeout),
                Ok(Ok(answer)) => break response_of(answer),
                Ok(Err(
                    ProposeError::NotLeader { leader: None } | ProposeError::Unavailable(_),
                )) if Instant::now() + NO_LEADER_RETRY < deadline => {
                    tokio::time::sleep(NO_LEADER_RETRY).await;
                }
                Ok(Err(e)) => break Err(not_committed(&e)),
            }
        };
        self.telemetry
            .metrics()
            .proposal(kind, result.is_ok(), started.elapsed().as_secs_f64());
        let response = result?;
        if let Outcome::Rejected(why) = &response.outcome {
            tracing::error!(target: "queen-app", why, "the state machine rejected an entry");
            return Err(BrokerError::Internal(
                "the state machine could not read the entry".to_owned(),
            ));
        }
        Ok(response)
    }

    /// `propose`, answering the command's own outcome (`take`, one of `Outcome::into_*`).
    pub(crate) async fn propose_for<T>(
        &self,
        command: Command,
        take: fn(Outcome) -> Option<T>,
    ) -> Result<T, BrokerError> {
        let kind = kind(&command);
        Self::taken(kind, self.propose(command).await?, take)
    }

    /// `propose_for`, for the node's own writes (the S3 sink's), which pass a closed disk gate.
    pub(crate) async fn propose_internal_for<T>(
        &self,
        command: Command,
        take: fn(Outcome) -> Option<T>,
    ) -> Result<T, BrokerError> {
        let kind = kind(&command);
        Self::taken(kind, self.propose_internal(command).await?, take)
    }

    fn taken<T>(
        kind: &'static str,
        response: Response,
        take: fn(Outcome) -> Option<T>,
    ) -> Result<T, BrokerError> {
        take(response.outcome).ok_or_else(|| {
            tracing::error!(target: "queen-app", kind, "the log answered another command's outcome");
            BrokerError::unexpected_outcome()
        })
    }

    /// Wait until this node has applied everything committed when the read began, within the
    /// request deadline.
    pub(crate) async fn read_barrier(&self) -> Result<(), BrokerError> {
        match tokio::time::timeout(self.request_timeout, self.log.read_barrier()).await {
            Err(_) => Err(BrokerError::Timeout),
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(not_committed(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::twins::{FakeLog, ManualClock, MemState};
    use queen_domain::command::PushItem;
    use queen_domain::kv::{Expiry, KvOp};
    use queen_domain::names::{PartitionName, QueueName};

    fn proposer(log: Arc<FakeLog>, timeout: Duration) -> Proposer {
        Proposer::new(
            log.clone(),
            Arc::new(ManualClock::at(1_700_000_000_000_000)),
            log.state(),
            Telemetry::metrics_only(1),
            timeout,
        )
    }

    fn push(id: &str) -> Command {
        Command::Push(vec![PushItem {
            queue: QueueName::new("q".to_owned()).unwrap(),
            partition: PartitionName::new("p".to_owned()).unwrap(),
            transaction_id: queen_domain::ids::TransactionId::new(id).unwrap(),
            message_id: [7; 16],
            payload: b"{}".to_vec(),
            trace_id: None,
        }])
    }

    fn put() -> Command {
        Command::Kv(vec![KvOp::Put {
            ns: "queen-s3".into(),
            key: "lease".into(),
            value: b"{}".to_vec(),
            expiry: Expiry::Forever,
            expect: None,
            required: false,
        }])
    }

    #[tokio::test]
    async fn a_committed_command_answers_its_outcome() {
        let log = FakeLog::leader(MemState::default());
        let p = proposer(log.clone(), Duration::from_secs(5));
        let r = p.propose(push("t1")).await.expect("committed");
        assert!(matches!(r.outcome, Outcome::Push(ref o) if o.len() == 1));
        assert_eq!(log.proposals(), 1);
    }

    #[tokio::test]
    async fn a_closed_gate_refuses_client_writes_and_passes_the_sinks() {
        let log = FakeLog::leader(MemState::default());
        let mut p = proposer(log.clone(), Duration::from_secs(5));
        p.set_disk_gate(50, 0);
        // 90% in use: the client gate (50%) is closed, the reserve (0) is not reached.
        p.disk.sample(1 << 30, (1 << 30) / 10 * 9);
        let refused = p.propose(push("t1")).await.unwrap_err();
        assert!(
            matches!(refused, BrokerError::DiskFull(_)),
            "a client push is refused: {refused:?}"
        );
        assert!(matches!(
            p.propose(put()).await.unwrap_err(),
            BrokerError::DiskFull(_)
        ));
        assert_eq!(log.proposals(), 0, "nothing refused reached the log");
        let r = p
            .propose_internal(put())
            .await
            .expect("the sink's write passes");
        assert!(matches!(r.outcome, Outcome::Kv(_)));
        assert!(p.propose(Command::Tick).await.is_ok(), "a tick frees space");
    }

    #[tokio::test]
    async fn with_no_leader_a_proposal_is_held_until_the_deadline() {
        let log = FakeLog::leader(MemState::default());
        log.fail_next(u32::MAX, ProposeError::NotLeader { leader: None });
        let p = proposer(log.clone(), Duration::from_millis(300));
        let started = Instant::now();
        let e = p.propose(push("t1")).await.unwrap_err();
        // Held until the deadline was near, then the last answer: still no leader (nothing was
        // appended, so a retry is safe).
        assert!(
            matches!(
                e,
                BrokerError::NotLeader {
                    leader: None,
                    forwards: true
                }
            ),
            "{e:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(250));
        assert!(
            log.attempts() > 1,
            "it asked again while no leader was known"
        );
    }

    #[tokio::test]
    async fn a_leader_found_in_time_commits_the_held_proposal() {
        let log = FakeLog::leader(MemState::default());
        log.fail_next(3, ProposeError::NotLeader { leader: None });
        let p = proposer(log.clone(), Duration::from_secs(5));
        assert!(p.propose(push("t1")).await.is_ok());
        assert_eq!(log.attempts(), 4);
    }

    #[tokio::test]
    async fn failures_keep_what_the_caller_can_do() {
        let log = FakeLog::leader(MemState::default());
        let p = proposer(log.clone(), Duration::from_secs(5));
        log.fail_next(1, ProposeError::OutcomeUnknown);
        assert!(matches!(
            p.propose(push("t1")).await.unwrap_err(),
            BrokerError::OutcomeUnknown
        ));
        log.fail_next(1, ProposeError::NotLeader { leader: Some(3) });
        assert!(matches!(
            p.propose(push("t1")).await.unwrap_err(),
            BrokerError::NotLeader {
                leader: Some(3),
                forwards: true
            }
        ));
        log.fail_next(1, ProposeError::Fatal("disk".into()));
        let e = p.propose(push("t1")).await.unwrap_err();
        assert!(matches!(e, BrokerError::Internal(_)));
        assert!(
            !e.to_string().contains("disk"),
            "the cause stays in the log"
        );
    }

    #[tokio::test]
    async fn without_offload_a_follower_refuses_and_says_so() {
        let log = FakeLog::follower(MemState::default(), Some(2));
        let mut p = proposer(log.clone(), Duration::from_secs(5));
        p.set_client_offload(false);
        let e = p.propose(push("t1")).await.unwrap_err();
        assert!(matches!(
            e,
            BrokerError::NotLeader {
                leader: Some(2),
                forwards: false
            }
        ));
        assert_eq!(log.proposals(), 0);
        p.set_client_offload(true);
        assert!(p.propose(push("t1")).await.is_ok(), "forwarded");
    }
}
