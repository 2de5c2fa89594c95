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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerRec {
    /// Message bytes.
    #[serde(with = "serde_bytes")]
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
