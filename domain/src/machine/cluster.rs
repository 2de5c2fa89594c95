//! Cluster-wide values that live in the replicated state: the cluster's log format version and
//! the clock-skew hold on leases after a leader change.
//!
//! Leases are timed by entry stamps, and stamps come from the wall clock of whoever proposed.
//! After a leader change the proposers' clocks may run up to `max_clock_skew` ahead of the
//! clocks that timed the leases already granted, so those leases would end early in real time.
//! Every entry that carries no command (the blank entry a new leader appends to start its term,
//! and membership changes) therefore opens a hold: until every lease that existed then is
//! past its expiry plus the skew, lease liveness is judged against `stamp - skew`. Leases
//! granted inside the window are held a little longer too, which costs only a later
//! redelivery. Everything here is decided by the state alone, so every replica agrees.

use serde::{Deserialize, Serialize};

use crate::keys;
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::{get_rec, last_stamp, put_rec};

/// The clock-skew bound (ms) used until a leader has written the configured one.
pub const DEFAULT_MAX_CLOCK_SKEW_MS: u64 = 500;

/// The hold on lease expiry opened by a leader change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct LeaseHold {
    /// The hold applies to entries stamped below this.
    until: Stamp,
    /// How far (µs) lease liveness is judged behind the entry's stamp while it applies.
    skew_us: u64,
}

fn cluster_version_key() -> Vec<u8> {
    keys::meta("cluster_version")
}

fn skew_key() -> Vec<u8> {
    keys::meta("max_clock_skew_ms")
}

fn hold_key() -> Vec<u8> {
    keys::meta("lease_hold")
}

fn max_expiry_key() -> Vec<u8> {
    keys::meta("lease_max_expiry")
}

/// The cluster's log format version (0 until a leader first raised it).
///
/// # Errors
/// Store failures.
pub fn cluster_version(s: &dyn StateRead) -> Result<u32, StoreError> {
    Ok(get_rec::<u32>(s, &cluster_version_key())?.unwrap_or(0))
}

/// The clock-skew bound a leader last wrote, if any.
///
/// # Errors
/// Store failures.
pub fn max_clock_skew_ms(s: &dyn StateRead) -> Result<Option<u64>, StoreError> {
    get_rec::<u64>(s, &skew_key())
}

/// Apply the leader's cluster settings: the version only rises, the skew bound is replaced.
/// Answers the version in force afterwards.
pub(crate) fn apply_settings(
    txn: &mut Txn<'_>,
    version: u32,
    max_clock_skew_ms: u64,
) -> Result<u32, StoreError> {
    let current = cluster_version(txn)?;
    if version > current {
        put_rec(txn, cluster_version_key(), &version);
    }
    put_rec(txn, skew_key(), &max_clock_skew_ms);
    Ok(current.max(version))
}

/// An entry without a command was applied (a new leader's blank entry, or a membership
/// change): hold every lease granted so far `skew` past its expiry.
///
/// # Errors
/// Store failures.
pub fn leader_changed(txn: &mut Txn<'_>) -> Result<(), StoreError> {
    let skew_us = max_clock_skew_ms(txn)?
        .unwrap_or(DEFAULT_MAX_CLOCK_SKEW_MS)
        .saturating_mul(1000);
    if skew_us == 0 {
        txn.delete(hold_key());
        return Ok(());
    }
    let newest = get_rec::<Stamp>(txn, &max_expiry_key())?
        .unwrap_or_default()
        .max(last_stamp(txn)?);
    let until = Stamp(newest.0.saturating_add(skew_us));
    // A hold still running from an earlier change keeps its own reach.
    let until = match get_rec::<LeaseHold>(txn, &hold_key())? {
        Some(h) if h.until > until && h.skew_us >= skew_us => h.until,
        _ => until,
    };
    put_rec(txn, hold_key(), &LeaseHold { until, skew_us });
    Ok(())
}

/// The stamp lease liveness is judged against for an entry stamped `stamp`: `stamp - skew`
/// while a hold runs, else `stamp`.
///
/// # Errors
/// Store failures.
pub(crate) fn lease_now(s: &dyn StateRead, stamp: Stamp) -> Result<Stamp, StoreError> {
    Ok(match get_rec::<LeaseHold>(s, &hold_key())? {
        Some(h) if stamp < h.until => Stamp(stamp.0.saturating_sub(h.skew_us)),
        _ => stamp,
    })
}

/// Remember the latest lease expiry ever granted, so a leader change knows how long to hold.
pub(crate) fn note_lease_expiry(txn: &mut Txn<'_>, expires: Stamp) -> Result<(), StoreError> {
    let key = max_expiry_key();
    if get_rec::<Stamp>(txn, &key)?.is_none_or(|m| m < expires) {
        put_rec(txn, key, &expires);
    }
    Ok(())
}
