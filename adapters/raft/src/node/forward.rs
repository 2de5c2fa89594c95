//! Proposals and reads from any node: a leader writes locally and confirms its read index; a
//! follower hands the command to the leader over the raft port and waits until it applied the
//! entry that carried it, or asks the leader for its read index. The `ReplicatedLog` port.

use super::*;
use queen_ports::Answer;

impl RaftNode {
    /// The raft address of `leader`: from the membership, else from the configured peers.
    pub(super) fn leader_addr(&self, leader: u64, hint: Option<&NodeInfo>) -> Option<String> {
        if let Some(n) = hint.filter(|n| !n.raft_addr.is_empty()) {
            return Some(n.raft_addr.clone());
        }
        if let Some(n) = self
            .inner
            .raft
            .server_metrics()
            .borrow_watched()
            .membership_config
            .get_node(&leader)
            && !n.raft_addr.is_empty()
        {
            return Some(n.raft_addr.clone());
        }
        self.inner
            .peers
            .iter()
            .find(|p| p.id == leader)
            .map(|p| p.raft_addr.clone())
    }

    /// The leader this node currently knows (from metrics), other than itself.
    fn known_leader(&self) -> Option<u64> {
        self.inner.raft.metrics().borrow_watched().current_leader
    }

    /// This node's term now.
    fn term(&self) -> u64 {
        self.inner.raft.metrics().borrow_watched().current_term
    }

    /// Resolves once `leader`'s leadership of `term` is over as this node sees it: a newer term
    /// began here (an election, whoever wins it) or another node leads. A call to that leader
    /// still waiting then will most likely never be answered (it stopped, or lost its
    /// majority), and what it carried is decided by the next leader.
    async fn leadership_over(&self, leader: u64, term: u64) {
        // The server metrics (leader, vote) change only with them; `metrics()` is sent on every
        // turn of the core's loop and would wake this call several times per raft round.
        let mut rx = self.inner.raft.server_metrics();
        loop {
            {
                let m = rx.borrow_watched();
                if m.vote.leader_id.term > term || m.current_leader.is_some_and(|l| l != leader) {
                    return;
                }
            }
            if rx.changed().await.is_err() {
                // The core stopped; the call's own timeout ends it.
                return std::future::pending().await;
            }
        }
    }

    /// Hand a command to `leader` over the raft port and wait until this node has applied the
    /// entry that carried it. A call still waiting when the leader's term ends here is given up
    /// with an unknown outcome at once, not after `FORWARD_TIMEOUT`: a leader stopped (SIGSTOP,
    /// a hung machine) answers nothing, and every forward to it would otherwise hold its
    /// request, and the push lane's slots, for the whole timeout after a new leader took over.
    async fn forward(
        &self,
        leader: u64,
        addr: &str,
        command: &[u8],
    ) -> Result<Answer, ProposeError> {
        let term = self.term();
        let call = self.inner.transport.post(
            leader,
            addr,
            wire::FORWARD,
            full(bytes::Bytes::copy_from_slice(command)),
            FORWARD_TIMEOUT,
        );
        let bytes = tokio::select! {
            r = call => r.map_err(|e| forward_call_error(leader, e))?,
            () = self.leadership_over(leader, term) => {
                tracing::debug!(leader, term, "leadership ended during a forward; outcome unknown");
                return Err(ProposeError::OutcomeUnknown);
            }
        };
        let reply: wire::ForwardReply = wire::decode(&bytes).map_err(|e| {
            tracing::warn!(leader, error = %e, "undecodable forward reply");
            ProposeError::OutcomeUnknown
        })?;
        let fwd = reply.map_err(ProposeError::from)?;
        if !self.wait_applied(fwd.index, APPLY_WAIT_TIMEOUT).await {
            tracing::warn!(
                index = fwd.index,
                "forwarded command committed but not applied here in time"
            );
            return Err(ProposeError::OutcomeUnknown);
        }
        Ok(Answer::Bytes(fwd.data))
    }

