//! The in-memory table of recent keys: inserts, lookups, and handing its entries over sorted
//! when it is flushed to a run.

use super::{Ent, Key, MemTable, ent, key_of};

impl MemTable {
    pub(super) const CHUNK: usize = 2048;

    /// Words of the table's bloom filter (2^21 bits).
    const FILTER_WORDS: usize = 1 << 15;

    /// The bit positions of an entry's key in the table's filter. The key's words are SHA-256
    /// output; they are mixed with the partition so that each probe uses different bits than
    /// the node's filter does.
    fn probes(e: &Ent) -> [usize; 3] {
        let x = (e[1] ^ e[2].rotate_left(32) ^ e[0].wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        let mask = (Self::FILTER_WORDS as u64 * 64) - 1;
        [
            (x >> 43) as usize,
            ((x >> 22) & mask) as usize,
            ((x >> 1) & mask) as usize,
        ]
    }

    fn remember(&mut self, e: &Ent) {
        if self.bits.is_empty() {
            self.bits = vec![0; Self::FILTER_WORDS];
        }
        for p in Self::probes(e) {
            self.bits[p / 64] |= 1 << (p % 64);
        }
    }

    pub(super) fn may_hold(&self, e: &Ent) -> bool {
        !self.bits.is_empty()
            && Self::probes(e)
                .iter()
                .all(|&p| self.bits[p / 64] & (1 << (p % 64)) != 0)
    }

    pub(super) fn insert(&mut self, key: &Key, offset: u64) {
        let e = ent(key, offset);
        self.remember(&e);
        self.tail.push(e);
        self.len += 1;
        if self.tail.len() >= Self::CHUNK {
            let mut chunk = std::mem::replace(&mut self.tail, Vec::with_capacity(Self::CHUNK));
            chunk.sort_unstable();
            self.chunks.push(chunk);
        }
    }

    /// The offsets under `key`, in no order, possibly repeated.
    pub(super) fn lookup(&self, key: &Key, out: &mut Vec<u64>) {
        let k = ent(key, 0);
        if !self.may_hold(&k) {
            return;
        }
        let same = |e: &Ent| e[..3] == k[..3];
        for c in &self.chunks {
            let at = c.partition_point(|e| e[..3] < k[..3]);
            out.extend(c[at..].iter().take_while(|e| same(e)).map(|e| e[3]));
        }
        out.extend(self.tail.iter().filter(|e| same(e)).map(|e| e[3]));
    }

    /// Every entry, sorted, without repeats; the table is left empty.
    pub(super) fn take_sorted(&mut self) -> Vec<Ent> {
        let mut all = Vec::with_capacity(self.len);
        for c in self.chunks.drain(..) {
            all.extend(c);
        }
        all.append(&mut self.tail);
        self.len = 0;
        self.bits.fill(0);
        // A stable sort finds the sorted chunks and merges them.
        all.sort();
        all.dedup();
        all
    }

    /// Put back what [`MemTable::take_sorted`] took (a run could not be written).
    pub(super) fn restore(&mut self, sorted: Vec<Ent>) {
        for e in &sorted {
            self.remember(e);
        }
        self.len += sorted.len();
        self.chunks.push(sorted);
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.chunks.iter().flatten().chain(&self.tail).map(key_of)
    }
}
