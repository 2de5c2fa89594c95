//! What the rule tests share: a single replica applying entries on an in-memory store with a
//! clock the test moves, and the ids as the edge admits them.

#![allow(dead_code, unused_imports)] // each test file uses its own part of it

pub use queen_domain::command::{
    AckItem, Command, Entry, Outcome, PopCommand, PopOutcome, PushItem, PushOutcome, PushStatus,
    Subscription,
};
pub use queen_domain::ids::{LeaseId, PartitionRef, TransactionId};
pub use queen_domain::model::QueueOptions;
pub use queen_domain::names::{GroupName, PartitionName, QueueName};
pub use queen_domain::{MemStore, Txn, apply_entry, invariants, reads};

/// A single replica: applies entries one by one, with a clock the test moves.
#[derive(Clone)]
pub struct Sim {
    pub store: MemStore,
    pub now: u64,
    pub seq: u64,
    pub index: u64,
}

impl Sim {
    /// A replica of a cluster whose members all read this build's log format (pops read the
    /// ready index).
    pub fn new() -> Self {
        let mut sim = Self::before_ready_index();
        sim.apply(Command::ClusterSettings {
            version: Command::LATEST_FORMAT,
            max_clock_skew_ms: queen_domain::machine::cluster::DEFAULT_MAX_CLOCK_SKEW_MS,
        });
        sim
    }

    /// A replica of a cluster whose version is still 0 (pops read every partition).
    pub fn before_ready_index() -> Self {
        Self {
            store: MemStore::new(),
            now: 1_700_000_000_000_000,
            seq: 0,
            index: 0,
        }
    }

    pub fn apply(&mut self, command: Command) -> Outcome {
        let entry = Entry {
            proposed_at: self.now,
            command,
        };
        let mut txn = Txn::new(&self.store);
        self.index += 1;
        let r = apply_entry(&mut txn, &entry, self.index).expect("apply");
        let w = txn.into_writes();
        self.store.commit(w);
        invariants::check(&self.store).expect("invariants hold after every entry");
        r.outcome
    }

    pub fn advance_secs(&mut self, s: u64) {
        self.now += s * 1_000_000;
    }

    pub fn advance_ms(&mut self, ms: u64) {
        self.now += ms * 1000;
    }

    /// What the store adapter does for an entry without a command (a new leader's blank entry).
    pub fn leader_change(&mut self) {
        let mut txn = Txn::new(&self.store);
        self.index += 1;
        queen_domain::machine::cluster::leader_changed(&mut txn).expect("apply");
        let w = txn.into_writes();
        self.store.commit(w);
    }

    pub fn push(&mut self, queue: &str, partition: &str, txn: &str) -> PushOutcome {
        self.seq += 1;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.seq.to_be_bytes());
        match self.apply(Command::Push(vec![PushItem {
            queue: QueueName::try_from(queue.to_owned()).unwrap(),
            partition: PartitionName::new(partition).unwrap(),
            transaction_id: tid(txn),
            message_id: id,
            payload: format!("{{\"n\":\"{txn}\"}}").into_bytes(),
            trace_id: None,
        }])) {
            Outcome::Push(mut v) => v.remove(0),
            o => panic!("{o:?}"),
        }
    }

    pub fn pop(&mut self, queue: &str, group: Option<&str>, batch: u32) -> PopOutcome {
        self.pop_with(queue, None, group, batch, 1, Subscription::Default)
    }

    pub fn pop_with(
        &mut self,
        queue: &str,
        partition: Option<&str>,
        group: Option<&str>,
        batch: u32,
        parts: u32,
        sub: Subscription,
    ) -> PopOutcome {
        self.seq += 1;
        match self.apply(Command::Pop(PopCommand {
            queue: QueueName::try_from(queue.to_owned()).unwrap(),
            partition: partition.map(|p| PartitionName::new(p).unwrap()),
            group: GroupName::or_queue_mode(group).unwrap(),
            batch,
            max_partitions: parts,
            lease_id: lease(&format!("lease-{}", self.seq)),
            auto_ack: false,
            subscription: sub,
        })) {
            Outcome::Pop(p) => p,
            o => panic!("{o:?}"),
        }
    }

    pub fn ack(
        &mut self,
        group: Option<&str>,
        pop: &PopOutcome,
        idx: usize,
        status: &str,
    ) -> queen_domain::model::AckVerdict {
        let claim = &pop.claims[0];
        let m = &claim.messages[idx];
        match self.apply(Command::Ack {
            group: GroupName::or_queue_mode(group).unwrap(),
            items: vec![AckItem {
                transaction_id: tid(&m.transaction_id),
                partition_id: PartitionRef::Id(claim.pid),
                status: status.into(),
                error: Some("boom".to_owned()),
                lease_id: Some(lease(&pop.lease_id)),
            }],
        }) {
            Outcome::Ack(mut v) => v.remove(0).verdict,
            o => panic!("{o:?}"),
        }
    }

    pub fn configure(&mut self, queue: &str, o: QueueOptions) {
        self.apply(Command::Configure {
            queue: QueueName::try_from(queue.to_owned()).unwrap(),
            namespace: None,
            task: None,
            options: o,
        });
    }
}

/// A transactionId as the edge admits it.
pub fn tid(t: &str) -> TransactionId {
    TransactionId::new(t).expect("a valid transactionId")
}

/// A lease id as the edge admits it.
pub fn lease(l: &str) -> LeaseId {
    LeaseId::new(l).expect("a valid lease id")
}

pub fn txns(p: &PopOutcome) -> Vec<String> {
    p.claims
        .iter()
        .flat_map(|c| c.messages.iter().map(|m| m.transaction_id.clone()))
        .collect()
}
