//! The pop autopilot's rule (contract 2.0.7): the batch, the sweep width and the empty-pop
//! pacing a pop gets for the knobs its client left to the broker. A knob the client set is
//! used exactly as set. Pure: the queue's counters and the consumer's recent pops come in, the
//! knobs go out; the caller keeps the memory and reads the clock.
//!
//! Why these inputs: the queue record's message and partition counters are exact and cost one
//! read, so a pop never walks partitions to size itself; the counters also count messages that
//! were delivered but are still retained, so they overstate how much each partition holds,
//! and the consumer's last pop corrects that (a sweep that claimed every partition it was
//! allowed and still left budget unused was too narrow, the next one is twice as wide).

/// Most messages the autopilot asks for in one pop (the client's handler gets them as one
/// list, under one lease).
pub const MAX_BATCH: u32 = 500;
/// Fewest messages the autopilot asks for: sizing below this saves nothing.
pub const MIN_BATCH: u32 = 10;
/// The batch when nothing is known of the queue (a pop by namespace or task, a queue not
/// created yet): the broker default of clients that predate the autopilot.
pub const DEFAULT_BATCH: u32 = 200;
/// Most partitions one autopilot pop claims, so competing consumers still share a wide queue.
pub const MAX_WIDTH: u32 = 100;
/// The first `waitMs` advice after an empty pop; each further empty pop doubles it.
pub const WAIT_STEP_MS: u32 = 100;
/// The longest `waitMs` advice.
pub const MAX_WAIT_MS: u32 = 2_000;

/// The knobs the client set on this pop (`None`: left to the broker).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetKnobs {
    /// `batch`.
    pub batch: Option<u32>,
    /// `partitions`.
    pub partitions: Option<u32>,
    /// `wait`.
    pub wait: Option<bool>,
}

/// What the queue holds, from its record's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// Messages stored now (delivered ones included until retention removes them).
    pub messages: u64,
    /// Partitions created.
    pub partitions: u64,
}

impl Backlog {
    /// Messages per partition on average, rounded up, at least 1.
    fn density(self) -> u64 {
        self.messages.div_ceil(self.partitions.max(1)).max(1)
    }
}

/// One finished pop of a consumer, as the rule needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastPop {
    /// The sweep width it was allowed.
    pub width: u32,
    /// Its message budget.
    pub batch: u32,
    /// Partitions it claimed.
    pub claimed: u32,
    /// Messages it delivered.
    pub delivered: u32,
}

impl LastPop {
    /// It claimed every partition it was allowed and still left budget unused: the sweep was
    /// what limited it.
    fn too_narrow(self) -> bool {
        self.delivered > 0 && self.claimed >= self.width && self.delivered < self.batch
    }

    /// It delivered its whole budget: the width was enough.
    fn filled(self) -> bool {
        self.delivered >= self.batch
    }
}

/// A consumer's recent pops of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct History {
    /// Empty pops in a row, up to now.
    pub empty_streak: u32,
    /// The last wildcard pop, when there was one.
    pub last: Option<LastPop>,
}

impl History {
    /// The history once `pop` finished (`wildcard`: it named no partition, so its width
    /// tells something about the queue's spread).
    #[must_use]
    pub fn after(self, pop: LastPop, wildcard: bool) -> History {
        History {
            empty_streak: if pop.delivered == 0 {
                self.empty_streak.saturating_add(1)
            } else {
                0
            },
            last: if wildcard { Some(pop) } else { self.last },
        }
    }

    /// The `waitMs` advice after these pops: none (0) unless the last pops came back empty,
    /// then 100 ms doubling with each further empty pop, up to 2 s.
    #[must_use]
    pub fn wait_advice_ms(self) -> u32 {
        match self.empty_streak {
            0 => 0,
            n => WAIT_STEP_MS
                .saturating_mul(1u32 << (n - 1).min(16))
                .min(MAX_WAIT_MS),
        }
    }
}

/// What one pop uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Message budget.
    pub batch: u32,
    /// Sweep width (1 on the partition route, unless the client set it).
    pub partitions: u32,
    /// How long to hold the pop for a message when the client did not say whether to wait
    /// (`Some` after empty pops); `None`: as the client asked.
    pub hold_ms: Option<u32>,
}

/// The knobs of a pop: the client's where it set them, chosen from `backlog` (when the queue
/// is known) and `history` otherwise. `wildcard`: the pop names no partition.
#[must_use]
pub fn choose(backlog: Option<Backlog>, history: History, set: SetKnobs, wildcard: bool) -> Choice {
    let partitions = set.partitions.unwrap_or_else(|| {
        if wildcard {
            width(backlog, history, set.batch)
        } else {
            1
        }
    });
    let batch = set.batch.unwrap_or_else(|| match backlog {
        Some(b) => {
            let want = b.density().saturating_mul(u64::from(partitions));
            u32::try_from(want.min(u64::from(MAX_BATCH)))
                .unwrap_or(MAX_BATCH)
                .max(MIN_BATCH)
        }
        None => DEFAULT_BATCH,
    });
    let hold_ms = match set.wait {
        None if history.empty_streak > 0 => Some(history.wait_advice_ms()),
        _ => None,
    };
    Choice {
        batch,
        partitions,
        hold_ms,
    }
}

/// The sweep width of a wildcard pop whose client left it to the broker: as many partitions
/// as it takes to fill the budget at the queue's density, widened when the last sweep was too
/// narrow, kept when it filled its budget, within what the queue has and [`MAX_WIDTH`].
fn width(backlog: Option<Backlog>, history: History, batch: Option<u32>) -> u32 {
    let budget = u64::from(batch.unwrap_or(MAX_BATCH));
    let (from_queue, bound) = match backlog {
        Some(b) if b.partitions > 1 => {
            let bound = b.partitions.min(u64::from(MAX_WIDTH));
            (budget.div_ceil(b.density()).clamp(1, bound), bound)
        }
        Some(_) => (1, 1),
        None => (1, u64::from(MAX_WIDTH)),
    };
    let w = match history.last {
        Some(l) if l.too_narrow() => from_queue.max(u64::from(l.width) * 2),
        Some(l) if l.filled() => from_queue.max(u64::from(l.width)),
        _ => from_queue,
    };
    u32::try_from(w.clamp(1, bound)).unwrap_or(MAX_WIDTH)
}

#[cfg(test)]
mod tests;
