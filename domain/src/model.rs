//! Stored records and queue options.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::time::Stamp;

/// A queue's options: the whole option table of the wire contract, with its defaults.
/// Durations are seconds; `max_size` is a message count; 0 means "off" or "forever".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueOptions {
    /// How long a pop's lease lives.
    pub lease_time: u64,
    /// How many failed deliveries are retried before the message is dead-lettered.
    pub retry_limit: u32,
    /// Stored and echoed; ordering between queues is not affected (one queue per pop).
    pub priority: i64,
    /// A message becomes deliverable this many seconds after it was pushed.
    pub delayed_processing: u64,
    /// Stored and echoed (batching hint of the original broker).
    pub window_buffer: u64,
    /// The most messages the queue may hold; a push beyond it fails per item. 0 = unlimited.
    pub max_size: u64,
    /// Delete messages older than this. 0 = keep.
    pub retention_seconds: u64,
    /// Delete messages every group has consumed once they are older than this. 0 = keep.
    pub completed_retention_seconds: u64,
    /// Payloads are sealed (AES-256-GCM under `QUEEN_ENCRYPTION_KEY`) by the node that takes
    /// the push, before it is proposed; readers open them (the application's `sealing.rs`).
    pub encryption_enabled: bool,
    /// Whether a message past `retry_limit` goes to the dead letters (else it is dropped).
    pub dlq_after_max_retries: bool,
    /// Master switch for the three retention settings.
    pub retention_enabled: bool,
    /// Delete messages still waiting after this long, consumed or not. 0 = off.
    pub max_wait_time_seconds: u64,
    /// Stored and echoed.
    pub retry_delay: u64,
    /// Stored and echoed.
    pub ttl: u64,
    /// The S3 sink that must have mirrored a message before retention may delete it.
    pub retention_sink_hold: Option<String>,
    /// The longest the sink hold may keep a message.
    pub retention_sink_hold_max_seconds: u64,
    /// Options this broker does not interpret, kept as JSON text and echoed.
    pub extra: BTreeMap<String, String>,
}

impl Default for QueueOptions {
    fn default() -> Self {
        Self {
            lease_time: 300,
            retry_limit: 3,
            priority: 0,
            delayed_processing: 0,
            window_buffer: 0,
            max_size: 0,
            retention_seconds: 0,
            completed_retention_seconds: 0,
            encryption_enabled: false,
            dlq_after_max_retries: true,
            retention_enabled: true,
            max_wait_time_seconds: 0,
            retry_delay: 0,
            ttl: 0,
            retention_sink_hold: None,
            retention_sink_hold_max_seconds: 604_800,
            extra: BTreeMap::new(),
        }
    }
}

