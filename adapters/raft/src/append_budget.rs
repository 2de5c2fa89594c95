//! How much an append carries and how long a raft RPC may take: the entries that fit a byte
//! budget, the budget that shrinks after a failure and grows back, and the deadline of an RPC by
//! its bytes. Its own file because three senders share it: the per-request client
//! (`network.rs`), the append stream (`stream.rs`) and the simulated network (`sim/net.rs`).

use std::time::Duration;

use openraft::network::RPCOption;

use crate::config::MAX_APPEND_BYTES;

/// The least time a raft RPC is given. openraft offers appends and heartbeats a budget of one
/// heartbeat interval (100 ms, 75 ms of it to us): on a link whose packets queue for longer
/// (a congested or distant link), every append and heartbeat timed out, was retried, and timed
/// out again, and no write committed for as long as the link stayed slow (48 s in the fault
/// test's slow link). A late answer is still an answer: the next heartbeat waits for it.
pub(crate) const RPC_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);
/// Bytes per second an append is allowed on top of the floor, so a large catch-up append is not
/// cut off by a deadline meant for a heartbeat.
const APPEND_BYTES_PER_SECOND: u64 = 1 << 20;
/// The smallest byte budget an append is cut to after timeouts (it always carries one entry).
const MIN_APPEND_BUDGET: usize = 16 << 10;

/// The deadline of a raft RPC carrying `bytes` of commands: openraft's budget, at least
/// [`RPC_TIMEOUT_FLOOR`], plus time to move the bytes at [`APPEND_BYTES_PER_SECOND`].
pub(crate) fn rpc_timeout(option: &RPCOption, bytes: usize) -> Duration {
    let transfer =
        Duration::from_millis((bytes as u64).saturating_mul(1000) / APPEND_BYTES_PER_SECOND);
    option.soft_ttl().max(RPC_TIMEOUT_FLOOR) + transfer
}

/// The next byte budget of appends to one target: halved after a failure (down to
/// [`MIN_APPEND_BUDGET`]), so a slow link still moves entries, and doubled after a success (up
/// to [`MAX_APPEND_BYTES`]).
pub(crate) fn next_append_budget(budget: usize, ok: bool) -> usize {
    if ok {
        budget.saturating_mul(2).min(MAX_APPEND_BYTES)
    } else {
        (budget / 2).max(MIN_APPEND_BUDGET)
    }
}

/// How many leading entries fit in `limit` bytes of commands (at least one), and their bytes.
pub(crate) fn entries_within(
    entries: &[crate::type_config::Entry],
    limit: usize,
) -> (usize, usize) {
    let mut total = 0usize;
    for (i, e) in entries.iter().enumerate() {
        let size = match &e.payload {
            openraft::EntryPayload::Normal(c) => c.0.len(),
            _ => 64,
        };
        if total.saturating_add(size) > limit && i > 0 {
            return (i, total);
        }
        total = total.saturating_add(size);
    }
    (entries.len(), total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpcs_get_at_least_the_floor_and_appends_time_for_their_bytes() {
        let heartbeat = RPCOption::new(Duration::from_millis(100));
        assert_eq!(rpc_timeout(&heartbeat, 0), RPC_TIMEOUT_FLOOR);
        assert_eq!(
            rpc_timeout(&heartbeat, 4 << 20),
            RPC_TIMEOUT_FLOOR + Duration::from_secs(4)
        );
        let long = RPCOption::new(Duration::from_secs(8));
        assert_eq!(rpc_timeout(&long, 0), Duration::from_secs(6));
    }

    #[test]
    fn the_append_budget_halves_on_failure_and_doubles_back() {
        let mut b = MAX_APPEND_BYTES;
        for _ in 0..20 {
            b = next_append_budget(b, false);
        }
        assert_eq!(b, MIN_APPEND_BUDGET);
        for _ in 0..20 {
            b = next_append_budget(b, true);
        }
        assert_eq!(b, MAX_APPEND_BYTES);
    }
}
