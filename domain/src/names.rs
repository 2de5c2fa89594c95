//! Names of queues, partitions, consumer groups, namespaces and tasks, validated once.
//!
//! Pop paths carry names unencoded, so `/`, `?`, `#` and control characters are refused: such a
//! name could never be reached on every route.

use serde::{Deserialize, Serialize};

/// The most bytes a name may have.
pub const MAX_NAME_BYTES: usize = 255;

/// The consumer group of group-less (queue-mode) consumption.
pub const QUEUE_MODE_GROUP: &str = "__QUEUE_MODE__";

/// The partition a push without one goes to.
pub const DEFAULT_PARTITION: &str = "Default";

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("must not be empty")]
    Empty,
    /// The name is too long.
    #[error("must be at most {MAX_NAME_BYTES} bytes")]
    TooLong,
    /// The name has a character that routes cannot carry.
    #[error("must not contain '/', '?', '#', '%' or control characters")]
    BadChar,
}

fn check(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong);
    }
    if name
        .chars()
        .any(|c| c.is_control() || matches!(c, '/' | '?' | '#' | '%'))
    {
        return Err(NameError::BadChar);
    }
    Ok(())
}

/// A stored name: a client's, or one under a tenant's scope (`crate::scope`).
fn check_stored(name: &str) -> Result<(), NameError> {
    match crate::scope::scoped_parts(name) {
        Some((_, local)) => check(local),
        None => check(name),
    }
}

macro_rules! name_type {
    ($(#[$doc:meta])* $ty:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $ty(String);

        impl TryFrom<String> for $ty {
            type Error = NameError;
            /// Read from the log or the store: a client's name, or one a tenant's scope
            /// holds (`tenant`), which no client can write.
            fn try_from(s: String) -> Result<Self, NameError> {
                check_stored(&s)?;
                Ok(Self(s))
            }
        }

        impl $ty {
            /// Validate and wrap a name.
            ///
            /// # Errors
            /// When the name is empty, too long or has a character routes cannot carry.
            pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
                let name = name.into();
                check(&name)?;
                Ok(Self(name))
            }

            /// Whether `name` is a valid stored name (a client's, or one under a tenant's
            /// scope), without a copy.
            #[must_use]
            pub fn is_valid(name: &str) -> bool {
                check_stored(name).is_ok()
            }

            /// The name as text.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<$ty> for String {
            fn from(n: $ty) -> String {
                n.0
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// A queue's name.
    QueueName
);
name_type!(
    /// A partition's name inside its queue.
    PartitionName
);
name_type!(
    /// A consumer group's name (`__QUEUE_MODE__` for queue mode).
    GroupName
);

impl QueueName {
    /// A name already validated and put under its tenant's scope (`tenant::Tenant`).
    pub(crate) fn stored(name: String) -> Self {
        Self(name)
    }
}

impl PartitionName {
    /// The `Default` partition.
    #[must_use]
    pub fn default_partition() -> Self {
        Self(DEFAULT_PARTITION.to_owned())
    }
}

impl GroupName {
    /// A name already validated and put under its tenant's scope (`tenant::Tenant`).
    pub(crate) fn stored(name: String) -> Self {
        Self(name)
    }

    /// The queue-mode group.
    #[must_use]
    pub fn queue_mode() -> Self {
        Self(QUEUE_MODE_GROUP.to_owned())
    }

    /// The group a request names, or queue mode when it names none.
    ///
    /// # Errors
    /// When the named group is not a valid name.
    pub fn or_queue_mode(name: Option<&str>) -> Result<Self, NameError> {
        match name {
            None | Some("") => Ok(Self::queue_mode()),
            Some(n) => Self::new(n),
        }
    }

    /// Whether this is queue mode.
    #[must_use]
    pub fn is_queue_mode(&self) -> bool {
        self.0 == QUEUE_MODE_GROUP
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_unroutable_names() {
        assert_eq!(QueueName::new(""), Err(NameError::Empty));
        assert_eq!(QueueName::new("a/b"), Err(NameError::BadChar));
        assert_eq!(QueueName::new("a\nb"), Err(NameError::BadChar));
        assert_eq!(QueueName::new("x".repeat(256)), Err(NameError::TooLong));
        assert!(QueueName::new("orders.eu-1 v2").is_ok());
        assert!(GroupName::or_queue_mode(None).unwrap().is_queue_mode());
    }
}
