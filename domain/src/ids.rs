//! Ids the domain treats as opaque, checked once where they enter (the HTTP edge) instead of by
//! every rule that reads them.
//!
//! In the log they are stored exactly as the text they replace (`serde(transparent)`, or the
//! decimal text for a partition reference), so entries written before these types existed read
//! the same. Reading the log does not check them again: an entry holds what the edge admitted,
//! and a rule that once refused a value per item (an empty transactionId, a partition reference
//! that is not a number) still does so for entries written before the edge checked.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The most bytes a transactionId may have.
pub const MAX_TRANSACTION_ID_BYTES: usize = 512;
/// The most bytes a lease id may have (the broker mints 36-character UUIDs).
pub const MAX_LEASE_ID_BYTES: usize = 255;

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id is empty.
    #[error("must not be empty")]
    Empty,
    /// The id is too long.
    #[error("must be at most {0} bytes")]
    TooLong(usize),
    /// The id has a control character.
    #[error("must not contain control characters")]
    BadChar,
}

fn check_transaction_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_TRANSACTION_ID_BYTES {
        return Err(IdError::TooLong(MAX_TRANSACTION_ID_BYTES));
    }
    Ok(())
}

fn check_lease_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_LEASE_ID_BYTES {
        return Err(IdError::TooLong(MAX_LEASE_ID_BYTES));
    }
    if id.chars().any(char::is_control) {
        return Err(IdError::BadChar);
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $ty:ident, $check:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $ty(String);

        impl $ty {
            /// Check and wrap an id.
            ///
            /// # Errors
            /// When the id breaks the type's rule (see the type).
            pub fn new(id: impl Into<String>) -> Result<Self, IdError> {
                let id = id.into();
                $check(&id)?;
                Ok(Self(id))
            }

            /// An id the broker minted itself (a UUID's text), not checked again.
            #[must_use]
            pub fn minted(uuid_text: String) -> Self {
                debug_assert!($check(&uuid_text).is_ok());
                Self(uuid_text)
            }

            /// The id as text.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id's text, unwrapped.
            #[must_use]
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A message's idempotency key within its partition: non-empty, at most
    /// [`MAX_TRANSACTION_ID_BYTES`]. The broker mints one for a message that came without.
    TransactionId,
    check_transaction_id
);

id_type!(
    /// A lease: minted by the broker for a pop, echoed by consumers in acks and extensions.
    /// Non-empty, at most [`MAX_LEASE_ID_BYTES`], no control characters.
    LeaseId,
    check_lease_id
);

/// A partition as an ack names it: the partition id a pop answered (decimal text on the wire),
/// or text that is not one. An ack naming no partition the broker knows is refused per item,
/// whether its text is a number or not, so the edge keeps both and the rule decides.
///
/// In the log it is the text the consumer sent (trimmed, for an id), as before this type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum PartitionRef {
    /// A partition id.
    Id(u64),
    /// Text that is not a partition id, kept to name it in the refusal.
    Unknown(String),
    /// A partition of another tenant than the request's: refused exactly as an unknown id
    /// is (the edge marks it; in the log it is `foreign:<id>`).
    Foreign(u64),
}

/// How a [`PartitionRef::Foreign`] is written in the log.
const FOREIGN: &str = "foreign:";

impl PartitionRef {
    /// Read a consumer's partition reference.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        Self::id_in(text).map_or_else(|| Self::Unknown(text.to_owned()), Self::Id)
    }

    /// The partition id `text` spells (surrounding blanks allowed), if it spells one.
    fn id_in(text: &str) -> Option<u64> {
        text.trim().parse().ok()
    }
}

impl From<String> for PartitionRef {
    fn from(text: String) -> Self {
        if let Some(id) = text.strip_prefix(FOREIGN).and_then(|t| t.parse().ok()) {
            return Self::Foreign(id);
        }
        Self::id_in(&text).map_or(Self::Unknown(text), Self::Id)
    }
}

impl From<PartitionRef> for String {
    fn from(p: PartitionRef) -> Self {
        p.to_string()
    }
}

impl fmt::Display for PartitionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Id(id) => write!(f, "{id}"),
            Self::Unknown(text) => f.write_str(text),
            Self::Foreign(id) => write!(f, "{FOREIGN}{id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shapes these types replaced, to prove the log's bytes are unchanged.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Before {
        transaction_id: String,
        partition_id: String,
        lease_id: Option<String>,
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct After {
        transaction_id: TransactionId,
        partition_id: PartitionRef,
        lease_id: Option<LeaseId>,
    }

    #[test]
    fn the_log_bytes_are_the_text_they_replace() {
        let before = Before {
            transaction_id: "order-1".into(),
            partition_id: "17".into(),
            lease_id: Some("0198-lease".into()),
        };
        let after = After {
            transaction_id: TransactionId::new("order-1").unwrap(),
            partition_id: PartitionRef::parse("17"),
            lease_id: Some(LeaseId::new("0198-lease").unwrap()),
        };
        let old = postcard::to_allocvec(&before).unwrap();
        assert_eq!(old, postcard::to_allocvec(&after).unwrap());
        assert_eq!(postcard::from_bytes::<After>(&old).unwrap(), after);
        // An entry written before the edge checked reads back as it was written.
        let odd = Before {
            transaction_id: String::new(),
            partition_id: "p".into(),
            lease_id: None,
        };
        let read: After = postcard::from_bytes(&postcard::to_allocvec(&odd).unwrap()).unwrap();
        assert_eq!(read.transaction_id.as_str(), "");
        assert_eq!(read.partition_id, PartitionRef::Unknown("p".into()));
    }

    #[test]
    fn ids_are_checked_once() {
        assert_eq!(TransactionId::new(""), Err(IdError::Empty));
        assert!(TransactionId::new("x".repeat(MAX_TRANSACTION_ID_BYTES)).is_ok());
        assert_eq!(
            TransactionId::new("x".repeat(MAX_TRANSACTION_ID_BYTES + 1)),
            Err(IdError::TooLong(MAX_TRANSACTION_ID_BYTES))
        );
        assert_eq!(LeaseId::new(""), Err(IdError::Empty));
        assert_eq!(LeaseId::new("a\nb"), Err(IdError::BadChar));
        assert!(LeaseId::new("x".repeat(MAX_LEASE_ID_BYTES + 1)).is_err());
        assert_eq!(PartitionRef::parse(" 17 "), PartitionRef::Id(17));
        assert_eq!(
            PartitionRef::parse("eu"),
            PartitionRef::Unknown("eu".into())
        );
        assert_eq!(PartitionRef::parse("eu").to_string(), "eu");
    }

    #[test]
    fn a_foreign_partition_survives_the_log_and_is_never_an_id() {
        let f = PartitionRef::Foreign(7);
        let back: PartitionRef =
            crate::codec::decode(b"k", &crate::codec::encode(&f)).expect("decodes");
        assert_eq!(back, f);
        assert_eq!(PartitionRef::from("7".to_owned()), PartitionRef::Id(7));
    }
}
