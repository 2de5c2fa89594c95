//! The disk gate: whether a proposal may add to the data directory's file system.
//!
//! A sample of the file system (`statvfs`, taken every [`SAMPLE_EVERY`] by the node) is stale
//! the moment a write is admitted, and a write lands several times: in the raft log, in the
//! state store's journal, and again as a table when the store's memtable is flushed. So the gate
//! does not compare the last sample with the threshold: it projects what the disk will hold once
//! everything already admitted, and this command, is written out:
//!
//! ```text
//! projected = used (last sample)
//!           + memtable bytes (written to the journal already; flushed into a table later)
//!           + (bytes admitted and not yet sampled + this command) x AMPLIFICATION
//! ```
//!
//! and refuses with 507 `disk_full`:
//! - a client command that adds data when `projected` passes `QUEEN_RAFT_DISK_HIGH_PCT` of the
//!   file system, or leaves less than the reserve free;
//! - any other command (pops, acks, lease extensions, the sink's own KV writes) only when it
//!   would leave less than the reserve (`QUEEN_RAFT_DISK_RESERVE_BYTES`) free: the hard floor
//!   below which the state store risks failing a write (which stops the node until a restart);
//! - deletions (of a queue or a consumer group) and ticks (their housekeeping sweeps deleted
//!   queues and applies retention), which free space, only when they would leave less than a
//!   quarter of the reserve free.
//!
//! The arithmetic is [`decide`], a pure function; [`DiskGate`] keeps the shared figures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use queen_domain::command::Command;

/// How often the node samples the file system (one `statvfs`, a few microseconds).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Bytes on disk per byte of an admitted command, not counting the memtable's later flush (which
/// the gate counts from the store's own figure): the raft log entry (1x) and the state store's
/// journal (1x), plus one more for a table being flushed or compacted while the journal and the
/// old tables still exist. Measured with 1 MiB pushes on a 300 MiB tmpfs
/// (`tests/blackbox/disk_gate.rs`): 84 pushes left 2.8 bytes in use per pushed byte.
pub(crate) const AMPLIFICATION: u64 = 3;

/// Default of `QUEEN_RAFT_DISK_RESERVE_BYTES`.
pub(crate) const DEFAULT_RESERVE_BYTES: u64 = 32 << 20;

/// What a command does to the disk, for the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// A client write that adds data (push, transaction, KV, timers, configure, locks): stops at
    /// the gate.
    Adds,
    /// Work that must go on at a closed gate so consumers drain (pop, ack, lease extension,
    /// seek, the sink's own KV writes): stops only at the reserve.
    Drains,
    /// A deletion, or a tick (whose housekeeping sweeps deleted queues and applies retention),
    /// which frees space once applied: may use three quarters of the reserve.
    Frees,
}

impl Admission {
    /// How a command meets the gate; `internal` marks the node's own writes (the S3 sink's
    /// leases, intents, pointers and checkpoints), which drain like acks.
    pub(crate) fn of(command: &Command, internal: bool) -> Admission {
        match command {
            // A tick runs the housekeeping that sweeps deleted queues and applies retention.
            Command::DeleteQueue { .. } | Command::DeleteGroup { .. } | Command::Tick => {
                Admission::Frees
            }
            Command::Push(_)
            | Command::AsProducer { .. }
            | Command::Transaction { .. }
            | Command::Kv(_)
            | Command::Timers(_)
            | Command::Configure { .. }
            | Command::Locks(_)
                if !internal =>
            {
                Admission::Adds
            }
            _ => Admission::Drains,
        }
    }
}

/// The gate's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// `QUEEN_RAFT_DISK_HIGH_PCT`: client writes stop once the projection passes this share.
    pub(crate) high_pct: u8,
    /// `QUEEN_RAFT_DISK_RESERVE_BYTES`: free space no write may take (the hard floor).
    pub(crate) reserve_bytes: u64,
}

/// One reading of the file system and of what is not in it yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Projection {
    /// Size of the file system in bytes (0: unknown; the gate then admits everything).
    pub(crate) total: u64,
    /// Bytes in use at the last sample (size minus what an unprivileged writer may still use).
    pub(crate) used: u64,
    /// Bytes admitted since the last sample (their proposals may still be in flight).
    pub(crate) in_flight: u64,
    /// Bytes in the state store's memtables, to be written again as tables.
    pub(crate) memtable: u64,
}

/// Why a command was refused (the use-case port's typed refusal).
pub(crate) use queen_ports::DiskRefusal as Refusal;

