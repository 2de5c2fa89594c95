//! A linearizability checker for histories taken from a real cluster: the search of Wing and
//! Gong with Lowe's memo of (operations done, state), the method of Knossos and Porcupine.
//!
//! A history is a list of operations, each with the instant its request was sent and the
//! instant its answer came, or no answer at all (a timeout, a refused connection, a 5xx: the
//! operation may have taken effect at any time after it was sent, or never). The history is
//! linearizable when the operations with an answer, and any of those without, can be put in one
//! order that keeps real time (an operation answered before another was sent comes first) and
//! that a sequential `Model` accepts, answer by answer.
//!
//! The search keeps a list of the sends and answers in time order and, at each step, tries the
//! operations sent before the first outstanding answer: answered ones first, then unanswered
//! ones (which are needed only to explain what others saw). A (set done, state) pair already
//! tried is not tried again. Histories of one register are checked separately: a history is
//! linearizable exactly when each key's is (linearizability is local).

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A sequential specification.
pub trait Model {
    /// The object's state.
    type State: Clone + Eq + Hash + Debug;
    /// An operation and its arguments.
    type Input: Debug;
    /// An answer.
    type Output: Debug;
    /// The state before any operation.
    fn init(&self) -> Self::State;
    /// The state after `input` on `state`, when the object would answer `output`; `None` when
    /// it would answer something else. `output` is `None` for an operation without an answer:
    /// the step then says only what the operation would do.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: Option<&Self::Output>,
    ) -> Option<Self::State>;
}

/// One operation of a history.
#[derive(Debug, Clone)]
pub struct Op<I, O> {
    /// When its request was sent.
    pub call: Instant,
    /// When its answer came, and the answer; `None` when none came.
    pub ret: Option<(Instant, O)>,
    /// What it asked.
    pub input: I,
}

/// What the search found.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// An order exists.
    Linearizable,
    /// No order exists; the text names the operation no order could place after the longest
    /// prefix found.
    Violation(String),
    /// The search ran out of its time or memory budget.
    GaveUp(String),
}

#[derive(Clone, Copy)]
enum Entry {
    Call(usize),
    Ret(usize),
}

/// The list of sends and answers not yet linearized, linked both ways so that an entry taken
/// out can be put back where it was (in the reverse order of taking out).
struct Events {
    entries: Vec<Entry>,
    next: Vec<usize>,
    prev: Vec<usize>,
    /// For each operation, its call's and its return's positions in `entries`.
    at: Vec<(usize, Option<usize>)>,
}

/// Position 0 is the head; entries are at 1..=n; `END` ends the list.
const END: usize = usize::MAX;

impl Events {
    fn new<I, O>(ops: &[Op<I, O>]) -> Self {
        let mut order: Vec<(Instant, u8, Entry)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            order.push((op.call, 0, Entry::Call(i)));
            if let Some((t, _)) = &op.ret {
                // At the same instant a send comes before an answer: concurrent, which only
                // allows more orders.
                order.push((*t, 1, Entry::Ret(i)));
            }
        }
        order.sort_by_key(|(t, k, _)| (*t, *k));
        let n = order.len();
        let mut entries = vec![Entry::Call(0)];
        let mut at = vec![(0, None); ops.len()];
        for (pos, (_, _, e)) in order.into_iter().enumerate() {
            match e {
                Entry::Call(i) => at[i].0 = pos + 1,
                Entry::Ret(i) => at[i].1 = Some(pos + 1),
            }
            entries.push(e);
        }
        let next = (0..=n).map(|p| if p == n { END } else { p + 1 }).collect();
        let prev = (0..=n).map(|p| p.saturating_sub(1)).collect();
        Self {
            entries,
            next,
            prev,
            at,
        }
    }

    fn unlink(&mut self, p: usize) {
        let (a, b) = (self.prev[p], self.next[p]);
        self.next[a] = b;
        if b != END {
            self.prev[b] = a;
        }
    }

    fn relink(&mut self, p: usize) {
        let (a, b) = (self.prev[p], self.next[p]);
        self.next[a] = p;
        if b != END {
            self.prev[b] = p;
        }
    }

    /// Takes operation `i` out of the list.
    fn lift(&mut self, i: usize) {
        let (c, r) = self.at[i];
        self.unlink(c);
        if let Some(r) = r {
            self.unlink(r);
        }
    }

    /// Puts operation `i` back.
    fn unlift(&mut self, i: usize) {
        let (c, r) = self.at[i];
        if let Some(r) = r {
            self.relink(r);
        }
        self.relink(c);
    }

    /// The operations that may come next: those sent before the first outstanding answer,
    /// answered ones first.
    fn candidates(&self) -> Vec<usize> {
        let (mut answered, mut open) = (Vec::new(), Vec::new());
        let mut p = self.next[0];
        while p != END {
            match self.entries[p] {
                Entry::Ret(_) => break,
                Entry::Call(i) => {
                    if self.at[i].1.is_some() {
                        answered.push(i);
                    } else {
                        open.push(i);
                    }
                }
            }
            p = self.next[p];
        }
        answered.extend(open);
        answered
    }
}

