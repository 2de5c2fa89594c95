//! Encrypted queues: payloads of queues with `encryptionEnabled` are sealed here, on the node
//! that takes the request and before anything is proposed, so the raft log, the store, its
//! snapshots and the lake's inputs hold only the sealed envelope; and opened here when they
//! leave the node (pops; `fetch` and dead letters through `ClientApi::open_payload`; the S3
//! sink through `Broker::cipher`).
//!
//! A node without `QUEEN_ENCRYPTION_KEY` refuses to store a payload for a flagged queue (409
//! `encryption_required`) instead of storing it in the clear, and refuses to turn the flag on.
//! Whether a queue is flagged is read from this node's applied state when the request arrives:
//! a push that races the configure turning the flag on may be stored as it came. What was read
//! is kept while the store's queue-options epoch stays the same (it changes after every applied
//! create, configure or delete of a queue and every snapshot install), so a push does not read
//! its queue's row again each time.

use std::collections::HashMap;
use std::sync::Arc;

use queen_domain::command::{PopOutcome, PushItem, TxnOp};
use queen_domain::timers::TimerOp;
use queen_ports::{BrokerError, Opened, PayloadCipher};

use super::Broker;

/// Queues kept at most, before the kept flags are dropped and read again.
const FLAGS_KEPT: usize = 4096;

/// Whether queues are flagged, as read at one queue-options epoch of the store.
#[derive(Default)]
pub(crate) struct Flags(std::sync::Mutex<(u64, HashMap<String, bool>)>);

impl Flags {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, HashMap<String, bool>)> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The flag of `queue` read at `epoch`, if kept.
    fn get(&self, epoch: u64, queue: &str) -> Option<bool> {
        let mut g = self.lock();
        if g.0 != epoch {
            *g = (epoch, HashMap::new());
            return None;
        }
        g.1.get(queue).copied()
    }

    /// Keep `flag`, read at `epoch` (or later), unless the epoch moved on meanwhile.
    fn keep(&self, epoch: u64, queue: &str, flag: bool) {
        let mut g = self.lock();
        if g.0 == epoch {
            if g.1.len() >= FLAGS_KEPT {
                g.1.clear();
            }
            g.1.insert(queue.to_owned(), flag);
        }
    }
}

impl Broker {
    /// Seal and open payloads with `cipher`; `has_key` says whether it can seal (shown on
    /// `/status` and checked before a queue is flagged).
    #[must_use]
    pub fn with_cipher(mut self, cipher: Arc<dyn PayloadCipher>, has_key: bool) -> Self {
        self.cipher = cipher;
        self.has_key = has_key;
        self
    }

    /// The payload cipher (the S3 sink opens what it writes with it).
    #[must_use]
    pub fn cipher(&self) -> Arc<dyn PayloadCipher> {
        self.cipher.clone()
    }

    /// Whether this node holds an encryption key.
    #[must_use]
    pub fn has_encryption_key(&self) -> bool {
        self.has_key
    }

    /// Whether `queue` has `encryptionEnabled` in this node's applied state (cached per call
    /// in `seen`).
    fn flagged(&self, queue: &str, seen: &mut HashMap<String, bool>) -> Result<bool, BrokerError> {
        if let Some(f) = seen.get(queue) {
            return Ok(*f);
        }
        // The epoch before the read: a change applied after it raises the epoch, and what was
        // read is then dropped, never kept past it.
        let epoch = self.state.queue_options_epoch();
        if let Some(f) = epoch.and_then(|e| self.flags.get(e, queue)) {
            return Ok(f);
        }
        let state = self.state.view();
        let f = queen_domain::reads::queue(&*state, queue)
            .map_err(|e| Self::read_error(&e))?
            .is_some_and(|q| q.options.encryption_enabled);
        if let Some(e) = epoch {
            self.flags.keep(e, queue, f);
        }
        seen.insert(queue.to_owned(), f);
        Ok(f)
    }

