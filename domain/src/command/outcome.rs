//! What apply answers: each command's outcome, and the response envelope a proposer decodes.

use super::*;

/// The outcome of one push item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PushStatus {
    /// Stored at `offset`.
    Queued,
    /// Already stored; the original's id and offset are given.
    Duplicate,
    /// Refused, with the reason.
    Failed(String),
}

/// One push item's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushOutcome {
    /// What happened.
    pub status: PushStatus,
    /// The message id (the original's on a duplicate).
    pub message_id: [u8; 16],
    /// The offset (the original's on a duplicate).
    pub offset: u64,
    /// The partition id.
    pub partition_id: u64,
    /// The transactionId.
    pub transaction_id: String,
    /// The queue.
    pub queue: String,
}

/// A delivered message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivered {
    /// Offset in its partition.
    pub offset: u64,
    /// The stored message.
    pub transaction_id: String,
    /// Its id.
    pub id: [u8; 16],
    /// Its trace id.
    pub trace_id: Option<String>,
    /// Payload JSON text.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// Push stamp.
    pub created: Stamp,
    /// 1 for a first delivery; failed deliveries raise it (expired leases do not).
    pub attempt: u32,
    /// Who pushed it (`producerSub`). Encoded by [`PopOutcome`] after everything else, so
    /// that a node of an earlier build reads the answer without it.
    #[serde(skip)]
    pub producer: Option<String>,
}

/// The messages claimed from one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// Partition id.
    pub pid: u64,
    /// Partition name.
    pub partition: String,
    /// The messages, in offset order.
    pub messages: Vec<Delivered>,
}

/// A pop's answer.
///
/// Encoded as its three fields and then, only when a message has one or the answer has a
/// conflation echo, the producers of every message in order (possibly none), then, only when
/// there is one, the conflation echo: the answer of a node of an earlier build (which a
/// follower may receive for a pop it forwarded during a rolling upgrade) reads as one without
/// producers or echo, and such a node reads this build's answer and ignores what follows. So a
/// `PopOutcome` is always the last part of an encoded value (a `Response`'s outcome is its last
/// field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopOutcome {
    /// The lease covering every claim ("" when none was taken).
    pub lease_id: String,
    /// When the lease expires.
    pub lease_expires: Stamp,
    /// The claims, in claim order.
    pub claims: Vec<Claim>,
    /// The group's delivery policy as the answer echoes it (contract 2.0.8).
    pub conflation: ConflationEcho,
}

/// What a pop answers about conflation (contract 2.0.8): the client checks the answer of every
/// pop that asked for it, `conflict` first, then `conflating`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflationEcho {
    /// The group's policy conflates: each claim holds only its partition's newest visible
    /// message (`"conflation": true`).
    pub conflating: bool,
    /// The pop declared the other policy than the one the group registered with, which is the
    /// one applied (`"conflationConflict": true`).
    pub conflict: bool,
}

impl ConflationEcho {
    /// Whether the answer has anything to say (then it is a 200 with a body, never a 204).
    #[must_use]
    pub fn any(self) -> bool {
        self.conflating || self.conflict
    }
}

const POP_FIELDS: [&str; 5] = [
    "lease_id",
    "lease_expires",
    "claims",
    "producers",
    "conflation",
];

impl Serialize for PopOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let delivered = || self.claims.iter().flat_map(|c| &c.messages);
        let echo = self.conflation.any();
        let any = echo || delivered().any(|m| m.producer.is_some());
        let fields = 3 + usize::from(any) + usize::from(echo);
        let mut st = s.serialize_struct("PopOutcome", fields)?;
        st.serialize_field(POP_FIELDS[0], &self.lease_id)?;
        st.serialize_field(POP_FIELDS[1], &self.lease_expires)?;
        st.serialize_field(POP_FIELDS[2], &self.claims)?;
        if any {
            let producers: Vec<Option<&str>> = if delivered().any(|m| m.producer.is_some()) {
                delivered().map(|m| m.producer.as_deref()).collect()
            } else {
                Vec::new()
            };
            st.serialize_field(POP_FIELDS[3], &producers)?;
        }
        if echo {
            st.serialize_field(POP_FIELDS[4], &self.conflation)?;
        }
        st.end()
    }
}

impl<'de> Deserialize<'de> for PopOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = PopOutcome;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a pop's answer")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<PopOutcome, A::Error> {
                let short = |i| serde::de::Error::invalid_length(i, &"a pop's answer");
                let lease_id = a.next_element()?.ok_or_else(|| short(0))?;
                let lease_expires = a.next_element()?.ok_or_else(|| short(1))?;
                let mut claims: Vec<Claim> = a.next_element()?.ok_or_else(|| short(2))?;
                // Written only when a message has a producer.
                let producers: Vec<Option<String>> =
                    a.next_element().ok().flatten().unwrap_or_default();
                // Written only when there is something to echo.
                let conflation: ConflationEcho =
                    a.next_element().ok().flatten().unwrap_or_default();
                for (m, p) in claims
                    .iter_mut()
                    .flat_map(|c| c.messages.iter_mut())
                    .zip(producers)
                {
                    m.producer = p;
                }
                Ok(PopOutcome {
                    lease_id,
                    lease_expires,
                    claims,
                    conflation,
                })
            }
        }
        d.deserialize_struct("PopOutcome", &POP_FIELDS, Fields)
    }
}

