//! A node's raft groups as the HTTP layer reaches them (`QUEEN_RAFT_GROUPS`): one use-case
//! object per group and the placement of tenants, for the listener's routing and the embedded
//! proxy (whose own state lives in its reserved tenant's group).

use std::sync::Arc;

/// A node's raft groups as a listener routes to them: one use-case object per group, the first
/// of which also answers for the node (health, status, metrics, membership), and the placement
/// of tenants in groups.
pub struct Groups<A> {
    apis: Vec<Arc<A>>,
    placement: queen_domain::groups::Placement,
}

impl<A> Groups<A> {
    /// How many groups.
    pub(crate) fn len(&self) -> usize {
        self.apis.len()
    }

    /// Every group's use cases, by number.
    pub(crate) fn all(&self) -> &[Arc<A>] {
        &self.apis
    }

    /// The use cases of the group that holds `tenant`.
    pub(crate) fn of(&self, tenant: &queen_domain::tenant::Tenant) -> &Arc<A> {
        let g = usize::from(self.placement.group_of(tenant));
        self.apis.get(g).unwrap_or(&self.apis[0])
    }

    /// The use cases of the group that holds the embedded proxy's own state (its directory,
    /// usage and audit rows, under the proxy's reserved tenant).
    pub(crate) fn home(&self) -> &Arc<A> {
        let g = usize::from(
            self.placement
                .group_of_id(queen_domain::tenant::PROXY_TENANT),
        );
        self.apis.get(g).unwrap_or(&self.apis[0])
    }

    /// One group.
    pub fn one(api: Arc<A>) -> Self {
        Self {
            apis: vec![api],
            placement: queen_domain::groups::Placement::single(),
        }
    }

    /// `apis[g]` for group `g`; `placement` must count as many groups (else: one group, the
    /// first).
    pub fn new(apis: Vec<Arc<A>>, placement: queen_domain::groups::Placement) -> Self {
        if apis.is_empty() || apis.len() != usize::from(placement.groups()) {
            tracing::error!(target: "queen-http", groups = apis.len(), placement = placement.groups(), "the groups and the placement disagree; serving the first group only");
            let first = apis.into_iter().next();
            return match first {
                Some(a) => Self::one(a),
                None => panic!("a listener needs at least one group"),
            };
        }
        Self { apis, placement }
    }
}
