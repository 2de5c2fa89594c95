//! Advice to the page cache about the log's segments: drop the pages of segments written long
//! ago, and read ahead of a consumer that reads such a segment again.
//!
//! Why drop any: every page the log appends is a fresh page of the page cache, and the kernel
//! takes fresh pages from free memory while it has any, so the cache grows with everything
//! written. On a virtual machine whose balloon reports free memory back to the host (this
//! project's machine), a page that was free for a few seconds costs a fault in the host when it
//! is taken again: writing 4 GB into the page cache took 9.9 s of system time that way, and
//! 1.05 s when the pages 256 MiB behind the writer were dropped as it went, so that the kernel
//! handed the same pages out again at once (`bench/probes/fresh_pages.py`). Older entries are
//! read again only by consumers far behind; for them the reader asks the kernel to read whole
//! windows ahead (`ReadAhead`), so that a pop does not wait for the disk record by record.

use std::collections::VecDeque;
use std::fs::File;

/// Segments behind the active one whose pages are left in the page cache when the log rolls;
/// the one before them is dropped from it. With 64 MiB segments, 256 MiB of the newest entries
/// (what followers catch up from and what consumers near the head read) stay cached.
pub(super) const CACHED_SEGMENTS: u64 = 4;

/// Bytes of a segment read ahead at once for a consumer reading a dropped segment.
const WINDOW: u64 = 4 << 20;

/// Windows remembered as read ahead (a few consumers, each a window or two ahead).
const REMEMBERED: usize = 64;

/// The windows of dropped segments already asked for, newest first.
#[derive(Default)]
pub(super) struct ReadAhead {
    asked: VecDeque<(u64, u64)>,
}

/// What to tell the kernel before a read of a dropped segment (`ReadAhead::plan`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// Byte ranges (position, length) to read ahead.
    pub(super) read: Vec<(u64, u64)>,
    /// A byte range the reader has left behind, to drop again.
    pub(super) drop: Option<(u64, u64)>,
}

impl ReadAhead {
    /// Before a read at `pos` of segment `seq` (active segment `active`): the windows to ask
    /// the kernel for, the one holding `pos` and the next, unless asked for already; and once
    /// a reader moves into a new window, the window two behind it, which it has read, so that
    /// what consumers read of old segments does not pile up in the cache either. Nothing for a
    /// segment still kept in the cache.
    pub(super) fn plan(&mut self, seq: u64, active: u64, pos: u64) -> Plan {
        let mut plan = Plan::default();
        if seq + CACHED_SEGMENTS >= active {
            return plan;
        }
        let first = pos / WINDOW;
        for w in [first, first + 1] {
            if !self.asked.contains(&(seq, w)) {
                self.asked.push_front((seq, w));
                plan.read.push((w * WINDOW, WINDOW));
            }
        }
        if plan.read.len() == 1 && first >= 2 {
            plan.drop = Some(((first - 2) * WINDOW, WINDOW));
            // Dropped again: a reader further behind asks for it afresh.
            self.asked.retain(|&a| a != (seq, first - 2));
        }
        self.asked.truncate(REMEMBERED);
        plan
    }
}

/// Ask the kernel to drop the cached pages of `len` bytes of `file` from `pos` (`len` 0: to
/// the end), a segment already synced, so its pages are clean. Advisory; a failure only leaves
/// them cached.
pub(super) fn drop_cached(file: &File, pos: u64, len: u64) {
    advise(file, pos, len, Advice::DontNeed);
}

/// Ask the kernel to start reading `len` bytes of `file` from `pos` into the cache; it returns
/// without waiting for the disk. Advisory.
pub(super) fn will_need(file: &File, pos: u64, len: u64) {
    advise(file, pos, len, Advice::WillNeed);
}

enum Advice {
    DontNeed,
    WillNeed,
}

#[cfg(target_os = "linux")]
fn advise(file: &File, pos: u64, len: u64, advice: Advice) {
    use std::os::fd::AsRawFd;
    let (Ok(pos), Ok(len)) = (i64::try_from(pos), i64::try_from(len)) else {
        return;
    };
    let advice = match advice {
        Advice::DontNeed => libc::POSIX_FADV_DONTNEED,
        Advice::WillNeed => libc::POSIX_FADV_WILLNEED,
    };
    // SAFETY: posix_fadvise takes a descriptor and numbers and touches no memory of this
    // process; `file` keeps the descriptor open for the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), pos, len, advice) };
    if rc != 0 {
        tracing::debug!(rc, "page cache advice for a raft log segment not taken");
    }
}

#[cfg(not(target_os = "linux"))]
fn advise(_file: &File, _pos: u64, _len: u64, _advice: Advice) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ahead_once_per_window_and_only_in_dropped_segments() {
        let mut ra = ReadAhead::default();
        // A segment still cached: nothing.
        assert_eq!(ra.plan(7, 10, 0), Plan::default());
        // A dropped one: this window and the next, then nothing until the next window.
        assert_eq!(
            ra.plan(2, 10, 100).read,
            vec![(0, WINDOW), (WINDOW, WINDOW)]
        );
        assert_eq!(ra.plan(2, 10, 200), Plan::default());
        let next = ra.plan(2, 10, WINDOW + 5);
        assert_eq!(next.read, vec![(2 * WINDOW, WINDOW)]);
        assert_eq!(next.drop, None);
        // Moving into window 2 drops window 0, which the reader has left.
        let later = ra.plan(2, 10, 2 * WINDOW);
        assert_eq!(later.read, vec![(3 * WINDOW, WINDOW)]);
        assert_eq!(later.drop, Some((0, WINDOW)));
        // A reader still in window 0 (behind the one that moved on) asks for it again.
        assert_eq!(ra.plan(2, 10, 7).read, vec![(0, WINDOW)]);
        // Another segment's windows are its own.
        assert_eq!(ra.plan(3, 10, 0).read.len(), 2);
    }
}
