//! Administration: membership changes through the membership port, and giving a deleted
//! queue's space back near the disk gate.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use queen_domain::reads;
use queen_ports::{BrokerError, Member, MembershipChange, MembershipOp, StateReader};

use super::Broker;

/// A queue deletion this close to the disk gate (percentage points) reclaims the deleted rows'
/// space at once.
const RECLAIM_WITHIN_POINTS: u8 = 10;
/// How long a reclaim waits for a deleted queue's rows to be swept.
const RECLAIM_WAIT: Duration = Duration::from_secs(60);

/// Whether rows of deleted queues are still waiting to be swept by housekeeping (a read
/// failure counts as none: the reclaim then runs at once).
fn graves_pending(store: &dyn StateReader) -> bool {
    reads::deletions_pending(&*store.view()).unwrap_or(false)
}

impl Broker {
    pub(super) async fn change_membership(
        &self,
        op: MembershipOp,
    ) -> Result<Vec<Member>, BrokerError> {
        let Some(raft) = &self.membership else {
            return Err(BrokerError::Unavailable(
                "this node has no raft group".to_owned(),
            ));
        };
        // A follower hands the change to the leader (raft port); the leader checks and runs it.
        let change = match op {
            MembershipOp::List => MembershipChange::List,
            MembershipOp::AddLearner { id, raft: r, http } => {
                let min_kinds = reads::cluster_version(&*self.state.view()).unwrap_or(0);
                MembershipChange::AddLearner {
                    id,
                    raft: r,
                    http,
                    min_kinds,
                }
            }
            MembershipOp::Promote { ids, force } => MembershipChange::Promote {
                ids,
                force,
                max_lag: self.promote_max_lag,
            },
            MembershipOp::Remove { id } => MembershipChange::Remove { id },
        };
        // A membership change has the request deadline too: past it the outcome is unknown
        // (every change is idempotent, so a retry is safe).
        match tokio::time::timeout(self.proposer.request_timeout(), raft.change(change)).await {
            Err(_) => Err(BrokerError::Timeout),
            Ok(result) => Ok(result?),
        }
    }

    /// After a queue deletion near the disk gate, give the deleted rows' space back soon (one
    /// reclaim at a time): otherwise it returns only when the store next compacts those tables,
    /// and a node at a closed gate has stopped writing the data that would make it compact. The
    /// queue's rows are deleted by the next ticks in bounded steps (its "graves"), so the
    /// reclaim waits until none is left (at most `RECLAIM_WAIT`).
    pub(super) fn reclaim_near_gate(&self) {
        if !self.proposer.disk.near_gate(RECLAIM_WITHIN_POINTS)
            || self.reclaiming.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (store, running) = (self.state.clone(), self.reclaiming.clone());
        let log = self.log.clone();
        tokio::spawn(async move {
            let until = Instant::now() + RECLAIM_WAIT;
            while graves_pending(&*store) && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // The deleted messages are in raft log files (written once, where the log wrote
            // their entries): a snapshot and a purge up to it let those files go now.
            let started = Instant::now();
            let done = log.compact(RECLAIM_WAIT).await;
            tracing::info!(target: "queen-app", ms = started.elapsed().as_millis(), done, "compacted the raft log near the disk gate");
            let started = Instant::now();
            let done = tokio::task::spawn_blocking(move || {
                store.reclaim().map(|()| store.figures().disk_bytes)
            })
            .await;
            match done {
                Ok(Ok(bytes)) => {
                    tracing::info!(target: "queen-app", ms = started.elapsed().as_millis(), store_bytes = bytes, "reclaimed deleted rows near the disk gate")
                }
                Ok(Err(e)) => {
                    tracing::warn!(target: "queen-app", error = %e, "reclaiming deleted rows failed")
                }
                Err(e) => {
                    tracing::warn!(target: "queen-app", error = %e, "the reclaim task failed")
                }
            }
            running.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use queen_ports::{BoxFuture, ClientApi, Membership, MembershipError};

    use super::*;
    use crate::broker::twins::{FakeLog, ManualClock, MemState, broker};

    /// Records the changes it is handed and answers with a scripted result.
    #[derive(Default)]
    struct FakeMembership {
        seen: Mutex<Vec<MembershipChange>>,
        refuse: Option<MembershipError>,
    }

    impl Membership for FakeMembership {
        fn change(
            &self,
            change: MembershipChange,
        ) -> BoxFuture<'_, Result<Vec<Member>, MembershipError>> {
            self.seen.lock().unwrap().push(change);
            let answer = match &self.refuse {
                Some(e) => Err(e.clone()),
                None => Ok(self.members()),
            };
            Box::pin(async move { answer })
        }

        fn members(&self) -> Vec<Member> {
            vec![Member {
                id: 1,
                raft: "127.0.0.1:7001".into(),
                http: "127.0.0.1:6001".into(),
                voter: true,
                live: true,
                lag: 0,
            }]
        }
    }

    fn with(m: Arc<FakeMembership>) -> Broker {
        let log = FakeLog::leader(MemState::default());
        broker(&log, Arc::new(ManualClock::at(1)), Duration::from_secs(5))
            .with_cluster(m, 250, 1000, 2000)
    }

    #[tokio::test]
    async fn changes_carry_the_nodes_limits_to_the_leader() {
        let m = Arc::new(FakeMembership::default());
        let b = with(m.clone());
        let members = b
            .membership(MembershipOp::Promote {
                ids: vec![2],
                force: false,
            })
            .await
            .unwrap();
        assert_eq!(members.len(), 1);
        b.membership(MembershipOp::AddLearner {
            id: 4,
            raft: "h:1".into(),
            http: "h:2".into(),
        })
        .await
        .unwrap();
        let seen = m.seen.lock().unwrap().clone();
        assert!(matches!(
            seen[0],
            MembershipChange::Promote { max_lag: 250, .. }
        ));
        assert!(matches!(
            seen[1],
            MembershipChange::AddLearner { min_kinds: 0, .. }
        ));
    }

    #[tokio::test]
    async fn a_refusal_reaches_the_caller_typed() {
        let m = Arc::new(FakeMembership {
            refuse: Some(MembershipError::LastVoter(1)),
            ..FakeMembership::default()
        });
        let e = with(m)
            .membership(MembershipOp::Remove { id: 1 })
            .await
            .unwrap_err();
        assert!(matches!(
            e,
            BrokerError::Membership(MembershipError::LastVoter(1))
        ));
    }

    #[tokio::test]
    async fn a_node_without_a_group_is_unavailable() {
        let log = FakeLog::leader(MemState::default());
        let b = broker(&log, Arc::new(ManualClock::at(1)), Duration::from_secs(5));
        assert!(matches!(
            b.membership(MembershipOp::List).await.unwrap_err(),
            BrokerError::Unavailable(_)
        ));
    }
}
