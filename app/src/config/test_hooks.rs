//! The test hooks: switches the black-box tests set on a node (`QUEEN_TEST_*`) to cut it off,
//! shrink its snapshots and log files, pretend another log format or crash its sink at a
//! commit point. The binary reads them with every other setting and hands them in here, so
//! nothing below reads the environment; they are inert unless a test sets them.

use std::path::{Path, PathBuf};

/// The fault layer's file in the data directory: node ids to drop raft traffic to.
const FAULTS_FILE: &str = "test-faults";

/// The test hooks as given (unset when the variable is).
#[derive(Debug, Clone, Default)]
pub struct RawTestHooks {
    /// `QUEEN_TEST_FAULTS`
    pub faults: Option<String>,
    /// `QUEEN_TEST_LOG_KINDS`
    pub log_kinds: Option<String>,
    /// `QUEEN_TEST_SNAPSHOT_EVERY`
    pub snapshot_every: Option<String>,
    /// `QUEEN_TEST_LOG_SEGMENT_BYTES`
    pub log_segment_bytes: Option<String>,
    /// `QUEEN_TEST_S3_CRASH_AT`
    pub s3_crash_at: Option<String>,
}

impl RawTestHooks {
    /// The hooks from `get` (the binary's reader of the environment).
    pub fn read(get: &dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            faults: get("QUEEN_TEST_FAULTS"),
            log_kinds: get("QUEEN_TEST_LOG_KINDS"),
            snapshot_every: get("QUEEN_TEST_SNAPSHOT_EVERY"),
            log_segment_bytes: get("QUEEN_TEST_LOG_SEGMENT_BYTES"),
            s3_crash_at: get("QUEEN_TEST_S3_CRASH_AT"),
        }
    }

    /// The typed hooks. A value that does not parse is ignored (the hook stays off), never
    /// refused: a test switch cannot stop a boot.
    #[must_use]
    pub fn resolve(&self) -> TestHooks {
        let crash_at = self.s3_crash_at.as_deref().and_then(S3CrashPoint::parse);
        // Everything but the sink's crash point stays off unless `QUEEN_TEST_FAULTS=1`.
        if self.faults.as_deref().map(str::trim) != Some("1") {
            return TestHooks {
                s3_crash_at: crash_at,
                ..TestHooks::default()
            };
        }
        TestHooks {
            faults: true,
            log_kinds: number(&self.log_kinds),
            snapshot_every: number(&self.snapshot_every),
            log_segment_bytes: number(&self.log_segment_bytes),
            s3_crash_at: crash_at,
        }
    }
}

/// A number as given, trimmed; `None` when unset or not a number.
fn number<T: std::str::FromStr>(v: &Option<String>) -> Option<T> {
    v.as_deref().and_then(|v| v.trim().parse().ok())
}

/// Test-only switches, all off unless a test sets them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TestHooks {
    /// `QUEEN_TEST_FAULTS=1`: the fault layer reads `QUEEN_RAFT_DIR/test-faults` (node ids to
    /// drop raft traffic to) and the other switches but the sink's crash point are looked at.
    pub faults: bool,
    /// `QUEEN_TEST_LOG_KINDS`: pretend this build reads up to this format.
    pub log_kinds: Option<u32>,
    /// `QUEEN_TEST_SNAPSHOT_EVERY`: build a snapshot (and let the log be purged) every this many
    /// entries instead of the default, so a test can strand a follower behind a purge quickly.
    pub snapshot_every: Option<u64>,
    /// `QUEEN_TEST_LOG_SEGMENT_BYTES`: roll the raft log's files at this size, so that purges
    /// delete and archive files in tests that write a few MiB.
    pub log_segment_bytes: Option<u64>,
    /// `QUEEN_TEST_S3_CRASH_AT`: the sink aborts the process there (on its own, without
    /// `QUEEN_TEST_FAULTS`).
    pub s3_crash_at: Option<S3CrashPoint>,
}

impl TestHooks {
    /// The fault layer's file under `dir`, when the fault layer is on.
    #[must_use]
    pub fn faults_file(&self, dir: &Path) -> Option<PathBuf> {
        self.faults.then(|| dir.join(FAULTS_FILE))
    }
}

/// A point of the sink's commit sequence where `QUEEN_TEST_S3_CRASH_AT` aborts the process (as
/// `kill -9` would), right after the first window that reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3CrashPoint {
    /// `intent`: the window's intent is written.
    Intent,
    /// `objects`: its objects are uploaded.
    Objects,
    /// `manifest`: its manifest is written.
    Manifest,
    /// `pointer`: the queue's pointer names it.
    Pointer,
    /// `checkpoint`: a checkpoint is written after it.
    Checkpoint,
}

impl S3CrashPoint {
    /// The point a value names, exactly as written (any other value names none).
    #[must_use]
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "intent" => Some(Self::Intent),
            "objects" => Some(Self::Objects),
            "manifest" => Some(Self::Manifest),
            "pointer" => Some(Self::Pointer),
            "checkpoint" => Some(Self::Checkpoint),
            _ => None,
        }
    }

    /// The value that names this point.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Intent => "intent",
            Self::Objects => "objects",
            Self::Manifest => "manifest",
            Self::Pointer => "pointer",
            Self::Checkpoint => "checkpoint",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, &str)]) -> RawTestHooks {
        RawTestHooks::read(&|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn off_unless_faults_is_one() {
        let hooks = raw(&[
            ("QUEEN_TEST_FAULTS", "yes"),
            ("QUEEN_TEST_LOG_KINDS", "4"),
            ("QUEEN_TEST_SNAPSHOT_EVERY", "200"),
        ])
        .resolve();
        assert_eq!(hooks, TestHooks::default());
        assert_eq!(hooks.faults_file(Path::new("/d")), None);
    }

    #[test]
    fn faults_turn_the_others_on() {
        let hooks = raw(&[
            ("QUEEN_TEST_FAULTS", " 1 "),
            ("QUEEN_TEST_LOG_KINDS", " 4"),
            ("QUEEN_TEST_SNAPSHOT_EVERY", "200"),
            ("QUEEN_TEST_LOG_SEGMENT_BYTES", "not a number"),
        ])
        .resolve();
        assert!(hooks.faults);
        assert_eq!(hooks.log_kinds, Some(4));
        assert_eq!(hooks.snapshot_every, Some(200));
        assert_eq!(hooks.log_segment_bytes, None);
        assert_eq!(
            hooks.faults_file(Path::new("/d")),
            Some(PathBuf::from("/d/test-faults"))
        );
    }

    #[test]
    fn the_crash_point_needs_no_faults_and_an_exact_name() {
        for p in ["intent", "objects", "manifest", "pointer", "checkpoint"] {
            let hooks = raw(&[("QUEEN_TEST_S3_CRASH_AT", p)]).resolve();
            assert_eq!(hooks.s3_crash_at.map(S3CrashPoint::as_str), Some(p));
            assert!(!hooks.faults);
        }
        for p in ["", "Intent", " intent", "other"] {
            assert_eq!(
                raw(&[("QUEEN_TEST_S3_CRASH_AT", p)]).resolve().s3_crash_at,
                None
            );
        }
    }
}
