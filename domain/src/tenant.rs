//! Tenants. Every named piece of state belongs to exactly one tenant: queues (and through their
//! ids their partitions, messages, cursors, groups, leases, dead letters and timers), KV
//! namespaces, lock names and the tags of `pop` by namespace or task.
//!
//! How a tenant is kept in a name: the default tenant's names are stored as clients wrote them,
//! so every store written before tenancy reads the same. Another tenant's names are stored
//! behind a scope, `\u{1}<tenant id>\u{1}<name>`. No client name can hold `\u{1}` (queue names
//! refuse control characters, KV namespaces are `[a-z0-9._-]`), so no spelling of a name
//! reaches another tenant's state, and every scoped name sorts before every default one: the
//! default tenant's names are one range of each table and another tenant's names another.

use std::borrow::Cow;

use crate::names::{GroupName, NameError, QueueName};
pub use crate::scope::SCOPE_MARK;
use crate::scope::{is_uuid, scoped_parts};

pub mod purge;

/// The tenant of a request that names none.
pub const DEFAULT_TENANT: &str = "00000000-0000-0000-0000-000000000001";

/// The tenant the embedded proxy keeps its own tables under; never a client's.
pub const PROXY_TENANT: &str = "00000000-0000-0000-0000-00000000fffe";

/// Why a tenant id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// Not a UUID in its 8-4-4-4-12 hexadecimal form.
    #[error("must be a UUID (8-4-4-4-12 hexadecimal digits)")]
    NotUuid,
    /// The proxy's own tenant.
    #[error("is reserved for the proxy's own state")]
    Reserved,
}

/// One tenant, with the scope its names are stored under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant {
    /// The id, lowercase.
    id: String,
    /// `\u{1}<id>\u{1}`, or empty for the default tenant.
    scope: String,
}

impl Default for Tenant {
    fn default() -> Self {
        Self {
            id: DEFAULT_TENANT.to_owned(),
            scope: String::new(),
        }
    }
}

impl Tenant {
    /// The tenant a client names (`x-queen-tenant`, a token's tenant claim). The default
    /// tenant's id names the default tenant.
    ///
    /// # Errors
    /// When `text` is not a UUID, or is the proxy's reserved tenant.
    pub fn parse(text: &str) -> Result<Self, TenantError> {
        let id = Self::any(text)?;
        if id.id == PROXY_TENANT {
            return Err(TenantError::Reserved);
        }
        Ok(id)
    }

    /// Any tenant, the proxy's own included (for the node's own callers, never for a client).
    ///
    /// # Errors
    /// When `text` is not a UUID.
    pub fn any(text: &str) -> Result<Self, TenantError> {
        let text = text.trim();
        if !is_uuid(text) {
            return Err(TenantError::NotUuid);
        }
        let id = text.to_ascii_lowercase();
        if id == DEFAULT_TENANT {
            return Ok(Self::default());
        }
        let scope = format!("{SCOPE_MARK}{id}{SCOPE_MARK}");
        Ok(Self { id, scope })
    }

    /// The id, lowercase.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether this is the default tenant (its names are stored unscoped).
    #[must_use]
    pub fn is_default(&self) -> bool {
        self.scope.is_empty()
    }

    /// What this tenant's stored names start with (empty for the default tenant, whose names
    /// are those that start with no scope).
    #[must_use]
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// A client's queue name, validated, as this tenant stores it.
    ///
    /// # Errors
    /// When `local` is not a valid queue name.
    pub fn queue(&self, local: &str) -> Result<QueueName, NameError> {
        QueueName::new(local)?;
        Ok(QueueName::stored(self.name(local)))
    }

    /// Put an already valid queue name under this tenant's scope.
    #[must_use]
    pub fn scope_queue(&self, q: QueueName) -> QueueName {
        if self.is_default() {
            q
        } else {
            QueueName::stored(self.name(q.as_str()))
        }
    }

