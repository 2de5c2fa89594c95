//! Raft groups per process (`QUEEN_RAFT_GROUPS`): which group holds a tenant, and which member
//! of the peer list a group prefers as its leader. Pure rules, the same on every node and every
//! build.
//!
//! A tenant lives in exactly one group. Its group is `fnv1a64(id) mod groups`, where `id` is
//! the tenant's UUID in lowercase hyphenated text (the default tenant's is
//! `00000000-0000-0000-0000-000000000001`) and FNV-1a is the 64-bit variant (offset basis
//! `0xcbf29ce484222325`, prime `0x100000001b3`), unless `QUEEN_TENANT_GROUPS` pins it
//! (`<tenant id>=<group>,...`).

use std::collections::BTreeMap;

use crate::tenant::Tenant;

/// Most groups a process runs.
pub const MAX_GROUPS: u16 = 64;

/// Where each tenant lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    groups: u16,
    pins: BTreeMap<String, u16>,
}

/// A setting of the placement that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The group count is out of range.
    #[error("must be a whole number from 1 to {MAX_GROUPS}")]
    Count,
    /// One pin of `QUEEN_TENANT_GROUPS` is malformed.
    #[error("'{0}' is not <tenant id>=<group> (the tenant a UUID, the group a number)")]
    Pin(String),
    /// A pin names a group the process does not run.
    #[error("pins tenant {tenant} to group {group}, but groups are numbered 0 to {last}")]
    NoSuchGroup {
        /// The tenant.
        tenant: String,
        /// The group it names.
        group: u16,
        /// The last group.
        last: u16,
    },
    /// A tenant is pinned twice.
    #[error("pins tenant {0} twice")]
    Twice(String),
}

/// FNV-1a, 64 bits: small, fixed and documented, so placement never changes with a build.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Placement {
    /// One group: every tenant in group 0.
    #[must_use]
    pub fn single() -> Self {
        Self {
            groups: 1,
            pins: BTreeMap::new(),
        }
    }

    /// `groups` groups with the pins of `QUEEN_TENANT_GROUPS` (`<tenant id>=<group>,...`,
    /// blank for none).
    ///
    /// # Errors
    /// A count out of range, or a pin that is malformed, repeated or names no group.
    pub fn new(groups: u16, pins: &str) -> Result<Self, PlacementError> {
        if !(1..=MAX_GROUPS).contains(&groups) {
            return Err(PlacementError::Count);
        }
        let mut out = BTreeMap::new();
        for pin in pins.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || PlacementError::Pin(pin.to_owned());
            let (tenant, group) = pin.split_once('=').ok_or_else(bad)?;
            let tenant = Tenant::any(tenant).map_err(|_| bad())?;
            let group: u16 = group.trim().parse().map_err(|_| bad())?;
            if group >= groups {
                return Err(PlacementError::NoSuchGroup {
                    tenant: tenant.id().to_owned(),
                    group,
                    last: groups - 1,
                });
            }
            if out.insert(tenant.id().to_owned(), group).is_some() {
                return Err(PlacementError::Twice(tenant.id().to_owned()));
            }
        }
        Ok(Self { groups, pins: out })
    }

    /// How many groups there are.
    #[must_use]
    pub fn groups(&self) -> u16 {
        self.groups
    }

    /// The group of the tenant whose id is `id` (lowercase UUID text).
    #[must_use]
    pub fn group_of_id(&self, id: &str) -> u16 {
        if let Some(g) = self.pins.get(id) {
            return *g;
        }
        // The remainder is below `groups`, a u16.
        u16::try_from(fnv1a64(id.as_bytes()) % u64::from(self.groups)).unwrap_or(0)
    }

    /// The group of `tenant`.
    #[must_use]
    pub fn group_of(&self, tenant: &Tenant) -> u16 {
        self.group_of_id(tenant.id())
    }

    /// The pinned tenants, with their groups.
    pub fn pins(&self) -> impl Iterator<Item = (&str, u16)> {
        self.pins.iter().map(|(t, g)| (t.as_str(), *g))
    }
}

