//! Merging sorted lists of entries into one sorted list: a tournament of losers.
//!
//! Writing a table out merges its sorted chunks, and a merge of runs merges [`super::FANOUT`]
//! of them. A binary heap costs about two comparisons per level on each pop and again on each
//! push; a tree of losers keeps, at each inner node, the list that lost the match there, and
//! taking the winner and replaying its leaf's path to the root is one comparison per level.
//! (With 64 chunks the heap's cost was not the comparisons but the cache misses of reading 64
//! lists at once; see [`super::MemTable::CHUNK`].)

use super::Ent;

/// The next entry of each list and whether it has one.
pub(super) struct Losers<I: Iterator<Item = Ent>> {
    lists: Vec<I>,
    heads: Vec<Ent>,
    live: Vec<bool>,
    /// `tree[n]` for an inner node `n` (1 to k - 1) is the list that lost there; `tree[0]` is
    /// the winner. Leaf `i` is node `k + i`, and node `n`'s parent is `n / 2`.
    tree: Vec<usize>,
}

impl<I: Iterator<Item = Ent>> Losers<I> {
    pub(super) fn new(mut lists: Vec<I>) -> Self {
        let k = lists.len();
        let mut heads = Vec::with_capacity(k);
        let mut live = Vec::with_capacity(k);
        for l in &mut lists {
            let head = l.next();
            live.push(head.is_some());
            heads.push(head.unwrap_or_default());
        }
        let mut me = Self {
            lists,
            heads,
            live,
            tree: vec![0; k.max(1)],
        };
        if k > 0 {
            me.tree[0] = me.build(1);
        }
        me
    }

    /// The lists, for what they hold after the merge (a read error).
    pub(super) fn lists_mut(&mut self) -> &mut [I] {
        &mut self.lists
    }

    /// Whether list `a`'s head comes before list `b`'s (a list with none left comes last;
    /// equal heads in list order).
    fn before(&self, a: usize, b: usize) -> bool {
        match (self.live[a], self.live[b]) {
            (true, true) => (self.heads[a], a) < (self.heads[b], b),
            (true, false) => true,
            (false, true) => false,
            (false, false) => a < b,
        }
    }

    /// Play the matches below node `n`; its winner.
    fn build(&mut self, n: usize) -> usize {
        let k = self.lists.len();
        if n >= k {
            return n - k;
        }
        let (a, b) = (self.build(2 * n), self.build(2 * n + 1));
        let (win, lose) = if self.before(a, b) { (a, b) } else { (b, a) };
        self.tree[n] = lose;
        win
    }
}

impl<I: Iterator<Item = Ent>> Iterator for Losers<I> {
    type Item = Ent;

    fn next(&mut self) -> Option<Ent> {
        let k = self.lists.len();
        if k == 0 {
            return None;
        }
        let w = self.tree[0];
        if !self.live[w] {
            return None;
        }
        let out = self.heads[w];
        match self.lists[w].next() {
            Some(e) => self.heads[w] = e,
            None => self.live[w] = false,
        }
        // Replay the winner's path: at each node the one that comes first goes on.
        let mut win = w;
        let mut n = (k + w) / 2;
        while n > 0 {
            if self.before(self.tree[n], win) {
                std::mem::swap(&mut self.tree[n], &mut win);
            }
            n /= 2;
        }
        self.tree[0] = win;
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(lists: Vec<Vec<Ent>>) {
        let mut want: Vec<Ent> = lists.iter().flatten().copied().collect();
        want.sort_unstable();
        let got: Vec<Ent> = Losers::new(lists.into_iter().map(Vec::into_iter).collect()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn merges_any_number_of_lists_of_any_length() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        check(Vec::new());
        check(vec![Vec::new()]);
        for k in 1..=70 {
            let lists = (0..k)
                .map(|_| {
                    let n = (rnd() % 40) as usize;
                    let mut l: Vec<Ent> = (0..n)
                        // Few distinct values, so that equal heads meet.
                        .map(|_| [rnd() % 3, rnd() % 5, rnd() % 7, rnd() % 2])
                        .collect();
                    l.sort_unstable();
                    l
                })
                .collect();
            check(lists);
        }
    }
}
