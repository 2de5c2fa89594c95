//! The stored messages of a push entry's items, for a store that keeps the entry instead of the
//! messages (its segments read them back from the raft log's files).

use crate::model::MessageRecRef;
use crate::time::Stamp;

/// Why [`pushed_messages`] could not read an entry's messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushedMessagesError {
    /// The bytes are not a push entry of this build.
    #[error("the entry is not a push of this build")]
    NotAPush,
    /// The push has fewer items than asked for.
    #[error("the push has {has} items, not {first} + {count}")]
    TooFewItems {
        /// Items in the push.
        has: usize,
        /// The first asked for.
        first: usize,
        /// How many were asked for.
        count: usize,
    },
}

/// The stored messages of items `first .. first + count` of an encoded `Command::Push` entry
/// applied at `stamp`: byte for byte what the push appended for them, for a store that keeps
/// the entry instead of the messages.
///
/// # Errors
/// The bytes are not a push entry of this build, or it has fewer items.
pub fn pushed_messages(
    entry: &[u8],
    stamp: u64,
    first: usize,
    count: usize,
) -> Result<Vec<Vec<u8>>, PushedMessagesError> {
    // Read in place: the items' text and payloads borrowed from `entry`, so that each message
    // is copied once, into its stored form.
    let (_, items) = crate::command::decode_push(entry).ok_or(PushedMessagesError::NotAPush)?;
    let items = first
        .checked_add(count)
        .and_then(|end| items.get(first..end))
        .ok_or(PushedMessagesError::TooFewItems {
            has: items.len(),
            first,
            count,
        })?;
    Ok(items
        .iter()
        .map(|item| {
            MessageRecRef {
                transaction_id: item.transaction_id,
                id: item.message_id,
                trace_id: item.trace_id,
                stamp: Stamp(stamp),
                payload: item.payload,
                // A push entry of `Command::Push` carries no producer (those of
                // `Command::AsProducer` are stored as encoded messages, not kept entries).
                producer: None,
            }
            .encode()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A push entry read in place gives, for any run of its items, the bytes the push stores
    /// for them; another entry, or a run past its items, is an error.
    #[test]
    fn pushed_messages_are_the_stored_bytes_of_the_items() {
        use crate::command::{Command, Entry, PushItem};
        use crate::names::{PartitionName, QueueName};
        let items: Vec<PushItem> = (0..7u8)
            .map(|i| PushItem {
                queue: QueueName::new(format!("q{i}")).unwrap(),
                partition: PartitionName::new("Default").unwrap(),
                transaction_id: crate::ids::TransactionId::new(format!(
                    "txn-{}",
                    "x".repeat(usize::from(i) * 40)
                ))
                .unwrap(),
                message_id: [i; 16],
                payload: vec![i; usize::from(i) * 100],
                trace_id: (i % 2 == 0).then(|| format!("trace-{i}")),
            })
            .collect();
        let entry = Entry {
            proposed_at: 1_700_000_000_000_000,
            command: Command::Push(items.clone()),
        }
        .encode();
        let stamp = 1_700_000_000_000_123;
        for first in 0..items.len() {
            for count in 0..=items.len() - first {
                let want: Vec<Vec<u8>> = items[first..first + count]
                    .iter()
                    .map(|item| {
                        MessageRecRef {
                            transaction_id: item.transaction_id.as_str(),
                            id: item.message_id,
                            trace_id: item.trace_id.as_deref(),
                            stamp: Stamp(stamp),
                            payload: &item.payload,
                            producer: None,
                        }
                        .encode()
                    })
                    .collect();
                assert_eq!(pushed_messages(&entry, stamp, first, count).unwrap(), want);
            }
        }
        assert!(pushed_messages(&entry, stamp, 6, 2).is_err());
        let tick = Entry {
            proposed_at: 1,
            command: Command::Tick,
        }
        .encode();
        assert!(pushed_messages(&tick, stamp, 0, 0).is_err());
    }
}
