//! A node-local filter over the dedup index: most pushes carry a transactionId never seen
//! before, and telling that from the engine costs a memtable and table lookup per message (a
//! fifth of a node's CPU under batch pushes, measured with `perf`). The filter answers "surely
//! absent" from memory for nearly all of them; "maybe present" falls through to the engine.
//!
//! A blocked bloom filter of fixed size (16 MiB of 64-byte blocks; a key's five probes all fall
//! in one block, so each check costs one cache miss, not five; the block and the probes come
//! from the key's own SHA-256 bytes), so memory does not grow with the backlog. It is never
//! replicated and never decides an outcome: it only skips reads whose answer is known, so every
//! replica still computes the same state. Rows are added before the batch that writes them
//! commits and never removed (a deleted row only costs a needless lookup); it is rebuilt from the
//! index at open and after a snapshot install. It lets through about 0.03% of absent keys with
//! 5.5 million rows added since the last rebuild, 0.2% with 8.5 million, 0.3% with 10 million,
//! 1.6% with 15 million and 4% with 20 million (1M absent keys each), and stays correct. Each key
//! let through costs a read of every dedup run, so the filter's size is what keeps a push's cost
//! flat as the stored messages grow: at 8 MiB it let through 2.5% at 8.5 million, and batch
//! pushes in the third round of `queen-bench cluster` cost 13% more CPU per message than with 16
//! (10.1 against 8.9 µs).

use std::sync::atomic::{AtomicU64, Ordering};

/// One block: a cache line of 512 bits. Every probe of a key falls in the same block, so a
/// lookup or insert touches one cache line instead of one per probe (the table is far larger
/// than the caches, so each line touched is a miss to memory).
#[repr(align(64))]
struct Block([AtomicU64; 8]);

/// Blocks of the node's filter: 2^18 blocks of 64 bytes, 16 MiB.
const BLOCKS_LOG2: u32 = 18;
/// Probes per key. Measured with 1M absent keys on the 16 MiB filter: 5 probes let through
/// 0.18% at 8.5M keys held and 4.2% at 20M, 6 probes 0.13% and 4.5%, 7 probes 0.10% and 5.1%
/// (on the earlier 8 MiB one at 8.5M: 4 probes 2.62%, 5 probes 2.46%, 6 probes 2.50%); more
/// probes only pay while the filter is sparse.
const PROBES: u64 = 5;

/// A fixed-size blocked bloom filter over dedup keys: the node's (16 MiB, [`DedupFilter::new`])
/// and the dedup index's table in memory (256 KiB, [`DedupFilter::with_blocks_log2`]).
pub(crate) struct DedupFilter {
    blocks: Box<[Block]>,
    /// The filter has `2^blocks_log2` blocks.
    blocks_log2: u32,
}

/// The (word, mask) pairs of the probes within a block: 9 bits of the seed per probe.
fn probes(seed: u64) -> impl Iterator<Item = (usize, u64)> {
    (0..PROBES).map(move |i| {
        let bit = (seed >> (i * 9)) & 511;
        ((bit >> 6) as usize, 1u64 << (bit & 63))
    })
}

impl DedupFilter {
    /// An empty filter of the node's size.
    pub(crate) fn new() -> Self {
        Self::with_blocks_log2(BLOCKS_LOG2)
    }

    /// An empty filter of `2^blocks_log2` blocks of 64 bytes (1 to 31).
    pub(crate) fn with_blocks_log2(blocks_log2: u32) -> Self {
        let blocks_log2 = blocks_log2.clamp(1, 31);
        let mut blocks = Box::<[Block]>::new_zeroed_slice(1usize << blocks_log2);
        // Before the first touch, so the pages come in as huge pages where the system allows
        // them (transparent huge pages "madvise" or "always").
        ask_for_huge_pages(
            blocks.as_mut_ptr().cast(),
            blocks.len() * size_of::<Block>(),
        );
        // SAFETY: a block is eight `AtomicU64`s, for which all-zero bytes are a valid value
        // (zero).
        #[allow(unsafe_code)]
        let blocks = unsafe { blocks.assume_init() };
        Self {
            blocks,
            blocks_log2,
        }
    }

    /// The block and the probe seed of a dedup key without its table byte (`pid | hash`,
    /// 24 bytes), from the key's own hash bytes.
    fn key_hashes(&self, key: &[u8]) -> (usize, u64) {
        let word =
            |r: std::ops::Range<usize>| u64::from_le_bytes(key[r].try_into().unwrap_or_default());
        let pid = word(0..8);
        let h1 = word(8..16) ^ pid.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let block = (h1 >> (64 - self.blocks_log2)) as usize;
        (block, word(16..24))
    }

