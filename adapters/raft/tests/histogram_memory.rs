//! openraft makes a `base2histogram::Histogram` when a raft node starts. The published
//! base2histogram 0.2.3 built the lookup tables of all sixteen bucket widths for the first one,
//! about 26 MB written and so resident in every node; the workspace builds the patched copy in
//! `vendor/base2histogram` instead (`vendor/README.md`). This fails if that patch is dropped
//! while the crate still behaves so. Alone in its binary, so nothing else allocates meanwhile.

fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

#[test]
fn a_histogram_does_not_build_tables_for_every_width() {
    let before = resident_kib();
    let mut h = base2histogram::Histogram::<()>::new();
    h.record(100);
    let grown = resident_kib().saturating_sub(before);
    assert!(
        grown < 4 * 1024,
        "one histogram made the process {grown} KiB larger (the published crate: about 26,000)"
    );
}
