//! What the node says about itself: readiness for `/health`, the status document and the
//! gauges of `/metrics/prometheus`.

use queen_domain::reads;
use queen_ports::{
    BrokerError, HealthView, NodeStatus, NotReady, PopsStatus, QueueStatus, QueuesStatus, RaftRole,
    StatusView, StorageStatus,
};

use super::Broker;

/// A node is ready within this many entries of the commit index.
pub(super) const READY_LAG_ENTRIES: u64 = 1000;
/// A leader unacknowledged by a majority for longer than this reports `no_quorum` (the
/// election timeout's upper bound).
const LEADER_QUORUM_MS: u64 = 2000;

impl Broker {
    pub(super) fn readiness(&self) -> HealthView {
        let p = self.log.progress();
        let view = self.state.view();
        let lag = p.commit.saturating_sub(p.applied);
        // Time behind: the leader ticks every second, so a node that applied the latest
        // entries has a recent safeTime (broker time, compared with this node's clock).
        let age_ms = reads::safe_time(&*view)
            .map(|s| self.clock.now_micros().saturating_sub(s.0) / 1000)
            .unwrap_or(u64::MAX);
        // A leader that no majority acknowledged within an election timeout has lost its quorum;
        // a follower that no leader reached for as long is cut off (with pre-vote it keeps its
        // term and the leader it knew, so the known leader alone does not tell).
        let leader_alone = p.quorum_ack_ms.is_some_and(|ms| ms > LEADER_QUORUM_MS);
        let follower_alone = matches!(p.role, RaftRole::Follower | RaftRole::Learner)
            && p.leader_contact_ms.is_none_or(|ms| ms > LEADER_QUORUM_MS);
        let not_ready = if !p.storage_ready {
            Some(NotReady::Settling)
        } else if p.leader.is_none() || leader_alone || follower_alone {
            Some(NotReady::NoQuorum)
        } else if lag > self.ready_lag_entries && age_ms > self.ready_lag_ms {
            Some(NotReady::Settling)
        } else {
            None
        };
        HealthView {
            not_ready,
            progress: p,
            kinds: self.kinds,
            cluster_version: reads::cluster_version(&*view).unwrap_or(0),
            apply_failure: None,
        }
    }

    pub(super) fn status_view(&self) -> Result<StatusView, BrokerError> {
        let view = self.state.view();
        let queues = reads::queues(&*view, 1000).map_err(|e| Self::read_error(&e))?;
        let safe = reads::safe_time(&*view).map_err(|e| Self::read_error(&e))?;
        let p = self.log.progress();
        let flagged: Vec<String> = queues
            .iter()
            .filter(|q| q.options.encryption_enabled)
            .map(|q| q.name.clone())
            .collect();
        Ok(StatusView {
            group: self.group,
            ephemeral: self.ephemeral_status(),
            encryption: queen_ports::EncryptionStatus {
                key_loaded: self.has_key,
                encrypted_queues: flagged,
            },
            node: NodeStatus {
                id: p.node_id,
                uptime_seconds: self.started.elapsed().as_secs(),
                version: env!("CARGO_PKG_VERSION"),
            },
            raft: p,
            safe_time: safe.iso_micros(),
            storage: StorageStatus {
                store: self.state.figures(),
                log_fsyncs: (self.fsyncs)(),
            },
            queues: QueuesStatus {
                count: queues.len(),
                messages: queues.iter().map(|q| q.messages).sum(),
                items: queues
                    .into_iter()
                    .map(|q| QueueStatus {
                        name: queen_domain::tenant::display(&q.name).into_owned(),
                        messages: q.messages,
                        partitions: q.partitions,
                        dead_lettered: q.dead_lettered,
                        namespace: q.namespace,
                        task: q.task,
                    })
                    .collect(),
            },
            pops: PopsStatus {
                waiting: self.wakeups.parked(),
            },
            s3: self.s3_status.get().map(|f| f()),
        })
    }

    pub(crate) fn progress_gauges(&self) {
        let p = self.log.progress();
        let m = self.telemetry.metrics();
        m.set_raft(
            self.group,
            p.term,
            p.applied,
            p.commit,
            p.role == RaftRole::Leader,
        );
        m.set_log_fsyncs(self.group, (self.fsyncs)());
        m.set_store_disk_bytes(self.group, self.state.figures().disk_bytes);
        m.set_waiting_pops(self.wakeups.parked());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use queen_domain::command::Command;
    use queen_ports::ClientApi;

    use super::*;
    use crate::broker::twins::{FakeLog, ManualClock, MemState, broker};

    const T0: u64 = 1_700_000_000_000_000;

    #[tokio::test]
    async fn a_leader_that_applied_a_recent_tick_is_ready() {
        let log = FakeLog::leader(MemState::default());
        let clock = Arc::new(ManualClock::at(T0));
        let b = broker(&log, clock.clone(), Duration::from_secs(5));
        b.propose(Command::Tick).await.unwrap();
        let h = b.health();
        assert_eq!(h.not_ready, None, "{h:?}");
        assert_eq!(h.kinds, crate::broker::LOG_KINDS);
    }

    #[tokio::test]
    async fn a_node_without_a_leader_reports_no_quorum() {
        let log = FakeLog::follower(MemState::default(), None);
        let b = broker(&log, Arc::new(ManualClock::at(T0)), Duration::from_secs(5));
        assert_eq!(b.health().not_ready, Some(NotReady::NoQuorum));
    }

    #[tokio::test]
    async fn a_follower_no_leader_reached_for_an_election_timeout_reports_no_quorum() {
        let log = FakeLog::follower(MemState::default(), Some(1));
        let clock = Arc::new(ManualClock::at(T0));
        let b = broker(&log, clock, Duration::from_secs(5));
        b.propose(Command::Tick).await.unwrap();
        log.set_leader_contact(Some(100));
        assert_eq!(b.health().not_ready, None, "heard 100 ms ago");
        // It still knows a leader and its term (pre-vote keeps both), but nobody reached it.
        log.set_leader_contact(Some(LEADER_QUORUM_MS + 1));
        assert_eq!(b.health().not_ready, Some(NotReady::NoQuorum));
        log.set_leader_contact(None);
        assert_eq!(
            b.health().not_ready,
            Some(NotReady::NoQuorum),
            "never reached"
        );
    }

    #[tokio::test]
    async fn the_status_counts_the_queues_and_the_parked_pops() {
        let log = FakeLog::leader(MemState::default());
        let clock = Arc::new(ManualClock::at(T0));
        let b = broker(&log, clock.clone(), Duration::from_secs(5));
        b.propose(Command::Tick).await.unwrap();
        clock.advance(Duration::from_secs(1));
        let s = b.status().await.unwrap();
        assert_eq!((s.queues.count, s.queues.messages), (0, 0));
        assert_eq!(s.pops.waiting, 0);
        assert_eq!(s.raft.role, RaftRole::Leader);
        assert_eq!(s.safe_time, queen_domain::time::Stamp(T0).iso_micros());
        assert!(s.s3.is_none(), "no sink runs");
        // The storage block's keys, as /status has always shown them.
        let v = serde_json::to_value(&s).unwrap();
        let keys: Vec<&str> = v["storage"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "dedupMemoryEntries",
                "dedupRunEntries",
                "dedupRuns",
                "diskBytes",
                "flushesQueued",
                "level0Tables",
                "logFsyncs",
                "memtableBytes",
                "sealedMemtables",
                "segmentBytes",
                "segmentFiles",
            ]
        );
    }
}
