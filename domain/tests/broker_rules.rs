//! The broker's rules, driven through entries on an in-memory store.

use queen_domain::command::{
    AckItem, Command, Entry, Outcome, PopCommand, PopOutcome, PushItem, PushOutcome, PushStatus,
    Subscription,
};
use queen_domain::ids::{LeaseId, PartitionRef, TransactionId};
use queen_domain::model::QueueOptions;
use queen_domain::names::{GroupName, PartitionName, QueueName};
use queen_domain::{MemStore, Txn, apply_entry, invariants, reads};

/// A single replica: applies entries one by one, with a clock the test moves.
#[derive(Clone)]
struct Sim {
    store: MemStore,
    now: u64,
    seq: u64,
    index: u64,
}

impl Sim {
    fn new() -> Self {
        Self {
            store: MemStore::new(),
            now: 1_700_000_000_000_000,
            seq: 0,
            index: 0,
        }
    }

    fn apply(&mut self, command: Command) -> Outcome {
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

    fn advance_secs(&mut self, s: u64) {
        self.now += s * 1_000_000;
    }

    fn advance_ms(&mut self, ms: u64) {
        self.now += ms * 1000;
    }

    /// What the store adapter does for an entry without a command (a new leader's blank entry).
    fn leader_change(&mut self) {
        let mut txn = Txn::new(&self.store);
        self.index += 1;
        queen_domain::machine::cluster::leader_changed(&mut txn).expect("apply");
        let w = txn.into_writes();
        self.store.commit(w);
    }

    fn push(&mut self, queue: &str, partition: &str, txn: &str) -> PushOutcome {
        self.seq += 1;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.seq.to_be_bytes());
        match self.apply(Command::Push(vec![PushItem {
            queue: QueueName::new(queue).unwrap(),
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

    fn pop(&mut self, queue: &str, group: Option<&str>, batch: u32) -> PopOutcome {
        self.pop_with(queue, None, group, batch, 1, Subscription::Default)
    }

    fn pop_with(
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
            queue: QueueName::new(queue).unwrap(),
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

    fn ack(
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

    fn configure(&mut self, queue: &str, o: QueueOptions) {
        self.apply(Command::Configure {
            queue: QueueName::new(queue).unwrap(),
            namespace: None,
            task: None,
            options: o,
        });
    }
}

/// A transactionId as the edge admits it.
fn tid(t: &str) -> TransactionId {
    TransactionId::new(t).expect("a valid transactionId")
}

/// A lease id as the edge admits it.
fn lease(l: &str) -> LeaseId {
    LeaseId::new(l).expect("a valid lease id")
}

fn txns(p: &PopOutcome) -> Vec<String> {
    p.claims
        .iter()
        .flat_map(|c| c.messages.iter().map(|m| m.transaction_id.clone()))
        .collect()
}

#[test]
fn push_assigns_offsets_from_zero_and_dedups() {
    let mut s = Sim::new();
    assert_eq!(s.push("q", "a", "t1").offset, 0);
    assert_eq!(s.push("q", "a", "t2").offset, 1);
    assert_eq!(s.push("q", "b", "t1").offset, 0, "dedup is per partition");
    let dup = s.push("q", "a", "t1");
    assert_eq!(dup.status, PushStatus::Duplicate);
    assert_eq!(dup.offset, 0);
    assert_eq!(s.pop("q", None, 10).claims[0].messages.len(), 2);
}

#[test]
fn repeats_inside_one_push_keep_the_first() {
    let mut s = Sim::new();
    let item = |t: &str, n: u8| PushItem {
        queue: QueueName::new("q").unwrap(),
        partition: PartitionName::default_partition(),
        transaction_id: tid(t),
        message_id: [n; 16],
        payload: b"1".to_vec(),
        trace_id: None,
    };
    let Outcome::Push(v) = s.apply(Command::Push(vec![
        item("x", 1),
        item("x", 2),
        item("y", 3),
    ])) else {
        panic!()
    };
    assert_eq!(v[0].status, PushStatus::Queued);
    assert_eq!(v[1].status, PushStatus::Duplicate);
    assert_eq!(v[1].message_id, [1; 16]);
    assert_eq!(v[2].offset, 1);
}

#[test]
fn stamps_rise_even_when_the_clock_goes_back() {
    let mut s = Sim::new();
    let a = s.push("q", "p", "a");
    let _ = a;
    s.now -= 10_000_000;
    let before = reads::safe_time(&s.store).unwrap();
    s.push("q", "p", "b");
    assert!(reads::safe_time(&s.store).unwrap() > before);
}

#[test]
fn a_leased_partition_is_skipped_until_acked() {
    let mut s = Sim::new();
    for i in 0..3 {
        s.push("q", "p", &format!("t{i}"));
    }
    let p1 = s.pop("q", None, 2);
    assert_eq!(txns(&p1), ["t0", "t1"]);
    assert!(
        s.pop("q", None, 2).is_empty(),
        "one live lease per partition and group"
    );
    assert!(s.ack(None, &p1, 0, "completed").success);
    let v = s.ack(None, &p1, 1, "completed");
    assert!(v.success && v.lease_released);
    assert_eq!(txns(&s.pop("q", None, 2)), ["t2"]);
}

#[test]
fn an_expired_lease_redelivers_without_counting_a_retry() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            lease_time: 5,
            ..QueueOptions::default()
        },
    );
    s.push("q", "Default", "t0");
    let first = s.pop("q", None, 1);
    s.advance_secs(6);
    let again = s.pop("q", None, 1);
    assert_eq!(txns(&again), ["t0"]);
    assert_eq!(again.claims[0].messages[0].attempt, 1);
    let stale = s.ack(None, &first, 0, "completed");
    assert!(!stale.success, "an ack under the expired lease is refused");
    assert!(s.ack(None, &again, 0, "completed").success);
}

#[test]
fn failures_retry_up_to_the_limit_then_dead_letter() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            retry_limit: 2,
            ..QueueOptions::default()
        },
    );
    s.push("q", "Default", "bad");
    s.push("q", "Default", "good");
    for attempt in 1..=3 {
        let p = s.pop("q", None, 1);
        assert_eq!(txns(&p), ["bad"]);
        assert_eq!(p.claims[0].messages[0].attempt, attempt);
        let v = s.ack(None, &p, 0, "failed");
        assert!(v.success && v.lease_released);
        assert_eq!(v.dlq, attempt == 3);
    }
    assert_eq!(txns(&s.pop("q", None, 1)), ["good"]);
    let q = reads::queue(&s.store, "q").unwrap().unwrap();
    let (dlq, total) = reads::dead_letters(&s.store, q.qid, &|_| true, 0, 10).unwrap();
    assert_eq!(total, 1);
    assert_eq!(dlq[0].transaction_id, "bad");
    assert_eq!(dlq[0].error.as_deref(), Some("boom"));
}

#[test]
fn a_nack_rewinds_the_partition_and_refuses_the_rest_of_the_batch() {
    let mut s = Sim::new();
    for i in 0..3 {
        s.push("q", "p", &format!("t{i}"));
    }
    let p = s.pop("q", None, 3);
    assert!(s.ack(None, &p, 0, "completed").success);
    assert!(s.ack(None, &p, 1, "failed").success);
    assert!(
        !s.ack(None, &p, 2, "completed").success,
        "the lease was released by the nack"
    );
    assert_eq!(txns(&s.pop("q", None, 3)), ["t1", "t2"]);
}

#[test]
fn a_repeated_ack_is_answered_as_the_first() {
    let mut s = Sim::new();
    s.push("q", "p", "t0");
    s.push("q", "p", "t1");
    let p = s.pop("q", None, 2);
    let first = s.ack(None, &p, 0, "completed");
    let again = s.ack(None, &p, 0, "completed");
    assert_eq!(
        (first.success, first.lease_released),
        (again.success, again.lease_released)
    );
    assert!(again.noop && !first.noop);
}

#[test]
fn each_group_sees_every_message_and_new_starts_now() {
    let mut s = Sim::new();
    s.push("q", "p", "old");
    let a = s.pop("q", Some("a"), 10);
    let b = s.pop("q", Some("b"), 10);
    assert_eq!(txns(&a), ["old"]);
    assert_eq!(txns(&b), ["old"]);
    assert!(
        s.pop_with("q", None, Some("late"), 10, 1, Subscription::New)
            .is_empty()
    );
    s.advance_secs(1);
    s.push("q", "p", "fresh");
    let late = s.pop_with("q", None, Some("late"), 10, 1, Subscription::All);
    assert_eq!(txns(&late), ["fresh"], "the first choice sticks");
    assert!(
        s.pop("q", None, 10).claims[0].messages.len() == 2,
        "queue mode starts at the oldest"
    );
}

#[test]
fn one_pop_claims_several_partitions_under_one_lease() {
    let mut s = Sim::new();
    for p in ["a", "b", "c"] {
        s.push("q", p, &format!("{p}0"));
    }
    let pop = s.pop_with("q", None, None, 10, 2, Subscription::Default);
    assert_eq!(pop.claims.len(), 2);
    let Outcome::Extend {
        success, renewed, ..
    } = s.apply(Command::ExtendLease {
        lease_id: lease(&pop.lease_id),
    })
    else {
        panic!()
    };
    assert!(success);
    assert_eq!(renewed, 2);
    assert_eq!(
        txns(&s.pop_with("q", None, None, 10, 5, Subscription::Default)),
        ["c0"]
    );
}

#[test]
fn extending_an_expired_lease_fails() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            lease_time: 1,
            ..QueueOptions::default()
        },
    );
    s.push("q", "Default", "t");
    let p = s.pop("q", None, 1);
    s.advance_secs(2);
    let Outcome::Extend { success, .. } = s.apply(Command::ExtendLease {
        lease_id: lease(&p.lease_id),
    }) else {
        panic!()
    };
    assert!(!success);
}