/// An option with a value of the wrong type or range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("options.{field} {problem}")]
pub struct OptionError {
    /// The option's wire name.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The longest duration a request may give in seconds (a lease, a TTL, a delay, a retention):
/// ten years of 365 days. Longer values are refused rather than capped, so a time shown back is
/// never a saturated one.
pub const MAX_DURATION_SECONDS: u64 = 315_360_000;
/// The same ten years in milliseconds, for durations given in milliseconds.
pub const MAX_DURATION_MS: u64 = MAX_DURATION_SECONDS * 1000;
/// Most option keys this broker does not interpret that one queue may keep.
pub const MAX_EXTRA_OPTIONS: usize = 64;
/// Longest such key, in bytes.
pub const MAX_EXTRA_OPTION_KEY_BYTES: usize = 255;
/// Longest such value, as JSON text, in bytes.
pub const MAX_EXTRA_OPTION_VALUE_BYTES: usize = 4096;

fn uint(field: &str, v: &serde_json::Value) -> Result<u64, OptionError> {
    if v.is_null() {
        return Ok(0);
    }
    v.as_u64().ok_or_else(|| OptionError {
        field: field.to_owned(),
        problem: "must be a non-negative integer".to_owned(),
    })
}

/// A duration option: a non-negative integer up to `max` (in the option's own unit).
fn duration(field: &str, v: &serde_json::Value, max: u64, unit: &str) -> Result<u64, OptionError> {
    let n = uint(field, v)?;
    if n > max {
        return Err(OptionError {
            field: field.to_owned(),
            problem: format!("must be 0 to {max} {unit} (ten years)"),
        });
    }
    Ok(n)
}

fn seconds(field: &str, v: &serde_json::Value) -> Result<u64, OptionError> {
    duration(field, v, MAX_DURATION_SECONDS, "seconds")
}

fn boolean(field: &str, v: &serde_json::Value) -> Result<bool, OptionError> {
    v.as_bool().ok_or_else(|| OptionError {
        field: field.to_owned(),
        problem: "must be true or false".to_owned(),
    })
}

impl QueueOptions {
    /// Read options from the `options` object of a configure request: known keys are type
    /// checked, unknown keys are kept as they are, absent keys take their defaults.
    ///
    /// # Errors
    /// The first option with a wrong type, named.
    pub fn from_json(
        obj: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Self, OptionError> {
        let mut o = Self::default();
        for (key, v) in obj {
            if v.is_null() {
                continue;
            }
            match key.as_str() {
                "leaseTime" => {
                    o.lease_time = seconds(key, v)?;
                    if o.lease_time == 0 {
                        return Err(OptionError {
                            field: key.clone(),
                            problem: "must be at least 1".to_owned(),
                        });
                    }
                }
                "retryLimit" => {
                    o.retry_limit = u32::try_from(uint(key, v)?).map_err(|_| OptionError {
                        field: key.clone(),
                        problem: "is too large".to_owned(),
                    })?;
                }
                "priority" => {
                    o.priority = v.as_i64().ok_or_else(|| OptionError {
                        field: key.clone(),
                        problem: "must be an integer".to_owned(),
                    })?;
                }
                "delayedProcessing" => o.delayed_processing = seconds(key, v)?,
                "windowBuffer" => o.window_buffer = seconds(key, v)?,
                "maxSize" => o.max_size = uint(key, v)?,
                "retentionSeconds" => o.retention_seconds = seconds(key, v)?,
                "completedRetentionSeconds" => o.completed_retention_seconds = seconds(key, v)?,
                "encryptionEnabled" => o.encryption_enabled = boolean(key, v)?,
                "dlqAfterMaxRetries" => o.dlq_after_max_retries = boolean(key, v)?,
                "retentionEnabled" => o.retention_enabled = boolean(key, v)?,
                "maxWaitTimeSeconds" => o.max_wait_time_seconds = seconds(key, v)?,
                // Clients of the original broker send it in milliseconds.
                "retryDelay" => o.retry_delay = duration(key, v, MAX_DURATION_MS, "milliseconds")?,
                "ttl" => o.ttl = seconds(key, v)?,
                "retentionSinkHold" => {
                    o.retention_sink_hold = Some(
                        v.as_str()
                            .ok_or_else(|| OptionError {
                                field: key.clone(),
                                problem: "must be a string".to_owned(),
                            })?
                            .to_owned(),
                    );
                }
                "retentionSinkHoldMaxSeconds" => {
                    o.retention_sink_hold_max_seconds = seconds(key, v)?
                }
                _ => {
                    // Kept in replicated state and echoed, so bounded in count and size.
                    let text = v.to_string();
                    if key.len() > MAX_EXTRA_OPTION_KEY_BYTES {
                        return Err(OptionError {
                            field: key.chars().take(64).collect(),
                            problem: format!(
                                "is an unknown option whose name is longer than {MAX_EXTRA_OPTION_KEY_BYTES} bytes"
                            ),
                        });
                    }
                    if text.len() > MAX_EXTRA_OPTION_VALUE_BYTES {
                        return Err(OptionError {
                            field: key.clone(),
                            problem: format!(
                                "is an unknown option; its value must be at most {MAX_EXTRA_OPTION_VALUE_BYTES} bytes of JSON"
                            ),
                        });
                    }
                    if o.extra.len() == MAX_EXTRA_OPTIONS && !o.extra.contains_key(key) {
                        return Err(OptionError {
                            field: key.clone(),
                            problem: format!(
                                "is one unknown option too many: at most {MAX_EXTRA_OPTIONS} are kept"
                            ),
                        });
                    }
                    o.extra.insert(key.clone(), text);
                }
            }
        }
        Ok(o)
    }

    /// The options as the wire shows them.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (k, v) in &self.extra {
            if let Ok(v) = serde_json::from_str(v) {
                m.insert(k.clone(), v);
            }
        }
        let known = serde_json::json!({
            "leaseTime": self.lease_time,
            "retryLimit": self.retry_limit,
            "priority": self.priority,
            "delayedProcessing": self.delayed_processing,
            "windowBuffer": self.window_buffer,
            "maxSize": self.max_size,
            "retentionSeconds": self.retention_seconds,
            "completedRetentionSeconds": self.completed_retention_seconds,
            "encryptionEnabled": self.encryption_enabled,
            "dlqAfterMaxRetries": self.dlq_after_max_retries,
            "retentionEnabled": self.retention_enabled,
            "maxWaitTimeSeconds": self.max_wait_time_seconds,
            "retryDelay": self.retry_delay,
            "ttl": self.ttl,
            "retentionSinkHold": self.retention_sink_hold,
            "retentionSinkHoldMaxSeconds": self.retention_sink_hold_max_seconds,
        });
        if let serde_json::Value::Object(k) = known {
            m.extend(k);
        }
        serde_json::Value::Object(m)
    }

