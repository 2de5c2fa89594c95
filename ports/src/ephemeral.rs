//! The ephemeral queues' use case as a client reaches it: one operation in, one answer out.
//! Operations that act on a partition travel between nodes as they are (a node that does not
//! own the partition hands the operation to the one that does), so both sides are serde types.

use queen_domain::ephemeral::{AckOutcome, AckStatus, Declared, Delivered, Options, QueueView};
use serde::{Deserialize, Serialize};

/// What a client asks of the ephemeral queues. Queue names are stored names (under the
/// request's tenant scope).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EphemeralOp {
    /// Declare a queue's options (replicated).
    Configure {
        /// The queue.
        queue: String,
        /// Its options as given.
        declared: Declared,
    },
    /// Drop its messages, void its leases, rewind its groups; configuration stays.
    Reset {
        /// The queue.
        queue: String,
    },
    /// Remove contents, positions and configuration.
    Delete {
        /// The queue.
        queue: String,
    },
    /// Append messages to one partition, all or nothing.
    Push {
        /// The queue.
        queue: String,
        /// The partition (`Default` when the client named none).
        partition: String,
        /// The payloads as the client wrote them (JSON text).
        payloads: Vec<Vec<u8>>,
    },
    /// Take messages.
    Pop {
        /// The queue.
        queue: String,
        /// One partition, or any of the queue's.
        partition: Option<String>,
        /// The consumer group (`__QUEUE_MODE__` when none).
        group: String,
        /// At most this many.
        batch: u32,
        /// Wait up to this long for a message (ms), or answer at once.
        wait_ms: Option<u64>,
        /// Commit at delivery.
        auto_ack: bool,
    },
    /// Settle deliveries.
    Ack {
        /// The queue.
        queue: String,
        /// The group that popped them.
        group: String,
        /// `(id, status)` each.
        acks: Vec<(String, AckStatus)>,
    },
    /// Every ephemeral queue of a tenant.
    Queues {
        /// The tenant's id.
        tenant: String,
    },
    /// One queue's gauges; `group` narrows the partitions' `pending`.
    Depth {
        /// The queue.
        queue: String,
        /// A group.
        group: Option<String>,
    },
    /// A page of a tenant's ephemeral queues in name order (last, so the older variants keep
    /// their encoding between members of two versions).
    QueuesPage {
        /// The tenant's id.
        tenant: String,
        /// Start after this name (as the tenant writes it).
        after: Option<String>,
        /// At most this many.
        limit: u32,
    },
}

/// One queue as the cluster holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EphemeralQueue {
    /// The stored name.
    pub queue: String,
    /// Whether it was configured (else it exists because it was pushed to or popped).
    pub declared: bool,
    /// Its effective options on the answering node.
    pub options: Options,
    /// What the members hold of it, summed.
    pub view: QueueView,
}

/// The answer to an [`EphemeralOp`], variant for variant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EphemeralAnswer {
    /// `Configure`: the effective options.
    Configured(Options),
    /// `Reset`: messages dropped.
    Dropped(u64),
    /// `Delete`: whether the queue existed.
    Deleted(bool),
    /// `Push`: messages kept.
    Pushed(u64),
    /// `Pop`: the deliveries.
    Delivered(Vec<Delivered>),
    /// `Ack`: one outcome per ack.
    Acked(Vec<AckOutcome>),
    /// `Queues`.
    Queues(Vec<EphemeralQueue>),
    /// `Depth`.
    Depth(EphemeralQueue),
    /// `QueuesPage`: the page, and whether more queues follow it.
    QueuesPage {
        /// The queues, in name order.
        queues: Vec<EphemeralQueue>,
        /// More follow.
        more: bool,
    },
}
