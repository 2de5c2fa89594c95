//! Commands of newer log formats, used once every member of the cluster reads them:
//! `producerSub`, the producer a push is stamped with (`Command::AsProducer`, format 2), and
//! acks that carry their offsets (`Command::AckAt`, format 4); the gate that refuses the others
//! until then (`require_format`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use queen_domain::command::{AckItem, Command};
use queen_domain::ids::{LeaseId, PartitionRef};
use queen_domain::machine::{DeliveredOffsets, resolve_ack_offsets};
use queen_domain::names::GroupName;
use queen_domain::reads;
use queen_ports::BrokerError;

use super::Broker;

/// How long a push waits for a cluster that has not written any format yet (a node that has
/// just started: its leader raises the format within about a second).
const FIRST_FORMAT_WAIT: Duration = Duration::from_secs(3);

impl Broker {
    /// The producer to stamp on a push's messages. `None` when there is none, or when the
    /// cluster's log format is still below the one that carries it: a member runs an earlier
    /// build (a rolling upgrade). Those messages are stored without a producer rather than
    /// refused, and the node says so in its log (a warning the first time, then at debug).
    pub(super) async fn stamped(&self, producer: Option<String>) -> Option<String> {
        let producer = producer?;
        let version = self.cluster_format().await;
        if version >= Command::AS_PRODUCER_FORMAT {
            return Some(producer);
        }
        if self.unstamped_warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(target: "queen-app", version, "producerSub not stamped: the cluster's log format is below 2");
        } else {
            tracing::warn!(target: "queen-app", version, "producerSub not stamped: the cluster writes log format {version} because a member runs an earlier build; pushes are stored without their producer until every member is upgraded");
        }
        None
    }

    /// The command for an ack: `AckAt`, with the offsets this node finds the messages at under
    /// their leases (so no replica reads the leased messages back to find them): where its
    /// own pop delivered them, else by reading its state. Used once every member reads it;
    /// else, or when this node cannot read its state, `Ack`. Never waits: an ack of a
    /// cluster that has just started goes as `Ack`.
    pub(super) fn ack_command(&self, group: GroupName, items: Vec<AckItem>) -> Command {
        let view = self.state.view();
        if reads::cluster_version(&*view).unwrap_or(0) < Command::ACK_AT_FORMAT {
            return Command::Ack { group, items };
        }
        // The claims this node answered, looked up once per (lease, partition) of the items.
        let mut claims: Vec<(&LeaseId, u64, Option<Arc<DeliveredOffsets>>)> = Vec::new();
        for item in &items {
            if let (Some(lease), PartitionRef::Id(pid)) = (&item.lease_id, &item.partition_id)
                && !claims.iter().any(|(l, p, _)| *l == lease && p == pid)
            {
                claims.push((lease, *pid, self.delivered.claim(lease, *pid)));
            }
        }
        let known = |lease: &LeaseId, pid: u64, t: &str| {
            claims
                .iter()
                .find(|(l, p, _)| *l == lease && *p == pid)?
                .2
                .as_ref()?
                .get(t)
        };
        match resolve_ack_offsets(&*view, &group, &items, known) {
            Ok(offsets) => Command::AckAt {
                group,
                items,
                offsets,
            },
            Err(e) => {
                tracing::debug!(target: "queen-app", error = %e, "ack offsets not resolved");
                Command::Ack { group, items }
            }
        }
    }

    /// Refuse (503) an operation that needs log format `needs` until every member reads it.
    pub(super) async fn require_format(&self, needs: u32) -> Result<(), BrokerError> {
        if needs > 1 {
            let version = self.cluster_format().await;
            if needs > version {
                return Err(BrokerError::Unavailable(format!(
                    "the cluster writes log format {version} because a member runs an earlier build; this operation needs format {needs}: upgrade every member first"
                )));
            }
        }
        Ok(())
    }

    /// The log format the cluster writes; on a cluster that has written none yet (it has just
    /// started), waits up to `FIRST_FORMAT_WAIT` for the first (0 when none came).
    pub(super) async fn cluster_format(&self) -> u32 {
        let deadline = Instant::now() + FIRST_FORMAT_WAIT;
        loop {
            let version = reads::cluster_version(&*self.state.view()).unwrap_or(0);
            if version > 0 || Instant::now() >= deadline {
                return version;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