struct Frame<S> {
    state: S,
    candidates: Vec<usize>,
    tried: usize,
    chosen: Option<usize>,
}

/// The set of operations linearized so far, as bits.
fn with_bit(bits: &[u64], i: usize) -> Vec<u64> {
    let mut b = bits.to_vec();
    b[i / 64] |= 1 << (i % 64);
    b
}

/// Checks one history against `model`, within `budget` of time and `max_memo` remembered
/// (set, state) pairs.
pub fn check<M: Model>(
    model: &M,
    ops: &[Op<M::Input, M::Output>],
    budget: Duration,
    max_memo: usize,
) -> Verdict {
    let answered = ops.iter().filter(|o| o.ret.is_some()).count();
    if answered == 0 {
        return Verdict::Linearizable;
    }
    let started = Instant::now();
    let mut events = Events::new(ops);
    let mut memo: HashSet<(Vec<u64>, M::State)> = HashSet::new();
    let mut bits = vec![0_u64; ops.len().div_ceil(64)];
    let mut done = 0_usize;
    let mut stack = vec![Frame {
        state: model.init(),
        candidates: events.candidates(),
        tried: 0,
        chosen: None,
    }];
    // The deepest point reached, for the report: how many done, and what blocked there.
    let mut deepest = (0_usize, String::new());
    let mut steps = 0_u64;
    while let Some(top) = stack.last_mut() {
        steps += 1;
        if steps.is_multiple_of(4096) && started.elapsed() > budget {
            return Verdict::GaveUp(format!(
                "no answer within {budget:?} ({} pairs remembered, {done} of {answered} answered operations placed)",
                memo.len()
            ));
        }
        if let Some(i) = top.chosen.take() {
            events.unlift(i);
            bits[i / 64] &= !(1 << (i % 64));
            if ops[i].ret.is_some() {
                done -= 1;
            }
        }
        let mut next = None;
        while top.tried < top.candidates.len() {
            let i = top.candidates[top.tried];
            top.tried += 1;
            let op = &ops[i];
            let Some(s) = model.step(&top.state, &op.input, op.ret.as_ref().map(|(_, o)| o)) else {
                continue;
            };
            if memo.insert((with_bit(&bits, i), s.clone())) {
                next = Some((i, s));
                break;
            }
        }
        let Some((i, state)) = next else {
            if done >= deepest.0 {
                let first_answer = events
                    .candidates()
                    .into_iter()
                    .find_map(|i| ops[i].ret.as_ref().map(|(_, o)| (i, o)))
                    .map_or_else(String::new, |(i, o)| {
                        format!("{:?} answered {o:?}", ops[i].input)
                    });
                deepest = (
                    done,
                    format!("in state {:?}, nothing fits: {first_answer}", top.state),
                );
            }
            stack.pop();
            continue;
        };
        if memo.len() > max_memo {
            return Verdict::GaveUp(format!(
                "more than {max_memo} pairs remembered ({done} of {answered} answered operations placed)"
            ));
        }
        top.chosen = Some(i);
        events.lift(i);
        bits[i / 64] |= 1 << (i % 64);
        if ops[i].ret.is_some() {
            done += 1;
        }
        if done == answered {
            return Verdict::Linearizable;
        }
        stack.push(Frame {
            state,
            candidates: events.candidates(),
            tried: 0,
            chosen: None,
        });
    }
    Verdict::Violation(format!(
        "{} of {answered} answered operations placed at most; then {}",
        deepest.0, deepest.1
    ))
}

