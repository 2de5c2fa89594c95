//! Log entries (what is proposed) and their responses (what apply answers).

use serde::{Deserialize, Serialize};

use crate::ids::{LeaseId, PartitionRef, TransactionId};
use crate::model::QueueOptions;
use crate::names::{GroupName, PartitionName, QueueName};
use crate::time::Stamp;

mod outcome;
pub use outcome::{
    AckOutcome, Claim, ConflationEcho, DecodeError, Delivered, MessageChange, Outcome, PopOutcome,
    PushOutcome, PushStatus, Response,
};

/// One entry of the replicated log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The proposer's wall clock, microseconds since the epoch. The state machine stamps the
    /// entry `max(previous + 1, proposed_at)`.
    pub proposed_at: u64,
    /// What to do.
    pub command: Command,
}

impl Entry {
    /// Encode for the log.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        crate::codec::encode_with_capacity(self, self.command.encoded_len_hint())
    }

    /// Decode from the log.
    ///
    /// # Errors
    /// When the bytes are not an entry this build reads.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        postcard::from_bytes(bytes).map_err(|source| DecodeError {
            what: "log entry",
            source,
        })
    }
}

/// A pushed item read in place from an encoded entry: its text and payload borrowed from the
/// entry's bytes. The fields of [`PushItem`], in its order (the same encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct PushItemRef<'a> {
    /// Target queue.
    pub queue: &'a str,
    /// Target partition.
    pub partition: &'a str,
    /// Idempotency key.
    pub transaction_id: &'a str,
    /// Message id.
    pub message_id: [u8; 16],
    /// Payload as JSON text.
    pub payload: &'a [u8],
    /// Optional trace id.
    pub trace_id: Option<&'a str>,
}

impl PushItem {
    /// The item as borrowed fields.
    #[must_use]
    pub fn as_item_ref(&self) -> PushItemRef<'_> {
        PushItemRef {
            queue: self.queue.as_str(),
            partition: self.partition.as_str(),
            transaction_id: self.transaction_id.as_str(),
            message_id: self.message_id,
            payload: &self.payload,
            trace_id: self.trace_id.as_deref(),
        }
    }
}

/// The proposer's clock and the items of an encoded `Command::Push` entry, read in place
/// (nothing copied out of `bytes`). `None` for any other entry, and for one that
/// [`Entry::decode`] would refuse (a queue or partition name that is not valid), so that a
/// caller falling back to it decides exactly as before.
#[must_use]
pub fn decode_push(bytes: &[u8]) -> Option<(u64, Vec<PushItemRef<'_>>)> {
    // Fields in the order of `Entry`; the variants of `Command` up to `Push`.
    #[derive(Deserialize)]
    struct EntryRef<'a> {
        proposed_at: u64,
        #[serde(borrow)]
        command: CommandRef<'a>,
    }
    #[derive(Deserialize)]
    enum CommandRef<'a> {
        Tick,
        Push(#[serde(borrow)] Vec<PushItemRef<'a>>),
    }
    let EntryRef {
        proposed_at,
        command: CommandRef::Push(items),
    } = postcard::from_bytes(bytes).ok()?
    else {
        return None;
    };
    // Names are checked once per change from the item before (a batch names a few).
    let mut last: Option<(&str, &str)> = None;
    for i in &items {
        if last != Some((i.queue, i.partition)) {
            if !QueueName::is_valid(i.queue) || !PartitionName::is_valid(i.partition) {
                return None;
            }
            last = Some((i.queue, i.partition));
        }
    }
    Some((proposed_at, items))
}

impl Command {
    /// The log format that first reads [`Command::AsProducer`].
    pub const AS_PRODUCER_FORMAT: u32 = 2;

    /// The log format that first reads [`Command::DeleteMessage`] and
    /// [`Command::RetryDeadLetter`].
    pub const MESSAGE_MARKS_FORMAT: u32 = 3;

    /// The log format that first reads [`Command::AckAt`].
    pub const ACK_AT_FORMAT: u32 = 4;