    /// Whether any retention rule can delete messages of this queue.
    #[must_use]
    pub fn has_retention(&self) -> bool {
        self.retention_enabled
            && (self.retention_seconds > 0
                || self.completed_retention_seconds > 0
                || self.max_wait_time_seconds > 0)
    }
}

/// A queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRec {
    /// Internal id; a queue deleted and created again gets a new one.
    pub qid: u64,
    /// The queue's name.
    pub name: String,
    /// Optional namespace tag (pop by namespace/task).
    pub namespace: Option<String>,
    /// Optional task tag.
    pub task: Option<String>,
    /// The effective options.
    pub options: QueueOptions,
    /// When the queue came into being.
    pub created: Stamp,
    /// Messages stored now (pushed minus deleted by retention).
    pub messages: u64,
    /// Partitions created.
    pub partitions: u64,
    /// Messages moved to the dead letters, ever.
    pub dead_lettered: u64,
}

/// A partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRec {
    /// Global id (rendered as a decimal string on the wire).
    pub pid: u64,
    /// Owning queue id.
    pub qid: u64,
    /// Owning queue name.
    pub queue: String,
    /// The partition's name.
    pub name: String,
    /// The offset the next push gets (the high watermark).
    pub next_offset: u64,
    /// The oldest offset still stored.
    pub log_start: u64,
    /// When it was created.
    pub created: Stamp,
    /// Stamp of the last push into it.
    pub last_write: Stamp,
}

/// A stored message.
///
/// Encoded as its fields in order (postcard). `producer` is written only when set, after the
/// payload: a message without one has exactly the bytes messages had before the field existed,
/// and every message stored before reads as one without. So a `MessageRec` is always a whole
/// encoded value, never a field inside another record (its reader takes whatever follows the
/// payload as the producer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRec {
    /// The producer's idempotency key.
    pub transaction_id: String,
    /// UUIDv7 bytes minted by the proposing node.
    pub id: [u8; 16],
    /// Optional trace id.
    pub trace_id: Option<String>,
    /// The push's stamp.
    pub stamp: Stamp,
    /// The payload as JSON text, verbatim.
    pub payload: Vec<u8>,
    /// Who pushed it: the `sub` of the pushing request's token (`producerSub`), stamped by
    /// the broker.
    pub producer: Option<String>,
}

