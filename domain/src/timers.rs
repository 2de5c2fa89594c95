//! Timers: a message scheduled for later under `(queue, timerKey)`. Scheduling again replaces
//! the timer; a tick delivers every due timer into its queue with the promised message id and
//! the timer's `txn` as transactionId, in the same entry that removes it.

use serde::{Deserialize, Serialize};

use crate::names::{PartitionName, QueueName};
use crate::time::Stamp;

/// A timer operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimerOp {
    /// Schedule or reschedule (an upsert).
    Schedule {
        /// Destination queue.
        queue: QueueName,
        /// The timer's key in that queue.
        key: String,
        /// Message bytes (JSON text).
        payload: Vec<u8>,
        /// Delay from the entry's stamp, in milliseconds.
        delay_ms: u64,
        /// Becomes the delivered message's transactionId.
        txn: String,
        /// Destination partition (Default when absent).
        partition: Option<PartitionName>,
        /// The id the delivered message will carry.
        message_id: [u8; 16],
        /// Whether the caller said `reschedule`.
        reschedule: bool,
    },
    /// Cancel a pending timer.
    Cancel {
        /// Queue.
        queue: QueueName,
        /// Key.
        key: String,
    },
}

impl TimerOp {
    /// The queue the operation works on (a tenant's scope is put in front of it).
    pub fn queue_mut(&mut self) -> &mut QueueName {
        match self {
            TimerOp::Schedule { queue, .. } | TimerOp::Cancel { queue, .. } => queue,
        }
    }
}

/// A stored timer.
///
/// Encoded as its fields in order; `producer` is written only when set, last, so a timer
/// without one keeps the bytes timers had before the field existed and every stored timer
/// reads as one without (a `TimerRec` is always a whole encoded value, never a field of
/// another).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerRec {
    /// Message bytes.
    pub payload: Vec<u8>,
    /// Not before.
    pub deliver_at: Stamp,
    /// Delivered transactionId.
    pub txn: String,
    /// Delivered partition.
    pub partition: String,
    /// Delivered message id.
    pub message_id: [u8; 16],
    /// When it was (re)scheduled.
    pub scheduled: Stamp,
    /// Who scheduled it (the token's `sub`): the delivered message's `producerSub`.
    pub producer: Option<String>,
}

const TIMER_FIELDS: [&str; 7] = [
    "payload",
    "deliver_at",
    "txn",
    "partition",
    "message_id",
    "scheduled",
    "producer",
];

impl Serialize for TimerRec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("TimerRec", 6 + usize::from(self.producer.is_some()))?;
        st.serialize_field(TIMER_FIELDS[0], serde_bytes::Bytes::new(&self.payload))?;
        st.serialize_field(TIMER_FIELDS[1], &self.deliver_at)?;
        st.serialize_field(TIMER_FIELDS[2], &self.txn)?;
        st.serialize_field(TIMER_FIELDS[3], &self.partition)?;
        st.serialize_field(TIMER_FIELDS[4], &self.message_id)?;
        st.serialize_field(TIMER_FIELDS[5], &self.scheduled)?;
        if let Some(p) = &self.producer {
            st.serialize_field(TIMER_FIELDS[6], p)?;
        }
        st.end()
    }
}

impl<'de> Deserialize<'de> for TimerRec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = TimerRec;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a stored timer")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<TimerRec, A::Error> {
                let short = |i| serde::de::Error::invalid_length(i, &"a stored timer");
                let payload: serde_bytes::ByteBuf = a.next_element()?.ok_or_else(|| short(0))?;
                let deliver_at = a.next_element()?.ok_or_else(|| short(1))?;
                let txn = a.next_element()?.ok_or_else(|| short(2))?;
                let partition = a.next_element()?.ok_or_else(|| short(3))?;
                let message_id = a.next_element()?.ok_or_else(|| short(4))?;
                let scheduled = a.next_element()?.ok_or_else(|| short(5))?;
                // Written only when set: a timer without one ends here.
                let producer = a.next_element::<String>().ok().flatten();
                Ok(TimerRec {
                    payload: payload.into_vec(),
                    deliver_at,
                    txn,
                    partition,
                    message_id,
                    scheduled,
                    producer,
                })
            }
        }
        d.deserialize_struct("TimerRec", &TIMER_FIELDS, Fields)
    }
}

/// A timer operation's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerResult {
    /// Whether it took effect.
    pub ok: bool,
    /// scheduled, rescheduled, cancelled, absent.
    pub status: String,
    /// Queue.
    pub queue: String,
    /// Key.
    pub key: String,
    /// The timer's txn (the cancelled one's, or the request's).
    pub txn: Option<String>,
    /// The promised message id.
    pub message_id: Option<[u8; 16]>,
    /// Not before.
    pub deliver_at: Option<Stamp>,
}