    /// The log format whose pops that name no partition read the ready index
    /// (`machine::ready`) instead of every partition of the queue: all members must apply a
    /// pop alike, so they switch together once every member reads it.
    pub const READY_INDEX_FORMAT: u32 = 5;

    /// The log format that first reads [`Command::PopConflating`].
    pub const CONFLATION_FORMAT: u32 = 5;

    /// The log format whose wildcard pops read the partitions their group's ready index does
    /// not cover yet only when its rows run dry, and at most [`crate::machine::MAX_FILL_STEPS`]
    /// steps of them a pop (the format before filled on until the pop was full, a walk of the
    /// whole queue when little of it held messages); and whose pops claim nothing under a
    /// lease id already on record (a second copy of a committed pop replaced the first
    /// claim's lease record, and its partitions were never released).
    pub const BOUNDED_FILL_FORMAT: u32 = 6;

    /// The newest log format this build reads.
    pub const LATEST_FORMAT: u32 = 6;

    /// The log format every member must read before this command may be proposed.
    #[must_use]
    pub fn format(&self) -> u32 {
        match self {
            Command::AsProducer { .. } => Self::AS_PRODUCER_FORMAT,
            Command::DeleteMessage { .. } | Command::RetryDeadLetter { .. } => {
                Self::MESSAGE_MARKS_FORMAT
            }
            Command::AckAt { .. } => Self::ACK_AT_FORMAT,
            Command::PopConflating(_) => Self::CONFLATION_FORMAT,
            _ => 1,
        }
    }

    /// About how many bytes the command encodes to: exact enough that a push of many messages
    /// is encoded into one buffer instead of one grown and copied step by step.
    #[must_use]
    pub fn encoded_len_hint(&self) -> usize {
        // Per item: the four lengths, the id, the trace id's tag and some slack.
        const ITEM: usize = 32;
        match self {
            Command::Push(items) => {
                64 + items
                    .iter()
                    .map(|i| {
                        ITEM + i.queue.as_str().len()
                            + i.partition.as_str().len()
                            + i.transaction_id.as_str().len()
                            + i.payload.len()
                            + i.trace_id.as_ref().map_or(0, String::len)
                    })
                    .sum::<usize>()
            }
            Command::AsProducer { producer, command } => {
                16 + producer.len() + command.encoded_len_hint()
            }
            _ => 64,
        }
    }
}

/// How a named group starts when it first pops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Subscription {
    /// The broker default (all).
    Default,
    /// From the oldest retained message.
    All,
    /// From the pop's own stamp.
    New,
    /// From this time.
    From(Stamp),
}

/// One item of a push.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushItem {
    /// Target queue (created with defaults when unknown).
    pub queue: QueueName,
    /// Target partition (created on first push).
    pub partition: PartitionName,
    /// Idempotency key (minted by the receiving node when the client sent none).
    pub transaction_id: TransactionId,
    /// Message id minted by the receiving node (UUIDv7 bytes).
    pub message_id: [u8; 16],
    /// Payload as JSON text.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// Optional trace id.
    pub trace_id: Option<String>,
}

/// A pop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PopCommand {
    /// The queue.
    pub queue: QueueName,
    /// Only this partition, when named.
    pub partition: Option<PartitionName>,
    /// The group (`__QUEUE_MODE__` for queue mode).
    pub group: GroupName,
    /// Message budget across claimed partitions (at least 1).
    pub batch: u32,
    /// Most partitions to claim (at least 1).
    pub max_partitions: u32,
    /// The lease id to use, minted by the proposer.
    pub lease_id: LeaseId,
    /// Commit at delivery: move the cursor at once, take no lease.
    pub auto_ack: bool,
    /// The subscription start for a group's first pop.
    pub subscription: Subscription,
}

/// One acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckItem {
    /// The message's transactionId.
    pub transaction_id: TransactionId,
    /// The message's partition, as the consumer named it.
    pub partition_id: PartitionRef,
    /// How the consumer settled the message.
    pub status: AckStatus,
    /// The consumer's error text.
    pub error: Option<String>,
    /// The lease the ack is fenced by.
    pub lease_id: Option<LeaseId>,
}

