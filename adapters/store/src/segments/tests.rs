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
