//! Opening a log directory: scanning every segment, cutting off a torn tail, rebuilding the
//! index, and listing the archived segments.

use std::collections::BTreeMap;
use std::fs::File;
use std::fs::OpenOptions;
use std::io;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use super::flusher::FlushStats;
use super::record::FORMAT_VERSION;
use super::record::Record;
use super::record::ScanItem;
use super::segment_name;
use super::{ARCHIVE_DIR, LogInner, SEGMENT_SUFFIX, Segment, record};

/// Scan every segment in order and rebuild the state; cut a torn tail off the last segment.
pub(super) fn recover(dir: &Path, inner: &mut LogInner, stats: &FlushStats) -> io::Result<()> {
    let seqs = segment_seqs(dir)?;

    let mut first = true;
    for (i, &seq) in seqs.iter().enumerate() {
        let is_last = i + 1 == seqs.len();
        let path = dir.join(segment_name(seq));
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let file_len = file.metadata()?.len();
        inner.segments.insert(
            seq,
            Segment {
                path: path.clone(),
                file: Arc::new(file.try_clone()?),
                size: file_len,
                max_entry_index: None,
            },
        );

        let mut reader = BufReader::with_capacity(1024 * 1024, file);
        let mut offset = 0u64;
        let mut saw_header = false;
        loop {
            match record::scan_next(&mut reader)? {
                ScanItem::End => break,
                ScanItem::Record(rec, len) => {
                    if !saw_header {
                        let Record::Header(h) = &rec else {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!(
                                    "raft log segment {} does not start with a header",
                                    path.display()
                                ),
                            ));
                        };
                        if h.format != FORMAT_VERSION {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("raft log format {} is not supported", h.format),
                            ));
                        }
                        if first {
                            inner.vote = h.vote;
                            inner.committed = h.committed;
                            inner.last_purged = h.last_purged;
                            first = false;
                        }
                        saw_header = true;
                    }
                    inner.apply(&rec, seq, offset, len)?;
                    offset += u64::from(len);
                }
                ScanItem::Torn(why) => {
                    if !is_last {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "raft log segment {} is corrupt at offset {offset}: {why}",
                                path.display()
                            ),
                        ));
                    }
                    tracing::warn!(
                        segment = %path.display(),
                        offset,
                        dropped_bytes = file_len - offset,
                        reason = why,
                        "cutting torn tail off the raft log"
                    );
                    let seg = inner
                        .segments
                        .get_mut(&seq)
                        .ok_or_else(|| io::Error::other("raft log segment vanished"))?;
                    seg.file.set_len(offset)?;
                    stats.sync_data(&seg.file)?;
                    seg.size = offset;
                    break;
                }
            }
        }

        if !saw_header {
            // Only the newest segment can be headerless: its creation was cut short.
            if !is_last {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("raft log segment {} has no header", path.display()),
                ));
            }
            inner.segments.remove(&seq);
            std::fs::remove_file(&path)?;
            stats.sync_dir(dir)?;
            tracing::warn!(segment = %path.display(), "removed a raft log segment whose creation was cut short");
        }
    }
    // Once every purge record is read, the first entry must follow the last purge point.
    if let (Some(first), Some(p)) = (inner.entries.front(), inner.last_purged)
        && first.log_id.index != p.index + 1
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "raft log has a hole: purged up to {} but the first entry is {}",
                p.index, first.log_id.index
            ),
        ));
    }
    Ok(())
}

/// The segments in `archive/` (creating the directory on first use).
pub(super) fn list_archive(
    dir: &Path,
    stats: &FlushStats,
) -> io::Result<BTreeMap<u64, Option<Arc<File>>>> {
    let archive = dir.join(ARCHIVE_DIR);
    if !archive.exists() {
        std::fs::create_dir(&archive)?;
        stats.sync_dir(dir)?;
    }
    Ok(segment_seqs(&archive)?
        .into_iter()
        .map(|seq| (seq, None))
        .collect())
}

/// The sequence numbers of the segment files in `dir`, ascending; a `.seg` file whose name is
/// not a number is left alone, with a warning.
pub(super) fn segment_seqs(dir: &Path) -> io::Result<Vec<u64>> {
    let mut seqs = Vec::new();
    for dent in std::fs::read_dir(dir)? {
        let dent = dent?;
        let name = dent.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else {
            continue;
        };
        match stem.parse::<u64>() {
            Ok(seq) => seqs.push(seq),
            Err(_) => tracing::warn!(
                file = name,
                dir = %dir.display(),
                "ignoring unexpected file in raft log directory"
            ),
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}
