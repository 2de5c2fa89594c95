//! The rules of ephemeral queues: rings, groups, leases, bounds, hand-over and ownership.

use queen_domain::ephemeral::owner::owner;
use queen_domain::ephemeral::{
    AckOutcome, AckStatus, Declared, Limits, MessageId, Options, Policy, PushRefusal, Rings, Take,
};
use serde_json::json;

fn take(
    partition: Option<&'static str>,
    group: &'static str,
    batch: usize,
    auto_ack: bool,
) -> Take<'static> {
    Take {
        partition,
        group,
        batch,
        auto_ack,
    }
}

fn opts() -> Options {
    Declared::default().effective(&Limits::default())
}

fn payloads(range: std::ops::Range<u32>) -> Vec<Vec<u8>> {
    range.map(|i| i.to_string().into_bytes()).collect()
}

fn texts(d: &[queen_domain::ephemeral::Delivered]) -> Vec<String> {
    d.iter()
        .map(|m| String::from_utf8(m.payload.clone()).unwrap())
        .collect()
}

#[test]
fn a_partition_is_fifo_and_a_group_sees_each_message_once() {
    let mut r = Rings::new(7, Limits::default());
    let o = opts();
    r.push("q", "p", payloads(0..5), &o, 0).unwrap();
    r.push("q", "p", payloads(5..8), &o, 1).unwrap();
    let a = r.pop("q", take(Some("p"), "g", 3, false), &o, 2);
    let b = r.pop("q", take(None, "g", 10, false), &o, 3);
    assert_eq!(texts(&a), ["0", "1", "2"]);
    assert_eq!(texts(&b), ["3", "4", "5", "6", "7"]);
    assert!(
        a.iter()
            .chain(&b)
            .all(|m| m.attempts == 1 && m.partition == "p")
    );
    assert!(r.pop("q", take(None, "g", 10, false), &o, 4).is_empty());
}

#[test]
fn groups_fan_out_and_a_message_is_freed_once_every_group_passed_it() {
    let mut r = Rings::new(1, Limits::default());
    let o = opts();
    r.push("q", "p", payloads(0..4), &o, 0).unwrap();
    let a = r.pop("q", take(None, "a", 10, true), &o, 1);
    assert_eq!(a.len(), 4);
    // Only group a consumes: it passed everything, so nothing is held.
    assert_eq!(r.len(), 0);
    r.push("q", "p", payloads(4..6), &o, 2).unwrap();
    let b = r.pop("q", take(None, "b", 10, false), &o, 3);
    assert_eq!(texts(&b), ["4", "5"], "a new group starts at what is held");
    assert_eq!(r.len(), 2, "b's leases keep the messages");
    let acks: Vec<_> = b
        .iter()
        .map(|m| (m.id.clone(), AckStatus::Completed))
        .collect();
    assert_eq!(
        r.ack("q", "b", &acks, &o, 4),
        [AckOutcome::Acked, AckOutcome::Acked]
    );
    assert_eq!(r.len(), 2, "group a has not consumed 4 and 5 yet");
    assert_eq!(
        texts(&r.pop("q", take(None, "a", 10, true), &o, 5)),
        ["4", "5"]
    );
    assert_eq!((r.len(), r.bytes()), (0, 0));
}

#[test]
fn competing_consumers_of_one_group_share_the_work() {
    let mut r = Rings::new(1, Limits::default());
    let o = opts();
    r.push("q", "p", payloads(0..6), &o, 0).unwrap();
    let one = r.pop("q", take(None, "w", 3, false), &o, 1);
    let two = r.pop("q", take(None, "w", 3, false), &o, 1);
    assert_eq!(texts(&one), ["0", "1", "2"]);
    assert_eq!(texts(&two), ["3", "4", "5"]);
}

