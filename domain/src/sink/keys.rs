//! Object keys of the lake: a Hive layout under a prefix, names percent-encoded so that no name
//! can climb out of its prefix, `dt=`/`hour=` taken from the window's start.
//!
//! Every path component of a key fits in [`MAX_COMPONENT_BYTES`] (most file systems refuse a
//! longer file or folder name, and the local-folder lake is a file system): a name whose encoding
//! would make its component longer is shortened by [`encode_within`], a prefix of its encoding
//! and a hash of the whole name. Names that fit are encoded exactly as before, so no existing key
//! moves; the manifest keeps the full names.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use crate::time::Stamp;

/// The most bytes of one path component of a key: ext4, XFS, APFS and NTFS take 255.
pub const MAX_COMPONENT_BYTES: usize = 255;

/// Marks a shortened name: it is followed by [`HASH_HEX`] hex digits of the name's sha256.
/// [`encode`] never writes it, so a shortened name never equals a name encoded whole.
pub const SHORTENED_MARKER: char = '~';

/// Hex digits of sha256 a shortened name ends with (64 bits: distinct names collide with odds
/// of about n²/2⁶⁵ among n long names of one queue).
pub const HASH_HEX: usize = 16;

/// The longest file extension [`WindowKeys::data`] and [`WindowKeys::partition_data`] are
/// sized for (`jsonl.zst` is the longest today).
pub const MAX_EXT_BYTES: usize = 16;

/// The most bytes a `u64` takes in decimal.
const U64_DIGITS: usize = 20;

/// The most bytes of an encoded tenant: `tenant=` and it fill one component.
pub const MAX_TENANT_BYTES: usize = MAX_COMPONENT_BYTES - "tenant=".len();

/// The most bytes of an encoded queue: `queue=` and it fill one component.
pub const MAX_QUEUE_BYTES: usize = MAX_COMPONENT_BYTES - "queue=".len();

/// The most bytes of an encoded partition in a per-partition object's file name
/// `w-<k>-<tStart>-<tEnd>-p-<partition>-<first>-<last>.<ext>`, with every number at its widest
/// (20 digits) and the longest extension, so the rule depends on the name alone.
pub const MAX_PARTITION_BYTES: usize =
    MAX_COMPONENT_BYTES - ("w----p---.".len() + 5 * U64_DIGITS + MAX_EXT_BYTES);

