//! What the proxy lets through: every route of the broker in one class, what an API key needs
//! for each class, and what a cluster's status refuses. Anything the table does not name under
//! `/api`, `/streams` or `/internal` is blocked: a route added to the broker later stays closed
//! behind the proxy until it is placed here.

use super::{Effective, Scopes};

/// A family of features a plan may switch off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `/api/v1/kv`, `/api/v1/locks`.
    Kv,
    /// `/api/v1/timers`.
    Timers,
    /// `/api/v1/ephemeral`.
    Ephemeral,
    /// `/streams/v1`.
    Streams,
    /// `/api/v1/traces`.
    Traces,
}

/// What a gated request does to the tenant's stored data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedOp {
    /// Reads only.
    Read,
    /// Adds data (refused like a push while pushes are blocked).
    Grow,
    /// Removes or releases (never refused by a push block).
    Open,
    /// A batch that may do either (refused whole by a push block only when it grows).
    Mixed,
}

/// The class of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `/health`: passes straight through.
    Health,
    /// `/metrics`, `/metrics/prometheus`: the control-plane token, or 404.
    Metrics,
    /// The dashboard's page and files (no data).
    Dashboard,
    /// `/api/cp/*`: the control plane, behind its own token.
    ControlPlane,
    /// Push, transaction.
    Produce,
    /// Pop, ack, leases, fetch, partitions changed.
    Consume,
    /// Configure, deletions, DLQ retries, consumer-group changes.
    QueueAdmin,
    /// Listings, status, analytics, message and DLQ reads.
    Read,
    /// A feature family.
    Gated(Feature, GatedOp),
    /// Node-wide pages an operator reads; no API key reaches them.
    Operator,
    /// Never through the proxy: membership, the node's own pages, tenant purges, unknown routes.
    Blocked,
}

/// The class of `method` on the decoded path `segs`.
#[must_use]
pub fn classify(method: &str, segs: &[&str]) -> Class {
    let read = matches!(method, "GET" | "HEAD");
    match segs {
        ["health"] if read => Class::Health,
        ["metrics"] | ["metrics", "prometheus"] if read => Class::Metrics,
        [] | ["dashboard", ..] if read => Class::Dashboard,
        ["api", "cp", ..] => Class::ControlPlane,
        ["api", "v1", rest @ ..] => v1(method, read, rest),
        ["streams", "v1", rest @ ..] => Class::Gated(Feature::Streams, streams_op(method, rest)),
        _ => Class::Blocked,
    }
}

fn v1(method: &str, read: bool, rest: &[&str]) -> Class {
    use Class as C;
    match (method, rest) {
        ("POST", ["push"] | ["transaction"]) => C::Produce,
        ("GET", ["pop", "queue", _] | ["pop", "queue", _, "partition", _])
        | ("POST", ["ack"] | ["ack", "batch"] | ["lease", _, "extend"])
        | ("POST", ["fetch"] | ["partitions", "changed"]) => C::Consume,
        ("POST", ["configure"])
        | ("DELETE", ["resources", "queues", _])
        | ("DELETE", ["messages", _, _])
        | ("POST", ["messages", _, _, "retry"]) => C::QueueAdmin,
        (_, ["consumer-groups", ..]) => {
            if read {
                C::Read
            } else {
                C::QueueAdmin
            }
        }
        (
            _,
            ["status"]
            | ["status", "buffers"]
            | [
                "analytics",
                "system-metrics" | "worker-metrics" | "postgres-stats",
            ],
        ) if read => C::Operator,
        (_, ["resources", ..] | ["status", ..] | ["analytics", _] | ["dlq"] | ["messages", ..])
            if read =>
        {
            C::Read
        }
        (_, ["kv", ..]) => C::Gated(Feature::Kv, kv_op(method, rest)),
        (_, ["locks"]) if method == "POST" => C::Gated(Feature::Kv, GatedOp::Open),
        (_, ["timers", ..]) => C::Gated(
            Feature::Timers,
            match method {
                "GET" | "HEAD" => GatedOp::Read,
                "DELETE" => GatedOp::Open,
                _ => GatedOp::Mixed,
            },
        ),
        (_, ["ephemeral", tail @ ..]) => C::Gated(
            Feature::Ephemeral,
            match (method, tail) {
                ("POST", ["push"]) => GatedOp::Grow,
                ("GET" | "HEAD", ["queues", ..]) => GatedOp::Read,
                _ => GatedOp::Open,
            },
        ),
        (_, ["traces", ..]) => C::Gated(
            Feature::Traces,
            if read { GatedOp::Read } else { GatedOp::Grow },
        ),
        // Membership, migrations, the stats refresh, discovery pops (they name no queue, so
        // they would search every tenant's tags), tenant purges (the control plane's), and
        // anything not named above.
        _ => C::Blocked,
    }
}

