//! `producerSub`: a push or transaction applied as a producer stamps every message it stores;
//! stored messages and pop answers of earlier builds read as ones without a producer, and an
//! earlier build reads this build's pop answers.

mod common;
use common::*;
use queen_domain::command::{Claim, ConflationEcho, Delivered, TxnOp};
use queen_domain::model::MessageRec;
use queen_domain::time::Stamp;
use serde::{Deserialize, Serialize};

fn item(queue: &str, txn: &str) -> PushItem {
    PushItem {
        queue: QueueName::new(queue).unwrap(),
        partition: PartitionName::new("p").unwrap(),
        transaction_id: tid(txn),
        message_id: [1; 16],
        payload: b"{}".to_vec(),
        trace_id: None,
    }
}

fn as_producer(who: &str, command: Command) -> Command {
    Command::AsProducer {
        producer: who.to_owned(),
        command: Box::new(command),
    }
}

fn producers(p: &PopOutcome) -> Vec<Option<String>> {
    p.claims
        .iter()
        .flat_map(|c| c.messages.iter().map(|m| m.producer.clone()))
        .collect()
}

#[test]
fn pushes_and_transactions_as_a_producer_stamp_their_messages() {
    let mut s = Sim::new();
    s.apply(as_producer("alice", Command::Push(vec![item("q", "a")])));
    s.apply(Command::Push(vec![item("q", "plain")]));
    let out = s.apply(as_producer(
        "bob",
        Command::Transaction {
            ops: vec![TxnOp::Push(item("q", "b"))],
            required_leases: vec![],
            kv: vec![],
            timers: vec![],
        },
    ));
    assert!(
        matches!(out, Outcome::Transaction(ref t) if t.success),
        "{out:?}"
    );
    let got = s.pop("q", None, 10);
    assert_eq!(txns(&got), vec!["a", "plain", "b"]);
    assert_eq!(
        producers(&got),
        vec![Some("alice".to_owned()), None, Some("bob".to_owned())]
    );
    // Only a push or a transaction can be applied as a producer.
    let nested = s.apply(as_producer("eve", Command::Kv(vec![])));
    assert!(matches!(nested, Outcome::Rejected(_)), "{nested:?}");
}

/// The stored message as builds before `producer` wrote it.
#[derive(Serialize, Deserialize)]
struct MessageBefore {
    transaction_id: String,
    id: [u8; 16],
    trace_id: Option<String>,
    stamp: Stamp,
    #[serde(with = "serde_bytes")]
    payload: Vec<u8>,
}

#[test]
fn stored_messages_keep_their_bytes_without_a_producer_and_read_either_way() {
    let m = |producer: Option<&str>| MessageRec {
        transaction_id: "t".into(),
        id: [2; 16],
        trace_id: Some("tr".into()),
        stamp: Stamp(9),
        payload: b"{\"a\":1}".to_vec(),
        producer: producer.map(str::to_owned),
    };
    let before = MessageBefore {
        transaction_id: "t".into(),
        id: [2; 16],
        trace_id: Some("tr".into()),
        stamp: Stamp(9),
        payload: b"{\"a\":1}".to_vec(),
    };
    let old = postcard::to_allocvec(&before).unwrap();
    assert_eq!(postcard::to_allocvec(&m(None)).unwrap(), old);
    assert_eq!(postcard::from_bytes::<MessageRec>(&old).unwrap(), m(None));
    let stamped = postcard::to_allocvec(&m(Some("alice"))).unwrap();
    assert_eq!(
        postcard::from_bytes::<MessageRec>(&stamped).unwrap(),
        m(Some("alice"))
    );
    // An earlier build reads a stamped message (it ignores what follows the payload).
    assert_eq!(
        postcard::from_bytes::<MessageBefore>(&stamped)
            .unwrap()
            .payload,
        before.payload
    );
}

/// A pop's answer as builds before producers wrote it.
#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct PopBefore {
    lease_id: String,
    lease_expires: Stamp,
    claims: Vec<Claim>,
}