    /// A group as a command that reaches every queue of this tenant names it (deleting a group
    /// everywhere, resubscribing it): the machine reads the scope and touches only this
    /// tenant's queues.
    #[must_use]
    pub fn group_everywhere(&self, g: GroupName) -> GroupName {
        if self.is_default() {
            g
        } else {
            GroupName::stored(self.name(g.as_str()))
        }
    }

    /// A validated name (a KV namespace, a lock name, a queue's tag) as this tenant stores it.
    #[must_use]
    pub fn name(&self, local: &str) -> String {
        if self.is_default() {
            local.to_owned()
        } else {
            let mut s = String::with_capacity(self.scope.len() + local.len());
            s.push_str(&self.scope);
            s.push_str(local);
            s
        }
    }

    /// Whether a stored name belongs to this tenant.
    #[must_use]
    pub fn owns(&self, stored: &str) -> bool {
        if self.is_default() {
            !stored.starts_with(SCOPE_MARK)
        } else {
            stored.starts_with(&self.scope)
        }
    }

    /// The name a client of this tenant knows for a stored name it owns (a name it does not
    /// own comes back whole; callers filter with [`Tenant::owns`] first).
    #[must_use]
    pub fn local<'a>(&self, stored: &'a str) -> &'a str {
        if self.is_default() {
            stored
        } else {
            stored.strip_prefix(self.scope.as_str()).unwrap_or(stored)
        }
    }
}

/// The tenant id and the client's name of any stored name: `(None, name)` for the default
/// tenant's.
#[must_use]
pub fn split(stored: &str) -> (Option<&str>, &str) {
    match scoped_parts(stored) {
        Some((id, local)) => (Some(id), local),
        None => (None, stored),
    }
}

/// A stored name as operators read it (logs, metrics, `/status`): `<tenant id>/<name>` for a
/// scoped one (`/` is in no name, so the form is unambiguous), the name itself otherwise.
#[must_use]
pub fn display(stored: &str) -> Cow<'_, str> {
    match scoped_parts(stored) {
        Some((id, local)) => Cow::Owned(format!("{id}/{local}")),
        None => Cow::Borrowed(stored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "2f1c1a52-8d3e-4a7b-9c11-0e5d6f7a8b9c";

    #[test]
    fn parses_uuids_and_refuses_the_rest() {
        assert!(Tenant::parse(DEFAULT_TENANT).unwrap().is_default());
        assert_eq!(
            Tenant::parse(&T.to_uppercase()).unwrap().id(),
            T,
            "ids are kept lowercase"
        );
        assert_eq!(Tenant::parse("acme"), Err(TenantError::NotUuid));
        assert_eq!(
            Tenant::parse("2f1c1a52x8d3e-4a7b-9c11-0e5d6f7a8b9c"),
            Err(TenantError::NotUuid)
        );
        assert_eq!(Tenant::parse(PROXY_TENANT), Err(TenantError::Reserved));
        assert!(Tenant::any(PROXY_TENANT).is_ok());
    }

    #[test]
    fn scoped_names_round_trip_and_stay_apart() {
        let t = Tenant::parse(T).unwrap();
        let d = Tenant::default();
        let q = t.queue("orders").unwrap();
        assert_ne!(q, d.queue("orders").unwrap());
        assert!(t.owns(q.as_str()) && !d.owns(q.as_str()));
        assert!(d.owns("orders") && !t.owns("orders"));
        assert_eq!(t.local(q.as_str()), "orders");
        assert_eq!(split(q.as_str()), (Some(T), "orders"));
        assert_eq!(split("orders"), (None, "orders"));
        assert_eq!(display(q.as_str()), format!("{T}/orders"));
        // A scoped name survives the log's encoding; a client can never write one.
        let back: QueueName = crate::codec::decode(b"k", &crate::codec::encode(&q)).unwrap();
        assert_eq!(back, q);
        assert!(QueueName::new(q.as_str()).is_err());
        assert!(t.queue(q.as_str()).is_err());
        // Every scoped name sorts before every valid default one.
        assert!(q.as_str() < " ");
    }
}