/// The tenant written for the default tenant's queues.
pub use crate::tenant::DEFAULT_TENANT;

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
        let plain =
            b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-') || (b == b'.' && !dots_only);
        if plain {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// [`encode`] when the encoding fits in `max` bytes; otherwise the longest prefix of the
/// encoding that ends between two characters of the name (so never inside a `%XX` or a UTF-8
/// sequence) and leaves room for the marker, then [`SHORTENED_MARKER`] and the first
/// [`HASH_HEX`] hex digits of the sha256 of the whole name. The result is at most `max` bytes
/// for every `max` of at least `HASH_HEX + 1`, the same on every node and build, and stays one
/// path segment like [`encode`]'s.
#[must_use]
pub fn encode_within(name: &str, max: usize) -> String {
    let full = encode(name);
    if full.len() <= max {
        return full;
    }
    let room = max.saturating_sub(HASH_HEX + 1);
    // Walk the encoding token by token (one plain byte or one `%XX`); a cut may go before any
    // token that does not continue a UTF-8 sequence.
    let bytes = full.as_bytes();
    let (mut at, mut cut) = (0, 0);
    while at < bytes.len() {
        let (len, continues) = if bytes[at] == b'%' {
            let hex = full
                .get(at + 1..at + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(0);
            (3, hex & 0xC0 == 0x80)
        } else {
            (1, false)
        };
        if !continues {
            cut = at;
        }
        if at + len > room {
            break;
        }
        at += len;
        if at == bytes.len() {
            cut = at;
        }
    }
    let mut out = String::with_capacity(cut + 1 + HASH_HEX);
    out.push_str(&full[..cut]);
    out.push(SHORTENED_MARKER);
    for b in &Sha256::digest(name.as_bytes())[..HASH_HEX / 2] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The tenant as its `tenant=` component carries it.
#[must_use]
pub fn encode_tenant(tenant: &str) -> String {
    encode_within(tenant, MAX_TENANT_BYTES)
}

/// The queue as its `queue=` component carries it.
#[must_use]
pub fn encode_queue(queue: &str) -> String {
    encode_within(queue, MAX_QUEUE_BYTES)
}

/// The partition as a per-partition object's file name carries it.
#[must_use]
pub fn encode_partition(partition: &str) -> String {
    encode_within(partition, MAX_PARTITION_BYTES)
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
        let mut d = format!(
            "{}/tenant={}/queue={}/dt={dt}",
            self.prefix,
            encode_tenant(self.tenant),
            encode_queue(self.queue)
        );
        if self.align != Align::Day {
            let _ = write!(d, "/hour={hour}");
        }
        d
    }

    /// The merged layout's data object.
    #[must_use]
    pub fn data(&self, ext: &str) -> String {
        format!(
            "{}/w-{:010}-{}-{}.{ext}",
            self.dir(),
            self.k,
            self.t_start.0,
            self.t_end.0
        )
    }

    /// The per-partition layout's data object for one partition.
    #[must_use]
    pub fn partition_data(&self, partition: &str, first: u64, last: u64, ext: &str) -> String {
        debug_assert!(
            ext.len() <= MAX_EXT_BYTES,
            "extension {ext} is longer than the keys are sized for"
        );
        format!(
            "{}/w-{:010}-{}-{}-p-{}-{first}-{last}.{ext}",
            self.dir(),
            self.k,
            self.t_start.0,
            self.t_end.0,
            encode_partition(partition)
        )
    }

    /// The window's manifest (under `_queen/`, which is not a Hive partition).
    #[must_use]
    pub fn manifest(&self) -> String {
        format!(
            "{}/_queen/tenant={}/queue={}/windows/{:010}.json",
            self.prefix,
            encode_tenant(self.tenant),
            encode_queue(self.queue),
            self.k
        )
    }

    /// The checkpoint written after window k.
    #[must_use]
    pub fn checkpoint(&self) -> String {
        format!(
            "{}/_queen/tenant={}/queue={}/checkpoint/{:010}.json.zst",
            self.prefix,
            encode_tenant(self.tenant),
            encode_queue(self.queue),
            self.k
        )
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
        assert_eq!(
            w.manifest(),
            "queen/_queen/tenant=00000000-0000-0000-0000-000000000001/queue=orders/windows/0000000001.json"
        );
        assert!(
            w.partition_data("cust 1", 0, 4, "parquet")
                .ends_with("-p-cust%201-0-4.parquet")
        );
        let day = WindowKeys {
            align: Align::Day,
            ..w
        };
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

        // Every valid broker name, up to 255 bytes of any UTF-8 (CJK, emoji, dots only), gives
        // key components of at most 255 bytes and whole keys well inside S3's 1024.
        #[test]
        fn every_valid_name_fits_every_component(queue in broker_name(), partition in broker_name(), k in any::<u64>(), first in any::<u64>(), last in any::<u64>(), t in 0u64..253_402_300_799_000_000) {
            let w = WindowKeys { prefix: "queen", tenant: DEFAULT_TENANT, queue: &queue, k, t_start: Stamp(t), t_end: Stamp(u64::MAX), align: Align::Hour };
            for key in [w.data("jsonl.zst"), w.partition_data(&partition, first, last, "jsonl.zst"), w.partition_data(&partition, first, last, &"x".repeat(MAX_EXT_BYTES)), w.manifest(), w.checkpoint()] {
                prop_assert!(key.len() <= 900, "{} bytes: {key}", key.len());
                for c in key.split('/') {
                    prop_assert!(c.len() <= MAX_COMPONENT_BYTES, "component of {} bytes in {key}", c.len());
                    prop_assert!(!c.is_empty() && c != "." && c != "..");
                }
            }
            for e in [encode_queue(&queue), encode_partition(&partition)] {
                prop_assert!(e.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'%' | b'~')));
            }
        }

        // A name that fits is encoded exactly as before (no existing key moves); one that does
        // not is shortened, and a shortened form never equals a whole one.
        #[test]
        fn short_names_keep_their_encoding(name in broker_name()) {
            for (max, e) in [(MAX_QUEUE_BYTES, encode_queue(&name)), (MAX_PARTITION_BYTES, encode_partition(&name)), (MAX_TENANT_BYTES, encode_tenant(&name))] {
                let whole = encode(&name);
                if whole.len() <= max {
                    prop_assert_eq!(e, whole);
                } else {
                    prop_assert!(e.len() <= max && e.contains(SHORTENED_MARKER));
                    let (head, hash) = e.split_once(SHORTENED_MARKER).unwrap_or_default();
                    prop_assert!(whole.starts_with(head));
                    prop_assert_eq!(hash.len(), HASH_HEX);
                }
            }
        }

        // Distinct names give distinct components, also when both are long and share their
        // first 250 bytes.
        #[test]
        fn shortened_names_stay_distinct(stem in "[a-z\u{4e00}-\u{9fff}]{60,84}", a in "[a-z\u{4e00}-\u{9fff}]{1,2}", b in "[a-z\u{4e00}-\u{9fff}]{1,2}") {
            prop_assume!(a != b);
            let (x, y) = (format!("{stem}{a}"), format!("{stem}{b}"));
            prop_assert_ne!(encode_queue(&x), encode_queue(&y));
            prop_assert_ne!(encode_partition(&x), encode_partition(&y));
        }

        #[test]
        fn distinct_names_give_distinct_components(a in broker_name(), b in broker_name()) {
            prop_assume!(a != b);
            prop_assert_ne!(encode_queue(&a), encode_queue(&b));
            prop_assert_ne!(encode_partition(&a), encode_partition(&b));
        }
    }

    /// Names the broker accepts (`names.rs`): 1..=255 bytes, no `/ ? # %`, no control
    /// characters; weighted towards long and multi-byte ones.
    fn broker_name() -> impl Strategy<Value = String> {
        let valid = |s: &String| !s.is_empty() && crate::names::QueueName::new(s.clone()).is_ok();
        prop_oneof![
            "[^/?#%\\p{Cc}]{1,60}",
            "[^/?#%\\p{Cc}]{60,255}",
            "[a-zA-Z0-9._-]{200,255}",
            "[\u{4e00}-\u{9fff}]{40,85}",
            "[\u{1F600}-\u{1F64F}]{30,63}",
            "\\.{1,255}",
        ]
        .prop_map(|s: String| {
            // Cut to 255 bytes on a character boundary.
            let mut end = s.len().min(crate::names::MAX_NAME_BYTES);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_owned()
        })
        .prop_filter("a valid broker name", valid)
    }

    #[test]
    fn the_probes_names_fit() {
        let cjk = "漢".repeat(85);
        assert_eq!(encode(&cjk).len(), 765);
        let q = encode_queue(&cjk);
        assert!(q.len() <= MAX_QUEUE_BYTES && q.contains('~'), "{q}");
        // Cut between characters: the head decodes to whole characters.
        let head = q.split_once('~').map(|(h, _)| h).unwrap_or_default();
        assert_eq!(head.len() % 9, 0, "{head}");
        let long = "q".repeat(255);
        assert_eq!(encode_queue(&long).len(), MAX_QUEUE_BYTES);
        assert_eq!(
            encode_queue(&"q".repeat(MAX_QUEUE_BYTES)),
            "q".repeat(MAX_QUEUE_BYTES),
            "a name that fits is whole"
        );
        let p = "p".repeat(200);
        let w = WindowKeys {
            prefix: "queen",
            tenant: DEFAULT_TENANT,
            queue: &long,
            k: 1,
            t_start: Stamp(0),
            t_end: Stamp(1),
            align: Align::Hour,
        };
        for key in [
            w.partition_data(&p, 0, 9, "parquet"),
            w.data("jsonl.zst"),
            w.manifest(),
            w.checkpoint(),
        ] {
            assert!(
                key.split('/').all(|c| c.len() <= MAX_COMPONENT_BYTES),
                "{key}"
            );
        }
    }

    #[test]
    fn the_documents_shortening_example() {
        // docs/s3-sink.md shows this one; sha256 makes it the same on every node and build.
        let e = encode_queue(&"漢".repeat(85));
        assert_eq!(e, format!("{}~cb229c01fc5104b3", "%E6%BC%A2".repeat(25)));
        assert_eq!(e.len(), 242);
        assert_eq!(encode_queue("orders"), "orders");
    }
}
