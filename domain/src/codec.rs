//! Encoding of stored records and log entries (postcard: compact, deterministic).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::StoreError;

/// Encode a record. Encoding our own types into a vector cannot fail.
#[must_use]
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).unwrap_or_default()
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

/// A key shown printable for errors and logs.
#[must_use]
pub fn escape(key: &[u8]) -> String {
    key.iter()
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect()
}