    fn seal(&self, queue: &str, payload: &mut Vec<u8>) -> Result<(), BrokerError> {
        if !self.has_key {
            return Err(BrokerError::EncryptionRequired {
                queue: queue.to_owned(),
            });
        }
        *payload = self.cipher.seal(payload).map_err(|e| {
            tracing::error!(target: "queen-app", error = %e, "a payload could not be encrypted");
            BrokerError::Internal("a payload could not be encrypted; see the node's log".to_owned())
        })?;
        Ok(())
    }

    /// Seal the payloads of pushed items bound for flagged queues.
    pub(crate) fn seal_pushes(&self, items: &mut [PushItem]) -> Result<(), BrokerError> {
        let mut seen = HashMap::new();
        for item in items {
            if self.flagged(item.queue.as_str(), &mut seen)? {
                self.seal(item.queue.as_str(), &mut item.payload)?;
            }
        }
        Ok(())
    }

    /// Seal what a transaction pushes and what its timers will push into flagged queues.
    pub(crate) fn seal_transaction(
        &self,
        ops: &mut [TxnOp],
        timers: &mut [TimerOp],
    ) -> Result<(), BrokerError> {
        let mut seen = HashMap::new();
        for op in ops {
            if let TxnOp::Push(item) = op
                && self.flagged(item.queue.as_str(), &mut seen)?
            {
                self.seal(item.queue.as_str(), &mut item.payload)?;
            }
        }
        self.seal_timers_with(timers, &mut seen)
    }

    /// Seal the payloads of timers that will push into flagged queues.
    pub(crate) fn seal_timers(&self, timers: &mut [TimerOp]) -> Result<(), BrokerError> {
        self.seal_timers_with(timers, &mut HashMap::new())
    }

    fn seal_timers_with(
        &self,
        timers: &mut [TimerOp],
        seen: &mut HashMap<String, bool>,
    ) -> Result<(), BrokerError> {
        for t in timers {
            if let TimerOp::Schedule { queue, payload, .. } = t
                && self.flagged(queue.as_str(), seen)?
            {
                self.seal(queue.as_str(), payload)?;
            }
        }
        Ok(())
    }

    /// Open every sealed payload of a pop's answer that this node can open.
    pub(crate) fn open_pop(&self, out: &mut PopOutcome) {
        for claim in &mut out.claims {
            for m in &mut claim.messages {
                if let Opened::Plain(p) = self.cipher.open(&m.payload) {
                    m.payload = p;
                }
            }
        }
    }

    /// Refuse to flag a queue on a node that could not seal its payloads.
    pub(crate) fn check_flag(
        &self,
        queue: &str,
        encryption_enabled: bool,
    ) -> Result<(), BrokerError> {
        if encryption_enabled && !self.has_key {
            return Err(BrokerError::EncryptionRequired {
                queue: queue.to_owned(),
            });
        }
        Ok(())
    }
}

impl Broker {
    /// At start: a warning naming the queues with `encryptionEnabled` when this node holds no
    /// key (it refuses their pushes and serves their stored payloads sealed).
    pub fn warn_flagged_without_key(&self) {
        if self.has_key {
            return;
        }
        let state = self.state.view();
        let flagged: Vec<String> = queen_domain::reads::queues(&*state, 10_000)
            .unwrap_or_default()
            .into_iter()
            .filter(|q| q.options.encryption_enabled)
            .map(|q| q.name)
            .collect();
        if !flagged.is_empty() {
            tracing::warn!(target: "queen", queues = ?flagged, "queues have encryptionEnabled but this node has no QUEEN_ENCRYPTION_KEY: their pushes are refused (409 encryption_required) and their payloads are served sealed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Flags;

    /// A flag is kept for the epoch it was read at: a new epoch drops every kept flag, and a
    /// flag read before the epoch moved on is not kept.
    #[test]
    fn flags_are_kept_for_one_epoch() {
        let f = Flags::default();
        assert_eq!(f.get(1, "q"), None);
        f.keep(1, "q", true);
        assert_eq!(f.get(1, "q"), Some(true));
        assert_eq!(f.get(2, "q"), None, "a new epoch drops what was kept");
        f.keep(1, "q", true);
        assert_eq!(f.get(2, "q"), None, "read at an older epoch: not kept");
        f.keep(2, "q", false);
        assert_eq!(f.get(2, "q"), Some(false));
    }
}