/// The gate's decision (pure): may a command of `command_bytes` (its encoded entry) of kind
/// `admission` be proposed, given the projection and the limits?
///
/// # Errors
/// The refusal, with the figures its message shows.
pub(crate) fn decide(
    p: Projection,
    command_bytes: u64,
    admission: Admission,
    limits: Limits,
) -> Result<(), Refusal> {
    if p.total == 0 {
        // No figures (statvfs failed or not sampled yet): the store's own errors are the guard.
        return Ok(());
    }
    let adds = p
        .in_flight
        .saturating_add(command_bytes)
        .saturating_mul(AMPLIFICATION);
    let projected = p.used.saturating_add(p.memtable).saturating_add(adds);
    let free_after = p.total.saturating_sub(projected);
    let floor = match admission {
        Admission::Adds | Admission::Drains => limits.reserve_bytes,
        Admission::Frees => limits.reserve_bytes / 4,
    };
    if free_after < floor || projected > p.total {
        return Err(Refusal::Reserve {
            free_after,
            limit: floor,
        });
    }
    if admission == Admission::Adds {
        let limit = u128::from(p.total) * u128::from(limits.high_pct);
        if u128::from(projected) * 100 > limit {
            return Err(Refusal::Gate {
                used_pct: pct(p.used, p.total),
                projected_pct: pct(projected, p.total),
                in_flight: p.in_flight,
                high_pct: limits.high_pct,
            });
        }
    }
    Ok(())
}

/// `part` as a percentage of `whole`, rounded up (so 85.2% shows as 86%, past an 85% gate).
fn pct(part: u64, whole: u64) -> u64 {
    let whole = u128::from(whole.max(1));
    u64::try_from((u128::from(part) * 100).div_ceil(whole)).unwrap_or(u64::MAX)
}

/// The shared figures: the last sample and the bytes admitted since.
#[derive(Debug)]
pub(crate) struct DiskGate {
    limits: Limits,
    /// File system size at the last sample (0: none yet).
    total: AtomicU64,
    /// Bytes in use at the last sample.
    used: AtomicU64,
    /// Bytes of admitted proposals not answered yet: not (all) on disk, whatever the sample says.
    open: AtomicU64,
    /// Bytes of proposals answered since the last sample: written (raft log, store journal) but
    /// maybe after the sample read the file system.
    answered: AtomicU64,
}

