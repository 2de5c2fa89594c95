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
        let leader =
            match change_here(&self.inner.raft, me, &self.inner.transport, op.clone()).await {
                Err(MembershipError::NotLeader {
                    leader: Some(l), ..
                }) if l != me => l,
                Err(MembershipError::NotLeader { .. }) if list => return Ok(self.members()),
                r => return r,
            };
        let forwarded = async {
            let addr = self.leader_addr(leader, None).ok_or_else(|| {
                MembershipError::Unavailable(format!("no raft address known for leader {leader}"))
            })?;
            let body = wire::encode(&op).map_err(MembershipError::Unavailable)?;
            let bytes = self
                .inner
                .transport
                .post(leader, &addr, wire::MEMBERSHIP, full(body), FORWARD_TIMEOUT)
                .await
                .map_err(|e| MembershipError::Unavailable(format!("leader {leader}: {e}")))?;
            wire::decode::<wire::MembershipReply>(&bytes).map_err(MembershipError::Unavailable)?
        };
        match forwarded.await {
            Err(MembershipError::Unavailable(_)) if list => Ok(self.members()),
            r => r,
        }
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