#[test]
fn an_expired_lease_redelivers_with_attempts_until_the_retry_limit() {
    let mut r = Rings::new(1, Limits::default());
    let o = Declared::parse(Some(&json!({"leaseSeconds": 1, "retryLimit": 2})))
        .unwrap()
        .effective(&Limits::default());
    r.push("q", "p", payloads(0..1), &o, 0).unwrap();
    let mut seen = Vec::new();
    for t in 0..10 {
        for m in r.pop("q", take(None, "g", 1, false), &o, t * 1000) {
            seen.push(m.attempts);
        }
    }
    assert_eq!(seen, [1, 2, 3], "one delivery and two redeliveries");
    assert_eq!(r.view("q", None).unwrap().drops.retry, 1);
    assert_eq!(r.len(), 0);
}

#[test]
fn a_failed_ack_redelivers_and_the_last_one_drops() {
    let mut r = Rings::new(1, Limits::default());
    let o = Declared::parse(Some(&json!({"retryLimit": 1})))
        .unwrap()
        .effective(&Limits::default());
    r.push("q", "p", payloads(0..1), &o, 0).unwrap();
    let m = r.pop("q", take(None, "g", 1, false), &o, 0).remove(0);
    assert_eq!(
        r.ack("q", "g", &[(m.id.clone(), AckStatus::Failed)], &o, 1),
        [AckOutcome::Redelivered]
    );
    let m = r.pop("q", take(None, "g", 1, false), &o, 2).remove(0);
    assert_eq!(m.attempts, 2);
    assert_eq!(
        r.ack("q", "g", &[(m.id.clone(), AckStatus::Failed)], &o, 3),
        [AckOutcome::Acked]
    );
    assert_eq!(r.view("q", None).unwrap().drops.retry, 1);
    assert_eq!(
        r.ack("q", "g", &[(m.id, AckStatus::Completed)], &o, 4),
        [AckOutcome::Unknown],
        "settled already"
    );
}

#[test]
fn an_id_of_another_incarnation_is_stale_and_a_foreign_text_unknown() {
    let mut r = Rings::new(1, Limits::default());
    let o = opts();
    r.push("q", "p", payloads(0..1), &o, 0).unwrap();
    let m = r.pop("q", take(None, "g", 1, false), &o, 0).remove(0);
    let mut later = Rings::new(2, Limits::default());
    later.push("q", "p", payloads(0..1), &o, 0).unwrap();
    assert_eq!(
        later.ack(
            "q",
            "g",
            &[
                (m.id.clone(), AckStatus::Completed),
                ("x".into(), AckStatus::Completed)
            ],
            &o,
            1
        ),
        [AckOutcome::Stale, AckOutcome::Unknown]
    );
    let id = MessageId::parse(&m.id).unwrap();
    assert_eq!((id.epoch, id.seq, id.partition.as_str()), (1, 0, "p"));
    let colon = MessageId {
        epoch: 9,
        seq: 3,
        partition: "a:b".into(),
    };
    assert_eq!(MessageId::parse(&colon.to_string()), Some(colon));
}

#[test]
fn the_reject_policy_refuses_whole_pushes_and_drop_oldest_keeps_the_newest() {
    let mut r = Rings::new(1, Limits::default());
    let reject = Declared::parse(Some(&json!({"maxLength": 3})))
        .unwrap()
        .effective(&Limits::default());
    r.push("q", "p", payloads(0..2), &reject, 0).unwrap();
    assert!(matches!(
        r.push("q", "p", payloads(2..4), &reject, 1),
        Err(PushRefusal::QueueFull { len: 2, .. })
    ));
    assert!(matches!(
        r.push("q", "p", payloads(0..4), &reject, 1),
        Err(PushRefusal::TooLarge { .. })
    ));
    assert_eq!(r.len(), 2, "nothing of a refused push is kept");

    let drop = Declared::parse(Some(&json!({"maxLength": 3, "policy": "dropOldest"})))
        .unwrap()
        .effective(&Limits::default());
    r.push("f", "a", payloads(0..2), &drop, 0).unwrap();
    r.push("f", "b", payloads(2..3), &drop, 1).unwrap();
    r.push("f", "a", payloads(3..5), &drop, 2).unwrap();
    let got = r.pop("f", take(None, "g", 10, true), &drop, 3);
    let mut t = texts(&got);
    t.sort();
    assert_eq!(
        t,
        ["2", "3", "4"],
        "the two oldest, across partitions, went"
    );
    assert_eq!(r.view("f", None).unwrap().drops.bounds, 2);
    // A batch larger than the feed keeps its own newest.
    assert_eq!(r.push("f", "a", payloads(10..15), &drop, 4), Ok(5));
    assert_eq!(
        texts(&r.pop("f", take(None, "g", 10, true), &drop, 5)),
        ["12", "13", "14"]
    );
    assert_eq!(r.view("f", None).unwrap().drops.bounds, 4);
}

