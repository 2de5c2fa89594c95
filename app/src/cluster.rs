//! The cluster format gate and the cluster settings the leader keeps in the log.
//!
//! Every node reads log formats up to `kinds` (`LOG_KINDS` of this build). The cluster's
//! version (`clusterVersion`, replicated state) is raised by the leader only once every member
//! reports at least that format on the raft port, so no node ever meets an entry it cannot
//! read. Each node writes the version it has applied to `QUEEN_RAFT_DIR/cluster-version`, and a
//! build that reads less refuses to start on that directory. The leader also writes its
//! `QUEEN_RAFT_MAX_CLOCK_SKEW_MS` into the log, so every replica holds leases alike.

use std::path::{Path, PathBuf};

use queen_domain::command::Command;
use queen_domain::reads;
use queen_ports::{ClientApi, RaftRole, ReplicatedLog};
use queen_raft::RaftNode;

use crate::broker::Broker;
use crate::error::AppError;

/// The marker file in the data directory: the cluster version this node has applied.
pub(crate) const FORMAT_FILE: &str = "cluster-version";

/// The version recorded in the data directory's marker (0 when there is none).
///
/// # Errors
/// A marker that cannot be read or parsed, or one newer than `kinds`.
pub(crate) fn check_marker(dir: &Path, kinds: u32) -> Result<u32, AppError> {
    let path = dir.join(FORMAT_FILE);
    let found = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u32>()
            .map_err(|_| AppError::FormatMarker {
                path: path.display().to_string(),
            })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(_) => {
            return Err(AppError::FormatMarker {
                path: path.display().to_string(),
            });
        }
    };
    refuse_newer(dir, found, kinds)?;
    Ok(found)
}

/// Refuse a cluster version above what this build reads.
///
/// # Errors
/// `AppError::FormatTooNew`.
pub(crate) fn refuse_newer(dir: &Path, found: u32, kinds: u32) -> Result<(), AppError> {
    if found > kinds {
        return Err(AppError::FormatTooNew {
            dir: dir.display().to_string(),
            found,
            reads: kinds,
        });
    }
    Ok(())
}

/// Write the marker (through a temporary file, so a crash leaves the old or the new one).
fn write_marker(dir: &Path, version: u32) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{FORMAT_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{version}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(FORMAT_FILE))
}

/// The version the leader may raise the cluster to: the lowest format any member reads, when
/// every member answered and it is above the current version.
pub(crate) fn next_version(current: u32, reports: &[(u64, Option<u32>)]) -> Option<u32> {
    let lowest = reports
        .iter()
        .map(|(_, k)| *k)
        .collect::<Option<Vec<u32>>>()?
        .into_iter()
        .min()?;
    (lowest > current).then_some(lowest)
}

/// One node's part of the gate, stepped about once a second.
pub(crate) struct Gate {
    raft: RaftNode,
    dir: PathBuf,
    kinds: u32,
    max_clock_skew_ms: u64,
    /// The version the marker holds.
    marker: u32,
}

impl Gate {
    pub(crate) fn new(
        raft: RaftNode,
        dir: PathBuf,
        kinds: u32,
        max_clock_skew_ms: u64,
        marker: u32,
    ) -> Self {
        Self {
            raft,
            dir,
            kinds,
            max_clock_skew_ms,
            marker,
        }
    }

    /// Record the applied cluster version in the marker; on the leader, raise the version when
    /// every member reads more, and write the clock-skew setting when it differs.
    pub(crate) async fn step(&mut self, broker: &Broker) {
        let version = reads::cluster_version(&*broker.state()).unwrap_or(0);
        if version > self.marker {
            match write_marker(&self.dir, version) {
                Ok(()) => {
                    self.marker = version;
                    tracing::info!(target: "queen-app", version, "cluster version recorded");
                }
                Err(e) => {
                    tracing::warn!(target: "queen-app", error = %e, "cannot write the cluster version marker")
                }
            }
        }
        if self.raft.progress().role != RaftRole::Leader {
            return;
        }
        let mut next = version;
        if version < self.kinds {
            let reports = self.raft.member_kinds().await;
            match next_version(version, &reports) {
                Some(v) => next = v,
                None => {
                    tracing::debug!(target: "queen-app", ?reports, version, "cluster version stays")
                }
            }
        }
        let skew = reads::max_clock_skew_ms(&*broker.state()).ok().flatten();
        if next == version && skew == Some(self.max_clock_skew_ms) {
            return;
        }
        let command = Command::ClusterSettings {
            version: next,
            max_clock_skew_ms: self.max_clock_skew_ms,
        };
        match broker.propose(command).await {
            Ok(_) if next > version => {
                tracing::info!(target: "queen-app", from = version, to = next, "cluster version raised")
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(target: "queen-app", error = %e, "cluster settings not committed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_rises_only_when_every_member_reports_more() {
        assert_eq!(
            next_version(0, &[(1, Some(1)), (2, Some(1)), (3, Some(1))]),
            Some(1)
        );
        assert_eq!(
            next_version(1, &[(1, Some(2)), (2, Some(2)), (3, Some(1))]),
            None,
            "one member reads less"
        );
        assert_eq!(
            next_version(1, &[(1, Some(2)), (2, None), (3, Some(2))]),
            None,
            "one member did not answer"
        );
        assert_eq!(
            next_version(1, &[(1, Some(3)), (2, Some(2))]),
            Some(2),
            "the lowest format wins"
        );
        assert_eq!(next_version(2, &[(1, Some(1))]), None, "never lowered");
        assert_eq!(next_version(0, &[]), None);
    }

    #[test]
    fn a_marker_newer_than_this_build_refuses_the_start() {
        let dir = std::env::temp_dir().join(format!("queen-format-marker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            check_marker(&dir, 1).unwrap(),
            0,
            "no marker: a fresh directory"
        );
        write_marker(&dir, 1).unwrap();
        assert_eq!(check_marker(&dir, 1).unwrap(), 1);
        write_marker(&dir, 2).unwrap();
        let e = check_marker(&dir, 1).unwrap_err();
        assert!(
            matches!(
                e,
                AppError::FormatTooNew {
                    found: 2,
                    reads: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(e.exit_code(), 2);
        std::fs::write(dir.join(FORMAT_FILE), "two").unwrap();
        assert!(matches!(
            check_marker(&dir, 1),
            Err(AppError::FormatMarker { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
