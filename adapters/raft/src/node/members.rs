//! The `Membership` port: a change runs on the leader, here or handed to it over the raft port.

use super::*;

impl RaftNode {
    /// The members as this node sees them (liveness and lag are known on the leader).
    pub fn members(&self) -> Vec<Member> {
        members_of(&self.inner.raft, self.inner.node_id)
    }

    /// Run a membership change (or a listing) on the leader: here when this node leads, else
    /// handed to the leader over the raft port. Answers the members as the leader sees them
    /// afterwards. A listing with no leader reachable answers this node's own view.
    ///
    /// # Errors
    /// No leader known, the leader unreachable, or the leader's refusal (see
    /// `MembershipError`).
    pub async fn membership(&self, op: MembershipChange) -> Result<Vec<Member>, MembershipError> {
        let me = self.inner.node_id;
        let list = matches!(op, MembershipChange::List);
        // Where the change goes: here first. A leader asked to remove itself hands leadership
        // over and answers the new leader: follow it (a bounded number of times). A new leader
        // has not heard its followers yet, so for a few seconds it may see no live majority:
        // ask it again then.
        let mut to = me;
        let mut moved = false;
        for _ in 0..16 {
            let answer = if to == me {
                change_here(&self.inner.raft, me, &self.inner.transport, op.clone()).await
            } else {
                self.forward_membership(to, &op).await
            };
            match answer {
                Err(MembershipError::NotLeader {
                    leader: Some(l), ..
                }) if l != to => {
                    moved |= to != me || matches!(op, MembershipChange::Remove { id } if id == me);
                    to = l;
                }
                Err(MembershipError::NotLeader { .. }) if list => return Ok(self.members()),
                Err(MembershipError::Unavailable(_)) if list => return Ok(self.members()),
                Err(MembershipError::NoQuorum(_)) if moved => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                r => return r,
            }
        }
        Err(MembershipError::Unavailable(
            "the leader kept moving while the change was handed to it".into(),
        ))
    }

    /// Hand a membership change to `leader` over the raft port.
    async fn forward_membership(
        &self,
        leader: u64,
        op: &MembershipChange,
    ) -> Result<Vec<Member>, MembershipError> {
        let addr = self.leader_addr(leader, None).ok_or_else(|| {
            MembershipError::Unavailable(format!("no raft address known for leader {leader}"))
        })?;
        let body = wire::encode(op).map_err(MembershipError::Unavailable)?;
        let bytes = self
            .inner
            .transport
            .post(leader, &addr, wire::MEMBERSHIP, full(body), FORWARD_TIMEOUT)
            .await
            .map_err(|e| MembershipError::Unavailable(format!("leader {leader}: {e}")))?;
        wire::decode::<wire::MembershipReply>(&bytes).map_err(MembershipError::Unavailable)?
    }

    /// On the leader: the log format every member reads, `None` for a member that did not
    /// answer within a second. Members are asked in parallel.
    pub async fn member_kinds(&self) -> Vec<(u64, Option<u32>)> {
        let me = self.inner.node_id;
        let nodes: Vec<(u64, String)> = {
            let m = self.inner.raft.metrics().borrow_watched().clone();
            m.membership_config
                .membership()
                .nodes()
                .map(|(id, n)| (*id, n.raft_addr.clone()))
                .collect()
        };
        let transport = &self.inner.transport;
        let asks = nodes.into_iter().map(|(id, addr)| async move {
            if id == me {
                (id, Some(self.inner.log_kinds))
            } else {
                (id, ask_kinds(transport, id, &addr).await)
            }
        });
        futures::future::join_all(asks).await
    }
}

impl Membership for RaftNode {
    fn change(
        &self,
        change: MembershipChange,
    ) -> queen_ports::BoxFuture<'_, Result<Vec<Member>, MembershipError>> {
        Box::pin(self.membership(change))
    }

    fn members(&self) -> Vec<Member> {
        RaftNode::members(self)
    }
}