#[test]
fn retention_deletes_old_messages_through_ticks_and_frees_their_dedup() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            retention_seconds: 10,
            ..QueueOptions::default()
        },
    );
    s.push("q", "p", "t0");
    s.advance_secs(5);
    s.push("q", "p", "t1");
    s.advance_secs(6);
    s.apply(Command::Tick);
    let v = reads::queue_view(&s.store, "q").unwrap().unwrap();
    let p = v.partitions.iter().find(|p| p.name == "p").unwrap();
    assert_eq!((p.log_start, p.next_offset), (1, 2));
    assert_eq!(v.queue.messages, 1);
    assert_eq!(
        s.push("q", "p", "t0").status,
        PushStatus::Queued,
        "dedup lasts as long as the original"
    );
    assert_eq!(s.push("q", "p", "t1").status, PushStatus::Duplicate);
}

#[test]
fn completed_retention_waits_for_every_group() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            completed_retention_seconds: 1,
            ..QueueOptions::default()
        },
    );
    s.push("q", "p", "t0");
    let a = s.pop("q", Some("a"), 1);
    let _b = s.pop("q", Some("b"), 1);
    s.ack(Some("a"), &a, 0, "completed");
    s.advance_secs(2);
    s.apply(Command::Tick);
    assert_eq!(
        reads::queue(&s.store, "q").unwrap().unwrap().messages,
        1,
        "group b has not consumed it"
    );
}

