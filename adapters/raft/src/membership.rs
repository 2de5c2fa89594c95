//! Membership changes on the leader: the members as the leader sees them (liveness, lag), the
//! pure quorum predicate a change must keep, and running a change (the admin routes'
//! `MembershipChange`) here. A follower hands a change to the leader over the raft port
//! (`RaftNode::membership`); the raft port's server runs it with [`change_here`].

use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use queen_ports::{Member, MembershipChange, MembershipError};

use crate::network::{Transport, full};
use crate::state_machine::Raft;
use crate::type_config::NodeInfo;
use crate::wire;

/// A member that acknowledged the leader within this long counts as live (membership checks);
/// longer than the election timeout, so a slow heartbeat on a loaded machine does not count.
pub(crate) const LIVE_WITHIN: Duration = Duration::from_secs(2);
/// How long the leader waits for a member's answer to `/info`.
const INFO_TIMEOUT: Duration = Duration::from_secs(1);

/// The members as `raft` sees them (liveness and lag are known on the leader).
pub(crate) fn members_of(raft: &Raft, me: u64) -> Vec<Member> {
    let m = raft.metrics().borrow_watched().clone();
    let last = m.last_log_index.unwrap_or(0);
    let leader = m.state == ServerState::Leader;
    let replication = m.replication.clone().unwrap_or_default();
    let heartbeat = m.heartbeat.clone().unwrap_or_default();
    let live_within = LIVE_WITHIN;
    let cfg = m.membership_config.membership();
    let voters: std::collections::BTreeSet<u64> = cfg.voter_ids().collect();
    cfg.nodes()
        .map(|(id, node)| {
            let is_me = *id == me;
            let matched = replication
                .get(id)
                .cloned()
                .flatten()
                .map_or(0, |l| l.index);
            let live = is_me
                || heartbeat
                    .get(id)
                    .cloned()
                    .flatten()
                    .is_some_and(|t| openraft::Instant::elapsed(&*t) <= live_within);
            Member {
                id: *id,
                raft: node.raft_addr.clone(),
                http: node.http_addr.clone(),
                voter: voters.contains(id),
                live: if leader { live } else { is_me },
                lag: if is_me {
                    0
                } else {
                    last.saturating_sub(matched)
                },
            }
        })
        .collect()
}

fn require_leader(raft: &Raft, me: u64) -> Result<Vec<Member>, MembershipError> {
    let m = raft.metrics().borrow_watched().clone();
    if m.state != ServerState::Leader {
        return Err(not_leader(&m));
    }
    Ok(members_of(raft, me))
}

/// "Not the leader", naming the leader `m` knows and its client address.
fn not_leader(m: &openraft::RaftMetrics<crate::type_config::TypeConfig>) -> MembershipError {
    let leader = m.current_leader;
    let leader_http = leader.and_then(|l| {
        m.membership_config
            .membership()
            .get_node(&l)
            .map(|n| n.http_addr.clone())
    });
    MembershipError::NotLeader {
        leader,
        leader_http,
    }
}

/// On a leader that is asked to remove itself: hand leadership to the most caught-up live
/// voter and answer where the change must go now (`NotLeader` with the new leader, or
/// `Unavailable` when no other leader appeared within three seconds).
async fn hand_over_before_removal(raft: &Raft, me: u64, members: &[Member]) -> MembershipError {
    let Some(to) = members
        .iter()
        .filter(|m| m.voter && m.live && m.id != me)
        .min_by_key(|m| m.lag)
        .map(|m| m.id)
    else {
        return MembershipError::NoQuorum("no other live voter to lead after the removal".into());
    };
    if let Err(e) = raft.trigger().transfer_leader(to).await {
        return MembershipError::Unavailable(format!(
            "leadership could not be handed to {to} before removing the leader: {e}"
        ));
    }
    match raft
        .wait(Some(std::time::Duration::from_secs(3)))
        .metrics(
            |m| m.current_leader.is_some_and(|l| l != me),
            "another leader before removing this one",
        )
        .await
    {
        Ok(m) => not_leader(&m),
        Err(e) => MembershipError::Unavailable(format!(
            "no other leader within 3 s of handing leadership to {to}: {e}"
        )),
    }
}

fn live_majority(members: &[Member], voters: &std::collections::BTreeSet<u64>) -> bool {
    let live = members
        .iter()
        .filter(|m| voters.contains(&m.id) && m.live)
        .count();
    live * 2 > voters.len()
}

async fn change(
    raft: &Raft,
    change: openraft::ChangeMembers<u64, NodeInfo>,
) -> Result<(), MembershipError> {
    raft.change_membership(change, false)
        .await
        .map(|_| ())
        .map_err(|e| MembershipError::Failed(e.to_string()))
}