/// A key-value register as queen's KV serves one key: values are unique numbers.
#[derive(Debug, Clone, Copy)]
pub enum KvInput {
    /// `get`.
    Get,
    /// `put` without `expect` (upsert).
    Put(i64),
    /// `putIfAbsent`.
    PutIfAbsent(i64),
    /// `put` with `expect` set to the version that holds `expect` (read just before).
    Cas {
        /// The value at the expected version.
        expect: i64,
        /// The value written.
        value: i64,
    },
    /// `delete` with `expect` set to the version that holds `expect` (read just before).
    Delete {
        /// The value at the expected version.
        expect: i64,
    },
}

impl KvInput {
    /// The value this operation writes, if it writes one.
    fn writes(&self) -> Option<i64> {
        match *self {
            Self::Put(v) | Self::PutIfAbsent(v) | Self::Cas { value: v, .. } => Some(v),
            Self::Get | Self::Delete { .. } => None,
        }
    }

    /// The value this operation expects to find, if it names one.
    fn expects(&self) -> Option<i64> {
        match *self {
            Self::Cas { expect, .. } | Self::Delete { expect } => Some(expect),
            _ => None,
        }
    }
}

/// Leaves out the unanswered writes of values that no operation saw or expected.
///
/// Each unanswered operation may be placed anywhere after it was sent, so every one of them
/// doubles the orders to try. One whose value nobody saw is never needed: in this model only a
/// read, a refusal (which names the current value) or a compare-and-set or delete that expects
/// a value can tell a state apart, and each of those names its value, so a state holding an
/// unseen value explains nothing that the state before it does not (there is no unconditional
/// delete, which would accept any value). Leaving such a write out therefore changes no verdict.
#[must_use]
pub fn kv_without_unseen_writes(ops: Vec<Op<KvInput, KvOutput>>) -> Vec<Op<KvInput, KvOutput>> {
    let mut seen = HashSet::new();
    for op in &ops {
        seen.extend(op.input.expects());
        match op.ret {
            Some((_, KvOutput::Read(v) | KvOutput::Refused(v))) => seen.extend(v),
            Some((_, KvOutput::Applied)) => seen.extend(op.input.writes()),
            None => {}
        }
    }
    ops.into_iter()
        .filter(|op| op.ret.is_some() || op.input.writes().is_none_or(|v| seen.contains(&v)))
        .collect()
}

/// An answer of the KV register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvOutput {
    /// A `get`: the value found, if any.
    Read(Option<i64>),
    /// A write: applied, or not with the current value.
    Applied,
    /// A write not applied, and the value the answer said was current.
    Refused(Option<i64>),
}

/// The model of one KV key.
pub struct KvRegister;

impl Model for KvRegister {
    type State = Option<i64>;
    type Input = KvInput;
    type Output = KvOutput;

    fn init(&self) -> Option<i64> {
        None
    }

