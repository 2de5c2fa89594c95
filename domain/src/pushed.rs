//! The stored messages of a push entry's items, for a store that keeps the entry instead of the
//! messages (its segments read them back from the raft log's files).

use crate::model::MessageRecRef;
use crate::time::Stamp;

/// Why [`for_pushed_messages`] could not read an entry's messages.
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
    /// The bytes are not `count` whole items of a push, back to back.
    #[error("the bytes are not {count} whole items of a push")]
    NotItems {
        /// How many were asked for.
        count: usize,
    },
}

/// The stored messages of items `first .. first + count` of an encoded `Command::Push` entry
/// applied at `stamp`, handed to `visit` in order: encoded, byte for byte what the push
/// appended for them, for a store that keeps the entry instead of the messages.
///
/// # Errors
/// The bytes are not a push entry of this build, or it has fewer items (nothing is visited).
pub fn for_pushed_messages(
    entry: &[u8],
    stamp: u64,
    first: usize,
    count: usize,
    visit: &mut dyn FnMut(&MessageRecRef<'_>),
) -> Result<(), PushedMessagesError> {
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
    for item in items {
        visit(&stored(item, stamp));
    }
    Ok(())
}

/// What the push stored for `item` applied at `stamp`.
fn stored<'a>(item: &crate::command::PushItemRef<'a>, stamp: u64) -> MessageRecRef<'a> {
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
}

/// Where each item of an encoded `Command::Push` entry starts in `entry`, and where the last
/// one ends (one more position than items): items `a .. b` are the bytes
/// `bounds[a] .. bounds[b]`, which [`for_pushed_items`] reads on their own. `None` for bytes that
/// are not a push entry laid out as this build writes one.
///
/// It walks the encoding without decoding it (lengths only, no text checked): the store calls
/// it for every entry it keeps, on bytes that were applied, so decoded, already.
#[must_use]
pub fn item_bounds(entry: &[u8]) -> Option<Vec<u32>> {
    let mut at = 0usize;
    // The entry: the proposer's clock, the command's variant (`Push` is the second) and the
    // item count, each a varint; then the items back to back, and nothing after them.
    varint(entry, &mut at)?;
    if varint(entry, &mut at)? != PUSH_VARIANT {
        return None;
    }
    let n = usize::try_from(varint(entry, &mut at)?).ok()?;
    // Each item is at least 21 bytes: four lengths, the 16-byte id and the trace's tag.
    let mut out = Vec::with_capacity(n.min(entry.len() / 21) + 1);
    for _ in 0..n {
        out.push(u32::try_from(at).ok()?);
        // Queue, partition and transactionId: a length and the text.
        for _ in 0..3 {
            skip_sized(entry, &mut at)?;
        }
        // The message id, 16 bytes as they are.
        at = at.checked_add(16)?;
        // The payload: a length and the bytes.
        skip_sized(entry, &mut at)?;
        // The trace id: absent (0), or present (1) and a length and the text.
        match entry.get(at)? {
            0 => at += 1,
            1 => {
                at += 1;
                skip_sized(entry, &mut at)?;
            }
            _ => return None,
        }
    }
    (at == entry.len()).then_some(())?;
    out.push(u32::try_from(at).ok()?);
    Some(out)
}

/// The variant index of `Command::Push` in the encoding (after `Tick`).
const PUSH_VARIANT: u64 = 1;

/// Read a postcard varint (LEB128, at most ten bytes) at `at`, moving `at` past it.
fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Move `at` past a length-prefixed field (text or bytes) that ends inside `b`.
fn skip_sized(b: &[u8], at: &mut usize) -> Option<()> {
    let len = usize::try_from(varint(b, at)?).ok()?;
    *at = at.checked_add(len)?;
    (*at <= b.len()).then_some(())
}

/// The stored messages of `count` push items encoded back to back in `items` (a piece of a
/// push entry cut at [`item_bounds`]) applied at `stamp`, handed to `visit`: what
/// [`for_pushed_messages`] gives for the same items of the whole entry.
///
/// # Errors
/// The bytes are not exactly `count` whole items (some may have been visited: the caller
/// drops what it built).
pub fn for_pushed_items(
    items: &[u8],
    stamp: u64,
    count: usize,
    visit: &mut dyn FnMut(&MessageRecRef<'_>),
) -> Result<(), PushedMessagesError> {
    let bad = || PushedMessagesError::NotItems { count };
    let mut rest = items;
    for _ in 0..count {
        let (item, r) = postcard::take_from_bytes::<crate::command::PushItemRef<'_>>(rest)
            .map_err(|_| bad())?;
        rest = r;
        visit(&stored(&item, stamp));
    }
    if rest.is_empty() { Ok(()) } else { Err(bad()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pushed_messages(
        entry: &[u8],
        stamp: u64,
        first: usize,
        count: usize,
    ) -> Result<Vec<Vec<u8>>, PushedMessagesError> {
        let mut out = Vec::new();
        for_pushed_messages(entry, stamp, first, count, &mut |m| out.push(m.encode()))?;
        Ok(out)
    }

    fn pushed_items(
        items: &[u8],
        stamp: u64,
        count: usize,
    ) -> Result<Vec<Vec<u8>>, PushedMessagesError> {
        let mut out = Vec::new();
        for_pushed_items(items, stamp, count, &mut |m| out.push(m.encode()))?;
        Ok(out)
    }

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
                // The same items cut out of the entry at their bounds read the same.
                let b = item_bounds(&entry).unwrap();
                let piece = &entry[b[first] as usize..b[first + count] as usize];
                assert_eq!(pushed_items(piece, stamp, count).unwrap(), want);
                if count > 0 {
                    assert!(pushed_items(piece, stamp, count - 1).is_err());
                    assert!(pushed_items(&piece[..piece.len() - 1], stamp, count).is_err());
                }
                assert!(pushed_items(piece, stamp, count + 1).is_err());
            }
        }
        // The bounds are where postcard's own decoding of the items starts and ends each one.
        let (_, mut rest) = postcard::take_from_bytes::<(u64, u32, u64)>(&entry).unwrap();
        let mut walked = Vec::new();
        for _ in 0..items.len() {
            walked.push((entry.len() - rest.len()) as u32);
            rest = postcard::take_from_bytes::<crate::command::PushItemRef<'_>>(rest)
                .unwrap()
                .1;
        }
        walked.push(entry.len() as u32);
        assert_eq!(item_bounds(&entry).unwrap(), walked);
        // Cut short, or with bytes after the items: not a push laid out as written.
        assert!(item_bounds(&entry[..entry.len() - 1]).is_none());
        let mut longer = entry.clone();
        longer.push(0);
        assert!(item_bounds(&longer).is_none());
        assert!(pushed_messages(&entry, stamp, 6, 2).is_err());
        let tick = Entry {
            proposed_at: 1,
            command: Command::Tick,
        }
        .encode();
        assert!(pushed_messages(&tick, stamp, 0, 0).is_err());
        assert!(item_bounds(&tick).is_none());
    }
}