/// How a consumer settles a message. Stored in the log as its word, so entries read the same
/// as when it was a text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum AckStatus {
    /// Done: the cursor moves past it (`completed`, or its alias `success`).
    Completed,
    /// Failed: retried until the queue's retry limit, then dead-lettered if configured.
    Failed,
    /// Straight to the dead letters.
    Dlq,
    /// Released for redelivery, without counting a retry.
    Retry,
    /// A word this build does not know. The HTTP edge refuses it; it can only come from an
    /// entry written before the edge checked, and apply refuses it per item as it did then.
    Unknown(String),
}

impl AckStatus {
    /// The status a word names (`None` for a word this build does not know).
    #[must_use]
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "completed" | "success" => Some(AckStatus::Completed),
            "failed" => Some(AckStatus::Failed),
            "dlq" => Some(AckStatus::Dlq),
            "retry" => Some(AckStatus::Retry),
            _ => None,
        }
    }

    /// The word, as the metrics and the cursor's last ack record it.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            AckStatus::Completed => "completed",
            AckStatus::Failed => "failed",
            AckStatus::Dlq => "dlq",
            AckStatus::Retry => "retry",
            AckStatus::Unknown(w) => w,
        }
    }
}

impl From<String> for AckStatus {
    fn from(word: String) -> Self {
        AckStatus::parse(&word).unwrap_or(AckStatus::Unknown(word))
    }
}

impl From<&str> for AckStatus {
    fn from(word: &str) -> Self {
        AckStatus::parse(word).unwrap_or_else(|| AckStatus::Unknown(word.to_owned()))
    }
}

impl From<AckStatus> for String {
    fn from(s: AckStatus) -> Self {
        s.as_str().to_owned()
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    /// Acknowledge a message in a group.
    Ack {
        /// The group.
        group: GroupName,
        /// The acknowledgement.
        item: AckItem,
    },
    /// Push one item.
    Push(PushItem),
}

/// One result of a transaction, in operation order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnResult {
    /// An ack's verdict.
    Ack(AckOutcome),
    /// A push item's answer.
    Push(PushOutcome),
}

/// A transaction's answer: all applied, or nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnOutcome {
    /// Whether everything applied.
    pub success: bool,
    /// Why not.
    pub error: Option<String>,
    /// Per operation results (empty when nothing applied).
    pub results: Vec<TxnResult>,
    /// The KV rider's answer (when it lost a required precondition, `failed` is set and nothing
    /// of the bundle applied).
    pub kv: Option<crate::kv::KvOutcome>,
    /// The timer rider's answers.
    pub timers: Vec<crate::timers::TimerResult>,
}

impl TxnOutcome {
    /// The answer of a transaction whose required lease is not live (expired, released or
    /// unknown); also what a tenant hears about another tenant's lease, so the two cannot be
    /// told apart.
    #[must_use]
    pub fn lease_not_live(lease: &LeaseId) -> Self {
        Self {
            success: false,
            error: Some(format!("lease {lease} is expired, released or unknown")),
            results: Vec::new(),
            kv: None,
            timers: Vec::new(),
        }
    }
}