fn kv_op(method: &str, rest: &[&str]) -> GatedOp {
    match (method, rest) {
        ("GET" | "HEAD", _) => GatedOp::Read,
        ("DELETE", _) => GatedOp::Open,
        ("POST", ["kv"]) => GatedOp::Mixed,
        _ => GatedOp::Grow,
    }
}

fn streams_op(method: &str, rest: &[&str]) -> GatedOp {
    match (method, rest) {
        ("GET" | "HEAD", _) | ("POST", ["state", "get"]) => GatedOp::Read,
        _ => GatedOp::Mixed,
    }
}

/// Why the proxy refused a request of a known cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 404 `route_blocked`.
    RouteBlocked,
    /// 403 `forbidden`: the key lacks the scope.
    Scope(&'static str),
    /// 403 `cluster_suspended`.
    Suspended,
    /// 403 `push_blocked`.
    PushBlocked,
}

/// Whether a key with `scopes` may make a request of `class`.
///
/// # Errors
/// The refusal: blocked routes for every key, a missing scope otherwise.
pub fn authorize(class: Class, scopes: Scopes) -> Result<(), Refusal> {
    let need = match class {
        Class::Health | Class::Dashboard => return Ok(()),
        Class::Operator | Class::Blocked | Class::Metrics | Class::ControlPlane => {
            return Err(Refusal::RouteBlocked);
        }
        Class::Produce => Scopes::PRODUCE,
        Class::Consume => Scopes::CONSUME,
        Class::QueueAdmin => Scopes::ADMIN,
        Class::Read => Scopes::READ.or(Scopes::ADMIN),
        Class::Gated(_, GatedOp::Read) => Scopes::ALL,
        Class::Gated(..) => Scopes::PRODUCE.or(Scopes::CONSUME),
    };
    if scopes.any(need) {
        Ok(())
    } else {
        Err(Refusal::Scope(match class {
            Class::Produce => "this key has no produce scope",
            Class::Consume => "this key has no consume scope",
            Class::QueueAdmin => "this key has no admin scope",
            Class::Read => "this key has no read or admin scope",
            _ => "this key has neither the produce nor the consume scope",
        }))
    }
}

