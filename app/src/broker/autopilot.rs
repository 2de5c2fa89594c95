//! The pop autopilot's wiring (contract 2.0.7): before an `autopilot=true` pop, the knobs the
//! client left out are chosen by `queen_domain::autopilot` from the queue record's counters
//! (one read, no partition walked) and this consumer's recent pops; after it, what it found is
//! remembered and echoed. The memory is node-local and advisory (a lost entry only costs one
//! pop sized from the queue alone), so it is not replicated, and it is bounded whatever the
//! number of consumers: two generations of at most [`GENERATION`] entries, each forgotten
//! [`FORGET_AFTER`] after its consumer's last pop.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use queen_domain::autopilot::{self, Backlog, Choice, History, LastPop};
use queen_domain::command::PopOutcome;
use queen_ports::{AutopilotEcho, BrokerError, PopRequest};

use super::Broker;

/// Consumers one generation holds; when it is full it becomes the old one and the old one is
/// dropped, so at most twice this many are remembered.
const GENERATION: usize = 4_096;
/// A consumer not seen for this long starts afresh (its pops were long ago).
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// Each consumer's recent pops of a queue, keyed by queue, group and consumer.
#[derive(Default)]
pub(super) struct Memory {
    generations: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    young: HashMap<String, (History, Instant)>,
    old: HashMap<String, (History, Instant)>,
}

impl Memory {
    fn recall(&self, key: &str, now: Instant) -> History {
        let g = self
            .generations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.young
            .get(key)
            .or_else(|| g.old.get(key))
            .filter(|(_, seen)| now.saturating_duration_since(*seen) < FORGET_AFTER)
            .map(|(h, _)| *h)
            .unwrap_or_default()
    }

    fn keep(&self, key: String, history: History, now: Instant) {
        let mut g = self
            .generations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.old.remove(&key);
        if g.young.len() >= GENERATION && !g.young.contains_key(&key) {
            g.old = std::mem::take(&mut g.young);
        }
        g.young.insert(key, (history, now));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let g = self.generations.lock().unwrap();
        g.young.len() + g.old.len()
    }
}

/// One autopilot pop between its choice and its answer.
pub(super) struct Plan {
    key: String,
    history: History,
    choice: Choice,
    wildcard: bool,
}

impl Broker {
    /// Choose the knobs `req` left to the broker and write them into it; `None` when the pop
    /// did not engage the autopilot. `scope` names what the consumer pops (the queue, or the
    /// tags of a pop by namespace or task); `backlog` reads the queue's counters.
    pub(super) fn autopilot_plan(
        &self,
        req: &mut PopRequest,
        scope: &str,
        backlog: bool,
    ) -> Result<Option<Plan>, BrokerError> {
        let Some(ask) = req.autopilot.take() else {
            return Ok(None);
        };
        let backlog = if backlog {
            queen_domain::reads::queue(&*self.state.view(), req.command.queue.as_str())
                .map_err(|e| Self::read_error(&e))?
                .map(|q| Backlog {
                    messages: q.messages,
                    partitions: q.partitions,
                })
        } else {
            None
        };
        let key = format!(
            "{scope}\u{1f}{}\u{1f}{}",
            req.command.group.as_str(),
            ask.consumer
        );
        let history = self.autopilot.recall(&key, Instant::now());
        let wildcard = req.command.partition.is_none();
        let choice = autopilot::choose(backlog, history, ask.set, wildcard);
        req.command.batch = choice.batch;
        req.command.max_partitions = choice.partitions;
        if let Some(ms) = choice.hold_ms {
            req.wait = true;
            req.timeout = req.timeout.min(Duration::from_millis(u64::from(ms)));
        }
        Ok(Some(Plan {
            key,
            history,
            choice,
            wildcard,
        }))
    }

    /// Remember what the planned pop found; the echo of its answer.
    pub(super) fn autopilot_done(&self, plan: Plan, out: &PopOutcome) -> AutopilotEcho {
        let delivered: usize = out.claims.iter().map(|c| c.messages.len()).sum();
        let found = LastPop {
            width: plan.choice.partitions,
            batch: plan.choice.batch,
            claimed: u32::try_from(out.claims.len()).unwrap_or(u32::MAX),
            delivered: u32::try_from(delivered).unwrap_or(u32::MAX),
        };
        let history = plan.history.after(found, plan.wildcard);
        self.autopilot.keep(plan.key, history, Instant::now());
        AutopilotEcho {
            partitions: plan.choice.partitions,
            batch: plan.choice.batch,
            wait_ms: history.wait_advice_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_is_bounded_and_forgets_the_idle() {
        let m = Memory::default();
        let t0 = Instant::now();
        let streak = History {
            empty_streak: 3,
            last: None,
        };
        m.keep("a".to_owned(), streak, t0);
        assert_eq!(m.recall("a", t0 + Duration::from_secs(1)), streak);
        assert_eq!(m.recall("a", t0 + FORGET_AFTER), History::default());
        for i in 0..5 * GENERATION {
            m.keep(format!("c{i}"), streak, t0);
            assert!(m.len() <= 2 * GENERATION);
        }
        // The most recent consumers are still known; the first ones were dropped.
        assert_eq!(m.recall(&format!("c{}", 5 * GENERATION - 1), t0), streak);
        assert_eq!(m.recall("c0", t0), History::default());
    }
}
