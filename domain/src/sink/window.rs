//! Window bounds on the broker's clock. Window k holds the records with `ts` in
//! `[end of k-1, end of k)`; its end is never later than `safeTime - guard`, so once a window
//! closes no record can join it, and the same records always make the same window.

use crate::time::Stamp;

use super::keys::Align;

const HOUR_US: u64 = 3_600_000_000;
const DAY_US: u64 = 24 * HOUR_US;

/// The settings that cut windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRules {
    /// Close at this many bytes of uncompressed records (`QUEEN_S3_TARGET_MB`).
    pub target_bytes: u64,
    /// Close at this age on the broker clock (`QUEEN_S3_MAX_WINDOW_MS`, in µs).
    pub max_age_us: u64,
    /// Never cross this boundary (`QUEEN_S3_ALIGN`).
    pub align: Align,
    /// Stay this far below safeTime (`QUEEN_S3_SAFE_GUARD_MS`, in µs).
    pub guard_us: u64,
}

/// Why a window closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// It holds the target size.
    Size,
    /// It reached its maximum age.
    Age,
    /// It reached the alignment boundary.
    Boundary,
    /// The node's buffers passed their budget and this queue holds the most.
    Memory,
}

/// The start of the alignment period `t` falls in (the first window starts there).
#[must_use]
pub fn period_start(t: Stamp, align: Align) -> Stamp {
    match align {
        Align::Hour => Stamp(t.0 - t.0 % HOUR_US),
        Align::Day => Stamp(t.0 - t.0 % DAY_US),
        Align::None => t,
    }
}

/// The next alignment boundary after `start`, if any.
#[must_use]
pub fn boundary_after(start: Stamp, align: Align) -> Option<Stamp> {
    match align {
        Align::Hour => Some(Stamp(period_start(start, align).0 + HOUR_US)),
        Align::Day => Some(Stamp(period_start(start, align).0 + DAY_US)),
        Align::None => None,
    }
}

/// The latest end a window may have now.
#[must_use]
pub fn end_limit(safe_time: Stamp, rules: &WindowRules) -> Stamp {
    Stamp(safe_time.0.saturating_sub(rules.guard_us))
}

/// Decide whether the open window `[start, ..)` closes now, and at which end.
///
/// `last_ts` is the stamp of the newest record buffered, `bytes` what is buffered, `memory`
/// whether the memory budget asks this queue to close. A size or memory close ends right after
/// the newest record (records of one push share a stamp and stay together); an age close ends at
/// `start + max_age`; a boundary close at the boundary. No end passes the alignment boundary or
/// `safeTime - guard`; an age or boundary close waits until `safeTime - guard` reaches it.
#[must_use]
pub fn decide(
    start: Stamp,
    last_ts: Option<Stamp>,
    bytes: u64,
    memory: bool,
    safe_time: Stamp,
    rules: &WindowRules,
) -> Option<(Stamp, CloseReason)> {
    let last = last_ts?;
    let limit = end_limit(safe_time, rules);
    let boundary = boundary_after(start, rules.align).unwrap_or(Stamp(u64::MAX));
    let age_end = Stamp(start.0.saturating_add(rules.max_age_us));
    let cap = limit.min(boundary);
    let (end, reason) = if bytes >= rules.target_bytes {
        (Stamp(last.0.saturating_add(1)).min(cap), CloseReason::Size)
    } else if memory {
        (
            Stamp(last.0.saturating_add(1)).min(cap),
            CloseReason::Memory,
        )
    } else if boundary <= age_end {
        if limit < boundary {
            return None;
        }
        (boundary, CloseReason::Boundary)
    } else {
        if limit < age_end {
            return None;
        }
        // Old enough: the window takes everything the guard allows, so one that opened at its
        // hour's start with a record long after still closes soon after that record.
        (cap, CloseReason::Age)
    };
    (end > start).then_some((end, reason))
}

