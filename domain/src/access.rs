//! Who may do what: the access levels a route needs and the roles a credential grants.
//!
//! Five levels, as Queen 2.x has them. `Read` and `Write` sit side by side: a write-only
//! producer can push but never read or consume what others pushed, and a read-only client can
//! read but not change anything. `Consume` (pop, ack, transactions, KV writes) needs both,
//! which the `read-write` role grants; `Admin` passes everything.

/// The level a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Anyone, without a credential.
    Public,
    /// A reader: status, resources, dead letters, KV and timer reads, `fetch`.
    Read,
    /// A producer: push and timer creation.
    Write,
    /// A consumer that changes state: pop, ack, lease extension, transactions, KV writes,
    /// locks, queue configuration.
    Consume,
    /// An administrator: membership, deletions of queues and consumer groups.
    Admin,
}

impl Need {
    /// The level's name as the error messages and docs spell it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Need::Public => "public",
            Need::Read => "read-only",
            Need::Write => "write-only",
            Need::Consume => "read-write",
            Need::Admin => "admin",
        }
    }
}

/// A role a credential may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reads only.
    ReadOnly,
    /// Pushes only (produce-only, for untrusted publishers).
    WriteOnly,
    /// Reads, pushes and consumes.
    ReadWrite,
    /// Everything.
    Admin,
}

/// The roles one credential carries (a token may name several; the union applies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grants {
    read: bool,
    write: bool,
    consume: bool,
    admin: bool,
}

impl Grants {
    /// No role at all: only public routes pass.
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// Add a role.
    #[must_use]
    pub fn with(mut self, role: Role) -> Self {
        match role {
            Role::ReadOnly => self.read = true,
            Role::WriteOnly => self.write = true,
            Role::ReadWrite => {
                self.read = true;
                self.write = true;
                self.consume = true;
            }
            Role::Admin => self.admin = true,
        }
        self
    }

    /// Whether these roles pass a route that needs `need`.
    #[must_use]
    pub fn allow(self, need: Need) -> bool {
        self.admin
            || match need {
                Need::Public => true,
                Need::Read => self.read,
                Need::Write => self.write,
                Need::Consume => self.consume,
                Need::Admin => false,
            }
    }

    /// Whether the credential carries no recognised role.
    #[must_use]
    pub fn is_empty(self) -> bool {
        self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEEDS: [Need; 5] = [
        Need::Public,
        Need::Read,
        Need::Write,
        Need::Consume,
        Need::Admin,
    ];

    fn passes(g: Grants) -> Vec<Need> {
        NEEDS.into_iter().filter(|n| g.allow(*n)).collect()
    }

    #[test]
    fn each_role_passes_exactly_its_levels() {
        assert_eq!(passes(Grants::none()), vec![Need::Public]);
        assert_eq!(
            passes(Grants::none().with(Role::ReadOnly)),
            vec![Need::Public, Need::Read]
        );
        assert_eq!(
            passes(Grants::none().with(Role::WriteOnly)),
            vec![Need::Public, Need::Write]
        );
        assert_eq!(
            passes(Grants::none().with(Role::ReadWrite)),
            vec![Need::Public, Need::Read, Need::Write, Need::Consume]
        );
        assert_eq!(passes(Grants::none().with(Role::Admin)), NEEDS.to_vec());
    }

    #[test]
    fn read_and_write_together_do_not_make_a_consumer() {
        // Consuming changes what others see (leases, cursors): it is its own grant.
        let g = Grants::none().with(Role::ReadOnly).with(Role::WriteOnly);
        assert_eq!(passes(g), vec![Need::Public, Need::Read, Need::Write]);
        assert!(!g.is_empty());
        assert!(Grants::none().is_empty());
    }
}
