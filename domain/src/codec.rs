//! Encoding of stored records and log entries (postcard: compact, deterministic).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::StoreError;

/// Encode a record. Encoding our own types into a vector cannot fail.
#[must_use]
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Most records are small; starting at 64 bytes skips the growth steps below it.
    encode_with_capacity(value, 64)
}

/// Encode a record into a vector that starts with `capacity` bytes reserved (a record whose
/// size is known roughly, so that it is not grown and copied step by step).
#[must_use]
pub fn encode_with_capacity<T: Serialize>(value: &T, capacity: usize) -> Vec<u8> {
    postcard::to_extend(value, Vec::with_capacity(capacity)).unwrap_or_default()
}

/// Encode a record at the end of `out`.
///
/// # Errors
/// The value cannot be encoded (postcard refuses only sequences of unknown length, which no
/// record has); `out` is left as it was.
pub fn encode_onto<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), postcard::Error> {
    /// The end of a vector, as postcard's output.
    struct Tail<'a>(&'a mut Vec<u8>);
    impl Extend<u8> for Tail<'_> {
        fn extend<I: IntoIterator<Item = u8>>(&mut self, iter: I) {
            self.0.extend(iter);
        }
    }
    let len = out.len();
    postcard::to_extend(value, Tail(out))
        .map(drop)
        .inspect_err(|_| out.truncate(len))
}

/// Decode a stored record; a failure names the key.
///
/// # Errors
/// `StoreError::Corrupt` when the bytes are not a `T`.
pub fn decode<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| StoreError::Corrupt {
        key: escape(key),
        detail: e.to_string(),
    })
}

/// Decode the leading fields of a stored record as a `T` and leave the rest unread (postcard
/// encodes fields in order, so a struct of a record's first fields reads its head).
///
/// # Errors
/// `StoreError::Corrupt` when the bytes do not start with a `T`.
pub fn decode_head<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    decode_head_borrowed(key, bytes)
}

/// `decode_head` for a `T` that borrows from `bytes` (text fields as `&str`), so reading a
/// record's leading text copies nothing.
///
/// # Errors
/// `StoreError::Corrupt` when the bytes do not start with a `T`.
pub fn decode_head_borrowed<'de, T: serde::Deserialize<'de>>(
    key: &[u8],
    bytes: &'de [u8],
) -> Result<T, StoreError> {
    postcard::take_from_bytes(bytes)
        .map(|(head, _rest)| head)
        .map_err(|e| StoreError::Corrupt {
            key: escape(key),
            detail: e.to_string(),
        })
}

/// A key shown printable for errors and logs.
#[must_use]
pub fn escape(key: &[u8]) -> String {
    key.iter()
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use crate::model::MessageRec;
    use crate::time::Stamp;

    /// `MessageRec` as builds before byte-string payloads declared it: the payload a sequence
    /// of `u8`.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct MessageRecBefore {
        transaction_id: String,
        id: [u8; 16],
        trace_id: Option<String>,
        stamp: Stamp,
        payload: Vec<u8>,
    }

    /// A message's head reads without its payload, and gives the same fields as the whole record.
    #[test]
    fn a_message_head_reads_the_fields_before_the_payload() {
        let m = MessageRec {
            transaction_id: "t-9".to_owned(),
            id: [7; 16],
            trace_id: None,
            stamp: Stamp(42),
            payload: vec![b'x'; 10_000],
            producer: None,
        };
        let bytes = super::encode(&m);
        let head: crate::model::MessageHead = super::decode_head(b"k", &bytes).unwrap();
        assert_eq!(
            (
                head.transaction_id.as_str(),
                head.id,
                head.trace_id,
                head.stamp
            ),
            ("t-9", [7; 16], None, Stamp(42))
        );
        assert!(super::decode_head::<crate::model::MessageHead>(b"k", &bytes[..5]).is_err());
    }

    /// Payloads are encoded as one byte string; stores and logs written when they were a
    /// sequence of bytes must still read, and the other way round (a rolling upgrade).
    #[test]
    fn byte_string_payloads_keep_the_encoding() {
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let stamp = Stamp(1_700_000_000_000_007);
            let before = MessageRecBefore {
                transaction_id: "t-1".to_owned(),
                id: [3; 16],
                trace_id: Some("x".to_owned()),
                stamp,
                payload: payload.clone(),
            };
            let now = MessageRec {
                transaction_id: "t-1".to_owned(),
                id: [3; 16],
                trace_id: Some("x".to_owned()),
                stamp,
                payload,
                producer: None,
            };
            let old_bytes = super::encode(&before);
            assert_eq!(old_bytes, super::encode(&now), "payload of {len} bytes");
            let read: MessageRec = super::decode(b"k", &old_bytes).expect("decodes");
            assert_eq!(read, now);
        }
    }

    /// A record encoded from borrowed fields is byte for byte the owned record's encoding, so
    /// replicas and stores written either way agree.
    #[test]
    fn a_borrowed_message_encodes_as_the_owned_one() {
        for (trace, len) in [
            (None, 0usize),
            (Some("tr"), 1),
            (None, 300),
            (Some(""), 70_000),
        ] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let owned = MessageRec {
                transaction_id: "txn-42".to_owned(),
                id: [9; 16],
                trace_id: trace.map(str::to_owned),
                stamp: Stamp(1_700_000_000_123_456),
                payload: payload.clone(),
                producer: None,
            };
            let borrowed = crate::model::MessageRecRef {
                transaction_id: "txn-42",
                id: [9; 16],
                trace_id: trace,
                stamp: Stamp(1_700_000_000_123_456),
                payload: &payload,
                producer: None,
            };
            assert_eq!(
                borrowed.encode(),
                super::encode(&owned),
                "payload of {len} bytes"
            );
        }
    }
}
