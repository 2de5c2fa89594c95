//! Which tenant a request acts for, and the request's names put under that tenant's scope.
//!
//! A request names its tenant by `x-queen-tenant` (only with `QUEEN_TENANCY_HEADER=true`, which
//! the node allows only behind a trusted proxy) or by its token's tenant claim (broker JWT on,
//! `JWT_TENANT_CLAIM`, `tenant` by default); a request that names none acts for the default
//! tenant. Every name a handler parses goes through [`Scope`], so a handler never reads or
//! writes a name outside its tenant; answers carry the names back as the client wrote them.
//! State reached by id rather than by name (a partition id in an ack, a lease id) is checked
//! against the tenant whenever tenancy is on, and answered as unknown when it is another's.

use queen_domain::StateRead;
use queen_domain::command::{AckItem, PushItem, PushOutcome, TxnOp, TxnOutcome, TxnResult};
use queen_domain::ids::PartitionRef;
use queen_domain::kv::{KvOp, LockOp};
use queen_domain::names::{GroupName, QueueName};
use queen_domain::reads;
use queen_domain::tenant::Tenant;
use queen_domain::timers::{TimerOp, TimerResult};

use crate::api::ApiError;
use crate::auth::Principal;

/// The header a trusted proxy names the tenant in.
pub const TENANT_HEADER: &str = "x-queen-tenant";

/// How this listener learns a request's tenant.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tenancy {
    /// `QUEEN_TENANCY_HEADER=true`: `x-queen-tenant` names it.
    pub header: bool,
    /// Broker JWT is on, so a token's tenant claim may name it.
    pub claims: bool,
}

impl Tenancy {
    /// Whether any request of this listener can act for a tenant other than the default one.
    #[must_use]
    pub fn on(self) -> bool {
        self.header || self.claims
    }
}

/// How a request came to its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// It named none.
    Nothing,
    /// `x-queen-tenant`, from a trusted proxy.
    Header,
    /// Its own token's tenant claim: the tenant's own credential.
    Token,
}

/// Who one request acts for: its tenant, whether state reached by id must be checked against
/// it, and the producer its pushes are stamped with.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    pub(crate) tenant: Tenant,
    /// Tenancy is on: another tenant's partitions and leases may exist.
    guard: bool,
    pub(crate) via: Via,
    /// The token's `sub` (`producerSub` of what it pushes); never read from a body.
    pub(crate) producer: Option<String>,
    /// The address the request came from: how the autopilot tells consumers apart.
    pub(crate) peer: Option<std::net::IpAddr>,
}

impl Default for Scope {
    fn default() -> Self {
        Self {
            tenant: Tenant::default(),
            guard: false,
            via: Via::Nothing,
            producer: None,
            peer: None,
        }
    }
}

fn tenant_of(text: &str, field: &str) -> Result<Tenant, ApiError> {
    Tenant::parse(text).map_err(|e| ApiError::bad_request(field, &e.to_string()))
}

/// The tenant a request acts for.
///
/// # Errors
/// 400 when `x-queen-tenant` is sent to a node that does not read it, or is not a UUID, or
/// names the reserved proxy tenant; 401 when a token's tenant claim is not a UUID; 403 when the
/// header and the token name different tenants.
pub(crate) fn resolve(
    cfg: Tenancy,
    header: Option<&hyper::header::HeaderValue>,
    principal: Option<&Principal>,
) -> Result<Scope, ApiError> {
    let from_header = match header {
        None => None,
        Some(_) if !cfg.header => {
            return Err(ApiError::bad_request(
                TENANT_HEADER,
                "is read only by a node with QUEEN_TENANCY_HEADER=true (behind a trusted proxy); this node does not read it",
            ));
        }
        Some(v) => Some(tenant_of(v.to_str().unwrap_or(""), TENANT_HEADER)?),
    };
    let from_token = match principal.and_then(|p| p.tenant.as_deref()) {
        None => None,
        Some(t) => Some(Tenant::parse(t).map_err(|e| {
            ApiError::new(401, "unauthorized", format!("the token's tenant claim {e}"))
                .with_reason("bad_claims")
        })?),
    };
    let (tenant, via) = match (from_header, from_token) {
        (Some(h), Some(t)) if h != t => {
            return Err(ApiError::new(
                403,
                "forbidden",
                format!("{TENANT_HEADER} and the token's tenant claim name different tenants"),
            ));
        }
        (_, Some(t)) => (t, Via::Token),
        (Some(h), None) => (h, Via::Header),
        (None, None) => (Tenant::default(), Via::Nothing),
    };
    Ok(Scope {
        tenant,
        guard: cfg.on(),
        via,
        producer: principal.and_then(|p| p.sub.clone()),
        peer: None,
    })
}