/// Ask node `id` at `addr` which log format it reads; `None` when it does not answer.
pub(crate) async fn ask_kinds(transport: &Transport, id: u64, addr: &str) -> Option<u32> {
    ask_info(transport, id, addr).await.map(|r| r.kinds)
}

/// The group count each of `peers` but `me` runs (`QUEEN_RAFT_GROUPS`), as its raft port
/// answers within a second (a node from before groups counts one); `None` for a peer that did
/// not answer. Asked in parallel, before this node opens anything, so that a node started with
/// another count than its cluster's can refuse to start.
pub async fn peer_groups(
    token: Option<String>,
    me: u64,
    peers: &[crate::Peer],
) -> Vec<(u64, Option<u16>)> {
    let transport = Transport::new(token, None);
    let asks = peers.iter().filter(|p| p.id != me).map(|p| {
        let transport = transport.clone();
        async move {
            (
                p.id,
                ask_info(&transport, p.id, &p.raft_addr)
                    .await
                    .map(|i| i.groups),
            )
        }
    });
    futures::future::join_all(asks).await
}

/// A member's `/info` (within a second), `None` when it does not answer.
pub(crate) async fn ask_info(
    transport: &Transport,
    id: u64,
    addr: &str,
) -> Option<wire::InfoReply> {
    let bytes = transport
        .post(
            id,
            addr,
            wire::INFO,
            full(bytes::Bytes::new()),
            INFO_TIMEOUT,
        )
        .await
        .ok()?;
    wire::decode_info(&bytes).ok()
}

/// Run a membership change on this node, which must lead; answers the members afterwards.
pub(crate) async fn change_here(
    raft: &Raft,
    me: u64,
    transport: &Transport,
    op: MembershipChange,
) -> Result<Vec<Member>, MembershipError> {
    let members = require_leader(raft, me)?;
    match op {
        MembershipChange::List => return Ok(members),
        MembershipChange::AddLearner {
            id,
            raft: raft_addr,
            http,
            min_kinds,
        } => {
            if members.iter().any(|m| m.id == id && m.raft == raft_addr) {
                return Ok(members);
            }
            if min_kinds > 0
                && let Some(kinds) = ask_kinds(transport, id, &raft_addr).await
                && kinds < min_kinds
            {
                return Err(MembershipError::FormatTooOld {
                    id,
                    kinds,
                    version: min_kinds,
                });
            }
            raft.add_learner(
                id,
                NodeInfo {
                    raft_addr,
                    http_addr: http,
                },
                false,
            )
            .await
            .map_err(|e| MembershipError::Failed(e.to_string()))?;
        }
        MembershipChange::Promote {
            ids,
            force,
            max_lag,
        } => {
            let mut to_add = std::collections::BTreeSet::new();
            for id in &ids {
                let Some(m) = members.iter().find(|m| m.id == *id) else {
                    return Err(MembershipError::Unknown(*id));
                };
                if m.voter {
                    continue;
                }
                if !force && m.lag > max_lag {
                    return Err(MembershipError::LearnerBehind {
                        id: *id,
                        lag: m.lag,
                        limit: max_lag,
                    });
                }
                to_add.insert(*id);
            }
            if to_add.is_empty() {
                return Ok(members);
            }
            let mut after: std::collections::BTreeSet<u64> =
                members.iter().filter(|m| m.voter).map(|m| m.id).collect();
            after.extend(to_add.iter().copied());
            if !force && !live_majority(&members, &after) {
                return Err(MembershipError::NoQuorum(
                    "a live majority would not exist after the promotion".into(),
                ));
            }
            change(raft, openraft::ChangeMembers::AddVoterIds(to_add)).await?;
        }
        MembershipChange::Remove { id } => {
            let Some(target) = members.iter().find(|m| m.id == id) else {
                return Ok(members);
            };
            let before: std::collections::BTreeSet<u64> =
                members.iter().filter(|m| m.voter).map(|m| m.id).collect();
            if target.voter {
                if before.len() == 1 {
                    return Err(MembershipError::LastVoter(id));
                }
                let mut after = before.clone();
                after.remove(&id);
                if !live_majority(&members, &before) || !live_majority(&members, &after) {
                    return Err(MembershipError::NoQuorum(
                        "a live majority would not exist before and after the removal".into(),
                    ));
                }
                if id == me {
                    // openraft's core cannot remove its own leader (it stops with a panic):
                    // leadership goes to the most caught-up live voter first, and the caller
                    // sends the change to it.
                    return Err(hand_over_before_removal(raft, me, &members).await);
                }
                change(
                    raft,
                    openraft::ChangeMembers::RemoveVoters(std::collections::BTreeSet::from([id])),
                )
                .await?;
            }
            change(
                raft,
                openraft::ChangeMembers::RemoveNodes(std::collections::BTreeSet::from([id])),
            )
            .await?;
        }
    }
    Ok(members_of(raft, me))
}