#[test]
fn a_dropped_message_is_skipped_by_the_groups_that_had_not_consumed_it() {
    let mut r = Rings::new(1, Limits::default());
    let drop = Declared::parse(Some(&json!({"maxLength": 2, "policy": "dropOldest"})))
        .unwrap()
        .effective(&Limits::default());
    r.push("q", "p", payloads(0..2), &drop, 0).unwrap();
    let leased = r.pop("q", take(None, "g", 1, false), &drop, 0).remove(0);
    r.push("q", "p", payloads(2..4), &drop, 1).unwrap();
    assert_eq!(
        r.ack("q", "g", &[(leased.id, AckStatus::Completed)], &drop, 2),
        [AckOutcome::Unknown],
        "its message was dropped under it"
    );
    assert_eq!(
        texts(&r.pop("q", take(None, "g", 10, true), &drop, 3)),
        ["2", "3"]
    );
    assert_eq!(r.view("q", None).unwrap().groups[0].skipped, 2);
}

#[test]
fn ttl_drops_old_messages_and_the_node_budget_refuses_growth() {
    // Room for one queue's structures (about 3.5 KB), its two messages and a group (about
    // 2 KB), not for another queue with a 4000-byte message.
    let limits = Limits {
        node_max_bytes: 7000,
        ..Limits::default()
    };
    let mut r = Rings::new(1, limits.clone());
    let o = Declared::parse(Some(&json!({"ttlSeconds": 2})))
        .unwrap()
        .effective(&limits);
    r.push("q", "p", vec![vec![b'1'; 10]], &o, 0).unwrap();
    r.push("q", "p", vec![vec![b'2'; 10]], &o, 1500).unwrap();
    assert!(matches!(
        r.push("other", "p", vec![vec![b'3'; 4000]], &o, 1600),
        Err(PushRefusal::NodeFull { .. })
    ));
    let got = r.pop("q", take(None, "g", 10, true), &o, 2100);
    assert_eq!(got.len(), 1, "the first is older than 2 s");
    assert_eq!(r.view("q", None).unwrap().drops.ttl, 1);
    assert_eq!(r.bytes(), 0);
}

#[test]
fn reset_drops_everything_and_rewinds_groups() {
    let mut r = Rings::new(1, Limits::default());
    let o = opts();
    r.push("q", "p", payloads(0..3), &o, 0).unwrap();
    let _ = r.pop("q", take(None, "g", 1, false), &o, 0);
    assert_eq!(r.reset("q"), 3);
    assert_eq!(r.reset("nope"), 0);
    assert_eq!((r.len(), r.bytes()), (0, 0));
    r.push("q", "p", payloads(3..4), &o, 1).unwrap();
    assert_eq!(texts(&r.pop("q", take(None, "g", 10, true), &o, 2)), ["3"]);
    assert!(r.delete("q"));
    assert!(!r.delete("q"));
}