    /// Note a dedup row key (any other key is ignored).
    pub(crate) fn insert(&self, key: &[u8]) {
        if let Some(k) = queen_domain::keys::as_dedup_key(key) {
            self.insert_key(&k);
        }
    }

    /// Note a dedup key without its table byte (`pid | hash`, 24 bytes).
    pub(crate) fn insert_key(&self, key: &[u8]) {
        let (b, seed) = self.key_hashes(key);
        let block = &self.blocks[b].0;
        for (w, m) in probes(seed) {
            block[w].fetch_or(m, Ordering::Release);
        }
    }

    /// [`DedupFilter::insert_key`] by its only owner: plain writes instead of locked ones (the
    /// dedup index's table inserts every applied message).
    pub(crate) fn insert_key_owned(&mut self, key: &[u8]) {
        let (b, seed) = self.key_hashes(key);
        let block = &mut self.blocks[b].0;
        for (w, m) in probes(seed) {
            *block[w].get_mut() |= m;
        }
    }

    /// True when `key` is a dedup row key that was never inserted (since the last clear).
    /// False means "maybe": ask the index. Any other key is never absent.
    pub(crate) fn surely_absent(&self, key: &[u8]) -> bool {
        queen_domain::keys::as_dedup_key(key).is_some_and(|k| !self.may_hold_key(&k))
    }

    /// False when the dedup key `key` (`pid | hash`) was never inserted since the last clear.
    pub(crate) fn may_hold_key(&self, key: &[u8]) -> bool {
        let (b, seed) = self.key_hashes(key);
        let block = &self.blocks[b].0;
        probes(seed).all(|(w, m)| block[w].load(Ordering::Acquire) & m != 0)
    }

    /// Start bringing the block of dedup key `key` (`pid | hash`) into the cache, so that a
    /// check of many keys one after the other waits for their misses to memory together,
    /// not one by one (the filter is far larger than the caches).
    pub(crate) fn prefetch(&self, key: &[u8]) {
        let (b, _) = self.key_hashes(key);
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let p: *const Block = &raw const self.blocks[b];
            // SAFETY: a prefetch only hints the cache; `p` points into our own allocation.
            #[allow(unsafe_code)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p.cast());
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = b;
    }

    /// Forget every key (before a rebuild).
    pub(crate) fn clear(&self) {
        for b in &self.blocks {
            for w in &b.0 {
                w.store(0, Ordering::Release);
            }
        }
    }
}

/// Ask the kernel to back the whole 2 MiB pages inside `[start, start + len)` with huge pages
/// (none for a filter smaller than two of them).
/// Every check of the filter reads a random block of 16 MiB: with 4 KiB pages nearly each one
/// also misses the TLB, which in a virtual machine costs a nested page walk. Measured with
/// `perf` on a follower under pushes, the filter's share of the samples fell by about a third
/// with huge pages. A refusal (no THP support) is harmless: the pages stay small.
#[cfg(target_os = "linux")]
fn ask_for_huge_pages(start: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let from = (start as usize).next_multiple_of(HUGE);
    let to = (start as usize + len) / HUGE * HUGE;
    if to > from {
        // SAFETY: madvise only gives the kernel a hint about pages of our own allocation,
        // `[from, to)` lies inside it, and MADV_HUGEPAGE never changes their contents.
        #[allow(unsafe_code)]
        unsafe {
            libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn ask_for_huge_pages(_start: *mut u8, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pid: u64, txn: &str) -> Vec<u8> {
        queen_domain::keys::dedup(pid, txn)
    }

    #[test]
    fn inserted_keys_are_never_absent_and_most_others_are() {
        let f = DedupFilter::new();
        for i in 0..100_000 {
            f.insert(&key(i % 7, &format!("t{i}")));
        }
        for i in 0..100_000 {
            assert!(!f.surely_absent(&key(i % 7, &format!("t{i}"))));
        }
        let absent = (0..10_000)
            .filter(|i| f.surely_absent(&key(i % 7, &format!("other{i}"))))
            .count();
        assert!(absent > 9_900, "{absent} of 10000 unseen keys found absent");
        assert!(
            !f.surely_absent(b"\x02queue"),
            "other tables always go to the engine"
        );
        f.clear();
        assert!(f.surely_absent(&key(0, "t0")));
    }
}
