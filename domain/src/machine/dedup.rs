//! The dedup index: a partition's transactionIds by a 16-byte hash, each row holding the offsets
//! stored under that hash. A row is small and the same size for every id; the stored message is
//! the check against a collision (two ids of one partition with the same hash).

use crate::keys::{self, DedupKey};
use crate::model::MessageHead;
use crate::store::{StateRead, StoreError, Txn};

/// What the index says about a transactionId in a partition.
pub(crate) struct Lookup {
    key: DedupKey,
    offsets: Vec<u64>,
}

/// The original of a duplicate.
pub(crate) struct Original {
    pub offset: u64,
    pub id: [u8; 16],
}

fn head_at(s: &dyn StateRead, pid: u64, offset: u64) -> Result<Option<MessageHead>, StoreError> {
    let key = keys::message(pid, offset);
    match s.get(&key)? {
        Some(bytes) => crate::codec::decode_head::<MessageHead>(&key, &bytes).map(Some),
        None => Ok(None),
    }
}

/// Read the row of `transaction_id`.
pub(crate) fn lookup(txn: &Txn<'_>, pid: u64, transaction_id: &str) -> Result<Lookup, StoreError> {
    lookup_key(txn, keys::dedup_key(pid, transaction_id))
}

/// Read the row of `key` (see [`keys::dedup_key`]).
pub(crate) fn lookup_key(txn: &Txn<'_>, key: DedupKey) -> Result<Lookup, StoreError> {
    let offsets = txn.dedup_offsets(&key)?.unwrap_or_default();
    Ok(Lookup { key, offsets })
}

impl Lookup {
    /// The stored message with this transactionId, checked against the message itself.
    pub(crate) fn original(
        &self,
        s: &dyn StateRead,
        pid: u64,
        transaction_id: &str,
    ) -> Result<Option<Original>, StoreError> {
        for &offset in &self.offsets {
            if let Some(m) = head_at(s, pid, offset)?
                && m.transaction_id == transaction_id
            {
                return Ok(Some(Original { offset, id: m.id }));
            }
        }
        Ok(None)
    }

    /// The offset an ack of this transactionId names. One offset under the hash (every case
    /// but a collision) is taken without reading the message; several are told apart by it.
    pub(crate) fn offset(
        &self,
        s: &dyn StateRead,
        pid: u64,
        transaction_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        match self.offsets.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(*one)),
            _ => Ok(self.original(s, pid, transaction_id)?.map(|o| o.offset)),
        }
    }

    /// Record a new message under this row.
    pub(crate) fn record(mut self, txn: &mut Txn<'_>, offset: u64) {
        self.offsets.push(offset);
        txn.set_dedup(self.key, self.offsets);
    }
}

/// Drop the row of a message retention deleted. The row goes whole: with a collision (a
/// chance of about n²/2^129 for n ids in one partition) the other id's dedup goes with it.
pub(crate) fn forget(txn: &mut Txn<'_>, pid: u64, transaction_id: &str) {
    txn.delete(keys::dedup(pid, transaction_id));
}
