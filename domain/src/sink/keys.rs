//! Object keys of the lake: a Hive layout under a prefix, names percent-encoded so that no name
//! can climb out of its prefix, `dt=`/`hour=` taken from the window's start.

use std::fmt::Write as _;

use crate::time::Stamp;

/// The tenant written by a broker without tenancy.
pub const DEFAULT_TENANT: &str = "00000000-0000-0000-0000-000000000001";

/// How windows align (and so which Hive partitions a key carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Windows never cross an hour: `dt=` and `hour=`.
    Hour,
    /// Windows never cross a day: `dt=` only.
    Day,
    /// No boundary: `dt=` and `hour=` from the window's start.
    None,
}

/// Percent-encode everything outside `A-Z a-z 0-9 . _ -` (so `/`, `=`, `%` and `..` segments
/// cannot form a path of their own; a name made only of dots is encoded whole).
#[must_use]
pub fn encode(name: &str) -> String {
    let dots_only = !name.is_empty() && name.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-') || (b == b'.' && !dots_only);
        if plain {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn date_parts(t: Stamp) -> (String, String) {
    let iso = t.iso_micros();
    (iso[..10].to_owned(), iso[11..13].to_owned())
}

/// Where a window's objects live: what every key of the window shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowKeys<'a> {
    /// The key prefix (`queen`).
    pub prefix: &'a str,
    /// Tenant id.
    pub tenant: &'a str,
    /// Queue name.
    pub queue: &'a str,
    /// Window number (from 1).
    pub k: u64,
    /// Start (inclusive).
    pub t_start: Stamp,
    /// End (exclusive).
    pub t_end: Stamp,
    /// Alignment (decides `hour=`).
    pub align: Align,
}

impl WindowKeys<'_> {
    fn dir(&self) -> String {
        let (dt, hour) = date_parts(self.t_start);
        let mut d = format!("{}/tenant={}/queue={}/dt={dt}", self.prefix, encode(self.tenant), encode(self.queue));
        if self.align != Align::Day {
            let _ = write!(d, "/hour={hour}");
        }
        d
    }

    /// The merged layout's data object.
    #[must_use]
    pub fn data(&self, ext: &str) -> String {
        format!("{}/w-{:010}-{}-{}.{ext}", self.dir(), self.k, self.t_start.0, self.t_end.0)
    }

    /// The per-partition layout's data object for one partition.
    #[must_use]
    pub fn partition_data(&self, partition: &str, first: u64, last: u64, ext: &str) -> String {
        format!(
            "{}/w-{:010}-{}-{}-p-{}-{first}-{last}.{ext}",
            self.dir(),
            self.k,
            self.t_start.0,
            self.t_end.0,
            encode(partition)
        )
    }

    /// The window's manifest (under `_queen/`, which is not a Hive partition).
    #[must_use]
    pub fn manifest(&self) -> String {
        format!("{}/_queen/tenant={}/queue={}/windows/{:010}.json", self.prefix, encode(self.tenant), encode(self.queue), self.k)
    }

    /// The checkpoint written after window k.
    #[must_use]
    pub fn checkpoint(&self) -> String {
        format!("{}/_queen/tenant={}/queue={}/checkpoint/{:010}.json.zst", self.prefix, encode(self.tenant), encode(self.queue), self.k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_documents_example_key() {
        let w = WindowKeys {
            prefix: "queen",
            tenant: DEFAULT_TENANT,
            queue: "orders",
            k: 1,
            t_start: Stamp(1_791_007_200_000_000),
            t_end: Stamp(1_791_009_458_377_855),
            align: Align::Hour,
        };
        assert_eq!(
            w.data("jsonl.zst"),
            "queen/tenant=00000000-0000-0000-0000-000000000001/queue=orders/dt=2026-10-03/hour=06/w-0000000001-1791007200000000-1791009458377855.jsonl.zst"
        );
        assert_eq!(w.manifest(), "queen/_queen/tenant=00000000-0000-0000-0000-000000000001/queue=orders/windows/0000000001.json");
        assert!(w.partition_data("cust 1", 0, 4, "parquet").ends_with("-p-cust%201-0-4.parquet"));
        let day = WindowKeys { align: Align::Day, ..w };
        assert!(!day.data("x").contains("hour="));
    }

    proptest! {
        // No name climbs out of its prefix: encoded names have no '/', no '=', and are never
        // "." or "..".
        #[test]
        fn encoded_names_stay_one_segment(name in ".{0,40}") {
            let e = encode(&name);
            prop_assert!(!e.contains('/') && !e.contains('='));
            prop_assert!(e != "." && e != "..");
            prop_assert!(e.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'%')));
        }

        #[test]
        fn encoding_is_injective(a in ".{0,12}", b in ".{0,12}") {
            prop_assume!(a != b);
            prop_assert_ne!(encode(&a), encode(&b));
        }
    }
}
