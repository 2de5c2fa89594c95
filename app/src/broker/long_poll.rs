//! Pops that wait: a look at the applied state, a proposal when something is deliverable, and
//! a park until what this node applies makes something deliverable (`wakeups.rs`) when
//! nothing is.

use std::pin::pin;
use std::time::{Duration, Instant};

use queen_domain::command::{Command, ConflationEcho, Outcome, PopCommand, PopOutcome};
use queen_domain::ids::LeaseId;
use queen_domain::names::QueueName;
use queen_domain::reads;
use queen_domain::time::Stamp;
use queen_ports::{BrokerError, PopRequest};

use super::Broker;

/// How often a pop by namespace or task, which waits on no one queue, looks again.
const TAGGED_RECHECK: Duration = Duration::from_millis(250);

impl Broker {
    /// On a node that does not lead: wait until it has applied what the leader had committed
    /// (a read barrier), so a look after it sees every acknowledged write. Answers whether it
    /// did (false on the leader, which has applied what it acknowledged, and when the barrier
    /// fails: the caller then answers from what it has).
    async fn catch_up(&self) -> bool {
        if self.log.progress().role == queen_ports::RaftRole::Leader {
            return false;
        }
        self.proposer.read_barrier().await.is_ok()
    }

    pub(super) async fn long_poll(&self, req: PopRequest) -> Result<PopOutcome, BrokerError> {
        let conflation = self.conflation_gate(&req).await?;
        let deadline = Instant::now()
            + if req.wait {
                req.timeout
            } else {
                Duration::ZERO
            };
        let mut cmd = req.command;
        // Only a pop that waits takes a place among the waiters of its (queue, group,
        // partition); registered before its first look, so a commit between the look and the
        // park still wakes it.
        let reg = req.wait.then(|| {
            self.wakeups.register(
                cmd.queue.as_str(),
                cmd.group.as_str(),
                cmd.partition.as_ref().map(|p| p.as_str()),
            )
        });
        let idle = tokio::sync::Notify::new();
        let mut caught_up = false;
        let mut woken = false;
        let mut fills = 0;
        let result = loop {
            let notify = reg.as_ref().map_or(&idle, |r| r.notify());
            let mut notified = pin!(notify.notified());
            notified.as_mut().enable();
            let mut would = self.look(&cmd, conflation)?;
            if would.is_empty() && !caught_up {
                // A follower may not have applied a push another node acknowledged: before it
                // answers "nothing", it catches up with the leader's commit index once.
                caught_up = true;
                if self.catch_up().await {
                    would = self.look(&cmd, conflation)?;
                }
            }
            // While the group's ready index does not cover the queue, an empty look proves
            // nothing: the pop is proposed anyway, and each one covers a share more.
            let filling = would.is_empty() && !self.index_covers(&cmd)?;
            if !would.is_empty() || filling {
                cmd.lease_id = LeaseId::minted(uuid::Uuid::now_v7().to_string());
                let r = self.propose(pop_command(&cmd, conflation)).await?;
                if let Outcome::Pop(p) = r.outcome
                    && !p.is_empty()
                {
                    if woken && let Some(reg) = &reg {
                        // Woken and served: there may be more, for the next waiter.
                        reg.pass_on();
                    }
                    break Ok(p);
                }
                // Another consumer won the race: wait like an empty look.
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if filling && fills < MAX_FILL_ROUNDS {
                // Not covered yet: the next pop goes on filling, without waiting (a pop that
                // does not wait too: it answers "nothing" only when nothing is claimable).
                fills += 1;
                continue;
            }
            let Some(reg) = reg.as_ref().filter(|_| !remaining.is_zero()) else {
                // Nothing delivered; the echo is the one the last look found.
                break Ok(empty(would.conflation));
            };
            let _ = tokio::time::timeout(reg.park_for(remaining), notified).await;
            woken = true;
        };
        drop(reg);
        if let Ok(p) = &result {
            let n: usize = p.claims.iter().map(|c| c.messages.len()).sum();
            self.telemetry.metrics().messages_delivered(n as u64);
        }
        result
    }

    pub(super) async fn long_poll_tagged(
        &self,
        namespace: Option<String>,
        task: Option<String>,
        req: PopRequest,
    ) -> Result<(String, PopOutcome), BrokerError> {
        let deadline = Instant::now()
            + if req.wait {
                req.timeout
            } else {
                Duration::ZERO
            };
        let conflation = self.conflation_gate(&req).await?;
        let mut cmd = req.command;
        let mut caught_up = false;
        loop {
            let queues =
                reads::queues(&*self.state.view(), 100_000).map_err(|e| Self::read_error(&e))?;
            for q in queues.iter().filter(|q| {
                namespace
                    .as_ref()
                    .is_none_or(|n| q.namespace.as_ref() == Some(n))
                    && task.as_ref().is_none_or(|t| q.task.as_ref() == Some(t))
            }) {
                let Ok(name) = QueueName::try_from(q.name.clone()) else {
                    continue;
                };
                cmd.queue = name;
                if self.look(&cmd, conflation)?.is_empty() && self.index_covers(&cmd)? {
                    continue;
                }
                cmd.lease_id = LeaseId::minted(uuid::Uuid::now_v7().to_string());
                if let Outcome::Pop(p) = self.propose(pop_command(&cmd, conflation)).await?.outcome
                    && !p.is_empty()
                {
                    let n: usize = p.claims.iter().map(|c| c.messages.len()).sum();
                    self.telemetry.metrics().messages_delivered(n as u64);
                    return Ok((q.name.clone(), p));
                }
            }
            if !caught_up {
                // As in `long_poll`: a follower catches up once before it answers "nothing".
                caught_up = true;
                if self.catch_up().await {
                    continue;
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                // No queue delivered: the declaration is echoed as it stands.
                let echo = ConflationEcho {
                    conflating: conflation,
                    conflict: false,
                };
                return Ok((String::new(), empty(echo)));
            }
            tokio::time::sleep(remaining.min(TAGGED_RECHECK)).await;
        }
    }
}

/// Most pops one request proposes in a row while its group's ready index does not cover the
/// queue yet (each covers up to `queen_domain::machine::MAX_FILL_STEPS` x 256 partitions: 256
/// rounds reach a million partitions).
const MAX_FILL_ROUNDS: usize = 256;

impl Broker {
    /// Whether `cmd` would claim something now (declaring conflation or not), without writing
    /// anything: the answer is empty exactly when `cmd`'s would be. It probes for one message
    /// of one partition, since a pop claims something exactly when one partition has one
    /// message for it (a look the size of the pop doubled the node's work per pop).
    fn look(&self, cmd: &PopCommand, conflation: bool) -> Result<PopOutcome, BrokerError> {
        let probe = PopCommand {
            batch: 1,
            max_partitions: 1,
            ..cmd.clone()
        };
        reads::would_pop_declaring(
            &*self.state.view(),
            Stamp(self.clock.now_micros()),
            &probe,
            conflation,
        )
        .map_err(|e| Self::read_error(&e))
    }

    /// Whether `cmd`'s group reads every partition of its queue through its ready index (an
    /// empty look then means nothing is claimable); a pop that names a partition reads it.
    fn index_covers(&self, cmd: &PopCommand) -> Result<bool, BrokerError> {
        if cmd.partition.is_some() {
            return Ok(true);
        }
        reads::index_covers(&*self.state.view(), cmd.queue.as_str(), cmd.group.as_str())
            .map_err(|e| Self::read_error(&e))
    }

    /// Whether the pop declares conflation; such a pop is refused (503) until every member of
    /// the cluster reads `Command::PopConflating`.
    async fn conflation_gate(&self, req: &PopRequest) -> Result<bool, BrokerError> {
        if req.conflation {
            self.require_format(Command::CONFLATION_FORMAT).await?;
        }
        Ok(req.conflation)
    }
}

/// The command of a pop that declares conflation or not.
fn pop_command(cmd: &PopCommand, conflation: bool) -> Command {
    if conflation {
        Command::PopConflating(cmd.clone())
    } else {
        Command::Pop(cmd.clone())
    }
}

/// The answer of a pop that delivered nothing.
fn empty(conflation: ConflationEcho) -> PopOutcome {
    PopOutcome {
        lease_id: String::new(),
        lease_expires: Stamp(0),
        claims: Vec::new(),
        conflation,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use queen_domain::command::{PopCommand, PushItem, Subscription};
    use queen_domain::model::QueueOptions;
    use queen_domain::names::{GroupName, PartitionName, QueueName};
    use queen_ports::ClientApi;

    use super::*;
    use crate::broker::twins::{FakeLog, ManualClock, MemState, broker};

    const T0: u64 = 1_700_000_000_000_000;

    fn item(queue: &str, id: &str) -> PushItem {
        PushItem {
            queue: QueueName::new(queue.to_owned()).unwrap(),
            partition: PartitionName::new("p".to_owned()).unwrap(),
            transaction_id: queen_domain::ids::TransactionId::new(id).unwrap(),
            message_id: [1; 16],
            payload: b"{\"n\":1}".to_vec(),
            trace_id: None,
        }
    }

    fn pop(queue: &str, wait: Duration) -> PopRequest {
        PopRequest {
            command: PopCommand {
                queue: QueueName::new(queue.to_owned()).unwrap(),
                partition: None,
                group: GroupName::queue_mode(),
                batch: 10,
                max_partitions: 1,
                lease_id: LeaseId::new("placeholder").unwrap(),
                auto_ack: false,
                subscription: Subscription::Default,
            },
            wait: !wait.is_zero(),
            timeout: wait,
            autopilot: None,
            conflation: false,
        }
    }

    fn delivered(p: &PopOutcome) -> Vec<String> {
        p.claims
            .iter()
            .flat_map(|c| c.messages.iter().map(|m| m.transaction_id.clone()))
            .collect()
    }

    #[tokio::test]
    async fn an_empty_queue_answers_at_once_without_a_wait() {
        let log = FakeLog::leader(MemState::default());
        let b = broker(&log, Arc::new(ManualClock::at(T0)), Duration::from_secs(5));
        let started = Instant::now();
        let p = b.pop(pop("q", Duration::ZERO)).await.unwrap();
        assert!(p.outcome.is_empty() && p.autopilot.is_none());
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(log.proposals(), 0, "nothing to deliver: nothing proposed");
    }

    #[tokio::test]
    async fn a_waiting_pop_is_woken_by_a_push_and_leases_it() {
        let log = FakeLog::leader(MemState::default());
        let b = Arc::new(broker(
            &log,
            Arc::new(ManualClock::at(T0)),
            Duration::from_secs(5),
        ));
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move { b.pop(pop("q", Duration::from_secs(30))).await })
        };
        // Parked before the push: the wake-up, not the re-check, must deliver it.
        for _ in 0..200 {
            if b.wakeups.parked() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(b.wakeups.parked(), 1);
        b.push(vec![item("q", "t1")], None).await.unwrap();
        let p = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken well before its wait ran out")
            .unwrap()
            .unwrap()
            .outcome;
        assert_eq!(delivered(&p), ["t1"]);
        assert!(!p.lease_id.is_empty(), "a fresh lease id per attempt");
        assert_eq!(b.wakeups.parked(), 0);
    }

    #[tokio::test]
    async fn a_tagged_pop_finds_the_queue_by_its_namespace() {
        let log = FakeLog::leader(MemState::default());
        let b = broker(&log, Arc::new(ManualClock::at(T0)), Duration::from_secs(5));
        for (q, ns) in [("a", "billing"), ("b", "mail")] {
            b.configure(
                QueueName::new(q.to_owned()).unwrap(),
                Some(ns.to_owned()),
                None,
                QueueOptions::default(),
            )
            .await
            .unwrap();
            b.push(vec![item(q, &format!("{q}1"))], None).await.unwrap();
        }
        let (queue, p) = b
            .pop_tagged(
                Some("mail".to_owned()),
                None,
                pop("ignored", Duration::ZERO),
            )
            .await
            .unwrap();
        assert_eq!(queue, "b");
        assert_eq!(delivered(&p.outcome), ["b1"]);
    }
}
