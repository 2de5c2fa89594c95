use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use super::*;

fn rec(pid: u64, base: u64, n: usize, size: usize) -> (u64, u64, Vec<Vec<u8>>) {
    (
        pid,
        base,
        (0..n).map(|i| vec![(i % 250) as u8; size]).collect(),
    )
}

fn append(s: &Segments, recs: &[(u64, u64, Vec<Vec<u8>>)]) -> Vec<Loc> {
    let new: Vec<NewRecord<'_>> = recs
        .iter()
        .map(|(pid, base, vals)| NewRecord {
            pid: *pid,
            base: *base,
            stamp: 7,
            values: vals.iter().map(Vec::as_slice).collect(),
        })
        .collect();
    s.append(&new).unwrap().0
}

#[test]
fn records_read_back_and_a_torn_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let s = Segments::open(dir.path(), SEGMENT_BYTES, None, &|_| true).unwrap();
    let locs = append(&s, &[rec(1, 0, 3, 10), rec(2, 5, 1, 0)]);
    let r = s.read(locs[0]).unwrap();
    assert_eq!((r.pid, r.base), (1, 0));
    let vals: Vec<(u64, Vec<u8>)> = r.values().map(|(o, v)| (o, v.to_vec())).collect();
    assert_eq!(
        vals,
        vec![(0, vec![0; 10]), (1, vec![1; 10]), (2, vec![2; 10])]
    );
    let end = s.end();
    append(&s, &[rec(3, 0, 2, 100)]);
    drop(s);
    // Reopened at the earlier end: the later record is cut.
    let s = Segments::open(dir.path(), SEGMENT_BYTES, Some(end), &|_| true).unwrap();
    assert_eq!(s.end(), end);
    assert_eq!(std::fs::metadata(s.path(1)).unwrap().len(), end.1);
    assert!(s.read(locs[1]).is_ok());
}

#[test]
fn a_short_or_corrupt_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Segments::open(dir.path(), SEGMENT_BYTES, None, &|_| true).unwrap();
    let locs = append(&s, &[rec(1, 0, 3, 10)]);
    let end = s.end();
    drop(s);
    let path = dir.path().join(format!("{:020}.qseg", 1));
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[0xFF], locs[0].pos + 20).unwrap();
    let e = Segments::open(dir.path(), SEGMENT_BYTES, Some(end), &|_| true)
        .err()
        .expect("corrupt record refused");
    assert!(e.to_string().contains("checksum"), "{e}");
    f.set_len(end.1 - 1).unwrap();
    let e = Segments::open(dir.path(), SEGMENT_BYTES, Some(end), &|_| true)
        .err()
        .expect("short file refused");
    assert!(e.to_string().contains("ends at"), "{e}");
}

#[test]
fn files_roll_at_the_same_records_and_pins_hold_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(Segments::open(dir.path(), SEGMENT_BYTES, None, &|_| true).unwrap());
    let big = (SEGMENT_BYTES / 3) as usize;
    let locs = append(
        &s,
        &[
            rec(1, 0, 1, big),
            rec(1, 1, 1, big),
            rec(1, 2, 1, big),
            rec(1, 3, 1, 10),
        ],
    );
    assert_eq!(
        locs.iter().map(|l| l.file).collect::<Vec<_>>(),
        vec![1, 1, 2, 2]
    );
    let pin = s.pin();
    s.release(1);
    assert!(s.path(1).exists());
    drop(pin);
    assert!(!s.path(1).exists());
    assert!(s.read(locs[3]).is_ok());
}

/// A raft log of one file in memory, for reads of records kept there.
struct OneFile(Vec<u8>);

impl queen_ports::LogFiles for OneFile {
    fn read(&self, span: queen_ports::LogSpan) -> Result<Vec<u8>, queen_ports::BackendError> {
        let (from, to) = (span.pos as usize, span.pos as usize + span.len as usize);
        self.0
            .get(from..to)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| queen_ports::BackendError::Storage("past the end".to_owned()))
    }
    fn hold(&self, _file: u64) {}
    fn release(&self, _file: u64) -> Result<(), queen_ports::BackendError> {
        Ok(())
    }
    fn set_holds(&self, _files: &[u64]) -> Result<(), queen_ports::BackendError> {
        Ok(())
    }
}

