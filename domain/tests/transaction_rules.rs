//! The rules of transactions: all operations or none, required leases, pushes and acks together.

mod common;
use common::*;

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