#[test]
fn deleting_a_queue_removes_everything_in_bounded_ticks() {
    let mut s = Sim::new();
    for i in 0..50 {
        s.push("q", &format!("p{}", i % 3), &format!("t{i}"));
    }
    let Outcome::Deleted { existed } = s.apply(Command::DeleteQueue {
        queue: QueueName::new("q").unwrap(),
    }) else {
        panic!()
    };
    assert!(existed);
    assert!(s.pop("q", None, 10).is_empty());
    for _ in 0..3 {
        s.apply(Command::Tick);
    }
    // Only meta keys and the lease expiry-free tables remain.
    assert!(s.store.len() < 8, "rows left: {}", s.store.len());
    assert_eq!(
        s.push("q", "p0", "t0").status,
        PushStatus::Queued,
        "a new queue of the same name starts empty"
    );
}

#[test]
fn delayed_processing_hides_messages_until_due() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            delayed_processing: 10,
            ..QueueOptions::default()
        },
    );
    s.push("q", "Default", "t");
    assert!(s.pop("q", None, 1).is_empty());
    s.advance_secs(11);
    assert_eq!(txns(&s.pop("q", None, 1)), ["t"]);
}

#[test]
fn max_size_refuses_per_item() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            max_size: 1,
            ..QueueOptions::default()
        },
    );
    assert_eq!(s.push("q", "Default", "a").status, PushStatus::Queued);
    assert!(matches!(
        s.push("q", "Default", "b").status,
        PushStatus::Failed(_)
    ));
}

#[test]
fn unknown_ack_targets_are_refused_not_errors() {
    let mut s = Sim::new();
    s.push("q", "p", "t");
    let Outcome::Ack(v) = s.apply(Command::Ack {
        group: GroupName::queue_mode(),
        items: vec![
            AckItem {
                transaction_id: tid("t"),
                partition_id: PartitionRef::parse("999"),
                status: "completed".into(),
                error: None,
                lease_id: None,
            },
            AckItem {
                transaction_id: tid("t"),
                partition_id: PartitionRef::parse("nope"),
                status: "completed".into(),
                error: None,
                lease_id: None,
            },
            AckItem {
                transaction_id: tid("t"),
                partition_id: PartitionRef::parse("1"),
                status: "weird".into(),
                error: None,
                lease_id: None,
            },
        ],
    }) else {
        panic!()
    };
    assert!(
        v.iter()
            .all(|o| !o.verdict.success && o.verdict.error.is_some())
    );
}