#[test]
fn a_handed_over_ring_keeps_its_messages_and_positions_and_leases_come_back() {
    let mut a = Rings::new(1, Limits::default());
    let o = opts();
    a.push("q", "p", payloads(0..5), &o, 0).unwrap();
    let done = a.pop("q", take(None, "g", 2, true), &o, 0);
    assert_eq!(texts(&done), ["0", "1"]);
    let leased = a.pop("q", take(None, "g", 1, false), &o, 0);
    assert_eq!(texts(&leased), ["2"]);
    let _ = a.pop("q", take(None, "h", 1, true), &o, 0);
    let ring = a.detach("q", "p").unwrap();
    assert_eq!((a.len(), a.bytes()), (0, 0));

    let mut b = Rings::new(2, Limits::default());
    b.push("q", "p", payloads(5..6), &o, 1).unwrap();
    assert_eq!(
        b.adopt(ring, 2),
        3,
        "h still needed 3 and 4, g its lease on 2"
    );
    let g = b.pop("q", take(None, "g", 10, true), &o, 3);
    assert_eq!(texts(&g), ["2", "3", "4", "5"]);
    assert_eq!(
        g[0].attempts, 2,
        "the lease in flight came back as a redelivery"
    );
    let h = b.pop("q", take(None, "h", 10, true), &o, 3);
    assert_eq!(texts(&h), ["3", "4", "5"]);
    assert_eq!(b.len(), 0);
}

#[test]
fn idle_groups_and_idle_implicit_queues_are_forgotten() {
    let limits = Limits {
        idle_ms: 1000,
        ..Limits::default()
    };
    let mut r = Rings::new(1, limits.clone());
    let o = Declared::default().effective(&limits);
    r.push("q", "p", payloads(0..2), &o, 0).unwrap();
    let _ = r.pop("q", take(None, "gone", 1, true), &o, 0);
    r.push("q", "p", payloads(2..3), &o, 10).unwrap();
    r.sweep(5000, &mut |_| (o, false));
    // The group left: the ring keeps its messages for the next consumer.
    assert_eq!(r.len(), 2);
    let _ = r.pop("q", take(None, "new", 10, true), &o, 5000);
    r.sweep(7000, &mut |_| (o, false));
    assert_eq!(r.queue_names().count(), 0);
}

#[test]
fn options_are_a_closed_list_checked_by_field_and_clamped_to_the_node() {
    assert_eq!(
        Declared::parse(Some(&json!({"maxbytes": 1})))
            .unwrap_err()
            .0,
        "options.maxbytes"
    );
    assert_eq!(
        Declared::parse(Some(&json!({"policy": "drop"})))
            .unwrap_err()
            .0,
        "options.policy"
    );
    assert_eq!(
        Declared::parse(Some(&json!({"leaseSeconds": 0})))
            .unwrap_err()
            .0,
        "options.leaseSeconds"
    );
    assert_eq!(
        Declared::parse(Some(&json!({"windowBuffer": {"ms": 5, "n": 1}})))
            .unwrap_err()
            .0,
        "options.windowBuffer.n"
    );
    let limits = Limits {
        node_max_bytes: 1000,
        ..Limits::default()
    };
    let d = Declared::parse(Some(
        &json!({"maxBytes": 5000, "policy": "dropOldest", "windowBuffer": {"ms": 50, "count": 10}}),
    ))
    .unwrap();
    let e = d.effective(&limits);
    assert_eq!(e.max_bytes, 1000);
    assert_eq!(e.policy, Policy::DropOldest);
    assert_eq!(e.max_length, limits.queue_max_length);
    let back: Declared = serde_json::from_slice(&serde_json::to_vec(&d).unwrap()).unwrap();
    assert_eq!(back, d);
}

#[test]
fn the_owner_is_the_same_everywhere_and_a_leaving_member_moves_only_its_own() {
    let three = [1, 2, 3];
    let mut counts = [0; 4];
    let mut moved_wrongly = 0;
    for i in 0..3000 {
        let p = format!("p{i}");
        let o = owner("q", &p, &three).unwrap();
        counts[o as usize] += 1;
        let two: Vec<u64> = three.iter().copied().filter(|m| *m != 3).collect();
        let o2 = owner("q", &p, &two).unwrap();
        if o != 3 && o2 != o {
            moved_wrongly += 1;
        }
        assert_eq!(owner("q", &p, &[3, 1, 2]), Some(o), "order does not matter");
    }
    assert_eq!(moved_wrongly, 0);
    for c in &counts[1..] {
        assert!((800..1200).contains(c), "spread: {counts:?}");
    }
    assert_eq!(owner("q", "p", &[]), None);
}
