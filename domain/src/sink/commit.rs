//! The commit sequence of a window and the recovery decision after a crash.
//!
//! A window commits as: intent (its end fixed in KV) → objects → manifest → commit pointer. The
//! intent records the encoder and its settings (`writer`), so a node rebuilding the window after
//! an upgrade cannot change the bytes silently. A crash can stop the sequence at five points;
//! `recover` names what the next owner does for each.

use serde::{Deserialize, Serialize};

/// The intent: window k's bounds, fixed before anything is uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    /// Window number.
    pub k: u64,
    /// Start (µs, inclusive).
    pub t_start: u64,
    /// End (µs, exclusive).
    pub t_end: u64,
    /// Encoder and settings, e.g. `queen-s3/0.1.0 jsonl+zstd`.
    pub writer: String,
}

/// The commit pointer: the last window that is real.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pointer {
    /// Window number.
    pub k: u64,
    /// Its end: where the next window starts reading.
    pub t_end: u64,
}

/// One object of a window, as its manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestObject {
    /// Object key.
    pub key: String,
    /// Bytes stored.
    pub bytes: u64,
    /// Records inside.
    pub records: u64,
    /// Hex sha256 of the stored bytes.
    pub sha256: String,
}

/// A range of offsets retention deleted before the sink read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostRange {
    /// Partition.
    pub partition: String,
    /// First lost offset.
    pub from: u64,
    /// Last lost offset.
    pub to: u64,
}

/// A window's manifest, fields in the document's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Sink name.
    pub sink: String,
    /// Tenant.
    pub tenant: String,
    /// Queue.
    pub queue: String,
    /// Window number.
    pub k: u64,
    /// Start (µs).
    pub t_start: u64,
    /// End (µs).
    pub t_end: u64,
    /// jsonl or parquet.
    pub format: String,
    /// zstd, gzip, none (JSONL) or the Parquet codec.
    pub compression: String,
    /// merged or per-partition.
    pub layout: String,
    /// The objects.
    pub objects: Vec<ManifestObject>,
    /// Records in all objects.
    pub records: u64,
    /// Bytes in all objects.
    pub bytes: u64,
    /// Partitions with records.
    pub partitions: u64,
    /// Smallest record stamp (µs).
    pub min_ts: u64,
    /// Largest record stamp (µs).
    pub max_ts: u64,
    /// Ranges lost to retention.
    pub lost: Vec<LostRange>,
    /// Encoder and settings (the intent's).
    pub writer: String,
    /// Wall-clock time of the commit (the one wall-clock field in the lake).
    pub committed_at: String,
}

impl Manifest {
    /// Whether this manifest was written for `intent`.
    #[must_use]
    pub fn names(&self, intent: &Intent) -> bool {
        self.k == intent.k
            && self.t_start == intent.t_start
            && self.t_end == intent.t_end
            && self.writer == intent.writer
    }
}

/// What the owner of a queue does when it (re)starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing pending: the next window is `next_k`, reading from `from` (µs; 0 = the start).
    Continue {
        /// The next window number.
        next_k: u64,
        /// Its start.
        from: u64,
    },
    /// Rebuild the intent's window and upload it again: same records, same bytes, same keys.
    Redo(Intent),
    /// The upload finished (its manifest names the intent): move the pointer, upload nothing.
    CommitUploaded {
        /// The pending window.
        intent: Intent,
        /// The manifest that names it: the objects and lost records the commit records.
        manifest: Box<Manifest>,
    },
}

/// The stored state cannot be recovered without a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    /// The intent is ahead of the pointer by more than one window.
    #[error("intent for window {intent} but the pointer is at {pointer}: windows were skipped")]
    Gap {
        /// Intent's k.
        intent: u64,
        /// Pointer's k.
        pointer: u64,
    },
    /// The pending intent was written by another encoder or settings than this build's.
    #[error(
        "window {k} was started by '{found}', this node writes '{ours}': refusing to change its bytes"
    )]
    Writer {
        /// Window.
        k: u64,
        /// The intent's writer.
        found: String,
        /// This build's writer.
        ours: String,
    },
}