impl PopOutcome {
    /// Whether anything was delivered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}

/// One ack item's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckOutcome {
    /// Echo of the item's transactionId.
    pub transaction_id: String,
    /// The verdict.
    pub verdict: crate::model::AckVerdict,
}

/// What apply answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// Tick applied.
    Tick,
    /// Push answers, in item order.
    Push(Vec<PushOutcome>),
    /// Pop answer.
    Pop(PopOutcome),
    /// Ack answers, in item order.
    Ack(Vec<AckOutcome>),
    /// Lease extension.
    Extend {
        /// Whether the lease was live and is prolonged.
        success: bool,
        /// Partitions renewed.
        renewed: u32,
        /// New expiry.
        expires: Option<Stamp>,
    },
    /// Configure answer: the effective options.
    Configured(QueueOptions),
    /// A transaction's answer.
    Transaction(TxnOutcome),
    /// A KV call's answer.
    Kv(crate::kv::KvOutcome),
    /// Timer answers, in order.
    Timers(Vec<crate::timers::TimerResult>),
    /// Group positions dropped.
    GroupDeleted {
        /// Cursors dropped.
        partitions: u64,
        /// Subscription records dropped.
        metadata: u64,
    },
    /// Cursors moved.
    Seeked {
        /// Partitions updated.
        partitions: u64,
    },
    /// Subscription starts rewritten.
    Resubscribed {
        /// Records updated.
        rows: u64,
    },
    /// Lock answers, in order.
    Locks(Vec<crate::kv::LockResult>),
    /// Queue deletion.
    Deleted {
        /// Whether it existed.
        existed: bool,
    },
    /// The entry could not be decoded by this build (nothing applied).
    Rejected(String),
    /// Cluster settings applied: the cluster version in force.
    ClusterSettings {
        /// The cluster's log format version.
        version: u32,
    },
    // New variants go last.
    /// A message deleted or a dead letter retried.
    MessageChanged(MessageChange),
}

/// What [`Outcome::MessageChanged`] says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MessageChange {
    /// The message is deleted (now or before).
    Deleted,
    /// The dead letter's copy was appended at `offset` as `transaction_id`, for `group`.
    Retried {
        /// The copy's offset.
        offset: u64,
        /// The copy's transactionId.
        transaction_id: String,
        /// The group it is delivered to.
        group: String,
    },
    /// No such message (or dead letter) in the partition.
    NotFound,
    /// Refused, with why.
    Refused(String),
}

/// Each command's own outcome, taken out of an [`Outcome`]: `None` when the outcome is of
/// another kind (which would be a bug: the log answered another command).
impl Outcome {
    /// A message change's answer.
    #[must_use]
    pub fn into_message_change(self) -> Option<MessageChange> {
        match self {
            Outcome::MessageChanged(c) => Some(c),
            _ => None,
        }
    }

    /// A push's answers.
    #[must_use]
    pub fn into_push(self) -> Option<Vec<PushOutcome>> {
        match self {
            Outcome::Push(o) => Some(o),
            _ => None,
        }
    }

    /// An ack's answers.
    #[must_use]
    pub fn into_ack(self) -> Option<Vec<AckOutcome>> {
        match self {
            Outcome::Ack(o) => Some(o),
            _ => None,
        }
    }

    /// A KV call's answer.
    #[must_use]
    pub fn into_kv(self) -> Option<crate::kv::KvOutcome> {
        match self {
            Outcome::Kv(o) => Some(o),
            _ => None,
        }
    }

    /// Lock answers.
    #[must_use]
    pub fn into_locks(self) -> Option<Vec<crate::kv::LockResult>> {
        match self {
            Outcome::Locks(o) => Some(o),
            _ => None,
        }
    }

    /// A transaction's answer.
    #[must_use]
    pub fn into_transaction(self) -> Option<TxnOutcome> {
        match self {
            Outcome::Transaction(o) => Some(o),
            _ => None,
        }
    }

    /// The effective options of a configured queue.
    #[must_use]
    pub fn into_configured(self) -> Option<QueueOptions> {
        match self {
            Outcome::Configured(o) => Some(o),
            _ => None,
        }
    }

    /// Whether a deleted queue existed.
    #[must_use]
    pub fn into_deleted(self) -> Option<bool> {
        match self {
            Outcome::Deleted { existed } => Some(existed),
            _ => None,
        }
    }

    /// Timer answers.
    #[must_use]
    pub fn into_timers(self) -> Option<Vec<crate::timers::TimerResult>> {
        match self {
            Outcome::Timers(o) => Some(o),
            _ => None,
        }
    }
}

/// A response with the stamp its entry was given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The entry's stamp.
    pub stamp: Stamp,
    /// What happened.
    pub outcome: Outcome,
}

impl Response {
    /// Encode for the raft port.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        crate::codec::encode(self)
    }

    /// Decode from the raft port.
    ///
    /// # Errors
    /// When the bytes are not a response.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        postcard::from_bytes(bytes).map_err(|source| DecodeError {
            what: "state machine response",
            source,
        })
    }
}

/// Bytes that are not an entry or a response this build reads.
#[derive(Debug, thiserror::Error)]
#[error("the bytes are not a {what} this build reads: {source}")]
pub struct DecodeError {
    /// What the bytes should have been.
    pub what: &'static str,
    /// The decoder's complaint.
    #[source]
    pub source: postcard::Error,
}
