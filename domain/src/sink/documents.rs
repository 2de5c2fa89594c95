//! The sink's small documents in the replicated KV store, namespace `queen-s3`: per sink and
//! queue a lease row (who writes the queue), an intent (the window being committed, its end
//! fixed before anything is uploaded) and a commit pointer (the last committed window); per sink
//! and node a presence row (how many nodes run the sink). The queue is percent-encoded as in the
//! object keys, so `:` inside a queue name cannot be confused with the separators.

use serde::{Deserialize, Serialize};

use super::commit::{Intent, Pointer};
use super::keys::encode;
use crate::store::{StateRead, StoreError};
use crate::time::Stamp;

pub use crate::kv::SINK_NS as NS;
/// How far below the commit pointer's tEnd the retention hold lets retention delete.
pub const HOLD_MARGIN_SECONDS: u64 = 60;

/// The lease row of a queue: `s3:<sink>:<queue>:lease`.
#[must_use]
pub fn lease_key(sink: &str, queue: &str) -> String {
    format!("s3:{}:{}:lease", encode(sink), encode(queue))
}

/// The intent row of a queue: `s3:<sink>:<queue>:intent`.
#[must_use]
pub fn intent_key(sink: &str, queue: &str) -> String {
    format!("s3:{}:{}:intent", encode(sink), encode(queue))
}

/// The commit pointer row of a queue: `s3:<sink>:<queue>:pointer`.
#[must_use]
pub fn pointer_key(sink: &str, queue: &str) -> String {
    format!("s3:{}:{}:pointer", encode(sink), encode(queue))
}

/// The prefix of a sink's presence rows.
#[must_use]
pub fn presence_prefix(sink: &str) -> String {
    format!("s3:{}:presence:", encode(sink))
}

/// A node's presence row: `s3:<sink>:presence:<instance>`.
#[must_use]
pub fn presence_key(sink: &str, instance: &str) -> String {
    format!("{}{}", presence_prefix(sink), encode(instance))
}

/// The value of a lease row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseDoc {
    /// The instance that holds the queue.
    pub holder: String,
    /// When it took it (ISO 8601, the node's clock; informational).
    pub since: String,
}

/// The value of a presence row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PresenceDoc {
    /// The instance.
    pub instance: String,
    /// How many queues it holds.
    pub held: u64,
}

/// Whether a node present other than `me` holds fewer queues than its fair share of `queues`
/// (the queues over the nodes present, rounded up). A node already at its share leaves a free
/// queue to such a node for a while; when there is none, somebody has to go over its share
/// and waiting would only leave the queue unwritten.
#[must_use]
pub fn someone_under_share(present: &[PresenceDoc], me: &str, queues: u64) -> bool {
    let share = queues.div_ceil((present.len() as u64).max(1));
    present.iter().any(|p| p.instance != me && p.held < share)
}

/// How many other nodes present claim a free queue before `me`: those holding fewer queues,
/// and among those holding as many, those whose instance name sorts first. A node waits its
/// rank times a short stagger before it claims, so the least loaded node claims first and every
/// claim costs a fraction of a second however many queues the node already holds. `held` is
/// this node's own count, fresher than its presence row.
#[must_use]
pub fn claim_rank(present: &[PresenceDoc], me: &str, held: u64) -> u64 {
    present
        .iter()
        .filter(|p| p.instance != me)
        .filter(|p| p.held < held || (p.held == held && p.instance.as_str() < me))
        .count() as u64
}

/// When to look at a held lease row again, in microseconds from `now`: at the regular cadence,
/// or just after the row expires when that comes first. A live holder rewrites its row every
/// third of the lease TTL, so its row always expires later than the next regular look; a dead
/// holder's row expires, and the next look lands `slack` after that instead of up to a whole
/// cadence later.
#[must_use]
pub fn next_look_micros(expires: Option<Stamp>, now: Stamp, cadence: u64, slack: u64) -> u64 {
    expires.map_or(cadence, |e| {
        e.0.saturating_sub(now.0).saturating_add(slack).min(cadence)
    })
}

/// Whether a queue's lease row is live in the applied state (no live row: the queue looks
/// free). A hint for waking a node that waits to claim: the claim itself goes through the log.
///
/// # Errors
/// Store failures.
pub fn lease_live(
    s: &dyn StateRead,
    sink: &str,
    queue: &str,
    now: Stamp,
) -> Result<bool, StoreError> {
    Ok(crate::machine::kv::live_row(s, NS, &lease_key(sink, queue), now)?.is_some())
}

/// The live commit pointer of a queue, read from the applied state.
///
/// # Errors
/// Store failures (a row that does not parse reads as absent).
pub fn pointer(
    s: &dyn StateRead,
    sink: &str,
    queue: &str,
    now: Stamp,
) -> Result<Option<Pointer>, StoreError> {
    Ok(
        crate::machine::kv::live_row(s, NS, &pointer_key(sink, queue), now)?
            .and_then(|r| serde_json::from_slice::<Pointer>(&r.value).ok()),
    )
}