impl Scope {
    /// Name the consumer of an autopilot pop by its address (the autopilot remembers each
    /// consumer's recent pops; several consumers on one host count as one).
    pub(crate) fn name_consumer(&self, req: &mut queen_ports::PopRequest) {
        if let Some(a) = &mut req.autopilot {
            a.consumer = self.peer.map(|p| p.to_string()).unwrap_or_default();
        }
    }

    /// The scope of a request the embedded proxy let through for a cluster whose data lives
    /// under `tenant`.
    pub(crate) fn proxied(tenant: Tenant) -> Self {
        Self {
            tenant,
            guard: true,
            via: Via::Header,
            producer: None,
            peer: None,
        }
    }

    /// A client's queue name, validated, under this tenant.
    pub(crate) fn queue(&self, text: &str, field: &str) -> Result<QueueName, ApiError> {
        self.tenant
            .queue(text)
            .map_err(|e| ApiError::bad_request(field, &e.to_string()))
    }

    /// A stored name as this tenant's client knows it.
    pub(crate) fn local<'a>(&self, stored: &'a str) -> &'a str {
        self.tenant.local(stored)
    }

    /// Whether this tenant owns a stored name.
    pub(crate) fn owns(&self, stored: &str) -> bool {
        self.tenant.owns(stored)
    }

    /// A validated name (KV namespace, lock, queue tag) under this tenant.
    pub(crate) fn name(&self, local: &str) -> String {
        self.tenant.name(local)
    }

    /// Push items under this tenant.
    pub(crate) fn push(&self, items: &mut [PushItem]) {
        if self.tenant.is_default() {
            return;
        }
        for i in items {
            i.queue = self.tenant.scope_queue(i.queue.clone());
        }
    }

    /// KV operations under this tenant.
    pub(crate) fn kv(&self, ops: &mut [KvOp]) {
        if !self.tenant.is_default() {
            for op in ops {
                let ns = op.ns_mut();
                *ns = self.tenant.name(ns);
            }
        }
    }

    /// Lock operations under this tenant.
    pub(crate) fn locks(&self, ops: &mut [LockOp]) {
        if !self.tenant.is_default() {
            for op in ops {
                let n = op.name_mut();
                *n = self.tenant.name(n);
            }
        }
    }

    /// Timer operations under this tenant.
    pub(crate) fn timers(&self, ops: &mut [TimerOp]) {
        if !self.tenant.is_default() {
            for op in ops {
                let q = op.queue_mut();
                *q = self.tenant.scope_queue(q.clone());
            }
        }
    }

    /// A group as a command that reaches all of this tenant's queues names it.
    pub(crate) fn group_everywhere(&self, g: GroupName) -> GroupName {
        self.tenant.group_everywhere(g)
    }

    /// Acks whose partition belongs to another tenant are marked foreign: the machine answers
    /// them as it answers an unknown partition.
    pub(crate) fn acks<'a>(
        &self,
        state: &dyn StateRead,
        items: impl Iterator<Item = &'a mut AckItem>,
    ) -> Result<(), ApiError> {
        if !self.guard {
            return Ok(());
        }
        let mut known: Vec<(u64, bool)> = Vec::new();
        for item in items {
            let PartitionRef::Id(pid) = item.partition_id else {
                continue;
            };
            let ours = match known.iter().find(|(p, _)| *p == pid) {
                Some((_, o)) => *o,
                None => {
                    let o = reads::partition_queue(state, pid)
                        .map_err(|e| crate::api::store_error(&e))?
                        .is_none_or(|q| self.owns(&q));
                    known.push((pid, o));
                    o
                }
            };
            if !ours {
                item.partition_id = PartitionRef::Foreign(pid);
            }
        }
        Ok(())
    }

    /// A transaction's operations under this tenant: pushes scoped, acks checked.
    pub(crate) fn transaction(
        &self,
        state: Option<&dyn StateRead>,
        ops: &mut [TxnOp],
        kv: &mut [KvOp],
        timers: &mut [TimerOp],
    ) -> Result<(), ApiError> {
        self.kv(kv);
        self.timers(timers);
        for op in ops.iter_mut() {
            if let TxnOp::Push(p) = op {
                self.push(std::slice::from_mut(p));
            }
        }
        if let Some(state) = state {
            self.acks(
                state,
                ops.iter_mut().filter_map(|op| match op {
                    TxnOp::Ack { item, .. } => Some(item),
                    TxnOp::Push(_) => None,
                }),
            )?;
        }
        Ok(())
    }

    /// Whether a lease may be used by this tenant: unknown leases are (the machine answers
    /// them), another tenant's are not.
    pub(crate) fn lease_ours(&self, state: &dyn StateRead, lease: &str) -> Result<bool, ApiError> {
        if !self.guard {
            return Ok(true);
        }
        Ok(reads::lease_queue(state, lease)
            .map_err(|e| crate::api::store_error(&e))?
            .is_none_or(|q| self.owns(&q)))
    }

    /// Whether the request named a tenant (by header or token), even the default one.
    pub(crate) fn names_a_tenant(&self) -> bool {
        self.via != Via::Nothing
    }

    /// Whether reads by id must be checked (tenancy is on).
    pub(crate) fn guarded(&self) -> bool {
        self.guard
    }

    /// Push answers with the client's queue names.
    pub(crate) fn push_answers(&self, out: &mut [PushOutcome]) {
        if !self.tenant.is_default() {
            for o in out {
                o.queue = self.local(&o.queue).to_owned();
            }
        }
    }

    /// A transaction's answer with the client's names.
    pub(crate) fn transaction_answer(&self, out: &mut TxnOutcome) {
        if self.tenant.is_default() {
            return;
        }
        for r in &mut out.results {
            if let TxnResult::Push(o) = r {
                self.push_answers(std::slice::from_mut(o));
            }
        }
        self.timer_answers(&mut out.timers);
    }

    /// Timer answers with the client's queue names.
    pub(crate) fn timer_answers(&self, out: &mut [TimerResult]) {
        if !self.tenant.is_default() {
            for r in out {
                r.queue = self.local(&r.queue).to_owned();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "11111111-2222-4333-8444-555555555555";

    fn hv(s: &str) -> hyper::header::HeaderValue {
        hyper::header::HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn the_header_counts_only_where_it_is_read() {
        let on = Tenancy {
            header: true,
            claims: false,
        };
        let off = Tenancy::default();
        assert!(resolve(off, None, None).unwrap().tenant.is_default());
        assert_eq!(resolve(off, Some(&hv(A)), None).unwrap_err().status, 400);
        let s = resolve(on, Some(&hv(A)), None).unwrap();
        assert_eq!((s.tenant.id(), s.via), (A, Via::Header));
        assert_eq!(
            resolve(on, Some(&hv("acme")), None).unwrap_err().status,
            400
        );
        assert_eq!(
            resolve(on, Some(&hv(queen_domain::tenant::PROXY_TENANT)), None)
                .unwrap_err()
                .status,
            400
        );
    }

    #[test]
    fn a_token_names_its_tenant_and_the_header_cannot_differ() {
        let cfg = Tenancy {
            header: true,
            claims: true,
        };
        let p = Principal {
            tenant: Some(A.to_owned()),
            ..Principal::default()
        };
        let s = resolve(cfg, None, Some(&p)).unwrap();
        assert_eq!((s.tenant.id(), s.via), (A, Via::Token));
        let other = hv("99999999-2222-4333-8444-555555555555");
        assert_eq!(
            resolve(cfg, Some(&other), Some(&p)).unwrap_err().status,
            403
        );
        assert!(resolve(cfg, Some(&hv(A)), Some(&p)).is_ok());
        let bad = Principal {
            tenant: Some("acme".to_owned()),
            ..Principal::default()
        };
        assert_eq!(resolve(cfg, None, Some(&bad)).unwrap_err().status, 401);
    }
}