#[test]
fn would_pop_writes_nothing() {
    let mut s = Sim::new();
    s.push("q", "p", "t");
    let before = s.store.clone();
    let cmd = PopCommand {
        queue: QueueName::new("q").unwrap(),
        partition: None,
        group: GroupName::new("g").unwrap(),
        batch: 1,
        max_partitions: 1,
        lease_id: lease("x"),
        auto_ack: false,
        subscription: Subscription::Default,
    };
    assert!(
        !reads::would_pop(&s.store, queen_domain::time::Stamp(s.now), &cmd)
            .unwrap()
            .is_empty()
    );
    assert_eq!(before, s.store);
}

mod transactions {
    use super::*;
    use queen_domain::command::{TxnOp, TxnResult};

    fn item(queue: &str, txn: &str) -> PushItem {
        PushItem {
            queue: QueueName::new(queue).unwrap(),
            partition: PartitionName::default_partition(),
            transaction_id: tid(txn),
            message_id: [9; 16],
            payload: b"{}".to_vec(),
            trace_id: None,
        }
    }

    fn ack_op(pop: &PopOutcome, with_lease: bool) -> TxnOp {
        let c = &pop.claims[0];
        TxnOp::Ack {
            group: GroupName::queue_mode(),
            item: AckItem {
                transaction_id: tid(&c.messages[0].transaction_id),
                partition_id: PartitionRef::Id(c.pid),
                status: "completed".into(),
                error: None,
                lease_id: with_lease.then(|| lease(&pop.lease_id)),
            },
        }
    }

    #[test]
    fn ack_and_push_commit_together_and_a_resend_is_harmless() {
        let mut s = Sim::new();
        s.push("in", "Default", "m1");
        let p = s.pop("in", None, 1);
        let cmd = Command::Transaction {
            ops: vec![ack_op(&p, false), TxnOp::Push(item("out", "derived-1"))],
            required_leases: vec![lease(&p.lease_id)],
            kv: vec![],
            timers: vec![],
        };
        let Outcome::Transaction(t) = s.apply(cmd.clone()) else {
            panic!()
        };
        assert!(t.success, "{t:?}");
        assert!(matches!(&t.results[1], TxnResult::Push(o) if o.status == PushStatus::Queued));
        assert_eq!(txns(&s.pop("out", None, 5)), ["derived-1"]);
        // The ack moved the cursor: m1 is done, not redelivered after its lease's time.
        let mut later = s.clone();
        later.advance_secs(3_600);
        assert!(later.pop("in", None, 5).claims.is_empty());
        // The resend fails on the released lease and writes nothing.
        let before = s.store.clone();
        let Outcome::Transaction(again) = s.apply(cmd) else {
            panic!()
        };
        assert!(!again.success);
        // Only the stamp moved.
        let without_stamp = |m: &MemStore| {
            let mut m = m.clone();
            m.commit(
                [(queen_domain::keys::meta_stamp(), None)]
                    .into_iter()
                    .collect(),
            );
            m
        };
        assert_eq!(without_stamp(&s.store), without_stamp(&before));
    }

    #[test]
    fn a_failing_part_rolls_everything_back() {
        let mut s = Sim::new();
        s.push("in", "Default", "m1");
        let p = s.pop("in", None, 1);
        let mut bad = ack_op(&p, true);
        if let TxnOp::Ack { item, .. } = &mut bad {
            item.transaction_id = tid("no-such-message");
        }
        let Outcome::Transaction(t) = s.apply(Command::Transaction {
            ops: vec![TxnOp::Push(item("out", "x")), bad],
            required_leases: vec![],
            kv: vec![],
            timers: vec![],
        }) else {
            panic!()
        };
        assert!(!t.success);
        assert!(t.error.unwrap().contains("operation 1"));
        assert!(s.pop("out", None, 5).is_empty(), "the push was rolled back");
        assert!(
            s.ack(None, &p, 0, "completed").success,
            "the lease is untouched"
        );
    }

    #[test]
    fn an_expired_required_lease_fails_the_bundle() {
        let mut s = Sim::new();
        s.configure(
            "in",
            QueueOptions {
                lease_time: 1,
                ..QueueOptions::default()
            },
        );
        s.push("in", "Default", "m1");
        let p = s.pop("in", None, 1);
        s.advance_secs(2);
        let Outcome::Transaction(t) = s.apply(Command::Transaction {
            ops: vec![TxnOp::Push(item("out", "x"))],
            required_leases: vec![lease(&p.lease_id)],
            kv: vec![],
            timers: vec![],
        }) else {
            panic!()
        };
        assert!(!t.success);
        assert!(s.pop("out", None, 5).is_empty());
    }
}