/// Every command of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Moves time; runs bounded retention, lease and deletion housekeeping.
    Tick,
    /// Push items.
    Push(Vec<PushItem>),
    /// Claim messages.
    Pop(PopCommand),
    /// Acknowledge messages in one group.
    Ack {
        /// The group.
        group: GroupName,
        /// The items, answered in order.
        items: Vec<AckItem>,
    },
    /// Prolong a lease by the queue's lease time.
    ExtendLease {
        /// Which lease.
        lease_id: LeaseId,
    },
    /// Create or replace a queue's configuration.
    Configure {
        /// The queue.
        queue: QueueName,
        /// Namespace tag.
        namespace: Option<String>,
        /// Task tag.
        task: Option<String>,
        /// Full option set (replace, not patch).
        options: QueueOptions,
    },
    /// Acks and pushes as one unit: every part applies or none does.
    Transaction {
        /// The operations, in the caller's order.
        ops: Vec<TxnOp>,
        /// Leases that must all be live when the entry applies.
        required_leases: Vec<LeaseId>,
        /// KV operations riding with the bundle.
        kv: Vec<crate::kv::KvOp>,
        /// Timer operations riding with the bundle.
        timers: Vec<crate::timers::TimerOp>,
    },
    /// Drop a group's positions on one queue or all.
    DeleteGroup {
        /// The group.
        group: GroupName,
        /// Only this queue.
        queue: Option<QueueName>,
        /// Also drop its recorded subscription.
        delete_metadata: bool,
    },
    /// Move a group's cursors on a queue to the end (`to` None) or just after a time.
    Seek {
        /// The group.
        group: GroupName,
        /// The queue.
        queue: QueueName,
        /// Where to.
        to: Option<Stamp>,
    },
    /// Rewrite a group's subscription start.
    Resubscribe {
        /// The group.
        group: GroupName,
        /// The new start.
        from: Stamp,
    },
    /// Timer operations, in order.
    Timers(Vec<crate::timers::TimerOp>),
    /// KV operations in one call (all or nothing when a required precondition is lost).
    Kv(Vec<crate::kv::KvOp>),
    /// Lock operations (each independent).
    Locks(Vec<crate::kv::LockOp>),
    /// Delete a queue and everything in it.
    DeleteQueue {
        /// The queue.
        queue: QueueName,
    },
    /// Cluster-wide settings, written by the leader: the cluster's log format version (it only
    /// rises, and only once every member reads it) and the clock-skew bound that holds leases
    /// after a leader change.
    ClusterSettings {
        /// The format version every member reads.
        version: u32,
        /// `QUEEN_RAFT_MAX_CLOCK_SKEW_MS` of the leader.
        max_clock_skew_ms: u64,
    },
    // New variants go last: an entry names its variant by position.
    /// A push, a transaction or timer operations on behalf of an authenticated producer: every
    /// message it stores (or a timer it schedules delivers) carries `producer` (the token's
    /// `sub`, `producerSub`). Log format 2: proposed only once the cluster's version is at
    /// least [`Command::AS_PRODUCER_FORMAT`].
    AsProducer {
        /// The token's `sub`.
        producer: String,
        /// `Push`, `Transaction` or `Timers` (anything else is rejected).
        command: Box<Command>,
    },
    /// Delete one stored message for every group: no pop delivers it again (it stays in the
    /// log, and so in `fetch` and the lake, until retention drops it). Log format 3.
    DeleteMessage {
        /// The partition.
        pid: u64,
        /// The message.
        transaction_id: TransactionId,
    },
    /// Deliver a dead letter again to the group it died in: a copy is appended to its
    /// partition, seen by that group only, and the dead letter is removed. Log format 3.
    RetryDeadLetter {
        /// The partition.
        pid: u64,
        /// The message.
        transaction_id: TransactionId,
        /// The group (None: the only group it is a dead letter of).
        group: Option<GroupName>,
        /// The copy's message id, minted by the proposer.
        message_id: [u8; 16],
    },
    /// [`Command::Ack`] with, per item, the offset the proposing node found the message at
    /// under the lease the item names (`machine::resolve_ack_offsets`): a replica whose
    /// cursor still holds that lease takes it instead of reading the leased messages back.
    /// Log format 4.
    AckAt {
        /// The group.
        group: GroupName,
        /// The items, answered in order.
        items: Vec<AckItem>,
        /// Per item (same order), the offset found under its lease; `None` where none was.
        offsets: Vec<Option<u64>>,
    },
    /// [`Command::Pop`] that declares conflation (`conflation=true`, contract 2.0.8): a group
    /// it registers is stored as conflating; on a group registered otherwise the stored policy
    /// applies and the answer says so. A `Pop` declares the default policy. Log format 5.
    PopConflating(PopCommand),
}

#[cfg(test)]
mod tests;