    /// `propose` on a multi-node group: write locally when leading, else forward to the leader.
    async fn propose_multi(&self, command: Vec<u8>) -> Result<Answer, ProposeError> {
        let command = bytes::Bytes::from(command);
        let raft = &self.inner.raft;
        let mut hint: Option<(u64, Option<NodeInfo>)> = None;
        for attempt in 1..=FORWARD_ATTEMPTS {
            let target = match hint.take() {
                Some(h) => Some(h),
                None if raft.is_leader() => None,
                None => match self.known_leader() {
                    Some(l) if l == self.inner.node_id => None,
                    Some(l) => Some((l, None)),
                    None => return Err(ProposeError::NotLeader { leader: None }),
                },
            };
            let Some((leader, node)) = target else {
                match raft.client_write(Command(command.clone())).await {
                    Ok(resp) => return Ok(resp.data.0),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                        match f.leader_id {
                            Some(l) if l != self.inner.node_id => {
                                hint = Some((l, f.leader_node));
                                continue;
                            }
                            _ => return Err(ProposeError::NotLeader { leader: None }),
                        }
                    }
                    Err(e) => return Err(map_write_error(e)),
                }
            };
            let Some(addr) = self.leader_addr(leader, node.as_ref()) else {
                return Err(ProposeError::NotLeader {
                    leader: Some(leader),
                });
            };
            match self.forward(leader, &addr, &command).await {
                Err(ProposeError::NotLeader { leader: next }) if attempt < FORWARD_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(20 * attempt as u64)).await;
                    if let Some(n) = next.filter(|n| *n != leader) {
                        hint = Some((n, None));
                    }
                }
                r => return r,
            }
        }
        Err(ProposeError::NotLeader {
            leader: self.known_leader(),
        })
    }

    /// `read_barrier` on a multi-node group: a leader confirms its read index itself; a
    /// follower asks the leader for it and waits until it has applied that far.
    async fn read_barrier_multi(&self) -> Result<(), ProposeError> {
        let raft = &self.inner.raft;
        let leader = self.known_leader();
        if raft.is_leader() || leader == Some(self.inner.node_id) {
            return raft
                .ensure_linearizable(ReadPolicy::ReadIndex)
                .await
                .map(|_| ())
                .map_err(map_read_error);
        }
        let Some(leader) = leader else {
            return Err(ProposeError::NotLeader { leader: None });
        };
        let Some(addr) = self.leader_addr(leader, None) else {
            return Err(ProposeError::NotLeader {
                leader: Some(leader),
            });
        };
        let term = self.term();
        let call = self.inner.transport.post(
            leader,
            &addr,
            wire::READ_INDEX,
            full(bytes::Bytes::new()),
            READ_INDEX_TIMEOUT,
        );
        let bytes = tokio::select! {
            r = call => r.map_err(|e| ProposeError::Unavailable(format!("read index from {leader}: {e}")))?,
            () = self.leadership_over(leader, term) => {
                return Err(ProposeError::Unavailable(format!(
                    "leader {leader} lost its term {term} while asked for a read index"
                )));
            }
        };
        let reply: wire::ReadIndexReply =
            wire::decode(&bytes).map_err(ProposeError::Unavailable)?;
        let index = reply.map_err(ProposeError::from)?;
        if self.wait_applied(index, APPLY_WAIT_TIMEOUT).await {
            Ok(())
        } else {
            Err(ProposeError::Unavailable(format!(
                "did not apply up to read index {index} in time"
            )))
        }
    }
}

/// A failed forward call as the app sees it: nothing sent means retry; maybe sent means unknown.
fn forward_call_error(leader: u64, e: CallError) -> ProposeError {
    match e {
        CallError::Connect(e) => {
            ProposeError::Unavailable(format!("leader {leader} is unreachable: {e}"))
        }
        CallError::Status(401, _) => {
            ProposeError::Unavailable(format!("leader {leader} refused the raft token"))
        }
        CallError::Status(s, b) => {
            ProposeError::Unavailable(format!("leader {leader} answered {s}: {b}"))
        }
        CallError::Timeout | CallError::Sent(_) => ProposeError::OutcomeUnknown,
    }
}

impl ReplicatedLog for RaftNode {
    fn propose(
        &self,
        command: Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = Result<Answer, ProposeError>> + Send + '_>> {
        Box::pin(async move {
            if self.inner.multi {
                return self.propose_multi(command).await;
            }
            match self.inner.raft.client_write(Command(command.into())).await {
                Ok(resp) => Ok(resp.data.0),
                Err(e) => Err(map_write_error(e)),
            }
        })
    }

    fn read_barrier(&self) -> Pin<Box<dyn Future<Output = Result<(), ProposeError>> + Send + '_>> {
        Box::pin(async move {
            if self.inner.multi {
                return self.read_barrier_multi().await;
            }
            self.inner
                .raft
                .ensure_linearizable(ReadPolicy::ReadIndex)
                .await
                .map(|_| ())
                .map_err(map_read_error)
        })
    }

    fn compact(&self, within: Duration) -> queen_ports::BoxFuture<'_, bool> {
        Box::pin(self.compact_log(within))
    }

    fn progress(&self) -> LogProgress {
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let role = match m.state {
            ServerState::Leader => RaftRole::Leader,
            ServerState::Follower => RaftRole::Follower,
            ServerState::Candidate => RaftRole::Candidate,
            ServerState::Learner => RaftRole::Learner,
            ServerState::Shutdown => RaftRole::Shutdown,
        };
        LogProgress {
            node_id: self.inner.node_id,
            role,
            leader: m.current_leader,
            term: m.current_term,
            applied: m.last_applied.map_or(0, |l| l.index),
            commit: m.local_committed.map_or(0, |l| l.index),
            last_log: m.last_log_index.unwrap_or(0),
            storage_ready: m.running_state.is_ok(),
            // A lone voter is its own quorum; otherwise the time since a majority acknowledged.
            quorum_ack_ms: match m.state {
                ServerState::Leader
                    if m.membership_config.membership().voter_ids().count() <= 1 =>
                {
                    Some(0)
                }
                ServerState::Leader => m
                    .last_quorum_acked
                    .as_ref()
                    .map(|t| openraft::Instant::elapsed(&**t).as_millis() as u64),
                _ => None,
            },
            leader_contact_ms: match m.state {
                ServerState::Follower | ServerState::Learner if self.inner.multi => {
                    self.inner.shared.contact.since_ms()
                }
                _ => None,
            },
        }
    }
}