mod kv_rules {
    use super::*;
    use queen_domain::kv::{Expiry, KvOp, KvOutcome, KvResult, LockOp, LockResult, Num};

    fn kv(s: &mut Sim, ops: Vec<KvOp>) -> KvOutcome {
        match s.apply(Command::Kv(ops)) {
            Outcome::Kv(o) => o,
            o => panic!("{o:?}"),
        }
    }

    fn put(key: &str, v: &str, expect: Option<u64>, required: bool) -> KvOp {
        KvOp::Put {
            ns: "app".into(),
            key: key.into(),
            value: v.as_bytes().to_vec(),
            expiry: Expiry::Ttl(10),
            expect,
            required,
        }
    }

    fn get(key: &str) -> KvOp {
        KvOp::Get {
            ns: "app".into(),
            key: key.into(),
        }
    }

    fn applied(r: &KvResult) -> (bool, Option<String>, Option<u64>) {
        match r {
            KvResult::Write {
                applied,
                reason,
                current,
            } => (
                *applied,
                reason.clone(),
                current.as_ref().map(|c| c.version),
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn versions_rise_and_compare_and_set_uses_them() {
        let mut s = Sim::new();
        let a = kv(&mut s, vec![put("k", "1", None, false)]);
        let (ok, _, v1) = applied(&a.results[0]);
        assert!(ok);
        let b = kv(&mut s, vec![put("k", "2", v1, false)]);
        let (ok, _, v2) = applied(&b.results[0]);
        assert!(ok && v2 > v1, "versions rise");
        let stale = kv(&mut s, vec![put("k", "3", v1, false)]);
        assert_eq!(
            applied(&stale.results[0]),
            (false, Some("version".into()), v2),
            "the loser sees the winner's version"
        );
        let absent = kv(&mut s, vec![put("k", "4", Some(0), false)]);
        assert_eq!(applied(&absent.results[0]).1.as_deref(), Some("exists"));
    }

    #[test]
    fn ttl_expiry_follows_stamps_and_expired_rows_never_exist() {
        let mut s = Sim::new();
        kv(&mut s, vec![put("t", "1", None, false)]);
        s.advance_secs(11);
        let r = kv(&mut s, vec![get("t"), put("t", "2", Some(0), false)]);
        assert_eq!(r.results[0], KvResult::Get(None));
        assert!(
            applied(&r.results[1]).0,
            "expect 0 wins over an expired row"
        );
        s.advance_secs(11);
        s.apply(Command::Tick);
        assert!(matches!(
            kv(&mut s, vec![get("t")]).results[0],
            KvResult::Get(None)
        ));
    }

    #[test]
    fn a_lost_required_precondition_rolls_back_the_whole_call() {
        let mut s = Sim::new();
        let r = kv(
            &mut s,
            vec![
                put("a", "1", None, false),
                KvOp::Check {
                    ns: "app".into(),
                    key: "zzz".into(),
                    expect: 5,
                    required: true,
                },
                put("b", "1", None, false),
            ],
        );
        assert_eq!(r.failed, Some(1));
        assert_eq!(r.results.len(), 3, "index-aligned, never shorter");
        assert_eq!(applied(&r.results[0]).1.as_deref(), Some("rolled_back"));
        assert_eq!(applied(&r.results[1]).1.as_deref(), Some("absent"));
        assert!(matches!(
            kv(&mut s, vec![get("a")]).results[0],
            KvResult::Get(None)
        ));
        // Without `required` the same failure keeps the other writes.
        let r = kv(
            &mut s,
            vec![
                put("a", "1", None, false),
                KvOp::Check {
                    ns: "app".into(),
                    key: "zzz".into(),
                    expect: 5,
                    required: false,
                },
            ],
        );
        assert_eq!(r.failed, None);
        assert!(matches!(
            &kv(&mut s, vec![get("a")]).results[0],
            KvResult::Get(Some(_))
        ));
    }

    #[test]
    fn incr_counts_from_zero_refuses_out_of_bounds_and_wrong_types() {
        let mut s = Sim::new();
        let incr = |d: i64, max: Option<f64>| KvOp::Incr {
            ns: "app".into(),
            key: "n".into(),
            delta: Num::Int(d),
            min: None,
            max,
            expiry: Expiry::Forever,
            required: false,
        };
        kv(&mut s, vec![incr(2, None)]);
        let r = kv(&mut s, vec![incr(3, None)]);
        let KvResult::Write {
            current: Some(row), ..
        } = &r.results[0]
        else {
            panic!()
        };
        assert_eq!(row.value, b"5");
        assert_eq!(
            applied(&kv(&mut s, vec![incr(1, Some(5.0))]).results[0])
                .1
                .as_deref(),
            Some("limit")
        );
        kv(&mut s, vec![put("n", "\"text\"", None, false)]);
        assert_eq!(
            applied(&kv(&mut s, vec![incr(1, None)]).results[0])
                .1
                .as_deref(),
            Some("type")
        );
    }

    fn incr_op(delta: Num, min: Option<f64>, max: Option<f64>) -> KvOp {
        KvOp::Incr {
            ns: "app".into(),
            key: "c".into(),
            delta,
            min,
            max,
            expiry: Expiry::Forever,
            required: false,
        }
    }

    /// The row's text after an incr, or `refused: <reason>`.
    fn incr_text(s: &mut Sim, op: KvOp) -> String {
        match &kv(s, vec![op]).results[0] {
            KvResult::Write {
                applied: true,
                current: Some(row),
                ..
            } => String::from_utf8_lossy(&row.value).into_owned(),
            KvResult::Write {
                applied: false,
                reason,
                ..
            } => format!("refused: {}", reason.clone().unwrap_or_default()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn incr_is_exact_for_integers_and_refuses_overflow() {
        let mut s = Sim::new();
        kv(&mut s, vec![put("c", "9007199254740992", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "9007199254740993",
            "2^53 + 1 is kept"
        );
        kv(&mut s, vec![put("c", "9223372036854775806", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "9223372036854775807"
        );
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "refused: overflow",
            "i64::MAX + 1 is not applied"
        );
        kv(&mut s, vec![put("c", "-9223372036854775808", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(-1), None, None)),
            "refused: overflow"
        );
        kv(&mut s, vec![put("c", "18446744073709551616", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "refused: overflow",
            "a stored integer outside i64"
        );
        kv(&mut s, vec![put("c", "-0", None, false)]);
        assert_eq!(incr_text(&mut s, incr_op(Num::Int(1), None, None)), "1");
    }

    #[test]
    fn incr_uses_floats_only_for_fractions_and_refuses_infinity() {
        let mut s = Sim::new();
        kv(&mut s, vec![put("c", "1e308", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Float(1e308), None, None)),
            "refused: overflow",
            "1e308 + 1e308"
        );
        kv(&mut s, vec![put("c", "1e400", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "refused: overflow",
            "a stored 1e400 is infinite"
        );
        kv(&mut s, vec![put("c", "42.00", None, false)]);
        assert_eq!(incr_text(&mut s, incr_op(Num::Int(1), None, None)), "43.0");
        kv(&mut s, vec![put("c", "2", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Float(0.5), None, None)),
            "2.5"
        );
        kv(&mut s, vec![put("c", "true", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "refused: type"
        );
    }

    #[test]
    fn incr_limits_compare_integers_exactly() {
        let mut s = Sim::new();
        kv(&mut s, vec![put("c", "9007199254740992", None, false)]);
        // 2^53 + 1 is above the float 2^53 although it rounds to it.
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(1), None, Some(9_007_199_254_740_992.0))
            ),
            "refused: limit"
        );
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(0), None, Some(9_007_199_254_740_992.0))
            ),
            "9007199254740992"
        );
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, Some(9.3e18))),
            "9007199254740993"
        );
        kv(&mut s, vec![put("c", "4503599627370495", None, false)]);
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(0), Some(4_503_599_627_370_495.5), None)
            ),
            "refused: limit"
        );
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(0), None, Some(4_503_599_627_370_494.5))
            ),
            "refused: limit"
        );
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(1), None, Some(4_503_599_627_370_496.5))
            ),
            "4503599627370496"
        );
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), Some(-1e300), Some(1e300))),
            "4503599627370497"
        );
    }

    #[test]
    fn locks_are_exclusive_renewals_move_the_token_and_release_needs_it() {
        let mut s = Sim::new();
        let locks = |s: &mut Sim, ops: Vec<LockOp>| match s.apply(Command::Locks(ops)) {
            Outcome::Locks(r) => r,
            o => panic!("{o:?}"),
        };
        let acq = |owner: &str| LockOp::Acquire {
            name: "job".into(),
            ttl: 5,
            owner: owner.into(),
            limit: 1,
        };
        let r = locks(&mut s, vec![acq("me")]);
        let LockResult::Acquired {
            token,
            already: false,
            slot: 0,
            ..
        } = r[0].clone()
        else {
            panic!("{r:?}")
        };
        assert!(
            matches!(
                &locks(&mut s, vec![acq("me")])[0],
                LockResult::Acquired { already: true, .. }
            ),
            "a resend is safe"
        );
        assert!(
            matches!(&locks(&mut s, vec![acq("you")])[0], LockResult::NotAcquired { reason, .. } if reason == "held")
        );
        let r = locks(
            &mut s,
            vec![LockOp::Renew {
                name: "job".into(),
                token,
                ttl: 5,
                slot: 0,
            }],
        );
        let LockResult::Renewed { token: t2, .. } = r[0].clone() else {
            panic!("{r:?}")
        };
        assert!(t2 > token);
        assert_eq!(
            locks(
                &mut s,
                vec![LockOp::Release {
                    name: "job".into(),
                    token,
                    slot: 0
                }]
            )[0],
            LockResult::Released(false)
        );
        assert_eq!(
            locks(
                &mut s,
                vec![LockOp::Release {
                    name: "job".into(),
                    token: t2,
                    slot: 0
                }]
            )[0],
            LockResult::Released(true)
        );
        assert!(matches!(
            &locks(&mut s, vec![acq("you")])[0],
            LockResult::Acquired { .. }
        ));
        // An expired permit frees the lock.
        s.advance_secs(6);
        assert!(matches!(
            &locks(&mut s, vec![acq("me")])[0],
            LockResult::Acquired { already: false, .. }
        ));
    }
}

