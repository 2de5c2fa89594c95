//! The level each route needs when broker JWT is on (`docs/security.md` has the table).

use hyper::Method;
use queen_domain::access::Need;

/// The level a request needs, from its method and decoded path segments. A route not named
/// here needs `Consume` (read-write): a route added later is closed to readers and producers
/// until it is placed.
#[must_use]
pub(crate) fn need(method: &Method, segs: &[&str]) -> Need {
    match (method.as_str(), segs) {
        // Produce: what a write-only publisher may do.
        (
            "POST",
            ["api", "v1", "push"] | ["api", "v1", "timers"] | ["api", "v1", "ephemeral", "push"],
        ) => Need::Write,
        // Administration: membership (reads included: it names every node's addresses) and
        // deletions of whole queues and consumer groups.
        (_, ["api", "v1", "system", ..])
        | (
            "DELETE",
            ["api", "v1", "resources", ..]
            | ["api", "v1", "consumer-groups", ..]
            | ["api", "v1", "messages", ..],
        )
        | ("POST", ["api", "v1", "messages", _, _, "retry"]) => Need::Admin,
        // Reads of messages without a lease and of changes: readers.
        ("POST", ["api", "v1", "fetch"] | ["api", "v1", "partitions", "changed"]) => Need::Read,
        // Pops take leases: they change what other consumers see.
        ("GET", ["api", "v1", "pop", ..] | ["api", "v1", "ephemeral", "pop"]) => Need::Consume,
        // Every other read.
        ("GET" | "HEAD", _) => Need::Read,
        _ => Need::Consume,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(method: &str, path: &str) -> Need {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        need(
            &Method::from_bytes(method.as_bytes()).expect("method"),
            &segs,
        )
    }

    #[test]
    fn every_route_family_has_its_level() {
        let table = [
            ("POST", "/api/v1/push", Need::Write),
            ("POST", "/api/v1/timers", Need::Write),
            ("POST", "/api/v1/ephemeral/push", Need::Write),
            ("GET", "/api/v1/ephemeral/pop", Need::Consume),
            ("POST", "/api/v1/ephemeral/ack", Need::Consume),
            ("POST", "/api/v1/ephemeral/configure", Need::Consume),
            ("DELETE", "/api/v1/ephemeral/queue/q", Need::Consume),
            ("GET", "/api/v1/ephemeral/queues/q/depth", Need::Read),
            ("GET", "/api/v1/pop/queue/q", Need::Consume),
            ("GET", "/api/v1/pop/queue/q/partition/p", Need::Consume),
            ("GET", "/api/v1/pop", Need::Consume),
            ("POST", "/api/v1/ack", Need::Consume),
            ("POST", "/api/v1/ack/batch", Need::Consume),
            ("POST", "/api/v1/lease/l/extend", Need::Consume),
            ("POST", "/api/v1/transaction", Need::Consume),
            ("POST", "/api/v1/kv", Need::Consume),
            ("PUT", "/api/v1/kv/ns/k", Need::Consume),
            ("DELETE", "/api/v1/kv/ns/k", Need::Consume),
            ("GET", "/api/v1/kv/ns/k", Need::Read),
            ("POST", "/api/v1/locks", Need::Consume),
            ("POST", "/api/v1/configure", Need::Consume),
            ("DELETE", "/api/v1/timers/q/k", Need::Consume),
            ("GET", "/api/v1/timers/q", Need::Read),
            ("POST", "/api/v1/fetch", Need::Read),
            ("POST", "/api/v1/partitions/changed", Need::Read),
            ("GET", "/api/v1/dlq", Need::Read),
            ("POST", "/api/v1/traces", Need::Consume),
            ("GET", "/api/v1/traces/names", Need::Read),
            ("GET", "/api/v1/traces/7/t", Need::Read),
            ("GET", "/api/v1/status", Need::Read),
            ("GET", "/api/v1/resources/queues", Need::Read),
            ("GET", "/api/v1/consumer-groups", Need::Read),
            ("GET", "/status", Need::Read),
            ("GET", "/metrics", Need::Read),
            ("DELETE", "/api/v1/resources/queues/q", Need::Admin),
            ("DELETE", "/api/v1/consumer-groups/g", Need::Admin),
            ("DELETE", "/api/v1/messages/7/t", Need::Admin),
            ("POST", "/api/v1/messages/7/t/retry", Need::Admin),
            ("GET", "/api/v1/messages/7/t", Need::Read),
            ("GET", "/api/v1/system/raft/membership", Need::Admin),
            (
                "POST",
                "/api/v1/system/raft/membership/learners",
                Need::Admin,
            ),
            ("POST", "/api/v1/stats/refresh", Need::Consume),
            ("POST", "/api/v1/no-such-route", Need::Consume),
        ];
        for (method, path, want) in table {
            assert_eq!(n(method, path), want, "{method} {path}");
        }
    }
}