/// An admitted command: in flight until dropped (its proposal answered or abandoned), then
/// counted until the next sample.
pub(crate) struct Admitted<'a> {
    gate: &'a DiskGate,
    bytes: u64,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.gate.answered.fetch_add(self.bytes, Ordering::Relaxed);
        self.gate.open.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl DiskGate {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            total: AtomicU64::new(0),
            used: AtomicU64::new(0),
            open: AtomicU64::new(0),
            answered: AtomicU64::new(0),
        }
    }

    /// The threshold, in percent of the file system.
    pub(crate) fn high_pct(&self) -> u8 {
        self.limits.high_pct
    }

    /// Record a sample: proposals answered before it are now in `used`.
    pub(crate) fn sample(&self, total: u64, used: u64) {
        self.used.store(used, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.answered.store(0, Ordering::Relaxed);
    }

    /// The last sample: the file system's size and the bytes in use (zeros before the first).
    pub(crate) fn last_sample(&self) -> (u64, u64) {
        (
            self.total.load(Ordering::Relaxed),
            self.used.load(Ordering::Relaxed),
        )
    }

    /// Whether the last sample is within `points` percentage points of the gate (or past it).
    pub(crate) fn near_gate(&self, points: u8) -> bool {
        let total = self.total.load(Ordering::Relaxed);
        let used = self.used.load(Ordering::Relaxed);
        total > 0
            && u128::from(used) * 100
                >= u128::from(total) * u128::from(self.limits.high_pct.saturating_sub(points))
    }

    /// Admit a command of `bytes` or refuse it; `memtable` is the state store's unflushed
    /// bytes. Keep the answer until the proposal is answered.
    pub(crate) fn admit(
        &self,
        bytes: u64,
        admission: Admission,
        memtable: u64,
    ) -> Result<Admitted<'_>, Refusal> {
        let p = Projection {
            total: self.total.load(Ordering::Relaxed),
            used: self.used.load(Ordering::Relaxed),
            in_flight: self
                .open
                .load(Ordering::Relaxed)
                .saturating_add(self.answered.load(Ordering::Relaxed)),
            memtable,
        };
        decide(p, bytes, admission, self.limits)?;
        // Two commands may pass the check together; each still counts for the next one, and
        // the reserve absorbs the race (a few commands' worth, far below it).
        self.open.fetch_add(bytes, Ordering::Relaxed);
        Ok(Admitted { gate: self, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const LIMITS: Limits = Limits {
        high_pct: 85,
        reserve_bytes: 32 * MIB,
    };

    fn disk(total: u64, used: u64) -> Projection {
        Projection {
            total,
            used,
            in_flight: 0,
            memtable: 0,
        }
    }

    #[test]
    fn a_write_that_would_pass_the_threshold_is_refused_before_it_lands() {
        let p = disk(1000 * MIB, 800 * MIB);
        // 800 + 3 x 10 = 830 MiB: under 850.
        assert_eq!(decide(p, 10 * MIB, Admission::Adds, LIMITS), Ok(()));
        // 800 + 3 x 20 = 860 MiB: past 850, though the disk is only at 80%.
        let e = decide(p, 20 * MIB, Admission::Adds, LIMITS).unwrap_err();
        assert_eq!(
            e,
            Refusal::Gate {
                used_pct: 80,
                projected_pct: 86,
                in_flight: 0,
                high_pct: 85
            }
        );
        assert!(
            e.to_string().contains("QUEEN_RAFT_DISK_HIGH_PCT is 85%"),
            "{e}"
        );
    }

    #[test]
    fn bytes_in_flight_and_the_memtable_count_against_the_gate() {
        let p = Projection {
            total: 1000 * MIB,
            used: 700 * MIB,
            in_flight: 40 * MIB,
            memtable: 0,
        };
        // 700 + 3 x (40 + 10) = 850: at the threshold, allowed.
        assert_eq!(decide(p, 10 * MIB, Admission::Adds, LIMITS), Ok(()));
        assert!(decide(p, 11 * MIB, Admission::Adds, LIMITS).is_err());
        let with_memtable = Projection {
            memtable: 32 * MIB,
            ..p
        };
        assert!(matches!(
            decide(with_memtable, 10 * MIB, Admission::Adds, LIMITS),
            Err(Refusal::Gate { .. })
        ));
    }

    #[test]
    fn drains_pass_a_closed_gate_until_the_reserve() {
        let p = disk(1000 * MIB, 950 * MIB);
        assert!(decide(p, 1024, Admission::Adds, LIMITS).is_err());
        assert_eq!(decide(p, 1024, Admission::Drains, LIMITS), Ok(()));
        // 1000 - 32 = 968 MiB is the floor: 967 + a small entry passes, 969 does not.
        assert_eq!(
            decide(disk(1000 * MIB, 967 * MIB), 1024, Admission::Drains, LIMITS),
            Ok(())
        );
        let e = decide(disk(1000 * MIB, 969 * MIB), 1024, Admission::Drains, LIMITS).unwrap_err();
        assert!(
            matches!(e, Refusal::Reserve { limit, .. } if limit == 32 * MIB),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("QUEEN_RAFT_DISK_RESERVE_BYTES"),
            "{e}"
        );
    }

    #[test]
    fn deletions_may_use_three_quarters_of_the_reserve() {
        let p = disk(1000 * MIB, 980 * MIB);
        assert!(decide(p, 1024, Admission::Drains, LIMITS).is_err());
        assert_eq!(decide(p, 1024, Admission::Frees, LIMITS), Ok(()));
        assert!(decide(disk(1000 * MIB, 993 * MIB), 1024, Admission::Frees, LIMITS).is_err());
    }

    #[test]
    fn the_reserve_also_bounds_a_gate_set_at_100_percent() {
        let limits = Limits {
            high_pct: 100,
            reserve_bytes: 32 * MIB,
        };
        assert_eq!(
            decide(disk(1000 * MIB, 960 * MIB), MIB, Admission::Adds, limits),
            Ok(())
        );
        assert!(matches!(
            decide(disk(1000 * MIB, 970 * MIB), MIB, Admission::Adds, limits),
            Err(Refusal::Reserve { .. })
        ));
        // A command larger than the whole disk is refused, not wrapped around.
        assert!(decide(disk(1000 * MIB, 0), u64::MAX, Admission::Drains, limits).is_err());
    }

    #[test]
    fn client_writes_stop_at_the_gate_and_the_sinks_own_kv_writes_drain() {
        assert_eq!(
            Admission::of(&Command::Push(Vec::new()), false),
            Admission::Adds
        );
        assert_eq!(
            Admission::of(&Command::Kv(Vec::new()), false),
            Admission::Adds
        );
        assert_eq!(
            Admission::of(&Command::Kv(Vec::new()), true),
            Admission::Drains
        );
        assert_eq!(Admission::of(&Command::Tick, false), Admission::Frees);
        assert_eq!(
            Admission::of(
                &Command::ExtendLease {
                    lease_id: queen_domain::ids::LeaseId::new("l").unwrap()
                },
                false
            ),
            Admission::Drains
        );
    }

    #[test]
    fn no_sample_admits_everything() {
        assert_eq!(
            decide(disk(0, 0), u64::MAX, Admission::Adds, LIMITS),
            Ok(())
        );
    }

    #[test]
    fn admitted_bytes_count_until_the_next_sample() {
        let gate = DiskGate::new(LIMITS);
        gate.sample(1000 * MIB, 800 * MIB);
        // Each 10 MiB write adds 30 MiB to the projection: 830, then 860 is refused.
        let first = gate
            .admit(10 * MIB, Admission::Adds, 0)
            .expect("830 MiB projected");
        assert!(gate.admit(10 * MIB, Admission::Adds, 0).is_err());
        // Still in flight at a sample: it still counts.
        gate.sample(1000 * MIB, 800 * MIB);
        assert!(gate.admit(10 * MIB, Admission::Adds, 0).is_err());
        // Answered: it counts until the next sample, which has it on disk.
        drop(first);
        assert!(gate.admit(10 * MIB, Admission::Adds, 0).is_err());
        gate.sample(1000 * MIB, 810 * MIB);
        assert!(gate.admit(10 * MIB, Admission::Adds, 0).is_ok());
        assert!(gate.near_gate(10) && !gate.near_gate(0));
    }
}