/// Where the window after one ending at `end` starts: at `end`, or — when the next record comes
/// later than the next boundary — at the boundary period that record falls in, so a stretch with
/// no records makes no object.
#[must_use]
pub fn next_start(end: Stamp, next_record: Stamp, align: Align) -> Stamp {
    let p = period_start(next_record, align);
    if align != Align::None && p > end {
        p
    } else if align == Align::None && next_record > end {
        next_record
    } else {
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000;

    fn rules() -> WindowRules {
        WindowRules {
            target_bytes: 1000,
            max_age_us: 10 * S,
            align: Align::Hour,
            guard_us: 5 * S,
        }
    }

    #[test]
    fn the_first_window_starts_at_its_hour() {
        let t = Stamp(1_791_009_457_501_942);
        assert_eq!(period_start(t, Align::Hour), Stamp(1_791_007_200_000_000));
    }

    #[test]
    fn closes_by_age_size_and_boundary_never_past_the_guard() {
        let start = Stamp(1_791_007_200_000_000);
        let r = rules();
        // Young and small: stays open.
        assert_eq!(
            decide(
                start,
                Some(Stamp(start.0 + S)),
                10,
                false,
                Stamp(start.0 + 9 * S),
                &r
            ),
            None
        );
        // Old enough, but safeTime - guard has not passed the age yet.
        assert_eq!(
            decide(
                start,
                Some(Stamp(start.0 + S)),
                10,
                false,
                Stamp(start.0 + 12 * S),
                &r
            ),
            None
        );
        assert_eq!(
            decide(
                start,
                Some(Stamp(start.0 + S)),
                10,
                false,
                Stamp(start.0 + 15 * S),
                &r
            ),
            Some((Stamp(start.0 + 10 * S), CloseReason::Age))
        );
        // Size closes right after the newest record.
        assert_eq!(
            decide(
                start,
                Some(Stamp(start.0 + S)),
                1000,
                false,
                Stamp(start.0 + 7 * S),
                &r
            ),
            Some((Stamp(start.0 + S + 1), CloseReason::Size))
        );
        // A window near the end of the hour closes at the boundary.
        let late = Stamp(start.0 + HOUR_US - 3 * S);
        assert_eq!(
            decide(
                late,
                Some(late),
                10,
                false,
                Stamp(start.0 + HOUR_US + 6 * S),
                &r
            ),
            Some((Stamp(start.0 + HOUR_US), CloseReason::Boundary))
        );
        // No records: nothing to close.
        assert_eq!(
            decide(start, None, 0, false, Stamp(start.0 + HOUR_US), &r),
            None
        );
    }

    #[test]
    fn a_quiet_stretch_makes_no_object() {
        let end = Stamp(10 * HOUR_US + 10 * S);
        assert_eq!(
            next_start(end, Stamp(13 * HOUR_US + 5), Align::Hour),
            Stamp(13 * HOUR_US)
        );
        assert_eq!(next_start(end, Stamp(end.0 + 1), Align::Hour), end);
    }

    proptest! {
        // Cutting a stream of stamped records with these rules never lets a record fall in two
        // windows or none, never crosses a boundary, never ends past safeTime - guard, and gives
        // the same windows when replayed (determinism).
        #[test]
        fn windows_partition_the_records(gaps in proptest::collection::vec(0u64..3_000_000_000, 1..60), sizes in proptest::collection::vec(1u64..400, 60), step in 1_000_000u64..600_000_000) {
            let r = rules();
            let mut ts = Vec::new();
            let mut t = 1_791_007_000_000_000u64;
            for g in &gaps { t += g; ts.push(Stamp(t)); }
            let run = || {
                let mut windows: Vec<(Stamp, Stamp)> = Vec::new();
                let mut start = period_start(ts[0], r.align);
                let (mut i, mut safe) = (0usize, ts[0]);
                let mut buffered: Vec<usize> = Vec::new();
                let mut guard_rounds = 0;
                while (i < ts.len() || !buffered.is_empty()) && guard_rounds < 1_000_000 {
                    guard_rounds += 1;
                    safe = Stamp(safe.0 + step);
                    if buffered.is_empty() && i < ts.len() && safe < ts[i] {
                        // Idle: time moves on to the next record.
                        safe = ts[i];
                    }
                    while i < ts.len() && ts[i] <= safe { buffered.push(i); i += 1; }
                    let bytes: u64 = buffered.iter().map(|j| sizes[*j % sizes.len()]).sum();
                    let last = buffered.last().map(|j| ts[*j]);
                    if let Some((end, _)) = decide(start, last, bytes, false, safe, &r) {
                        let (inside, rest): (Vec<usize>, Vec<usize>) = buffered.iter().partition(|j| ts[**j] < end);
                        prop_assert!(end.0 <= safe.0 - r.guard_us);
                        if !inside.is_empty() { windows.push((start, end)); }
                        buffered = rest;
                        start = match buffered.first().or(if i < ts.len() { Some(&i) } else { None }) {
                            Some(j) => next_start(end, ts[*j], r.align),
                            None => end,
                        };
                    }
                }
                Ok(windows)
            };
            let a = run()?;
            let b = run()?;
            prop_assert_eq!(&a, &b);
            for w in a.windows(2) { prop_assert!(w[0].1 <= w[1].0); }
            for (s, e) in &a {
                prop_assert!(s < e);
                if let Some(bd) = boundary_after(*s, r.align) { prop_assert!(*e <= bd, "crossed a boundary"); }
            }
            for t in &ts {
                let n = a.iter().filter(|(s, e)| s <= t && t < e).count();
                prop_assert_eq!(n, 1, "record at {:?} in {} windows", t, n);
            }
        }
    }
}
