//! The rules of timers: scheduled messages fire once, at their time, into their queue.

mod common;
use common::*;

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