#[test]
fn pop_answers_cross_builds_both_ways() {
    let delivered = |producer: Option<&str>| Delivered {
        offset: 0,
        transaction_id: "t".into(),
        id: [3; 16],
        trace_id: None,
        payload: b"1".to_vec(),
        created: Stamp(4),
        attempt: 1,
        producer: producer.map(str::to_owned),
    };
    let pop = |producer| PopOutcome {
        lease_id: "l".into(),
        lease_expires: Stamp(5),
        claims: vec![Claim {
            pid: 1,
            partition: "p".into(),
            messages: vec![delivered(producer), delivered(None)],
        }],
        conflation: ConflationEcho::default(),
    };
    let echoes = [
        ConflationEcho::default(),
        ConflationEcho {
            conflating: true,
            conflict: false,
        },
        ConflationEcho {
            conflating: false,
            conflict: true,
        },
    ];
    for p in [None, Some("alice")] {
        for echo in echoes {
            let answer = PopOutcome {
                conflation: echo,
                ..pop(p)
            };
            let bytes = postcard::to_allocvec(&answer).unwrap();
            assert_eq!(postcard::from_bytes::<PopOutcome>(&bytes).unwrap(), answer);
            // An earlier build reads it, without the producers and the conflation echo.
            let old: PopBefore = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(old.claims.len(), 1);
        }
    }
    let old = PopBefore {
        lease_id: "l".into(),
        lease_expires: Stamp(5),
        claims: pop(None).claims,
    };
    let old_bytes = postcard::to_allocvec(&old).unwrap();
    assert_eq!(old_bytes, postcard::to_allocvec(&pop(None)).unwrap());
    assert_eq!(
        postcard::from_bytes::<PopOutcome>(&old_bytes).unwrap(),
        pop(None)
    );
}

#[test]
fn a_timer_scheduled_as_a_producer_delivers_a_stamped_message() {
    use queen_domain::timers::TimerOp;
    let mut s = Sim::new();
    let schedule = |txn: &str| TimerOp::Schedule {
        queue: QueueName::new("t").unwrap(),
        key: txn.to_owned(),
        payload: b"{}".to_vec(),
        delay_ms: 0,
        txn: txn.to_owned(),
        partition: None,
        message_id: [4; 16],
        reschedule: false,
    };
    s.apply(as_producer(
        "carol",
        Command::Timers(vec![schedule("by-carol")]),
    ));
    s.apply(Command::Timers(vec![schedule("plain")]));
    s.advance_secs(1);
    s.apply(Command::Tick);
    let got = s.pop("t", None, 10);
    let mut seen: Vec<(String, Option<String>)> = got
        .claims
        .iter()
        .flat_map(|c| c.messages.iter())
        .map(|m| (m.transaction_id.clone(), m.producer.clone()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("by-carol".to_owned(), Some("carol".to_owned())),
            ("plain".to_owned(), None)
        ]
    );
}

/// The stored timer as builds before `producer` wrote it.
#[derive(Serialize, Deserialize)]
struct TimerBefore {
    #[serde(with = "serde_bytes")]
    payload: Vec<u8>,
    deliver_at: Stamp,
    txn: String,
    partition: String,
    message_id: [u8; 16],
    scheduled: Stamp,
}

#[test]
fn stored_timers_keep_their_bytes_without_a_producer() {
    use queen_domain::timers::TimerRec;
    let rec = |producer: Option<&str>| TimerRec {
        payload: b"1".to_vec(),
        deliver_at: Stamp(7),
        txn: "x".into(),
        partition: "Default".into(),
        message_id: [5; 16],
        scheduled: Stamp(6),
        producer: producer.map(str::to_owned),
    };
    let old = postcard::to_allocvec(&TimerBefore {
        payload: b"1".to_vec(),
        deliver_at: Stamp(7),
        txn: "x".into(),
        partition: "Default".into(),
        message_id: [5; 16],
        scheduled: Stamp(6),
    })
    .unwrap();
    assert_eq!(postcard::to_allocvec(&rec(None)).unwrap(), old);
    assert_eq!(postcard::from_bytes::<TimerRec>(&old).unwrap(), rec(None));
    let stamped = postcard::to_allocvec(&rec(Some("carol"))).unwrap();
    assert_eq!(
        postcard::from_bytes::<TimerRec>(&stamped).unwrap(),
        rec(Some("carol"))
    );
}