/// A record kept in the raft log reads the same messages whether its row points at the whole
/// entry and its first item (layout 4) or at its items alone (layout 5), and a changed byte
/// in what it reads is refused, never served.
#[test]
fn a_kept_record_reads_the_same_from_the_whole_entry_and_from_its_items_alone() {
    use queen_domain::command::{Command, Entry, PushItem};
    use queen_domain::names::{PartitionName, QueueName};
    let items: Vec<PushItem> = (0..6u8)
        .map(|i| PushItem {
            queue: QueueName::new("q").unwrap(),
            partition: PartitionName::new(if i < 2 { "a" } else { "b" }).unwrap(),
            transaction_id: queen_domain::ids::TransactionId::new(format!("t{i}")).unwrap(),
            message_id: [i; 16],
            payload: vec![i; 100 + usize::from(i)],
            trace_id: (i == 3).then(|| "trace".to_owned()),
        })
        .collect();
    let entry = Entry {
        proposed_at: 5,
        command: Command::Push(items),
    }
    .encode();
    // The entry sits 100 bytes into the log file.
    let mut file = vec![0xAB; 100];
    file.extend_from_slice(&entry);
    file.extend_from_slice(&[0xCD; 50]);
    let dir = tempfile::tempdir().unwrap();
    // Segments reading their raft log from `file`, each with its own (empty) cache of records.
    let fresh = |file: Vec<u8>| {
        let mut s = Segments::open(dir.path(), SEGMENT_BYTES, None, &|_| true).unwrap();
        let link = Arc::new(LogLink::default());
        link.set(Arc::new(OneFile(file)));
        s.set_log(link);
        s
    };
    let s = fresh(file.clone());
    let stamp = 77;
    // Partition "b": items 2..6.
    let whole = Loc {
        file: RAFT_BIT,
        pos: 100,
        len: entry.len() as u32,
    };
    let old = s
        .read_raft(
            whole,
            Raft {
                stamp,
                crc: crc32fast::hash(&entry),
                first_item: 2,
            },
            9,
            40,
            4,
        )
        .unwrap();
    let b = queen_domain::pushed::item_bounds(&entry).unwrap();
    let piece = &entry[b[2] as usize..b[6] as usize];
    let alone = Loc {
        file: RAFT_BIT,
        pos: 100 + u64::from(b[2]),
        len: b[6] - b[2],
    };
    let items_only = Raft {
        stamp,
        crc: crc32fast::hash(piece),
        first_item: ITEMS_ONLY,
    };
    let new = s.read_raft(alone, items_only, 9, 40, 4).unwrap();
    let values = |r: &Record| r.values().map(|(o, v)| (o, v.to_vec())).collect::<Vec<_>>();
    assert_eq!(values(&new), values(&old));
    assert_eq!(values(&new).len(), 4);
    assert_eq!(values(&new)[0].0, 40);
    // Byte for byte the record the segment log would have written for those messages.
    let stored: Vec<Vec<u8>> = (2..6u8)
        .map(|i| {
            queen_domain::model::MessageRecRef {
                transaction_id: &format!("t{i}"),
                id: [i; 16],
                trace_id: (i == 3).then_some("trace"),
                stamp: queen_domain::time::Stamp(stamp),
                payload: &vec![i; 100 + usize::from(i)],
                producer: None,
            }
            .encode()
        })
        .collect();
    let mut want = Vec::new();
    codec::encode(
        &NewRecord {
            pid: 9,
            base: 40,
            stamp,
            values: stored.iter().map(Vec::as_slice).collect(),
        },
        &mut want,
    );
    assert!(
        old.framed() == want,
        "a kept record as the segment log frames it"
    );
    assert!(new.framed() == want);
    // One changed byte inside the items: refused (fresh segments, so that nothing is cached).
    let mut bad = file.clone();
    bad[100 + b[3] as usize + 3] ^= 1;
    assert!(fresh(bad).read_raft(alone, items_only, 9, 40, 4).is_err());
    // A count that does not match the bytes: refused.
    assert!(
        fresh(file.clone())
            .read_raft(alone, items_only, 9, 40, 3)
            .is_err()
    );
    assert!(fresh(file).read_raft(alone, items_only, 9, 40, 5).is_err());
}