/// A stored message borrowed from what a push carries: encodes to the same bytes as the
/// `MessageRec` with the same fields, without copying the payload into a record first.
#[derive(Debug, Clone, Copy)]
pub struct MessageRecRef<'a> {
    /// The producer's idempotency key.
    pub transaction_id: &'a str,
    /// UUIDv7 bytes minted by the proposing node.
    pub id: [u8; 16],
    /// Optional trace id.
    pub trace_id: Option<&'a str>,
    /// The push's stamp.
    pub stamp: Stamp,
    /// The payload as JSON text, verbatim.
    pub payload: &'a [u8],
    /// Who pushed it (see [`MessageRec::producer`]).
    pub producer: Option<&'a str>,
}

const MESSAGE_FIELDS: [&str; 6] = [
    "transaction_id",
    "id",
    "trace_id",
    "stamp",
    "payload",
    "producer",
];

impl Serialize for MessageRecRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("MessageRec", 5 + usize::from(self.producer.is_some()))?;
        st.serialize_field(MESSAGE_FIELDS[0], self.transaction_id)?;
        st.serialize_field(MESSAGE_FIELDS[1], &self.id)?;
        st.serialize_field(MESSAGE_FIELDS[2], &self.trace_id)?;
        st.serialize_field(MESSAGE_FIELDS[3], &self.stamp)?;
        st.serialize_field(MESSAGE_FIELDS[4], serde_bytes::Bytes::new(self.payload))?;
        if let Some(p) = self.producer {
            st.serialize_field(MESSAGE_FIELDS[5], p)?;
        }
        st.end()
    }
}

impl Serialize for MessageRec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.borrowed().serialize(s)
    }
}

impl<'de> Deserialize<'de> for MessageRec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = MessageRec;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a stored message")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<MessageRec, A::Error> {
                let short = |i| serde::de::Error::invalid_length(i, &"a stored message");
                let transaction_id = a.next_element()?.ok_or_else(|| short(0))?;
                let id = a.next_element()?.ok_or_else(|| short(1))?;
                let trace_id = a.next_element()?.ok_or_else(|| short(2))?;
                let stamp = a.next_element()?.ok_or_else(|| short(3))?;
                let payload: serde_bytes::ByteBuf = a.next_element()?.ok_or_else(|| short(4))?;
                // Written only when set: a message without one ends with its payload.
                let producer = a.next_element::<String>().ok().flatten();
                Ok(MessageRec {
                    transaction_id,
                    id,
                    trace_id,
                    stamp,
                    payload: payload.into_vec(),
                    producer,
                })
            }
        }
        d.deserialize_struct("MessageRec", &MESSAGE_FIELDS, Fields)
    }
}

impl MessageRec {
    /// The message as borrowed fields.
    #[must_use]
    pub fn borrowed(&self) -> MessageRecRef<'_> {
        MessageRecRef {
            transaction_id: &self.transaction_id,
            id: self.id,
            trace_id: self.trace_id.as_deref(),
            stamp: self.stamp,
            payload: &self.payload,
            producer: self.producer.as_deref(),
        }
    }
}

impl MessageRecRef<'_> {
    /// The record's bytes, in one allocation of the right size.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        crate::codec::encode_with_capacity(self, self.size_hint())
    }

    /// Bytes the encoding takes at most: lengths are varints of at most 10 bytes, the stamp at
    /// most 10, the id 16.
    #[must_use]
    pub fn size_hint(&self) -> usize {
        self.transaction_id.len()
            + self.trace_id.map_or(0, str::len)
            + self.producer.map_or(0, str::len)
            + self.payload.len()
            + 64
    }

    /// [`Self::encode`], appended to `out`.
    ///
    /// # Errors
    /// As [`crate::codec::encode_onto`] (never for a message); `out` is left as it was.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), postcard::Error> {
        crate::codec::encode_onto(self, out)
    }
}

/// The fields of a stored message before its payload, decoded without reading the payload
/// (postcard encodes fields in order and the payload is last), for rules that need only the
/// stamp or the transactionId.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MessageHead {
    /// The producer's idempotency key.
    pub transaction_id: String,
    /// UUIDv7 bytes minted by the proposing node.
    pub id: [u8; 16],
    /// Optional trace id.
    pub trace_id: Option<String>,
    /// The push's stamp.
    pub stamp: Stamp,
}