/// The live intent of a queue, read from the applied state.
///
/// # Errors
/// Store failures (a row that does not parse reads as absent).
pub fn intent(
    s: &dyn StateRead,
    sink: &str,
    queue: &str,
    now: Stamp,
) -> Result<Option<Intent>, StoreError> {
    Ok(
        crate::machine::kv::live_row(s, NS, &intent_key(sink, queue), now)?
            .and_then(|r| serde_json::from_slice::<Intent>(&r.value).ok()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(instance: &str, held: u64) -> PresenceDoc {
        PresenceDoc {
            instance: instance.into(),
            held,
        }
    }

    #[test]
    fn the_least_loaded_node_claims_first_and_ties_go_by_name() {
        let present = [doc("node-1", 3), doc("node-2", 3), doc("node-3", 9)];
        assert_eq!(claim_rank(&present, "node-1", 3), 0);
        assert_eq!(claim_rank(&present, "node-2", 3), 1);
        // A node's own count is fresher than its row: after a claim it falls behind the other.
        assert_eq!(claim_rank(&present, "node-1", 4), 1);
        assert_eq!(claim_rank(&present, "node-2", 3), 1);
        assert_eq!(claim_rank(&present, "node-3", 9), 2);
        // Alone, or absent from the rows: nobody goes first.
        assert_eq!(claim_rank(&[], "node-1", 100), 0);
        assert_eq!(claim_rank(&[doc("node-1", 0)], "node-1", 100), 0);
    }

    #[test]
    fn a_dead_holders_row_is_looked_at_just_after_it_expires() {
        let now = Stamp(10_000_000);
        // A live holder's row expires after the next regular look.
        assert_eq!(
            next_look_micros(Some(Stamp(35_000_000)), now, 10_000_000, 250_000),
            10_000_000
        );
        // A dead holder's row expires before it: look just after.
        assert_eq!(
            next_look_micros(Some(Stamp(12_000_000)), now, 10_000_000, 250_000),
            2_250_000
        );
        // Already expired (clocks apart): look after the slack only.
        assert_eq!(
            next_look_micros(Some(Stamp(9_000_000)), now, 10_000_000, 250_000),
            250_000
        );
        assert_eq!(next_look_micros(None, now, 10_000_000, 250_000), 10_000_000);
    }

    #[test]
    fn keys_follow_the_documented_shape_and_encode_the_queue() {
        assert_eq!(lease_key("default", "orders"), "s3:default:orders:lease");
        assert_eq!(intent_key("default", "a:b"), "s3:default:a%3Ab:intent");
        assert_eq!(pointer_key("default", "a b"), "s3:default:a%20b:pointer");
        assert!(presence_key("default", "node-1").starts_with(&presence_prefix("default")));
        assert!(crate::kv::check_ns(NS).is_ok());
    }

    // The KV rows keep the whole encoded queue (at most 3 x 255 bytes), which always fits the
    // store's 1024-byte keys, so these keys never needed shortening and none of them moved.
    #[test]
    fn document_keys_of_the_longest_queue_names_fit_the_kv_store() {
        for queue in [
            "q".repeat(255),
            "漢".repeat(85),
            ".".repeat(255),
            "\u{1F600}".repeat(63),
        ] {
            assert!(crate::names::QueueName::new(queue.clone()).is_ok());
            for key in [
                lease_key("default", &queue),
                intent_key("default", &queue),
                pointer_key("default", &queue),
            ] {
                assert!(key.len() <= 1024 - 200, "{} bytes", key.len());
                assert!(crate::kv::check_key(&key).is_ok());
            }
        }
    }

    fn present(held: &[u64]) -> Vec<PresenceDoc> {
        held.iter()
            .enumerate()
            .map(|(i, h)| PresenceDoc {
                instance: format!("node-{}", i + 1),
                held: *h,
            })
            .collect()
    }

    #[test]
    fn a_node_at_its_share_waits_only_for_nodes_under_theirs() {
        // 8 queues over 3 nodes: share 3.
        assert!(someone_under_share(&present(&[3, 2, 3]), "node-1", 8));
        assert!(
            !someone_under_share(&present(&[3, 3, 2]), "node-3", 8),
            "only this node is under"
        );
        // A node that died still has its row for a while (held 2 here): nobody is under 3,
        // so the live ones take its queues without waiting for a node that will not come.
        assert!(!someone_under_share(&present(&[3, 3, 3]), "node-1", 8));
        // 8 over 2: share 4.
        assert!(someone_under_share(&present(&[4, 3]), "node-1", 8));
        assert!(!someone_under_share(&present(&[4, 4]), "node-1", 8));
        assert!(!someone_under_share(&[], "node-1", 8));
    }
}