/// Whether a cluster whose statuses come to `status` lets a request of `class` through.
/// `grows` says, for a mixed batch, whether its body adds data.
///
/// # Errors
/// `Suspended` for the whole data plane of a suspended or deleting cluster or tenant;
/// `PushBlocked` for what adds data while pushes are blocked.
pub fn status_gate(class: Class, status: Effective, grows: bool) -> Result<(), Refusal> {
    match (status, class) {
        (_, Class::Health | Class::Dashboard) | (Effective::Active, _) => Ok(()),
        (Effective::Suspended, _) => Err(Refusal::Suspended),
        (Effective::PushBlocked, Class::Produce | Class::Gated(_, GatedOp::Grow)) => {
            Err(Refusal::PushBlocked)
        }
        (Effective::PushBlocked, Class::Gated(_, GatedOp::Mixed)) if grows => {
            Err(Refusal::PushBlocked)
        }
        (Effective::PushBlocked, _) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: &str, path: &str) -> Class {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        classify(method, &segs)
    }

    #[test]
    fn every_route_family_has_its_class() {
        use Class as C;
        let g = C::Gated;
        let table = [
            ("GET", "/health", C::Health),
            ("GET", "/metrics/prometheus", C::Metrics),
            ("GET", "/metrics", C::Metrics),
            ("GET", "/", C::Dashboard),
            ("GET", "/dashboard/app.js", C::Dashboard),
            ("POST", "/api/cp/tenants", C::ControlPlane),
            ("POST", "/api/v1/push", C::Produce),
            ("POST", "/api/v1/transaction", C::Produce),
            ("GET", "/api/v1/pop/queue/q", C::Consume),
            ("GET", "/api/v1/pop/queue/q/partition/p", C::Consume),
            ("POST", "/api/v1/ack", C::Consume),
            ("POST", "/api/v1/ack/batch", C::Consume),
            ("POST", "/api/v1/lease/l/extend", C::Consume),
            ("POST", "/api/v1/fetch", C::Consume),
            ("POST", "/api/v1/partitions/changed", C::Consume),
            ("POST", "/api/v1/configure", C::QueueAdmin),
            ("DELETE", "/api/v1/resources/queues/q", C::QueueAdmin),
            ("DELETE", "/api/v1/messages/7/t", C::QueueAdmin),
            ("POST", "/api/v1/messages/7/t/retry", C::QueueAdmin),
            ("DELETE", "/api/v1/consumer-groups/g", C::QueueAdmin),
            ("GET", "/api/v1/consumer-groups", C::Read),
            ("GET", "/api/v1/resources/queues", C::Read),
            ("GET", "/api/v1/resources/queues/q", C::Read),
            ("GET", "/api/v1/status/queues", C::Read),
            ("GET", "/api/v1/status/analytics", C::Read),
            ("GET", "/api/v1/analytics/throughput", C::Read),
            ("GET", "/api/v1/dlq", C::Read),
            ("GET", "/api/v1/messages", C::Read),
            ("GET", "/api/v1/status", C::Operator),
            ("GET", "/api/v1/status/buffers", C::Operator),
            ("GET", "/api/v1/analytics/system-metrics", C::Operator),
            ("PUT", "/api/v1/kv/ns/k", g(Feature::Kv, GatedOp::Grow)),
            ("GET", "/api/v1/kv/ns/k", g(Feature::Kv, GatedOp::Read)),
            ("DELETE", "/api/v1/kv/ns/k", g(Feature::Kv, GatedOp::Open)),
            ("POST", "/api/v1/kv", g(Feature::Kv, GatedOp::Mixed)),
            ("POST", "/api/v1/locks", g(Feature::Kv, GatedOp::Open)),
            ("POST", "/api/v1/timers", g(Feature::Timers, GatedOp::Mixed)),
            (
                "DELETE",
                "/api/v1/timers/q/k",
                g(Feature::Timers, GatedOp::Open),
            ),
            ("GET", "/api/v1/timers/q", g(Feature::Timers, GatedOp::Read)),
            (
                "POST",
                "/api/v1/ephemeral/push",
                g(Feature::Ephemeral, GatedOp::Grow),
            ),
            (
                "GET",
                "/api/v1/ephemeral/pop",
                g(Feature::Ephemeral, GatedOp::Open),
            ),
            (
                "GET",
                "/api/v1/ephemeral/queues/q/depth",
                g(Feature::Ephemeral, GatedOp::Read),
            ),
            ("POST", "/api/v1/traces", g(Feature::Traces, GatedOp::Grow)),
            (
                "POST",
                "/streams/v1/cycle",
                g(Feature::Streams, GatedOp::Mixed),
            ),
            (
                "POST",
                "/streams/v1/state/get",
                g(Feature::Streams, GatedOp::Read),
            ),
            ("GET", "/api/v1/system/raft/membership", C::Blocked),
            (
                "POST",
                "/api/v1/system/raft/membership/learners",
                C::Blocked,
            ),
            ("DELETE", "/api/v1/resources/tenant", C::Blocked),
            ("POST", "/api/v1/stats/refresh", C::Blocked),
            ("GET", "/api/v1/pop", C::Blocked),
            ("GET", "/status", C::Blocked),
            ("GET", "/internal/anything", C::Blocked),
            ("POST", "/api/v1/migration", C::Blocked),
            ("POST", "/api/v1/no-such-route", C::Blocked),
            ("POST", "/health", C::Blocked),
            ("GET", "/elsewhere", C::Blocked),
        ];
        for (method, path, want) in table {
            assert_eq!(c(method, path), want, "{method} {path}");
        }
    }

    #[test]
    fn scopes_open_their_classes_only() {
        let produce = Scopes::PRODUCE;
        assert_eq!(authorize(Class::Produce, produce), Ok(()));
        assert!(matches!(
            authorize(Class::Consume, produce),
            Err(Refusal::Scope(_))
        ));
        assert!(matches!(
            authorize(Class::Read, produce),
            Err(Refusal::Scope(_))
        ));
        assert_eq!(authorize(Class::Read, Scopes::ADMIN), Ok(()));
        assert_eq!(
            authorize(Class::Gated(Feature::Kv, GatedOp::Read), Scopes::READ),
            Ok(())
        );
        assert!(authorize(Class::Gated(Feature::Kv, GatedOp::Grow), Scopes::READ).is_err());
        assert_eq!(
            authorize(Class::Blocked, Scopes::ALL),
            Err(Refusal::RouteBlocked)
        );
        assert_eq!(
            authorize(Class::Operator, Scopes::ALL),
            Err(Refusal::RouteBlocked)
        );
    }

    #[test]
    fn statuses_refuse_what_they_should() {
        let push = Class::Produce;
        let pop = Class::Consume;
        let grow = Class::Gated(Feature::Kv, GatedOp::Grow);
        let mixed = Class::Gated(Feature::Kv, GatedOp::Mixed);
        assert_eq!(
            status_gate(push, Effective::PushBlocked, true),
            Err(Refusal::PushBlocked)
        );
        assert_eq!(
            status_gate(grow, Effective::PushBlocked, true),
            Err(Refusal::PushBlocked)
        );
        assert_eq!(
            status_gate(mixed, Effective::PushBlocked, true),
            Err(Refusal::PushBlocked)
        );
        assert_eq!(status_gate(mixed, Effective::PushBlocked, false), Ok(()));
        assert_eq!(status_gate(pop, Effective::PushBlocked, false), Ok(()));
        assert_eq!(
            status_gate(pop, Effective::Suspended, false),
            Err(Refusal::Suspended)
        );
        assert_eq!(
            status_gate(Class::Health, Effective::Suspended, false),
            Ok(())
        );
        assert_eq!(status_gate(push, Effective::Active, true), Ok(()));
    }
}