mod timer_rules {
    use super::*;
    use queen_domain::timers::{TimerOp, TimerResult};

    fn sched(key: &str, delay_ms: u64, txn: &str) -> TimerOp {
        TimerOp::Schedule {
            queue: QueueName::new("later").unwrap(),
            key: key.into(),
            payload: b"{\"hello\":1}".to_vec(),
            delay_ms,
            txn: txn.into(),
            partition: None,
            message_id: [7; 16],
            reschedule: false,
        }
    }

    fn timers(s: &mut Sim, ops: Vec<TimerOp>) -> Vec<TimerResult> {
        match s.apply(Command::Timers(ops)) {
            Outcome::Timers(r) => r,
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn a_due_timer_becomes_a_message_with_the_promised_ids() {
        let mut s = Sim::new();
        let r = timers(&mut s, vec![sched("k", 5_000, "txn-1")]);
        assert_eq!(r[0].status, "scheduled");
        s.apply(Command::Tick);
        assert!(s.pop("later", None, 5).is_empty(), "not before its time");
        s.advance_secs(6);
        s.apply(Command::Tick);
        let p = s.pop("later", None, 5);
        assert_eq!(txns(&p), ["txn-1"]);
        assert_eq!(p.claims[0].messages[0].id, [7; 16]);
        assert_eq!(
            timers(
                &mut s,
                vec![TimerOp::Cancel {
                    queue: QueueName::new("later").unwrap(),
                    key: "k".into()
                }]
            )[0]
            .status,
            "absent"
        );
    }

    #[test]
    fn rescheduling_replaces_and_cancelling_prevents_delivery() {
        let mut s = Sim::new();
        timers(
            &mut s,
            vec![sched("a", 1_000, "first"), sched("b", 1_000, "b")],
        );
        timers(&mut s, vec![sched("a", 60_000, "second")]);
        let c = timers(
            &mut s,
            vec![TimerOp::Cancel {
                queue: QueueName::new("later").unwrap(),
                key: "b".into(),
            }],
        );
        assert_eq!(c[0].status, "cancelled");
        assert_eq!(c[0].txn.as_deref(), Some("b"));
        s.advance_secs(2);
        s.apply(Command::Tick);
        assert!(
            s.pop("later", None, 5).is_empty(),
            "a moved to 60 s, b was cancelled"
        );
        s.advance_secs(60);
        s.apply(Command::Tick);
        assert_eq!(txns(&s.pop("later", None, 5)), ["second"]);
    }
}

#[test]
fn the_sink_hold_keeps_what_the_lake_has_not_committed_up_to_its_cap() {
    use queen_domain::kv::{Expiry, KvOp};
    use queen_domain::sink::documents;
    let mut s = Sim::new();
    let o = QueueOptions {
        retention_seconds: 10,
        retention_sink_hold: Some("default".into()),
        retention_sink_hold_max_seconds: 1000,
        ..QueueOptions::default()
    };
    s.configure("q", o);
    let t0 = s.now;
    s.push("q", "p", "t0");
    s.advance_secs(5);
    s.push("q", "p", "t1");
    s.advance_secs(20);
    s.apply(Command::Tick);
    let part = |s: &Sim| {
        reads::partition_by_name(&s.store, "q", "p")
            .unwrap()
            .unwrap()
    };
    assert_eq!(
        part(&s).log_start,
        0,
        "no commit pointer yet: everything younger than the cap stays"
    );
    let pointer = format!(r#"{{"k":1,"tEnd":{}}}"#, t0 + 62_000_000);
    s.apply(Command::Kv(vec![KvOp::Put {
        ns: documents::NS.into(),
        key: documents::pointer_key("default", "q"),
        value: pointer.into_bytes(),
        expiry: Expiry::Forever,
        expect: None,
        required: true,
    }]));
    s.apply(Command::Tick);
    let p = part(&s);
    assert_eq!(
        p.log_start, 1,
        "t0 is older than the pointer minus a minute, t1 is not"
    );
    assert!(
        reads::purged_stamp(&s.store, p.pid)
            .unwrap()
            .is_some_and(|t| t.0 >= t0 && t.0 < t0 + 1_000_000)
    );
    s.advance_secs(1000);
    s.apply(Command::Tick);
    assert_eq!(
        part(&s).log_start,
        2,
        "past retentionSinkHoldMaxSeconds the hold lets go"
    );
}

#[test]
fn a_leader_change_holds_leases_past_their_expiry_by_the_clock_skew() {
    // Without a leader change a lease ends at its expiry.
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            lease_time: 2,
            ..QueueOptions::default()
        },
    );
    s.push("q", "p", "t1");
    assert_eq!(txns(&s.pop("q", None, 1)), ["t1"]);
    s.advance_ms(2100);
    assert_eq!(
        txns(&s.pop("q", None, 1)),
        ["t1"],
        "redelivered 100 ms past expiry"
    );

    // After a leader change the same lease is held the default 500 ms past its expiry: not
    // redelivered, not expired by a tick, still good for an extension and an ack.
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            lease_time: 2,
            ..QueueOptions::default()
        },
    );
    s.push("q", "p", "t1");
    s.push("q", "p", "t2");
    let first = s.pop("q", None, 1);
    assert_eq!(txns(&first), ["t1"]);
    s.advance_ms(1000);
    s.leader_change();
    s.advance_ms(1100);
    s.apply(Command::Tick);
    assert!(
        s.pop("q", None, 1).is_empty(),
        "held within the skew of its expiry"
    );
    let v = s.ack(None, &first, 0, "completed");
    assert!(
        v.success && v.lease_released,
        "the holder's ack is accepted: {v:?}"
    );
    let second = s.pop("q", None, 1);
    assert_eq!(txns(&second), ["t2"]);
    // The hold is over once every lease granted before the change is past expiry + skew;
    // a lease granted afterwards expires on time again.
    s.advance_ms(2100);
    assert_eq!(
        txns(&s.pop("q", None, 1)),
        ["t2"],
        "redelivered after the hold ended"
    );

    // The leader's setting replaces the default; 0 turns the hold off.
    for (skew, held) in [(0, false), (1500, true)] {
        let mut s = Sim::new();
        s.apply(Command::ClusterSettings {
            version: 1,
            max_clock_skew_ms: skew,
        });
        s.configure(
            "q",
            QueueOptions {
                lease_time: 2,
                ..QueueOptions::default()
            },
        );
        s.push("q", "p", "t1");
        s.pop("q", None, 1);
        s.leader_change();
        s.advance_ms(2000 + 1000);
        let at_1s = s.pop("q", None, 1);
        if held {
            assert!(at_1s.is_empty(), "skew {skew} ms: held 1 s past expiry");
            s.advance_ms(600);
            assert_eq!(
                txns(&s.pop("q", None, 1)),
                ["t1"],
                "skew {skew} ms, 1.6 s past expiry"
            );
        } else {
            assert_eq!(txns(&at_1s), ["t1"], "skew 0: redelivered 1 s past expiry");
        }
    }
}

#[test]
fn the_cluster_version_only_rises() {
    let mut s = Sim::new();
    assert_eq!(reads::cluster_version(&s.store).unwrap(), 0);
    let r = s.apply(Command::ClusterSettings {
        version: 2,
        max_clock_skew_ms: 500,
    });
    assert_eq!(r, Outcome::ClusterSettings { version: 2 });
    let r = s.apply(Command::ClusterSettings {
        version: 1,
        max_clock_skew_ms: 700,
    });
    assert_eq!(r, Outcome::ClusterSettings { version: 2 }, "never lowered");
    assert_eq!(reads::cluster_version(&s.store).unwrap(), 2);
    assert_eq!(reads::max_clock_skew_ms(&s.store).unwrap(), Some(700));
}