/// The member group `group` prefers as its leader: position `group mod n` of the voters sorted
/// by id, so with as many groups as nodes each node prefers to lead one group.
#[must_use]
pub fn preferred_leader(group: u16, voters: &[u64]) -> Option<u64> {
    let mut ids = voters.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return None;
    }
    ids.get(usize::from(group) % ids.len()).copied()
}

/// The raft address of group `group` of a node whose raft address is `addr` (group 0's): the
/// same host, the port plus `group` (`None` past the last port, or when `addr` has no port).
#[must_use]
pub fn group_raft_addr(addr: &str, group: u16) -> Option<String> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    Some(format!("{host}:{}", port.checked_add(group)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0b1a4f52-5a43-4a8e-9a49-6f1d5e2c7b10";
    const B: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

    #[test]
    fn the_hash_is_the_documented_fnv1a() {
        // Fixed values: placement may never change between builds.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        let p = Placement::new(3, "").unwrap();
        let default = crate::tenant::DEFAULT_TENANT;
        assert_eq!(
            p.group_of_id(default),
            u16::try_from(fnv1a64(default.as_bytes()) % 3).unwrap()
        );
        assert_eq!(p.group_of(&Tenant::default()), p.group_of_id(default));
    }

    #[test]
    fn every_group_gets_tenants_and_one_group_holds_all() {
        let p = Placement::new(3, "").unwrap();
        let mut seen = [0u32; 3];
        for i in 0..300u32 {
            let id = format!("00000000-0000-4000-8000-{i:012x}");
            seen[usize::from(p.group_of_id(&id))] += 1;
        }
        assert!(seen.iter().all(|n| *n > 50), "{seen:?}");
        let one = Placement::single();
        assert_eq!(one.group_of_id(A), 0);
        assert_eq!(one.group_of_id(B), 0);
    }

    #[test]
    fn pins_override_the_hash_and_are_checked() {
        let p = Placement::new(4, &format!(" {}=3 , {B}=0", A.to_uppercase())).unwrap();
        assert_eq!(p.group_of_id(A), 3);
        assert_eq!(p.group_of_id(B), 0);
        assert_eq!(p.pins().count(), 2);
        assert_eq!(Placement::new(0, ""), Err(PlacementError::Count));
        assert_eq!(Placement::new(65, ""), Err(PlacementError::Count));
        assert!(matches!(
            Placement::new(2, &format!("{A}=2")),
            Err(PlacementError::NoSuchGroup {
                group: 2,
                last: 1,
                ..
            })
        ));
        assert!(matches!(
            Placement::new(2, "acme=1"),
            Err(PlacementError::Pin(_))
        ));
        assert!(matches!(
            Placement::new(2, &format!("{A}=1,{A}=0")),
            Err(PlacementError::Twice(_))
        ));
    }

    #[test]
    fn each_node_prefers_one_group_when_counts_match() {
        let voters = [3, 1, 2];
        let leaders: Vec<u64> = (0..3)
            .filter_map(|g| preferred_leader(g, &voters))
            .collect();
        assert_eq!(leaders, vec![1, 2, 3]);
        assert_eq!(preferred_leader(4, &voters), Some(2));
        assert_eq!(preferred_leader(0, &[]), None);
    }

    #[test]
    fn a_group_listens_on_the_raft_port_plus_its_number() {
        assert_eq!(
            group_raft_addr("10.0.0.1:6633", 2).as_deref(),
            Some("10.0.0.1:6635")
        );
        assert_eq!(
            group_raft_addr("[::1]:6633", 0).as_deref(),
            Some("[::1]:6633")
        );
        assert_eq!(group_raft_addr("host:65535", 1), None);
        assert_eq!(group_raft_addr("host", 1), None);
    }
}