    fn step(
        &self,
        s: &Option<i64>,
        input: &KvInput,
        out: Option<&KvOutput>,
    ) -> Option<Option<i64>> {
        // What the register does and answers in state `s`.
        let (next, answer) = match *input {
            KvInput::Get => (*s, KvOutput::Read(*s)),
            KvInput::Put(v) => (Some(v), KvOutput::Applied),
            KvInput::PutIfAbsent(v) => match s {
                None => (Some(v), KvOutput::Applied),
                Some(_) => (*s, KvOutput::Refused(*s)),
            },
            KvInput::Cas { expect, value } => {
                if *s == Some(expect) {
                    (Some(value), KvOutput::Applied)
                } else {
                    (*s, KvOutput::Refused(*s))
                }
            }
            KvInput::Delete { expect } => {
                if *s == Some(expect) {
                    (None, KvOutput::Applied)
                } else {
                    (*s, KvOutput::Refused(*s))
                }
            }
        };
        match out {
            None => Some(next),
            Some(o) if *o == answer => Some(next),
            Some(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        KvInput as I, KvOutput as O, KvRegister, Op, Verdict, check, kv_without_unseen_writes,
    };
    use std::time::{Duration, Instant};

    /// An operation sent at `a` and answered at `b` (in ms from `t0`), or never when `b` is
    /// `None`.
    fn op(t0: Instant, a: u64, b: Option<u64>, input: I, out: O) -> Op<I, O> {
        Op {
            call: t0 + Duration::from_millis(a),
            ret: b.map(|b| (t0 + Duration::from_millis(b), out)),
            input,
        }
    }

    fn verdict(ops: &[Op<I, O>]) -> Verdict {
        let ops = kv_without_unseen_writes(ops.to_vec());
        check(&KvRegister, &ops, Duration::from_secs(5), 1_000_000)
    }

    #[test]
    fn a_read_after_a_write_sees_it() {
        let t = Instant::now();
        let ok = [
            op(t, 0, Some(10), I::Put(1), O::Applied),
            op(t, 20, Some(30), I::Get, O::Read(Some(1))),
        ];
        assert_eq!(verdict(&ok), Verdict::Linearizable);
        let stale = [
            op(t, 0, Some(10), I::Put(1), O::Applied),
            op(t, 20, Some(30), I::Get, O::Read(None)),
        ];
        assert!(matches!(verdict(&stale), Verdict::Violation(_)));
    }

    #[test]
    fn a_read_concurrent_with_a_write_may_see_either() {
        let t = Instant::now();
        for seen in [None, Some(1)] {
            let h = [
                op(t, 0, Some(30), I::Put(1), O::Applied),
                op(t, 10, Some(20), I::Get, O::Read(seen)),
            ];
            assert_eq!(verdict(&h), Verdict::Linearizable, "{seen:?}");
        }
    }

    #[test]
    fn reads_never_go_back_in_time() {
        let t = Instant::now();
        // Both writes concurrent with both reads, but the reads are ordered: once one read
        // saw 2 (the later write), a later read cannot see 1.
        let h = [
            op(t, 0, Some(100), I::Put(1), O::Applied),
            op(t, 5, Some(100), I::Put(2), O::Applied),
            op(t, 10, Some(20), I::Get, O::Read(Some(1))),
            op(t, 30, Some(40), I::Get, O::Read(Some(2))),
            op(t, 50, Some(60), I::Get, O::Read(Some(1))),
        ];
        assert!(matches!(verdict(&h), Verdict::Violation(_)));
        let fine = [
            op(t, 0, Some(100), I::Put(1), O::Applied),
            op(t, 5, Some(100), I::Put(2), O::Applied),
            op(t, 10, Some(20), I::Get, O::Read(Some(1))),
            op(t, 30, Some(40), I::Get, O::Read(Some(2))),
            op(t, 50, Some(60), I::Get, O::Read(Some(2))),
        ];
        assert_eq!(verdict(&fine), Verdict::Linearizable);
    }

    #[test]
    fn an_unanswered_write_may_have_happened_or_not() {
        let t = Instant::now();
        let seen = [
            op(t, 0, None, I::Put(7), O::Applied),
            op(t, 50, Some(60), I::Get, O::Read(Some(7))),
        ];
        assert_eq!(verdict(&seen), Verdict::Linearizable);
        let unseen = [
            op(t, 0, None, I::Put(7), O::Applied),
            op(t, 50, Some(60), I::Get, O::Read(None)),
        ];
        assert_eq!(verdict(&unseen), Verdict::Linearizable);
        // But not before it was sent.
        let early = [
            op(t, 0, Some(10), I::Get, O::Read(Some(7))),
            op(t, 20, None, I::Put(7), O::Applied),
        ];
        assert!(matches!(verdict(&early), Verdict::Violation(_)));
        // And once seen, it cannot be undone: a later read of nothing needs a delete.
        let undone = [
            op(t, 0, None, I::Put(7), O::Applied),
            op(t, 50, Some(60), I::Get, O::Read(Some(7))),
            op(t, 70, Some(80), I::Get, O::Read(None)),
        ];
        assert!(matches!(verdict(&undone), Verdict::Violation(_)));
    }

    #[test]
    fn two_creations_of_one_key_need_a_delete_between() {
        let t = Instant::now();
        let twice = [
            op(t, 0, Some(50), I::PutIfAbsent(1), O::Applied),
            op(t, 10, Some(60), I::PutIfAbsent(2), O::Applied),
        ];
        assert!(matches!(verdict(&twice), Verdict::Violation(_)));
        let deleted = [
            op(t, 0, Some(50), I::PutIfAbsent(1), O::Applied),
            op(t, 10, Some(60), I::PutIfAbsent(2), O::Applied),
            op(t, 5, None, I::Delete { expect: 1 }, O::Applied),
        ];
        assert_eq!(verdict(&deleted), Verdict::Linearizable);
        let refused = [
            op(t, 0, Some(10), I::PutIfAbsent(1), O::Applied),
            op(t, 20, Some(30), I::PutIfAbsent(2), O::Refused(Some(1))),
        ];
        assert_eq!(verdict(&refused), Verdict::Linearizable);
        // A refusal must name the value that is there.
        let wrong = [
            op(t, 0, Some(10), I::PutIfAbsent(1), O::Applied),
            op(t, 20, Some(30), I::PutIfAbsent(2), O::Refused(Some(3))),
        ];
        assert!(matches!(verdict(&wrong), Verdict::Violation(_)));
    }

    #[test]
    fn only_unanswered_writes_that_someone_saw_are_kept() {
        let t = Instant::now();
        let h = vec![
            op(t, 0, None, I::Put(1), O::Applied),
            op(t, 0, None, I::Put(2), O::Applied),
            op(t, 0, None, I::Put(3), O::Applied),
            op(t, 0, None, I::Get, O::Read(None)),
            op(t, 10, Some(20), I::Get, O::Read(Some(1))),
            op(
                t,
                30,
                Some(40),
                I::Cas {
                    expect: 2,
                    value: 4,
                },
                O::Refused(Some(1)),
            ),
        ];
        let kept: Vec<_> = kv_without_unseen_writes(h)
            .iter()
            .map(|o| o.input.writes())
            .collect();
        assert_eq!(kept, [Some(1), Some(2), None, None, Some(4)]);
    }

    #[test]
    fn two_compare_and_sets_from_one_version_cannot_both_win() {
        let t = Instant::now();
        let cas = |expect, value| I::Cas { expect, value };
        // A write of 1, then two compare-and-sets from it, the second answered `second`.
        let race = |second| {
            vec![
                op(t, 0, Some(10), I::Put(1), O::Applied),
                op(t, 20, Some(50), cas(1, 2), O::Applied),
                op(t, 25, Some(55), cas(1, 3), second),
            ]
        };
        assert!(matches!(verdict(&race(O::Applied)), Verdict::Violation(_)));
        let mut one = race(O::Refused(Some(2)));
        one.push(op(t, 60, Some(70), I::Get, O::Read(Some(2))));
        assert_eq!(verdict(&one), Verdict::Linearizable);
    }

    #[test]
    fn a_long_history_of_sequential_rounds_is_checked_quickly() {
        // 3 clients, 2,000 rounds of overlapping writes and reads, plus unanswered writes.
        let t = Instant::now();
        let mut h = Vec::new();
        let mut last = None;
        for r in 0..2000_u64 {
            let base = r * 100;
            let v = i64::try_from(r).unwrap();
            h.push(op(t, base, Some(base + 50), I::Put(v), O::Applied));
            h.push(op(t, base + 10, Some(base + 40), I::Get, O::Read(last)));
            if r % 50 == 0 {
                h.push(op(t, base + 5, None, I::Put(-v - 1), O::Applied));
                // An unanswered write that nobody saw must not be needed; the read after
                // the round sees the answered one.
            }
            h.push(op(t, base + 60, Some(base + 70), I::Get, O::Read(Some(v))));
            last = Some(v);
        }
        let started = Instant::now();
        assert_eq!(verdict(&h), Verdict::Linearizable);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
