//! Where this node's pops delivered their messages, so that an ack arriving here finds its
//! offsets without reading the leased messages back (`Command::AckAt`).
//!
//! Bounded by the messages it holds: the oldest claims go first. A claim that is gone (or was
//! never kept, see `DeliveredOffsets::of_claim`) only means the ack reads its lease's messages,
//! as it would without this.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use queen_domain::command::PopOutcome;
use queen_domain::ids::LeaseId;
use queen_domain::machine::DeliveredOffsets;

/// Most messages remembered (about 72 bytes each with a 40-byte transactionId: about 1.2 MB):
/// 160 claims of 100, far more than the leases a node's consumers hold at once.
const MAX_MESSAGES: usize = 16_384;

/// (lease id, partition id) -> where the claim's messages are.
#[derive(Default)]
pub(crate) struct Delivered {
    inner: Mutex<Claims>,
}

#[derive(Default)]
struct Claims {
    by_lease: HashMap<(String, u64), Arc<DeliveredOffsets>>,
    order: VecDeque<(String, u64)>,
    messages: usize,
}

impl Delivered {
    /// Remember the claims of a pop this node answers.
    pub(crate) fn remember(&self, pop: &PopOutcome) {
        if pop.lease_id.is_empty() {
            return;
        }
        let claims: Vec<(u64, DeliveredOffsets)> = pop
            .claims
            .iter()
            .filter_map(|c| DeliveredOffsets::of_claim(c).map(|d| (c.pid, d)))
            .filter(|(_, d)| d.len() <= MAX_MESSAGES)
            .collect();
        if claims.is_empty() {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for (pid, d) in claims {
            let key = (pop.lease_id.clone(), pid);
            g.messages += d.len();
            if let Some(old) = g.by_lease.insert(key.clone(), Arc::new(d)) {
                g.messages -= old.len();
            } else {
                g.order.push_back(key);
            }
        }
        while g.messages > MAX_MESSAGES {
            let Some(key) = g.order.pop_front() else {
                break;
            };
            if let Some(old) = g.by_lease.remove(&key) {
                g.messages -= old.len();
            }
        }
    }

    /// The claim of `lease` on partition `pid`, when this node answered it and still holds it.
    pub(crate) fn claim(&self, lease: &LeaseId, pid: u64) -> Option<Arc<DeliveredOffsets>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.by_lease.get(&(lease.as_str().to_owned(), pid)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use queen_domain::command::{Claim, Delivered as Message};
    use queen_domain::time::Stamp;

    fn pop(lease: &str, pid: u64, offsets: &[u64]) -> PopOutcome {
        PopOutcome {
            lease_id: lease.to_owned(),
            lease_expires: Stamp(1),
            claims: vec![Claim {
                pid,
                partition: "p".to_owned(),
                messages: offsets
                    .iter()
                    .map(|&offset| Message {
                        offset,
                        transaction_id: format!("t{offset}"),
                        id: [0; 16],
                        trace_id: None,
                        payload: Vec::new(),
                        created: Stamp(1),
                        attempt: 1,
                        producer: None,
                    })
                    .collect(),
            }],
            conflation: Default::default(),
        }
    }

    #[test]
    fn claims_are_kept_within_the_bound_and_the_oldest_go_first() {
        let d = Delivered::default();
        let lease = |l: &str| LeaseId::new(l).unwrap();
        d.remember(&pop("a", 1, &[5, 6, 7]));
        assert_eq!(d.claim(&lease("a"), 1).and_then(|c| c.get("t6")), Some(6));
        assert!(d.claim(&lease("a"), 2).is_none());
        assert!(d.claim(&lease("b"), 1).is_none());
        // A claim that stepped over an offset is not kept.
        d.remember(&pop("c", 1, &[1, 3]));
        assert!(d.claim(&lease("c"), 1).is_none());
        // Filling past the bound drops the oldest claim.
        let many: Vec<u64> = (0..MAX_MESSAGES as u64 - 2).collect();
        d.remember(&pop("big", 1, &many));
        assert!(d.claim(&lease("a"), 1).is_none());
        assert!(d.claim(&lease("big"), 1).is_some());
        let g = d.inner.lock().unwrap();
        assert!(g.messages <= MAX_MESSAGES);
        assert_eq!(g.order.len(), g.by_lease.len());
    }
}