/// Decide what to do from the KV documents and the manifest found in the bucket for the
/// intent's window (if any).
///
/// # Errors
/// A gap between intent and pointer, or an intent this build would encode differently.
pub fn recover(
    pointer: Option<&Pointer>,
    intent: Option<&Intent>,
    manifest: Option<&Manifest>,
    writer: &str,
) -> Result<Recovery, RecoveryError> {
    let done_k = pointer.map_or(0, |p| p.k);
    let from = pointer.map_or(0, |p| p.t_end);
    let Some(i) = intent.filter(|i| i.k > done_k) else {
        return Ok(Recovery::Continue {
            next_k: done_k + 1,
            from,
        });
    };
    if i.k != done_k + 1 {
        return Err(RecoveryError::Gap {
            intent: i.k,
            pointer: done_k,
        });
    }
    if let Some(m) = manifest.filter(|m| m.names(i)) {
        return Ok(Recovery::CommitUploaded {
            intent: i.clone(),
            manifest: Box::new(m.clone()),
        });
    }
    if i.writer != writer {
        return Err(RecoveryError::Writer {
            k: i.k,
            found: i.writer.clone(),
            ours: writer.to_owned(),
        });
    }
    Ok(Recovery::Redo(i.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: &str = "queen-s3/0.1.0 jsonl+zstd";

    fn intent(k: u64) -> Intent {
        Intent {
            k,
            t_start: k * 10,
            t_end: k * 10 + 10,
            writer: W.into(),
        }
    }

    fn manifest_for(i: &Intent) -> Manifest {
        Manifest {
            sink: "default".into(),
            tenant: super::super::keys::DEFAULT_TENANT.into(),
            queue: "orders".into(),
            k: i.k,
            t_start: i.t_start,
            t_end: i.t_end,
            format: "jsonl".into(),
            compression: "zstd".into(),
            layout: "merged".into(),
            objects: vec![],
            records: 0,
            bytes: 0,
            partitions: 0,
            min_ts: 0,
            max_ts: 0,
            lost: vec![],
            writer: i.writer.clone(),
            committed_at: "2026-11-29T00:00:00.000000Z".into(),
        }
    }

    /// The five crash points of committing window 3 after window 2.
    #[test]
    fn every_crash_point_has_one_answer() {
        let p2 = Pointer { k: 2, t_end: 30 };
        let i3 = intent(3);
        // 1. Crash before the intent: continue after the pointer.
        assert_eq!(
            recover(Some(&p2), Some(&intent(2)), None, W),
            Ok(Recovery::Continue {
                next_k: 3,
                from: 30
            })
        );
        // 2. After the intent, before any object: redo with the intent's bounds.
        assert_eq!(
            recover(Some(&p2), Some(&i3), None, W),
            Ok(Recovery::Redo(i3.clone()))
        );
        // 3. After some objects, no manifest: redo (same keys, same bytes overwrite).
        assert_eq!(
            recover(Some(&p2), Some(&i3), None, W),
            Ok(Recovery::Redo(i3.clone()))
        );
        // 4. After the manifest, before the pointer: commit what was uploaded.
        assert_eq!(
            recover(Some(&p2), Some(&i3), Some(&manifest_for(&i3)), W),
            Ok(Recovery::CommitUploaded {
                intent: i3.clone(),
                manifest: Box::new(manifest_for(&i3))
            })
        );
        // 5. After the pointer: continue with window 4.
        assert_eq!(
            recover(
                Some(&Pointer { k: 3, t_end: 40 }),
                Some(&i3),
                Some(&manifest_for(&i3)),
                W
            ),
            Ok(Recovery::Continue {
                next_k: 4,
                from: 40
            })
        );
        // A stale manifest of an older attempt with other bounds does not count.
        let mut other = manifest_for(&i3);
        other.t_end += 1;
        assert_eq!(
            recover(Some(&p2), Some(&i3), Some(&other), W),
            Ok(Recovery::Redo(i3.clone()))
        );
        // Fresh queue.
        assert_eq!(
            recover(None, None, None, W),
            Ok(Recovery::Continue { next_k: 1, from: 0 })
        );
    }

    #[test]
    fn an_upgrade_never_changes_a_pending_windows_bytes_silently() {
        let p2 = Pointer { k: 2, t_end: 30 };
        let i3 = intent(3);
        assert!(matches!(
            recover(Some(&p2), Some(&i3), None, "queen-s3/0.2.0 jsonl+zstd"),
            Err(RecoveryError::Writer { .. })
        ));
        // A finished upload is committed whatever this build writes.
        assert!(matches!(
            recover(Some(&p2), Some(&i3), Some(&manifest_for(&i3)), "other"),
            Ok(Recovery::CommitUploaded { .. })
        ));
        assert!(matches!(
            recover(Some(&p2), Some(&intent(5)), None, W),
            Err(RecoveryError::Gap { .. })
        ));
    }

    #[test]
    fn the_manifest_serializes_with_the_documents_field_names() {
        let m = manifest_for(&intent(1));
        let v = serde_json::to_value(&m).unwrap();
        for f in [
            "sink",
            "tenant",
            "queue",
            "k",
            "tStart",
            "tEnd",
            "format",
            "compression",
            "layout",
            "objects",
            "records",
            "bytes",
            "partitions",
            "minTs",
            "maxTs",
            "lost",
            "writer",
            "committedAt",
        ] {
            assert!(v.get(f).is_some(), "{f}");
        }
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.starts_with(r#"{"sink":"default","tenant""#), "{text}");
    }
}