/// The stamp of an encoded message, read without copying anything out of it (a store that
/// groups messages into records by stamp needs only this).
#[must_use]
pub fn message_stamp(bytes: &[u8]) -> Option<Stamp> {
    #[derive(Deserialize)]
    struct StampOnly<'a> {
        #[serde(borrow)]
        _transaction_id: &'a str,
        _id: [u8; 16],
        #[serde(borrow)]
        _trace_id: Option<&'a str>,
        stamp: Stamp,
    }
    postcard::take_from_bytes::<StampOnly<'_>>(bytes)
        .ok()
        .map(|(s, _)| s.stamp)
}

/// A dedup row of the first store format (by transactionId text), read by the migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRec {
    /// Offset of the original.
    pub offset: u64,
    /// Message id of the original.
    pub id: [u8; 16],
}

/// The live claim of a group on one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorLease {
    /// The lease id.
    pub id: crate::ids::LeaseId,
    /// It is dead at and after this stamp.
    pub expires: Stamp,
    /// First offset after the claimed range (the range starts at the cursor).
    pub end: u64,
}

/// The answer given to an ack, kept so that a repeat is answered the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastAck {
    /// Which message.
    pub offset: u64,
    /// With which status.
    pub status: String,
    /// Under which lease.
    pub lease_id: Option<crate::ids::LeaseId>,
    /// What was answered.
    pub outcome: AckVerdict,
}

/// The verdict of one ack item.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AckVerdict {
    /// Whether the ack took effect.
    pub success: bool,
    /// Why not.
    pub error: Option<String>,
    /// Whether the partition's lease ended with it.
    pub lease_released: bool,
    /// Whether the message went to the dead letters.
    pub dlq: bool,
    /// Whether it changed nothing (a repeat).
    pub noop: bool,
}

/// A group's position in one partition.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CursorRec {
    /// Every offset below this is done for the group.
    pub next: u64,
    /// The claim in flight, if any (judged live by its expiry).
    pub lease: Option<CursorLease>,
    /// The offset whose failures are being counted.
    pub retry_offset: u64,
    /// Failed deliveries of `retry_offset` so far.
    pub retries: u32,
    /// The last ack's answer.
    pub last_ack: Option<LastAck>,
    /// Stamp of the last completed ack.
    pub last_consumed: Stamp,
}

impl CursorRec {
    /// The live lease at `now`.
    #[must_use]
    pub fn live_lease(&self, now: Stamp) -> Option<&CursorLease> {
        self.lease.as_ref().filter(|l| l.expires > now)
    }
}

/// A lease spanning the partitions one pop claimed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRec {
    /// The queue id.
    pub qid: u64,
    /// The group.
    pub group: String,
    /// Partitions still held.
    pub parts: Vec<u64>,
    /// Expiry.
    pub expires: Stamp,
}

/// Where a named group starts in a partition it touches for the first time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubscriptionStart {
    /// From the oldest retained message.
    All,
    /// From the first message stamped at or after this.
    From(Stamp),
}

/// A consumer group on one queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRec {
    /// The recorded start (sticky).
    pub start: SubscriptionStart,
    /// When the group first popped.
    pub created: Stamp,
    /// The partition claimed last, so the next pop starts after it (fairness).
    pub last_pid: u64,
}

/// A dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DlqRec {
    /// Partition id.
    pub pid: u64,
    /// Partition name.
    pub partition: String,
    /// Group it failed in.
    pub group: String,
    /// Its offset.
    pub offset: u64,
    /// Its transactionId.
    pub transaction_id: String,
    /// Its id.
    pub id: [u8; 16],
    /// The last error text.
    pub error: Option<String>,
    /// Failed deliveries.
    pub retries: u32,
    /// The payload, verbatim.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// When it was pushed.
    pub created: Stamp,
    /// When it was dead-lettered.
    pub failed: Stamp,
}

#[cfg(test)]
mod tests;
