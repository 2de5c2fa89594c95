//! The raft timing settings: heartbeat and election timeouts, validated together.

use queen_raft::{DEFAULT_ELECTION_MAX_MS, DEFAULT_ELECTION_MIN_MS, DEFAULT_HEARTBEAT_MS};

use super::{ConfigError, RawConfig, bad, number};

/// `(heartbeat_ms, election_min_ms, election_max_ms)` from `QUEEN_RAFT_HEARTBEAT_MS`,
/// `QUEEN_RAFT_ELECTION_MIN_MS` and `QUEEN_RAFT_ELECTION_MAX_MS`.
///
/// # Errors
/// A value that is not a number or is out of its range, named.
pub(super) fn validate(raw: &RawConfig) -> Result<(u64, u64, u64), ConfigError> {
    let heartbeat_ms: u64 = number(
        &raw.heartbeat_ms,
        "QUEEN_RAFT_HEARTBEAT_MS",
        DEFAULT_HEARTBEAT_MS,
        "a duration in ms",
    )?;
    if !(10..=5_000).contains(&heartbeat_ms) {
        return Err(bad(
            "QUEEN_RAFT_HEARTBEAT_MS",
            format!("{heartbeat_ms} is outside 10..=5000"),
        ));
    }
    let election_min_ms: u64 = number(
        &raw.election_min_ms,
        "QUEEN_RAFT_ELECTION_MIN_MS",
        DEFAULT_ELECTION_MIN_MS,
        "a duration in ms",
    )?;
    let election_max_ms: u64 = number(
        &raw.election_max_ms,
        "QUEEN_RAFT_ELECTION_MAX_MS",
        DEFAULT_ELECTION_MAX_MS.max(election_min_ms + 1),
        "a duration in ms",
    )?;
    if election_min_ms < heartbeat_ms * 3 || election_min_ms > 60_000 {
        return Err(bad(
            "QUEEN_RAFT_ELECTION_MIN_MS",
            format!(
                "{election_min_ms} must be at least three heartbeats (QUEEN_RAFT_HEARTBEAT_MS={heartbeat_ms}) and at most 60000"
            ),
        ));
    }
    if election_max_ms <= election_min_ms || election_max_ms > 120_000 {
        return Err(bad(
            "QUEEN_RAFT_ELECTION_MAX_MS",
            format!(
                "{election_max_ms} must be above QUEEN_RAFT_ELECTION_MIN_MS ({election_min_ms}) and at most 120000"
            ),
        ));
    }
    Ok((heartbeat_ms, election_min_ms, election_max_ms))
}
